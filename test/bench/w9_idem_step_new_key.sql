-- 9. idem step new key: idem_step() with a fresh step of the client's own
-- run (a run without declared steps, seeded by bench.reset()), the same
-- business INSERT and outbox event as workload 4; the step also records
-- itself in the run's row
\set a random(1, 1000000)
SELECT idem_step('bench-' || :client_id, gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a::numeric);
