-- producer, the lean queue: the business row and its event in one statement
\set a random(1, 1000000)
WITH p AS (
	INSERT INTO bench.payments (invoice, amount) VALUES ('inv-' || :a, :a)
	RETURNING id, invoice, amount)
INSERT INTO bench.q (topic, payload)
SELECT 'payments', jsonb_build_object('rows', jsonb_build_array(to_jsonb(p)),
									  'command', 'INSERT', 'rowcount', 1)
  FROM p;
