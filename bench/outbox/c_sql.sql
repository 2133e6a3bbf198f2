-- consumer, hand-written: the best SKIP LOCKED queue with the same
-- semantics as idem's claim (due events oldest first, the due time moved to
-- the lease end, attempt counted, dead letter after the last attempt, a new
-- token per lease) and ack (fenced by the token), the ack in one statement
WITH c AS (
	SELECT ctid AS tid FROM bench.queue
	 WHERE topic = 'payments' AND state = ANY (ARRAY['pending', 'leased'])
	   AND next_attempt_at <= clock_timestamp()
	 ORDER BY next_attempt_at LIMIT 10
	   FOR UPDATE SKIP LOCKED),
u AS (
	UPDATE bench.queue o
	   SET state = CASE WHEN o.attempts >= 10 THEN 'dead' ELSE 'leased' END,
		   attempts = CASE WHEN o.attempts >= 10 THEN o.attempts ELSE o.attempts + 1 END,
		   next_attempt_at = clock_timestamp() + interval '30 s',
		   lease_token = CASE WHEN o.attempts >= 10 THEN NULL ELSE gen_random_uuid() END,
		   leased_by = current_user::regrole, lease_holder = 'pid ' || pg_backend_pid()
	  FROM c WHERE o.ctid = c.tid
	RETURNING o.event_id, o.lease_token, o.state)
SELECT coalesce(array_agg(event_id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS toks
  FROM u WHERE state = 'leased' \gset
UPDATE bench.queue q SET state = 'delivered', delivered_at = clock_timestamp()
  FROM unnest(:ids::uuid[], :toks::uuid[]) AS u(e, t)
 WHERE q.event_id = u.e AND q.lease_token = u.t AND q.state = 'leased';
