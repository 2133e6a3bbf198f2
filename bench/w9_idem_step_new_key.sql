-- 9. idem step new key: idem_step() with a fresh step of the client's
-- current run, the same business INSERT and outbox event as workload 4;
-- the step also records itself in the run's row.  Runs have 8 steps (no
-- declared list): every 8th transaction begins the client's next run
-- first, so a run's own cost is in the figure, spread over its steps.
-- :i counts the client's transactions (pgbench -D i=0).
\set a random(1, 1000000)
\set r :i / 8
\set s :i % 8
\set i :i + 1
\if :s = 0
SELECT status FROM idem_run_begin('bench-' || :client_id || '-' || :r);
\endif
SELECT idem_step('bench-' || :client_id || '-' || :r, 'step-' || :s,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a::numeric);
