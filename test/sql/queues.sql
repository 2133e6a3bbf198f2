--
-- queues: run queues and who may use them, enqueueing runs on a queue
-- (idempotent like idem_run_begin), the retry policy's bounds, and bad
-- input (issue 21)
--
CREATE ROLE regress_rq_app;
CREATE ROLE regress_rq_producers;			-- a group granted produce
CREATE ROLE regress_rq_member IN ROLE regress_rq_producers;
CREATE ROLE regress_rq_agent;
CREATE ROLE regress_rq_other;
-- everything the runtime's tables hold, to show that a refused call changed nothing
CREATE VIEW rq_digest AS
SELECT (SELECT count(*) FROM idem.queues) AS queues,
	   (SELECT count(*) FROM idem.runs) AS runs,
	   md5(coalesce((SELECT string_agg(q::text, ',' ORDER BY queue) FROM idem.queues q), '') ||
		   coalesce((SELECT string_agg(r::text, ',' ORDER BY run_id) FROM idem.runs r), '')) AS digest;

-- administering queues is not granted to PUBLIC
SELECT p.oid::regprocedure AS function,
	   has_function_privilege('regress_rq_other', p.oid, 'EXECUTE') AS other_may_execute
  FROM pg_proc p WHERE p.proname LIKE 'idem_queue%' ORDER BY p.oid::regprocedure::text;

SELECT idem_queue_create('returns', producers => '{regress_rq_app,regress_rq_producers}',
	workers => '{regress_rq_agent}', concurrency => 8);
SELECT queue, producers, workers, signallers, concurrency, max_attempts,
	   backoff_base, backoff_cap, jitter FROM idem.queues;

-- bad input: a clear error, nothing changed
SELECT * FROM rq_digest \gset before_
SELECT idem_queue_create('returns');							-- 42710
SELECT idem_queue_create(NULL);
SELECT idem_queue_create('');
SELECT idem_queue_create(repeat('q', 256));
SELECT idem_queue_create('q2', concurrency => 0);
SELECT idem_queue_create('q2', max_attempts => 0);
SELECT idem_queue_create('q2', max_attempts => 1001);
SELECT idem_queue_create('q2', backoff_base => '-1 s');
SELECT idem_queue_create('q2', backoff_cap => '100 years');
SELECT idem_queue_create('q2', jitter => 'half');
SELECT idem_queue_create('q2', jitter => NULL);
SELECT idem_queue_create('q2', workers => NULL);
SELECT idem_queue_create('q2', workers => '{NULL}');
SELECT idem_queue_create('q2', workers => '{{regress_rq_other}}');
SELECT idem_queue_create('q2', producers => ARRAY[0::regrole]);
SELECT idem_queue_grant('returns', 987654321::regrole, 'work');
SELECT idem_queue_grant('nope', 'regress_rq_other', 'work');	-- 42704
SELECT idem_queue_grant('returns', 'regress_rq_other', 'consume');
SELECT (SELECT digest FROM rq_digest) = :'before_digest' AS unchanged;

-- grants: produce, work, signal; granting twice lists the role once
SELECT idem_queue_grant('returns', 'regress_rq_other', 'signal');
SELECT idem_queue_grant('returns', 'regress_rq_other', 'signal');
SELECT signallers FROM idem.queues WHERE queue = 'returns';
SELECT idem_queue_revoke('returns', 'regress_rq_other', 'signal');
SELECT signallers FROM idem.queues WHERE queue = 'returns';
-- a dropped role's OID may still be revoked
SELECT idem_queue_revoke('returns', 987654321::regrole, 'signal');
-- a list that names a role more than once keeps it once, in the order of
-- its first appearance, as granting twice does: every claim tests its
-- worker against the list, which 100,000 copies of one role made slow
SELECT idem_queue_create('dups', producers => '{regress_rq_other,regress_rq_app,regress_rq_other}',
	workers => array_fill('regress_rq_agent'::regrole, ARRAY[100000]));
SELECT producers, workers FROM idem.queues WHERE queue = 'dups';
DELETE FROM idem.queues WHERE queue = 'dups';

-- enqueue: the producer's run, due at once
SET ROLE regress_rq_app;
SELECT status, next_step, created FROM idem_run_begin('returns:acme:ret-4471',
	steps => ARRAY['check','label','refund','notify'],
	input => '{"return_id": "ret-4471"}', queue => 'returns');
-- the same request returns the run
SELECT status, next_step, created FROM idem_run_begin('returns:acme:ret-4471',
	steps => ARRAY['check','label','refund','notify'],
	input => '{"return_id": "ret-4471"}', queue => 'returns');
-- another queue or policy under the same id is another request: ID422
RESET ROLE;
SELECT * FROM rq_digest \gset before_
SET ROLE regress_rq_app;
SELECT status FROM idem_run_begin('returns:acme:ret-4471',
	steps => ARRAY['check','label','refund','notify'],
	input => '{"return_id": "ret-4471"}');
SELECT status FROM idem_run_begin('returns:acme:ret-4471',
	steps => ARRAY['check','label','refund','notify'],
	input => '{"return_id": "ret-4471"}', queue => 'returns', max_attempts => 3);
RESET ROLE;
SELECT (SELECT digest FROM rq_digest) = :'before_digest' AS unchanged;
SELECT run_id, owner, queue, status, state, next_step, steps_done, steps_total,
	   attempt, max_attempts, holder, next_due IS NOT NULL AS due
  FROM idem_runs;

-- a member of a producer group may enqueue; others may not
SET ROLE regress_rq_member;
SELECT created FROM idem_run_begin('m1', steps => ARRAY['s'], queue => 'returns', max_attempts => 2,
	backoff_base => '10 ms', backoff_cap => '1 s', jitter => 'equal');
RESET ROLE;
SELECT * FROM rq_digest \gset before_
SET ROLE regress_rq_other;
SELECT created FROM idem_run_begin('o1', queue => 'returns');		-- 42501
SELECT created FROM idem_run_begin('o1', queue => 'nope');			-- 42704
SELECT created FROM idem_run_begin('o1', max_attempts => 2);		-- a policy needs a queue
SELECT created FROM idem_run_begin('o1', queue => 'returns', max_attempts => 0);
SELECT created FROM idem_run_begin('o1', queue => 'returns', jitter => 'some');
-- a queued run's worker completes it with its last step: it needs steps
SET ROLE regress_rq_app;
SELECT created FROM idem_run_begin('o1', queue => 'returns');		-- 22023
SELECT created FROM idem_run_begin('o1', NULL, '{}', 'returns');	-- 22023
RESET ROLE;
SELECT (SELECT digest FROM rq_digest) = :'before_digest' AS unchanged;

-- run ids are compared byte for byte: ids that differ in case, or only in
-- their Unicode normalization (NFC, NFD), are different runs
SET ROLE regress_rq_app;
SELECT u.id, octet_length(u.id) AS bytes, b.created
  FROM unnest(ARRAY['ret-caf' || U&'\00e9', 'RET-CAF' || U&'\00c9', 'ret-cafe' || U&'\0301']) AS u(id),
	   LATERAL idem_run_begin(u.id, steps => ARRAY['a'], queue => 'returns') AS b
 ORDER BY convert_to(u.id, 'UTF8');
SELECT count(*) AS runs FROM idem_runs WHERE lower(run_id) LIKE 'ret-caf%';
RESET ROLE;
DELETE FROM idem.runs WHERE lower(run_id) LIKE 'ret-caf%';

-- idem_runs: a role sees its own runs; superusers, pg_monitor and
-- idem_admin members see every role's
SET ROLE regress_rq_other;
SELECT count(*) AS others_sees FROM idem_runs;
RESET ROLE;
SET ROLE regress_rq_app;
SELECT run_id FROM idem_runs ORDER BY 1;
RESET ROLE;
GRANT pg_monitor TO regress_rq_other;
SET ROLE regress_rq_other;
SELECT run_id FROM idem_runs ORDER BY 1;
RESET ROLE;
REVOKE pg_monitor FROM regress_rq_other;
GRANT idem_admin TO regress_rq_other;
SET ROLE regress_rq_other;
SELECT run_id FROM idem_runs ORDER BY 1;
RESET ROLE;
-- an idem_admin that cannot be trusted (it can log in, or a role other
-- than a superuser administers it) grants nothing: not the runs, not
-- another role's run to cancel (42501)
ALTER ROLE idem_admin LOGIN;
SET ROLE regress_rq_other;
SELECT count(*) AS untrusted_admin_sees FROM idem_runs;
SELECT idem_run_cancel('o1', owner => 'regress_rq_app');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
ALTER ROLE idem_admin NOLOGIN;
GRANT idem_admin TO regress_rq_app WITH ADMIN OPTION;
SET ROLE regress_rq_other;
SELECT count(*) AS untrusted_admin_sees FROM idem_runs;
RESET ROLE;
REVOKE idem_admin FROM regress_rq_app;
SET ROLE regress_rq_other;
SELECT count(*) > 0 AS trusted_again_sees FROM idem_runs;
RESET ROLE;
REVOKE idem_admin FROM regress_rq_other;
-- an operator names a run by its id, on a queue or not: an index finds it,
-- not a scan of every role's runs
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT status FROM idem_runs WHERE run_id = 'o1';
ROLLBACK;
-- the role idem_admin is the cluster's, not the extension's: dropped by an
-- administrator, every role still sees its own runs and attempts
BEGIN;
DROP ROLE idem_admin;
SET ROLE regress_rq_app;
SELECT run_id FROM idem_runs ORDER BY 1;
SELECT count(*) FROM idem_run_attempts;
RESET ROLE;
ROLLBACK;
-- nobody reads the tables themselves
SET ROLE regress_rq_other;
SELECT count(*) FROM idem.queues;
RESET ROLE;

--
-- lifecycle: idem_queue_alter() and idem_queue_drop(), an administrator's
--
CREATE TABLE rq_leases (run_id text, token uuid);
GRANT ALL ON rq_leases TO regress_rq_agent;
SELECT idem_queue_create('life', producers => '{regress_rq_app}',
	workers => '{regress_rq_agent}', concurrency => 2, max_attempts => 3);
SET ROLE regress_rq_app;
SELECT created FROM idem_run_begin('life-0', steps => ARRAY['a'], queue => 'life');
RESET ROLE;
-- a completed run, which stays for history when its queue is dropped
SET ROLE regress_rq_agent;
INSERT INTO rq_leases SELECT run_id, lease_token FROM idem_run_claim('life', 1, '1 min', 'w1');
SELECT idem_step_complete('life-0', 'a', '{}', token) FROM rq_leases WHERE run_id = 'life-0';
RESET ROLE;
SET ROLE regress_rq_app;
SELECT created FROM idem_run_begin('life-1', steps => ARRAY['a', 'b'], queue => 'life');
SELECT created FROM idem_run_begin('life-2', steps => ARRAY['a'], queue => 'life');
SELECT created FROM idem_run_begin('life-3', steps => ARRAY['a'], queue => 'life', max_attempts => 4);
RESET ROLE;

-- this session has read the queue (its cache); the change is seen at once.
-- A NULL keeps a value; a run's own policy still wins
SELECT idem_queue_alter('life', max_attempts => 1, backoff_base => '1 h', backoff_cap => '2 h', jitter => 'none');
SELECT concurrency, max_attempts, backoff_base, backoff_cap, jitter FROM idem.queues WHERE queue = 'life';
SELECT run_id, status, max_attempts FROM idem_runs WHERE queue = 'life' ORDER BY 1;
-- the cap: two leases under concurrency 2
SET ROLE regress_rq_agent;
INSERT INTO rq_leases SELECT run_id, lease_token FROM idem_run_claim('life', 3, '1 min', 'w1');
SELECT run_id FROM rq_leases WHERE run_id <> 'life-0' ORDER BY 1;
RESET ROLE;
-- a lower cap keeps the leases held and leases nothing more while they exceed it
SELECT idem_queue_alter('life', concurrency => 1);
SET ROLE regress_rq_agent;
SELECT count(*) AS leased_under_cap_1 FROM idem_run_claim('life', 3, '1 min', 'w1');
RESET ROLE;
-- uncapped: the next claim takes the rest
SELECT idem_queue_alter('life', uncapped => true);
SELECT concurrency FROM idem.queues WHERE queue = 'life';
SET ROLE regress_rq_agent;
INSERT INTO rq_leases SELECT run_id, lease_token FROM idem_run_claim('life', 3, '1 min', 'w1');
SELECT run_id FROM rq_leases WHERE run_id <> 'life-0' ORDER BY 1;
-- the next failure follows the new policy: one attempt fails life-2; life-3
-- keeps its own four, and backs off by the queue's new backoff (1 h, no jitter)
SELECT idem_step_fail(run_id, 'a', token, 'boom') FROM rq_leases WHERE run_id = 'life-2';
WITH f AS (SELECT idem_step_fail(run_id, 'a', token, 'boom') AS due
			 FROM rq_leases WHERE run_id = 'life-3')
SELECT due - now() BETWEEN '59 min' AND '61 min' AS backoff_1h FROM f;
RESET ROLE;
SELECT run_id, status, state, attempt, max_attempts FROM idem_runs WHERE queue = 'life' ORDER BY 1;

-- bad input: a clear error, nothing changed
SELECT * FROM rq_digest \gset before_
\set VERBOSITY sqlstate
SELECT idem_queue_alter(NULL);
SELECT idem_queue_alter('');
SELECT idem_queue_alter(repeat('q', 256));
SELECT idem_queue_alter('nope', concurrency => 2);
SELECT idem_queue_alter('life', concurrency => 0);
SELECT idem_queue_alter('life', concurrency => -1);
SELECT idem_queue_alter('life', concurrency => 3, uncapped => true);
SELECT idem_queue_alter('life', uncapped => NULL);
SELECT idem_queue_alter('life', max_attempts => 0);
SELECT idem_queue_alter('life', max_attempts => 1001);
SELECT idem_queue_alter('life', backoff_base => '-1 s');
SELECT idem_queue_alter('life', backoff_cap => '100 years');
SELECT idem_queue_alter('life', jitter => 'half');
SELECT idem_queue_drop(NULL);
SELECT idem_queue_drop('life', NULL);
SELECT idem_queue_drop('nope');
SELECT idem_queue_drop('');
SET ROLE regress_rq_other;
SELECT idem_queue_alter('life', concurrency => 5);
SELECT idem_queue_drop('life', cascade => true);
RESET ROLE;
\set VERBOSITY default
-- unfinished runs keep their queue: leased, backing off, failed (a retry
-- would put it back); the completed one does not count
SELECT idem_queue_drop('life');
SELECT (SELECT digest FROM rq_digest) = :'before_digest' AS unchanged;

-- cascade cancels them, as idem_run_cancel() does (audited, with the role
-- that acted), and drops the queue
SET idem.audit = executions;
SELECT idem_queue_drop('life', cascade => true);
RESET idem.audit;
SELECT run_id, owner, actor, outcome FROM idem_audit WHERE run_id LIKE 'life-%' ORDER BY run_id;
DELETE FROM idem.audit WHERE run_id LIKE 'life-%';
SELECT count(*) AS queues_named_life FROM idem.queues WHERE queue = 'life';
SELECT run_id, status, state, holder, last_error FROM idem_runs WHERE run_id LIKE 'life-%' ORDER BY 1;
SELECT run_id, claim, outcome, error FROM idem_run_attempts WHERE run_id LIKE 'life-%' ORDER BY 1, 2;
-- the worker that held life-1's lease: its next call is ID412 and changes
-- nothing, in this session and in a new one (no token it remembers)
SELECT * FROM rq_digest \gset before_
SET ROLE regress_rq_agent;
SELECT idem_run_extend(run_id, token) FROM rq_leases WHERE run_id = 'life-1';
SELECT idem_step_complete(run_id, 'a', '{}', token) FROM rq_leases WHERE run_id = 'life-1';
RESET ROLE;
\c -
SET ROLE regress_rq_agent;
SELECT idem_step_fail(run_id, 'a', token, 'late') FROM rq_leases WHERE run_id = 'life-1';
SELECT count(*) FROM idem_run_claim('life');						-- 42704
RESET ROLE;
SET ROLE regress_rq_app;
SELECT created FROM idem_run_begin('life-4', steps => ARRAY['a'], queue => 'life');	-- 42704
RESET ROLE;
SELECT (SELECT digest FROM rq_digest) = :'before_digest' AS unchanged;

-- a queue of the same name resurrects nothing: its claims find none of the
-- old runs, which are not retried and not begun again; it drops at once
SELECT idem_queue_create('life', producers => '{regress_rq_app}', workers => '{regress_rq_agent}');
SET ROLE regress_rq_agent;
SELECT count(*) AS claimed FROM idem_run_claim('life', 10);
SELECT idem_run_extend(run_id, token) FROM rq_leases WHERE run_id = 'life-1';
RESET ROLE;
SELECT idem_run_retry('life-2', owner => 'regress_rq_app');
SET ROLE regress_rq_app;
SELECT status, created FROM idem_run_begin('life-1', steps => ARRAY['a', 'b'], queue => 'life');
RESET ROLE;
SELECT run_id, status, state FROM idem_runs WHERE run_id LIKE 'life-%' ORDER BY 1;
SELECT idem_queue_drop('life');
DELETE FROM idem.runs WHERE run_id LIKE 'life-%';
DROP TABLE rq_leases;

-- cleanup
DELETE FROM idem.runs WHERE queue = 'returns';
DELETE FROM idem.queues;
DROP VIEW rq_digest;
DROP ROLE regress_rq_app, regress_rq_member, regress_rq_producers,
	regress_rq_agent, regress_rq_other;
