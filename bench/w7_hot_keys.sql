-- 7. hot keys: 50 keys shared by all clients.  The key carries a 10 ms time
-- bucket, so each of the 50 keys is executed once per bucket and replayed by
-- every other call in it: a mix of executions, lock waits and replays.
\set n random(1, 50)
SELECT idem_execute('hot-' || :n || '-' || (extract(epoch FROM clock_timestamp()) * 100)::bigint,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :n, :n::numeric);
