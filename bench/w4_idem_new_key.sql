-- 4. idem new key: idem_execute() with a fresh key per call; run with
-- idem.outbox_topic set, so it writes the same three rows as floor/plpgsql
\set a random(1, 1000000)
SELECT idem_execute(gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a::numeric);
