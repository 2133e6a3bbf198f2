-- consumer, the lean queue: claim one event, then delete it, fenced by its
-- token (the single-row DELETE)
WITH c AS (
	SELECT id FROM bench.q
	 WHERE topic = 'payments' AND due <= now()
	 ORDER BY due LIMIT 1
	   FOR UPDATE SKIP LOCKED)
UPDATE bench.q q
   SET due = now() + interval '30 s', attempts = q.attempts + 1,
	   lease_token = gen_random_uuid()
  FROM c WHERE q.id = c.id
RETURNING q.id, q.lease_token AS tok, q.payload \gset
DELETE FROM bench.q WHERE id = :id AND lease_token = :tok;
