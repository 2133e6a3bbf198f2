-- producer, idem: idem_execute() with a fresh key and idem.outbox_topic set
\set a random(1, 1000000)
SELECT idem_execute(gen_random_uuid()::text,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :a, :a::numeric);
