-- 3. plpgsql: the classic hand-written idempotency function (schema.sql)
-- with a fresh key per call
\set a random(1, 1000000)
SELECT bench.plpgsql_execute(gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a);
