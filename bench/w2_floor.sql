-- 2. floor: the business INSERT, the key record and the outbox event in one
-- data-modifying statement, with no lock, no lookup and no checks: the least
-- work any durable design can do.  The key record stores the same response
-- idem stores; the fingerprint is a constant (no hashing).
\set a random(1, 1000000)
WITH p AS (
	INSERT INTO bench.payments (invoice, amount) VALUES ('inv-' || :a, :a)
	RETURNING id, invoice, amount
), k AS (
	INSERT INTO bench.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
	SELECT gen_random_uuid()::text, :owner,
		   '\x0000000000000000000000000000000000000000000000000000000000000000'::bytea,
		   jsonb_build_object('rows', jsonb_build_array(to_jsonb(p)),
							  'command', 'INSERT', 'rowcount', 1),
		   now(), now() + interval '1 day', 2
	  FROM p
	RETURNING key, owner, response
)
INSERT INTO bench.outbox (event_id, key, owner, topic, payload, created_at,
						 state, attempts, next_attempt_at)
SELECT gen_random_uuid(), key, owner, 'payments', response, now(),
	   'pending', 0, now() FROM k;
