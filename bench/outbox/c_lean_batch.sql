-- consumer, the lean queue: claim 10 due events (oldest due first, the due
-- time moved to the lease end, attempt counted, a new fencing token), then
-- delete the batch, fenced by the tokens
WITH c AS (
	SELECT id FROM bench.q
	 WHERE topic = 'payments' AND due <= now()
	 ORDER BY due LIMIT 10
	   FOR UPDATE SKIP LOCKED),
u AS (
	UPDATE bench.q q
	   SET due = now() + interval '30 s', attempts = q.attempts + 1,
		   lease_token = gen_random_uuid()
	  FROM c WHERE q.id = c.id
	RETURNING q.id, q.topic, q.payload, q.attempts, q.lease_token)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS toks
  FROM u \gset
DELETE FROM bench.q q
 USING unnest(:ids::bigint[], :toks::uuid[]) AS u(e, t)
 WHERE q.id = u.e AND q.lease_token = u.t;
