-- producer, hand-written: business row, key record and event in one statement
\set a random(1, 1000000)
WITH p AS (
	INSERT INTO bench.payments (invoice, amount) VALUES ('inv-' || :a, :a)
	RETURNING id, invoice, amount
), k AS (
	INSERT INTO bench.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
	SELECT gen_random_uuid()::text, 'bench'::regrole,
		   '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
		   jsonb_build_object('rows', jsonb_build_array(to_jsonb(p)),
							  'command', 'INSERT', 'rowcount', 1),
		   now(), now() + interval '1 day', 2
	  FROM p
	RETURNING key, owner, response
)
INSERT INTO bench.queue (event_id, key, owner, topic, payload, created_at, state, attempts, next_attempt_at)
SELECT gen_random_uuid(), key, owner, 'payments', response, now(), 'pending', 0, now() FROM k;
