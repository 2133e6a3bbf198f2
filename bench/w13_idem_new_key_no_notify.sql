-- 13. idem new key without the outbox's NOTIFY: workload 4 with
-- idem.outbox_notify = off (set for the run), to show what the wakeup
-- costs: PostgreSQL commits notifying transactions one at a time
\set a random(1, 1000000)
SELECT idem_execute(gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a::numeric);
