-- 11. idem_call new key, as the client helpers send it: one statement, the
-- outbox topic as a per-call option, the arguments a plain text array that
-- idem types from the statement (what a driver's untyped parameters reach)
\set a random(1, 1000000)
SELECT response FROM idem_call(gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	ARRAY['inv-' || :a, :a::text], outbox_topic => 'payments');
