-- 6. plpgsql replay: keys seeded before the run (seed-1 .. seed-:seeds)
\set n random(1, :seeds)
SELECT bench.plpgsql_execute('seed-' || :n,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :n, :n);
