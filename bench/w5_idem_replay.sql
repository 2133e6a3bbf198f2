-- 5. idem replay: keys seeded before the run (seed-1 .. seed-:seeds)
\set n random(1, :seeds)
SELECT idem_execute('seed-' || :n,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :n, :n::numeric);
