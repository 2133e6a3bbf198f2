--
-- outbox_delivery: topics and who may use them, claim under a lease, ack,
-- fail with backoff, jitter and Retry-After, dead letters, requeue, the
-- states view, the purge of delivered events, and bad input (issue 10)
--
-- Acknowledged events stay here as delivered (idem.outbox_keep_delivered),
-- so that this file can show their state, ID410 and the purge;
-- outbox_ack covers the default, an ack that deletes the event.
SET idem.outbox_keep_delivered = on;
CREATE ROLE regress_ob_admin;
CREATE ROLE regress_ob_producer;
CREATE ROLE regress_ob_publishers;			-- a group granted publish
CREATE ROLE regress_ob_member IN ROLE regress_ob_publishers;
CREATE ROLE regress_ob_consumer;
CREATE ROLE regress_ob_other;
CREATE TABLE ob_pay (id serial PRIMARY KEY, amount int NOT NULL);
GRANT ALL ON ob_pay, ob_pay_id_seq TO PUBLIC;
-- what a consumer remembers between its claim and its ack
CREATE TABLE ob_claimed (who text, event_id uuid, token uuid, attempt int,
	lease_until timestamptz, key text, owner regrole);
GRANT ALL ON ob_claimed TO PUBLIC;
-- everything idem.outbox holds, to show that a refused call changed nothing
CREATE VIEW ob_digest AS
SELECT count(*) AS events,
	   md5(coalesce(string_agg(o::text, ',' ORDER BY event_id), '')) AS digest
  FROM idem.outbox o;

-- nothing of the delivery API is granted to PUBLIC
SELECT p.oid::regprocedure AS function,
	   has_function_privilege('regress_ob_other', p.oid, 'EXECUTE') AS other_may_execute
  FROM pg_proc p WHERE p.proname LIKE 'idem_outbox%' ORDER BY p.oid::regprocedure::text;
SELECT has_table_privilege('regress_ob_other', 'idem_outbox_events', 'SELECT') AS other_may_read_view;
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]),
	idem_outbox_fail(uuid, uuid, text, interval)
	TO regress_ob_consumer, regress_ob_other;
-- an administrator may be given topic administration without superuser
GRANT EXECUTE ON FUNCTION idem_outbox_create_topic(text, regrole[], regrole[]),
	idem_outbox_grant(text, regrole, text), idem_outbox_revoke(text, regrole, text)
	TO regress_ob_admin;

--
-- the topic registry
--
SET ROLE regress_ob_admin;
SELECT idem_outbox_create_topic('pay', publishers => '{regress_ob_producer}',
								consumers => '{regress_ob_consumer}');
SELECT idem_outbox_create_topic('mail');
SELECT idem_outbox_grant('mail', 'regress_ob_publishers', 'publish');
SELECT idem_outbox_grant('mail', 'regress_ob_publishers', 'publish');	-- no duplicate
RESET ROLE;
SELECT topic, publishers, consumers FROM idem.outbox_topics
 WHERE topic IN ('pay', 'mail') ORDER BY topic;
-- a role listed more than once is kept once, as granting twice does
SELECT idem_outbox_create_topic('dups', publishers => '{regress_ob_producer,regress_ob_publishers,regress_ob_producer}',
								consumers => array_fill('regress_ob_consumer'::regrole, ARRAY[100000]));
SELECT publishers, consumers FROM idem.outbox_topics WHERE topic = 'dups';
DELETE FROM idem.outbox_topics WHERE topic = 'dups';
\set VERBOSITY terse
SELECT idem_outbox_create_topic('pay');
SELECT idem_outbox_grant('nope', 'regress_ob_producer', 'publish');
SELECT idem_outbox_grant('pay', 'regress_ob_producer', 'read');
SELECT idem_outbox_create_topic('');
SELECT idem_outbox_create_topic(repeat('t', 256));
SELECT idem_outbox_create_topic(NULL);
SELECT idem_outbox_create_topic('x', publishers => NULL);
-- a role list holds roles: an OID of none would grant whatever role is
-- created with it later; a dropped role's OID may still be revoked
SELECT idem_outbox_create_topic('x', publishers => ARRAY[0::regrole]);
SELECT idem_outbox_create_topic('x', consumers => '{{regress_ob_producer}}');
SELECT idem_outbox_create_topic('x', consumers => ARRAY[NULL::regrole]);
SELECT idem_outbox_grant('pay', 0::regrole, 'publish');
SELECT idem_outbox_grant('pay', 987654321::regrole, 'consume');
SELECT idem_outbox_revoke('pay', 987654321::regrole, 'consume');
SELECT count(*) AS topics_x FROM idem.outbox_topics WHERE topic = 'x';
SET ROLE regress_ob_other;
SELECT idem_outbox_create_topic('mine');
RESET ROLE;
\set VERBOSITY default

--
-- who may publish: a refused call fails before the statement runs and
-- writes nothing, neither business row nor key record nor event
--
SELECT * FROM ob_digest \gset before_
SET ROLE regress_ob_other;
SET idem.outbox_topic = 'pay';
SELECT idem_execute('ob:deny', 'INSERT INTO ob_pay (amount) VALUES ($1) RETURNING id', 1);
SET idem.outbox_topic = 'unregistered';
SELECT idem_execute('ob:deny', 'INSERT INTO ob_pay (amount) VALUES ($1) RETURNING id', 1);
RESET ROLE;
SELECT (SELECT count(*) FROM ob_pay) AS business_rows,
	   (SELECT count(*) FROM idem.keys WHERE key = 'ob:deny') AS key_records,
	   (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged;

-- allowed: the producer itself, and a member of a role granted publish
SET ROLE regress_ob_producer;
SET idem.outbox_topic = 'pay';
SELECT idem_execute('ob:1', 'INSERT INTO ob_pay (amount) VALUES ($1) RETURNING amount', 10) ->> 'rows';
SELECT idem_execute('ob:2', 'INSERT INTO ob_pay (amount) VALUES ($1) RETURNING amount', 20) ->> 'rows';
SELECT idem_execute('ob:3', 'INSERT INTO ob_pay (amount) VALUES ($1) RETURNING amount', 30) ->> 'rows';
SET idem.outbox_topic = 'mail';
SELECT idem_execute('ob:mail', 'SELECT 1 AS one') ->> 'command';
SET ROLE regress_ob_member;
SELECT idem_execute('ob:member', 'SELECT 2 AS two') ->> 'command';
RESET idem.outbox_topic;
RESET ROLE;
-- each event names its verified producing role; plain calls carry no run
SELECT key, topic, owner, run_id, step, state, attempts,
	   next_attempt_at = created_at AS due_at_once
  FROM idem.outbox WHERE key LIKE 'ob:%' ORDER BY key;

-- a revoked publisher is refused again
SELECT idem_outbox_revoke('mail', 'regress_ob_publishers', 'publish');
SET ROLE regress_ob_member;
SET idem.outbox_topic = 'mail';
SELECT idem_execute('ob:member2', 'SELECT 2 AS two');
RESET idem.outbox_topic;
RESET ROLE;

-- a backend keeps the checks that passed, until what they read changes: a
-- role's membership, a role's attributes, the registry however written
SELECT idem_outbox_grant('mail', 'regress_ob_publishers', 'publish');
SET idem.outbox_topic = 'mail';
SET ROLE regress_ob_member;
SELECT idem_execute('obc:1', 'SELECT 1 AS one') ->> 'command' AS member_publishes;
RESET ROLE;
REVOKE regress_ob_publishers FROM regress_ob_member;
SET ROLE regress_ob_member;
SELECT idem_execute('obc:2', 'SELECT 1 AS one');
RESET ROLE;
GRANT regress_ob_publishers TO regress_ob_member;
SET ROLE regress_ob_member;
SELECT idem_execute('obc:3', 'SELECT 1 AS one') ->> 'command' AS member_again;
RESET ROLE;
UPDATE idem.outbox_topics SET publishers = '{}' WHERE topic = 'mail';
SET ROLE regress_ob_member;
SELECT idem_execute('obc:4', 'SELECT 1 AS one');
RESET ROLE;
ALTER ROLE regress_ob_other SUPERUSER;
SET ROLE regress_ob_other;
SELECT idem_execute('obc:5', 'SELECT 1 AS one') ->> 'command' AS superuser_publishes;
RESET ROLE;
ALTER ROLE regress_ob_other NOSUPERUSER;
SET ROLE regress_ob_other;
SELECT idem_execute('obc:6', 'SELECT 1 AS one');
RESET ROLE;
-- in one transaction: a revoke is seen by the next call
BEGIN;
SELECT idem_outbox_grant('mail', 'regress_ob_member', 'publish');
SET LOCAL ROLE regress_ob_member;
SELECT idem_execute('obc:7', 'SELECT 1 AS one') ->> 'command' AS granted_in_transaction;
RESET ROLE;
SELECT idem_outbox_revoke('mail', 'regress_ob_member', 'publish');
SET LOCAL ROLE regress_ob_member;
SAVEPOINT s;
SELECT idem_execute('obc:8', 'SELECT 1 AS one');
ROLLBACK TO s;
COMMIT;
RESET idem.outbox_topic;
SELECT key FROM idem.outbox WHERE key LIKE 'obc:%' ORDER BY key;
DELETE FROM idem.outbox WHERE key LIKE 'obc:%';
DELETE FROM idem.keys WHERE key LIKE 'obc:%';

--
-- who may consume
--
SELECT * FROM ob_digest \gset before_
SET ROLE regress_ob_other;
SELECT * FROM idem_outbox_claim('pay');
RESET ROLE;
SET ROLE regress_ob_consumer;
SELECT * FROM idem_outbox_claim('mail');
SELECT * FROM idem_outbox_claim('unregistered');
SELECT * FROM idem_outbox_events;
RESET ROLE;
SELECT (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged;

--
-- claim: due events, oldest first, each leased once under its own token
--
SET ROLE regress_ob_consumer;
INSERT INTO ob_claimed
SELECT 'c1', event_id, lease_token, attempt, lease_until, key, owner
  FROM idem_outbox_claim('pay', max_events => 2, lease => '30 s', consumer => 'worker-1');
SELECT key, owner, attempt, token IS NOT NULL AS has_token,
	   lease_until BETWEEN now() + '29 s' AND clock_timestamp() + '30 s' AS lease_30s
  FROM ob_claimed WHERE who = 'c1' ORDER BY key;
-- the leased events are not due: another claim gets the third one only
INSERT INTO ob_claimed
SELECT 'c2', event_id, lease_token, attempt, lease_until, key, owner
  FROM idem_outbox_claim('pay', 10, '30 s');
SELECT who, key FROM ob_claimed WHERE who = 'c2';
SELECT count(*) AS nothing_left FROM idem_outbox_claim('pay', 10, '30 s');
RESET ROLE;
SELECT count(DISTINCT token) AS distinct_tokens FROM ob_claimed;
-- the states view
SELECT key, state, attempts, leased_by,
	   regexp_replace(lease_holder, '^pid [0-9]+$', 'pid N') AS lease_holder,
	   lease_until = next_attempt_at AS lease_is_due_time, last_error
  FROM idem_outbox_events WHERE topic = 'pay' ORDER BY key;

--
-- ack
--
SET ROLE regress_ob_consumer;
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:1';
RESET ROLE;
SELECT key, state, delivered_at IS NOT NULL AS delivered_at_set
  FROM idem_outbox_events WHERE key = 'ob:1';
-- a role that may execute ack but not consume the topic changes nothing
SELECT * FROM ob_digest \gset before_
SET ROLE regress_ob_other;
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:2';
RESET ROLE;
SELECT (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged;

--
-- bad input: a documented SQLSTATE, nothing changed
--
SELECT * FROM ob_digest \gset before_
SET ROLE regress_ob_consumer;
-- an unknown event (IDE04: not ID404, which says a run does not exist)
SELECT idem_outbox_ack('00000000-0000-4000-8000-000000000000', '00000000-0000-4000-8000-000000000001');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_fail('00000000-0000-4000-8000-000000000000', '00000000-0000-4000-8000-000000000001', 'x');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY sqlstate
-- already delivered (ID410), with its own token or any other
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:1';
SELECT idem_outbox_ack(event_id, gen_random_uuid()) FROM ob_claimed WHERE key = 'ob:1';
SELECT idem_outbox_fail(event_id, token, 'late') FROM ob_claimed WHERE key = 'ob:1';
-- a forged token (ID412) and a NULL one (22004)
SELECT idem_outbox_ack(event_id, gen_random_uuid()) FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_fail(event_id, gen_random_uuid(), 'x') FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_ack(event_id, NULL) FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_ack(NULL, token) FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_fail(event_id, token, NULL) FROM ob_claimed WHERE key = 'ob:2';
-- an error text is kept in the row: at most 64 kB (22001)
SELECT idem_outbox_fail(event_id, token, repeat('x', 65537)) FROM ob_claimed WHERE key = 'ob:2';
-- retry_after negative or beyond idem.outbox_max_retry_after (1 day)
SELECT idem_outbox_fail(event_id, token, 'x', retry_after => '-1 s') FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_fail(event_id, token, 'x', retry_after => '2 days') FROM ob_claimed WHERE key = 'ob:2';
SELECT idem_outbox_fail(event_id, token, 'x', retry_after => '1 mon') FROM ob_claimed WHERE key = 'ob:2';
-- leases of zero, below zero, beyond idem.outbox_max_lease (1 h), NULL
SELECT * FROM idem_outbox_claim('pay', 10, '0 s');
SELECT * FROM idem_outbox_claim('pay', 10, '-5 s');
SELECT * FROM idem_outbox_claim('pay', 10, '1 h 1 s');
SELECT * FROM idem_outbox_claim('pay', 10, NULL);
-- max_events of zero, below zero, above 10000, NULL
SELECT * FROM idem_outbox_claim('pay', 0);
SELECT * FROM idem_outbox_claim('pay', -1);
SELECT * FROM idem_outbox_claim('pay', 10001);
SELECT * FROM idem_outbox_claim('pay', NULL);
-- unknown, empty and NULL topics
SELECT * FROM idem_outbox_claim('nope');
SELECT * FROM idem_outbox_claim('');
SELECT * FROM idem_outbox_claim(NULL);
SELECT * FROM idem_outbox_claim('pay', consumer => repeat('w', 256));
-- read-only
BEGIN READ ONLY;
SELECT * FROM idem_outbox_claim('pay');
ROLLBACK;
BEGIN READ ONLY;
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:2';
ROLLBACK;
-- the delivery policy is the administrator's
SET idem.outbox_jitter = off;
SET idem.outbox_max_attempts = 100;
SET idem.outbox_backoff_base = '1ms';
SET idem.outbox_max_lease = '1d';
SET idem.outbox_logical_message = off;
RESET ROLE;
SELECT idem_outbox_purge(0);
SELECT idem_outbox_requeue(event_id) FROM ob_claimed WHERE key = 'ob:2';
\set VERBOSITY default
SELECT (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged;
SELECT key, state, attempts, last_error FROM idem.outbox WHERE topic = 'pay' ORDER BY key;
-- the messages
SET ROLE regress_ob_consumer;
\set VERBOSITY sqlstate
SELECT idem_outbox_ack(event_id, gen_random_uuid()) FROM ob_claimed WHERE key = 'ob:2' \gset
SELECT regexp_replace(:'LAST_ERROR_MESSAGE', '[0-9a-f-]{36}', '<event>') AS fenced_message;
\set VERBOSITY terse
SELECT * FROM idem_outbox_claim('pay', 0);
SELECT * FROM idem_outbox_claim('pay', 10, '2 h');
SELECT idem_outbox_fail(event_id, token, 'x', retry_after => '2 days') FROM ob_claimed WHERE key = 'ob:2';
\set VERBOSITY default
RESET ROLE;

--
-- fail: exponential backoff, cap, Retry-After; without jitter the retry is
-- due at the end of its window, which makes the arithmetic exact
--
SET idem.outbox_jitter = off;
SET idem.outbox_backoff_base = '100ms';
SET idem.outbox_backoff_cap = '350ms';
SET idem.outbox_max_attempts = 6;
CREATE FUNCTION ob_reclaim(k text) RETURNS void LANGUAGE sql AS $$
	DELETE FROM ob_claimed WHERE key = k;
	INSERT INTO ob_claimed
	SELECT 'c', event_id, lease_token, attempt, lease_until, key, owner
	  FROM idem_outbox_claim('pay', 10, '30 s') WHERE key = k;
$$;
-- the n-th failure's retry is due base * 2^(n-1) (capped) after the call:
-- expected_ms must lie between the clock before and after it
CREATE FUNCTION ob_fail_delay(k text, expected_ms int, retry_after interval DEFAULT NULL,
	OUT attempt int, OUT delay_ok boolean, OUT state text)
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz; t1 timestamptz; nxt timestamptz;
BEGIN
	SELECT c.attempt INTO attempt FROM ob_claimed c WHERE c.key = k;
	t0 := clock_timestamp();
	SELECT idem_outbox_fail(c.event_id, c.token, 'gateway 503 #' || c.attempt, retry_after)
	  INTO nxt FROM ob_claimed c WHERE c.key = k;
	t1 := clock_timestamp();
	delay_ok := expected_ms BETWEEN floor(extract(epoch FROM nxt - t1) * 1000)
							  AND ceil(extract(epoch FROM nxt - t0) * 1000);
	SELECT o.state INTO state FROM idem.outbox o WHERE o.key = k;
END $$;
SELECT * FROM ob_fail_delay('ob:2', 100);
SELECT pg_sleep(0.15);
SELECT ob_reclaim('ob:2');
SELECT * FROM ob_fail_delay('ob:2', 200);
SELECT pg_sleep(0.25);
SELECT ob_reclaim('ob:2');
SELECT * FROM ob_fail_delay('ob:2', 350);		-- 400 ms, capped
SELECT pg_sleep(0.4);
SELECT ob_reclaim('ob:2');
-- Retry-After later than the window wins; an earlier one does not
SELECT * FROM ob_fail_delay('ob:2', 600, retry_after => '600 ms');
-- not due before its time
SELECT count(*) AS early FROM idem_outbox_claim('pay', 10, '30 s') WHERE key = 'ob:2';
SELECT pg_sleep(0.65);
SELECT ob_reclaim('ob:2');
SELECT * FROM ob_fail_delay('ob:2', 350, retry_after => '10 ms');
SELECT key, state, attempts, last_error,
	   next_attempt_at > now() AS due_later
  FROM idem_outbox_events WHERE key = 'ob:2';
-- the sixth failure was the last attempt: a dead letter, its error kept
SELECT pg_sleep(0.4);
SELECT ob_reclaim('ob:2');
SELECT attempt, delay_ok IS NULL AS no_retry, state FROM ob_fail_delay('ob:2', 0);
SELECT key, state, attempts, next_attempt_at IS NULL AS not_due,
	   lease_until IS NULL AS no_lease, last_error
  FROM idem_outbox_events WHERE key = 'ob:2';
SELECT count(*) AS dead_not_claimed FROM idem_outbox_claim('pay', 10, '30 s') WHERE key = 'ob:2';
-- an operator requeues it: due now, attempts from zero, last error kept
SELECT idem_outbox_requeue(event_id) FROM ob_claimed WHERE key = 'ob:2';
SELECT key, state, attempts, next_attempt_at <= now() AS due, last_error
  FROM idem_outbox_events WHERE key = 'ob:2';
\set VERBOSITY sqlstate
SELECT idem_outbox_requeue(event_id) FROM ob_claimed WHERE key = 'ob:2';
\set VERBOSITY terse
SELECT idem_outbox_requeue('00000000-0000-4000-8000-000000000000');
\set VERBOSITY default
SELECT ob_reclaim('ob:2');
SELECT attempt FROM ob_claimed WHERE key = 'ob:2';

--
-- an expired lease: the event is pending again (view), a claim takes it
-- over with a new token, and the old token is fenced off
--
SELECT * FROM ob_digest \gset before_
SELECT event_id AS ob3, token AS ob3_old FROM ob_claimed WHERE key = 'ob:3' \gset
DELETE FROM ob_claimed WHERE key = 'ob:3';
UPDATE idem.outbox SET next_attempt_at = clock_timestamp() - interval '1 ms'
 WHERE event_id = :'ob3';			-- as if its 30 s had passed
SELECT key, state, lease_until < now() AS lease_expired, attempts
  FROM idem_outbox_events WHERE key = 'ob:3';
SELECT ob_reclaim('ob:3');
SELECT attempt, token <> :'ob3_old' AS new_token FROM ob_claimed WHERE key = 'ob:3';
\set VERBOSITY sqlstate
SELECT idem_outbox_ack(:'ob3', :'ob3_old');
SELECT idem_outbox_fail(:'ob3', :'ob3_old', 'late');
\set VERBOSITY default
SELECT key, state, attempts FROM idem_outbox_events WHERE key = 'ob:3';
-- the lease of the last attempt expires: the next claim makes it dead
UPDATE idem.outbox SET next_attempt_at = clock_timestamp() - interval '1 ms',
	   attempts = 6 WHERE event_id = :'ob3';
SELECT count(*) AS claimed FROM idem_outbox_claim('pay', 10, '30 s') WHERE key = 'ob:3';
SELECT key, state, attempts, last_error FROM idem_outbox_events WHERE key = 'ob:3';
-- a lowered idem.outbox_max_attempts does not kill a pending event past
-- it: the limit is checked when an attempt fails, so the event still gets
-- its scheduled attempt and keeps its last error; that attempt's failure
-- makes it dead
SET idem.outbox_topic = 'pay';
SELECT idem_execute('ob:4', 'SELECT 4 AS n');
RESET idem.outbox_topic;
SELECT ob_reclaim('ob:4');
SELECT count(idem_outbox_fail(event_id, token, 'gateway 503'))
  FROM ob_claimed WHERE key = 'ob:4';
UPDATE idem.outbox SET next_attempt_at = clock_timestamp() - interval '1 ms'
 WHERE key = 'ob:4';
SET idem.outbox_max_attempts = 1;
SELECT ob_reclaim('ob:4');
SELECT attempt AS claimed_attempt FROM ob_claimed WHERE key = 'ob:4';
SELECT key, state, attempts, last_error FROM idem_outbox_events WHERE key = 'ob:4';
SELECT idem_outbox_fail(event_id, token, 'gateway 503 again') IS NULL AS no_retry
  FROM ob_claimed WHERE key = 'ob:4';
SELECT key, state, attempts, last_error FROM idem_outbox_events WHERE key = 'ob:4';
SET idem.outbox_max_attempts = 6;
DELETE FROM ob_claimed WHERE key = 'ob:4';
DELETE FROM idem.outbox WHERE key = 'ob:4';
DELETE FROM idem.keys WHERE key = 'ob:4';

--
-- full jitter: a random point of the window [0, base * 2^(n-1)), for
-- each of 200 events failed at their first attempt with a 1 s window
--
SET idem.outbox_jitter = on;
SET idem.outbox_backoff_base = '1s';
RESET idem.outbox_backoff_cap;
SET idem.outbox_topic = 'pay';
SELECT count(idem_execute('ob:j:' || i, 'SELECT $1 AS i', i)) FROM generate_series(1, 200) i;
RESET idem.outbox_topic;
CREATE TABLE ob_jitter AS
SELECT clock_timestamp() AS t0, c.key,
	   idem_outbox_fail(c.event_id, c.lease_token, 'x') AS nxt,
	   clock_timestamp() AS t1
  FROM idem_outbox_claim('pay', 1000, '30 s') c WHERE c.key LIKE 'ob:j:%';
SELECT count(*) AS failed,
	   bool_and(nxt >= t0 AND nxt <= t1 + '1 s') AS within_window,
	   count(DISTINCT nxt) > 190 AS spread,
	   min(extract(epoch FROM nxt - t0)) < 0.2 AS some_early,
	   max(extract(epoch FROM nxt - t1)) > 0.8 AS some_late
  FROM ob_jitter;

--
-- the acks of a batch in one call: all or nothing
--
SELECT pg_sleep(1.1);		-- the jitter events are due again
DELETE FROM ob_claimed;
INSERT INTO ob_claimed
SELECT 'b', event_id, lease_token, attempt, lease_until, key, owner
  FROM idem_outbox_claim('pay', 5, '30 s') WHERE key LIKE 'ob:j:%';
SELECT count(*) AS claimed FROM ob_claimed WHERE who = 'b';
SELECT * FROM ob_digest \gset before_
\set VERBOSITY sqlstate
-- one forged token: nothing is delivered
SELECT idem_outbox_ack_batch(array_agg(event_id ORDER BY key),
	   array_agg(CASE WHEN key = (SELECT max(key) FROM ob_claimed) THEN gen_random_uuid() ELSE token END ORDER BY key))
  FROM ob_claimed WHERE who = 'b';
SELECT idem_outbox_ack_batch(array_agg(event_id), (array_agg(token))[1:4]) FROM ob_claimed WHERE who = 'b';
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token) || NULL::uuid) FROM ob_claimed WHERE who = 'b';
SELECT idem_outbox_ack_batch(array_agg(event_id), NULL::uuid[]) FROM ob_claimed WHERE who = 'b';
SELECT idem_outbox_ack_batch(array_agg(event_id) || array_agg(event_id), array_agg(token) || array_agg(token)) FROM ob_claimed WHERE who = 'b';
-- a batch of more than one dimension, or of more events than a claim leases
SELECT idem_outbox_ack_batch(ARRAY[array_agg(event_id)], ARRAY[array_agg(token)]) FROM ob_claimed WHERE who = 'b';
SELECT idem_outbox_ack_batch(array_agg(event_id) || array_fill(gen_random_uuid(), ARRAY[10000]),
	   array_agg(token) || array_fill(gen_random_uuid(), ARRAY[10000])) FROM ob_claimed WHERE who = 'b';
\set VERBOSITY default
SELECT (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged;
SELECT idem_outbox_ack_batch('{}'::uuid[], '{}'::uuid[]) AS none;
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token)) AS acked FROM ob_claimed WHERE who = 'b';
\set VERBOSITY sqlstate
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token)) AS acked FROM ob_claimed WHERE who = 'b';
\set VERBOSITY default
SELECT state, count(*) FROM idem.outbox o JOIN ob_claimed c USING (event_id) GROUP BY state;
DELETE FROM ob_claimed;

--
-- purge of delivered events after idem.outbox_retention
--
SELECT count(idem_outbox_ack(event_id, lease_token)) AS acked
  FROM idem_outbox_claim('mail', 10, '30 s');
SELECT state, count(*) FROM idem.outbox WHERE key LIKE 'ob:%' GROUP BY state ORDER BY state;
-- the partial indexes hold only what their predicates say: events written
-- pending are not in the index of delivered ones
SET idem.outbox_topic = 'pay';
SELECT idem_execute('ob:idx', 'SELECT 1 AS one') ->> 'command';
RESET idem.outbox_topic;
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (costs off) SELECT count(*) FROM idem.outbox WHERE state = 'delivered' AND key LIKE 'ob:%';
SELECT count(*) AS delivered_by_index FROM idem.outbox WHERE state = 'delivered' AND key LIKE 'ob:%';
EXPLAIN (costs off) SELECT count(*) FROM idem.outbox WHERE topic = 'pay' AND state IN ('pending', 'leased');
SELECT count(*) AS due_or_leased_by_index FROM idem.outbox WHERE topic = 'pay' AND state IN ('pending', 'leased');
-- idem keeps each table's index insertion state between rows: an index
-- created or dropped in between is seen by the very next row
CREATE INDEX ob_extra_idx ON idem.outbox (key);
SET idem.outbox_topic = 'pay';
SELECT idem_execute('ob:idx2', 'SELECT 1 AS one') ->> 'command';
EXPLAIN (costs off) SELECT count(*) FROM idem.outbox WHERE key = 'ob:idx2';
SELECT count(*) AS in_new_index FROM idem.outbox WHERE key = 'ob:idx2';
DROP INDEX idem.ob_extra_idx;
SELECT idem_execute('ob:idx3', 'SELECT 1 AS one') ->> 'command';
RESET idem.outbox_topic;
SELECT count(*) AS due_or_leased_by_index FROM idem.outbox
 WHERE topic = 'pay' AND state IN ('pending', 'leased') AND key IN ('ob:idx2', 'ob:idx3');
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT idem_outbox_purge() AS purged_within_retention;
SET idem.outbox_retention = 0;
SELECT idem_outbox_purge(1) AS purged;
SELECT idem_outbox_purge() AS purged;
SELECT state, count(*) FROM idem.outbox WHERE key LIKE 'ob:%' GROUP BY state ORDER BY state;
RESET idem.outbox_retention;
RESET idem.outbox_jitter;
RESET idem.outbox_backoff_base;
RESET idem.outbox_backoff_cap;
RESET idem.outbox_max_attempts;

--
-- extend: a slow handler keeps its event, the lease running on from now,
-- fenced like an ack; release: the event is due at once and the claim's
-- attempt is not counted
--
SELECT idem_outbox_create_topic('ext', consumers => '{regress_ob_consumer}');
SET idem.outbox_topic = 'ext';
SELECT idem_execute('ob:x', 'SELECT 1 AS one') ->> 'rowcount' AS rowcount;
RESET idem.outbox_topic;
SELECT event_id AS obx, lease_token AS obx_tok, attempt
  FROM idem_outbox_claim('ext', 10, '1 s') \gset
SELECT :attempt AS first_attempt,
	   idem_outbox_extend(:'obx', :'obx_tok', '10 min') > now() + interval '9 min' AS extended;
SELECT state, lease_until > now() + interval '9 min' AS leased_on, attempts
  FROM idem_outbox_events WHERE event_id = :'obx';
SELECT count(*) AS claimable FROM idem_outbox_claim('ext', 10, '30 s');
\set VERBOSITY sqlstate
SELECT idem_outbox_extend(:'obx', gen_random_uuid(), '1 min');
SELECT idem_outbox_extend(:'obx', :'obx_tok', '0 s');
SELECT idem_outbox_extend(:'obx', :'obx_tok', '2 days');
SELECT idem_outbox_extend(:'obx', :'obx_tok', NULL);
SELECT idem_outbox_extend('00000000-0000-4000-8000-000000000000', :'obx_tok', '1 min');
SET ROLE regress_ob_other;
SELECT idem_outbox_extend(:'obx', :'obx_tok', '1 min');
RESET ROLE;
\set VERBOSITY default
SELECT state, attempts FROM idem_outbox_events WHERE event_id = :'obx';
SELECT idem_outbox_release(:'obx', :'obx_tok');
SELECT state, attempts, next_attempt_at <= now() AS due_now, lease_until
  FROM idem_outbox_events WHERE event_id = :'obx';
-- the error's detail and hint of each act with a token: the event's id
-- stays out of the output
CREATE FUNCTION pg_temp.ob_why(act text, id uuid, token uuid,
	OUT code text, OUT detail text, OUT hint text)
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format(CASE act
		WHEN 'ack' THEN 'SELECT idem_outbox_ack(%L, %L)'
		WHEN 'fail' THEN 'SELECT idem_outbox_fail(%L, %L, ''x'')'
		WHEN 'extend' THEN 'SELECT idem_outbox_extend(%L, %L, ''1 min'')'
		ELSE 'SELECT idem_outbox_release(%L, %L)' END, id, token);
	code := 'none';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, detail = PG_EXCEPTION_DETAIL,
		hint = PG_EXCEPTION_HINT;
END $$;
-- pending: no lease holds it
SELECT a.act, w.* FROM unnest(ARRAY['ack', 'fail', 'extend', 'release']) AS a(act),
	pg_temp.ob_why(a.act, :'obx', :'obx_tok') w;
SELECT lease_token AS obx_tok2, attempt FROM idem_outbox_claim('ext', 10, '30 s') \gset
SELECT :attempt AS attempt_after_release, :'obx_tok2' <> :'obx_tok' AS new_token;
-- leased under another token
SELECT a.act, w.* FROM unnest(ARRAY['ack', 'fail', 'extend', 'release']) AS a(act),
	pg_temp.ob_why(a.act, :'obx', :'obx_tok') w;
\set VERBOSITY sqlstate
SELECT idem_outbox_release(:'obx', :'obx_tok');
SELECT idem_outbox_ack(:'obx', :'obx_tok2');
SELECT idem_outbox_release(:'obx', :'obx_tok2');
SELECT idem_outbox_extend(:'obx', :'obx_tok2', '1 min');
\set VERBOSITY default
SELECT state, attempts FROM idem_outbox_events WHERE event_id = :'obx';


--
-- a workflow run's events of a topic are delivered in order: one waits
-- while an earlier event of its run and topic is pending or leased
--
SELECT idem_outbox_create_topic('ordr');
SET idem.outbox_topic = 'ordr';
SELECT status FROM idem_run_begin('ob-run-1', steps => ARRAY['a', 'b', 'c']);
SELECT idem_step('ob-run-1', 'a', 'SELECT 1 AS n') ->> 'command' AS a;
SELECT idem_step('ob-run-1', 'b', 'SELECT 2 AS n') ->> 'command' AS b;
SELECT status FROM idem_run_begin('ob-run-2');
SELECT idem_step('ob-run-2', 'x', 'SELECT 3 AS n') ->> 'command' AS x;
SELECT idem_execute('ob:plain', 'SELECT 4 AS n') ->> 'command' AS plain;
RESET idem.outbox_topic;
CREATE TEMP TABLE ob_ord AS
SELECT event_id, lease_token, coalesce(run_id || '/' || step, key) AS ev
  FROM idem_outbox_claim('ordr', 10, '30 s');
SELECT ev AS claimed_first FROM ob_ord ORDER BY ev;
SELECT count(*) AS claimable_while_a_leased FROM idem_outbox_claim('ordr', 10, '30 s');
-- handed back, a is pending and due again: still b waits
SELECT idem_outbox_release(event_id, lease_token) FROM ob_ord WHERE ev = 'ob-run-1/a';
SELECT event_id AS a_id, lease_token AS a_tok, run_id || '/' || step AS ev
  FROM idem_outbox_claim('ordr', 10, '30 s') \gset
SELECT :'ev' AS claimed_again;
SELECT idem_outbox_ack(:'a_id', :'a_tok');
SELECT event_id AS b_id, lease_token AS b_tok, run_id || '/' || step AS ev
  FROM idem_outbox_claim('ordr', 10, '30 s') \gset
SELECT :'ev' AS claimed_once_a_delivered;
-- c waits while b is leased; a dead b no longer holds the run up
SET idem.outbox_topic = 'ordr';
SELECT idem_step('ob-run-1', 'c', 'SELECT 5 AS n') ->> 'command' AS c;
RESET idem.outbox_topic;
SELECT count(*) AS claimable_while_b_leased FROM idem_outbox_claim('ordr', 10, '30 s');
SET idem.outbox_max_attempts = 1;
SELECT idem_outbox_fail(:'b_id', :'b_tok', 'poison') AS b_due_again;
RESET idem.outbox_max_attempts;
SELECT run_id || '/' || step AS claimed_once_b_dead
  FROM idem_outbox_claim('ordr', 10, '30 s');
-- the holdback probes the partial index of undelivered run events
SELECT pg_stat_force_next_flush();
SELECT idx_scan > 0 AS run_index_probed FROM pg_stat_user_indexes
 WHERE indexrelid = 'idem.outbox_run_idx'::regclass;
DELETE FROM idem.runs WHERE run_id LIKE 'ob-run-%';
DELETE FROM idem.outbox WHERE topic = 'ordr' OR run_id LIKE 'ob-run-%';
DELETE FROM idem.keys WHERE key LIKE 'ob:%' OR key LIKE '%ob-run-%';
DELETE FROM idem.outbox_topics WHERE topic = 'ordr';

--
-- idem_outbox_wait: bad input is refused first; the wait itself needs
-- shared memory, which this server has not (test/t/130_outbox_wait.pl
-- waits on a preloaded one).  A claim's wait polls without it: with
-- nothing to claim it returns nothing once the wait has passed.
--
SELECT has_function_privilege('regress_ob_consumer',
	'idem_outbox_wait(text, interval)', 'EXECUTE') AS consumer_may_wait;
GRANT EXECUTE ON FUNCTION idem_outbox_wait(text, interval)
	TO regress_ob_consumer, regress_ob_other;
SET ROLE regress_ob_consumer;
\set VERBOSITY sqlstate
SELECT idem_outbox_wait(NULL);
SELECT idem_outbox_wait('ext', NULL);
SELECT idem_outbox_wait('ext', '-1 ms');
SELECT idem_outbox_wait('ext', '1 hour 1 s');
SELECT idem_outbox_wait('ext', '-178000000 years');
SELECT idem_outbox_wait('ext', '178000000 years');
SELECT idem_outbox_wait('ext', '-178000000 years 1 hour');
SELECT idem_outbox_wait('no such topic', '0');
SET ROLE regress_ob_other;
SELECT idem_outbox_wait('ext', '0');
SET ROLE regress_ob_consumer;
SELECT * FROM idem_outbox_claim('ext', wait => '-1 s');
SELECT * FROM idem_outbox_claim('ext', wait => '2 hours');
\set VERBOSITY default
SELECT idem_outbox_wait('ext', '1 hour');
SELECT clock_timestamp() AS t0 \gset
SELECT * FROM idem_outbox_claim('ext', wait => '0.3 s');
SELECT clock_timestamp() - :'t0' >= interval '0.3 s' AS waited;
SELECT * FROM idem_outbox_claim('ext', wait => NULL);
RESET ROLE;

--
-- a topic's NOTIFY channel (issue 19): for its consumers only, with or
-- without shared memory (test/t/150_roles.pl listens on it)
--
GRANT EXECUTE ON FUNCTION idem_outbox_channel(text)
	TO regress_ob_consumer, regress_ob_other;
SET ROLE regress_ob_consumer;
SELECT idem_outbox_channel('ext') ~ '^idem_outbox_[0-9a-f]{32}$' AS channel_shape,
	   idem_outbox_channel('ext') = idem_outbox_channel('ext') AS stable,
	   idem_outbox_channel('ext') <> idem_outbox_channel('pay') AS per_topic;
\set VERBOSITY sqlstate
SELECT idem_outbox_channel(NULL);
SELECT idem_outbox_channel('');
SELECT idem_outbox_channel('no such topic');
SET ROLE regress_ob_other;
SELECT idem_outbox_channel('ext');
\set VERBOSITY default
SELECT idem_outbox_channel('pay');
RESET ROLE;

--
-- dropping a topic (an administrator's, not granted to PUBLIC): refused
-- while it has undelivered events (pending, leased, dead letters); cascade
-- deletes them; delivered events stay until the purge; a consumer's ack of
-- a deleted event finds none (IDE04), and later writes find no topic
--
SELECT idem_outbox_create_topic('gone', publishers => '{regress_ob_producer}',
	consumers => '{regress_ob_consumer}');
SET ROLE regress_ob_producer;
SET idem.outbox_topic = 'gone';
SELECT count(idem_execute('ob:gone:' || i, 'SELECT 1 AS one')) AS written
  FROM generate_series(1, 4) i;
RESET idem.outbox_topic;
RESET ROLE;
SET idem.outbox_max_attempts = 1;
SET ROLE regress_ob_consumer;
INSERT INTO ob_claimed (who, event_id, token, key)
SELECT 'gone', event_id, lease_token, key FROM idem_outbox_claim('gone', 3, '1 min');
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:gone:1';
SELECT idem_outbox_fail(event_id, token, 'poison') FROM ob_claimed WHERE key = 'ob:gone:2';
RESET ROLE;
RESET idem.outbox_max_attempts;
SELECT key, state FROM idem_outbox_events WHERE topic = 'gone' ORDER BY key;
SELECT * FROM ob_digest \gset before_
\set VERBOSITY sqlstate
SELECT idem_outbox_drop_topic(NULL);
SELECT idem_outbox_drop_topic('gone', NULL);
SELECT idem_outbox_drop_topic('');
SELECT idem_outbox_drop_topic(repeat('t', 256));
SELECT idem_outbox_drop_topic('no such topic');
SET ROLE regress_ob_admin;
SELECT idem_outbox_drop_topic('gone', cascade => true);
RESET ROLE;
\set VERBOSITY default
SELECT idem_outbox_drop_topic('gone');
SELECT (SELECT digest FROM ob_digest) = :'before_digest' AS outbox_unchanged,
	   (SELECT count(*) FROM idem.outbox_topics WHERE topic = 'gone') AS topics;
SELECT idem_outbox_drop_topic('gone', cascade => true);
SELECT key, state FROM idem_outbox_events WHERE topic = 'gone' ORDER BY key;
SELECT count(*) AS topics FROM idem.outbox_topics WHERE topic = 'gone';
SET ROLE regress_ob_consumer;
\set VERBOSITY sqlstate
SELECT idem_outbox_ack(event_id, token) FROM ob_claimed WHERE key = 'ob:gone:3';
\set VERBOSITY default
SELECT * FROM idem_outbox_claim('gone');
RESET ROLE;
SET ROLE regress_ob_producer;
SET idem.outbox_topic = 'gone';
SELECT idem_execute('ob:gone:5', 'SELECT 1 AS one');
RESET idem.outbox_topic;
RESET ROLE;
-- a topic with only delivered events drops without cascade
SELECT idem_outbox_create_topic('gone', publishers => '{regress_ob_producer}');
SELECT idem_outbox_drop_topic('gone');
DELETE FROM ob_claimed WHERE who = 'gone';
DELETE FROM idem.outbox WHERE key LIKE 'ob:gone:%';
DELETE FROM idem.keys WHERE key LIKE 'ob:gone:%';

DROP TABLE ob_jitter, ob_claimed, ob_pay CASCADE;
DROP FUNCTION ob_reclaim(text), ob_fail_delay(text, int, interval);
DELETE FROM idem.outbox WHERE key LIKE 'ob:%';
DELETE FROM idem.keys WHERE key LIKE 'ob:%';
DELETE FROM idem.outbox_topics WHERE topic IN ('pay', 'mail', 'ext');
REVOKE ALL ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]),
	idem_outbox_fail(uuid, uuid, text, interval),
	idem_outbox_wait(text, interval), idem_outbox_channel(text)
	FROM regress_ob_consumer, regress_ob_other;
REVOKE ALL ON FUNCTION idem_outbox_create_topic(text, regrole[], regrole[]),
	idem_outbox_grant(text, regrole, text), idem_outbox_revoke(text, regrole, text)
	FROM regress_ob_admin;
DROP ROLE regress_ob_admin, regress_ob_producer, regress_ob_member,
	regress_ob_publishers, regress_ob_consumer, regress_ob_other;
