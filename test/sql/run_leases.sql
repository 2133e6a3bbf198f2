--
-- run_leases: claims under a lease (oldest due first, the share among
-- roles, the concurrency cap, takeover of an expired lease), the
-- heartbeat, fenced steps (a holder whose lease was taken over executes
-- nothing), external steps, failures with backoff and the last attempt,
-- every attempt on record, cancel and retry, and bad input (issue 21)
--
CREATE ROLE regress_rl_app;
CREATE ROLE regress_rl_agent;
CREATE ROLE regress_rl_other;
CREATE TABLE rl_refunds (id text PRIMARY KEY, amount int NOT NULL);
GRANT ALL ON rl_refunds TO regress_rl_agent, regress_rl_app;
-- what a worker remembers between its claim and its calls
CREATE TABLE rl_claimed (who text, run_id text, token uuid, attempt int,
	next_step text, results jsonb, started_step text, started_attempts int);
GRANT ALL ON rl_claimed TO PUBLIC;
CREATE FUNCTION rl_token(w text) RETURNS uuid LANGUAGE sql
	AS $$ SELECT token FROM rl_claimed WHERE who = w $$;
-- everything the runtime's tables hold, to show that a refused call changed nothing
CREATE VIEW rl_digest AS
SELECT md5(coalesce((SELECT string_agg(r::text, ',' ORDER BY owner, run_id) FROM idem.runs r), '') ||
		   coalesce((SELECT string_agg(a::text, ',' ORDER BY owner, run_id, claim) FROM idem.run_attempts a), '') ||
		   coalesce((SELECT string_agg(k::text, ',' ORDER BY owner, key) FROM idem.keys k), '') ||
		   (SELECT count(*) FROM rl_refunds)::text) AS digest;
GRANT SELECT ON rl_digest TO PUBLIC;

SELECT idem_queue_create('rl', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}', concurrency => 2, max_attempts => 3,
	backoff_base => '1 h', backoff_cap => '4 h', jitter => 'none');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('ret-1', steps => ARRAY['check','label','refund'],
	input => '{"amount": 10}', queue => 'rl');
SELECT created FROM idem_run_begin('ret-2', steps => ARRAY['check','ship'], queue => 'rl');
SELECT created FROM idem_run_begin('ret-0', steps => ARRAY['s'], queue => 'rl');
RESET ROLE;

-- only workers claim
SET ROLE regress_rl_other;
SELECT * FROM idem_run_claim('rl');
RESET ROLE;

-- oldest due first, up to the cap of 2 leased runs
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w1', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', max_runs => 1, lease => '1 h', worker => 'w1');
INSERT INTO rl_claimed SELECT 'w2', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', max_runs => 5, lease => '1 h', worker => 'w2');
SELECT who, run_id, attempt, next_step, results FROM rl_claimed ORDER BY who;
-- the cap holds: a third claim gets nothing
SELECT count(*) FROM idem_run_claim('rl', max_runs => 5, worker => 'w3');
RESET ROLE;
-- a run that waits for its turn can be cancelled by its owner
SET ROLE regress_rl_app;
SELECT idem_run_cancel('ret-0', 'not needed');
RESET ROLE;
SELECT run_id, owner, status, state, holder, leased_by, attempt, lease_until > now() AS leased,
	   last_error
  FROM idem_runs ORDER BY run_id;

-- a fenced database step: the holder's token, the run's owner's record
SET ROLE regress_rl_agent;
SELECT response, replayed FROM idem_call(NULL,
	'INSERT INTO rl_refunds VALUES ($1, 10) RETURNING id', ARRAY['chk-1'],
	run_id => 'ret-1', step => 'check', lease_token => rl_token('w1'));
-- replays under the lease
SELECT response, replayed FROM idem_call(NULL,
	'INSERT INTO rl_refunds VALUES ($1, 10) RETURNING id', ARRAY['chk-1'],
	run_id => 'ret-1', step => 'check', lease_token => rl_token('w1'));
-- idem_step takes the token from idem.lease_token
BEGIN;
SELECT set_config('idem.lease_token', rl_token('w2')::text, true) IS NOT NULL AS set;
SELECT idem_step('ret-2', 'check', 'SELECT 2 AS two');
COMMIT;
-- a mistyped token is refused by the SET, in every form uuid_in() accepts
-- it is taken
SET idem.lease_token = 'garbage';
SET idem.lease_token = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1';
SET idem.lease_token = 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11-';
SET idem.lease_token = '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11';
SET idem.lease_token = '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}';
SET idem.lease_token = 'A0EEBC999C0B4EF8BB6D6BB9BD380A11';
SET idem.lease_token = 'a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11';
RESET idem.lease_token;
RESET ROLE;
SELECT owner, key FROM idem.keys WHERE owner::text LIKE 'regress_rl%' ORDER BY key;

-- no path reaches a queued run's step without its lease: nothing changes
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_app;
SELECT idem_step('ret-1', 'label', 'SELECT 1');						-- no token
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'ret-1', step => 'label');
SELECT idem_step_complete('ret-1', 'label', '{}');
SELECT idem_execute(idem_step_key('ret-1', 'label'), 'SELECT 1');
SELECT * FROM idem_dry_run(idem_step_key('ret-1', 'label'), 'SELECT 1');
SELECT * FROM idem_call(idem_step_key('ret-1', 'label'), 'SELECT 1');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''x'', 1)',
	run_id => 'ret-1', step => 'label', lease_token => rl_token('w2'));	-- another run's token
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''x'', 1)',
	run_id => 'ret-1', step => 'label', lease_token => gen_random_uuid());
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''x'', 1)',
	run_id => 'nope', step => 'label', lease_token => gen_random_uuid());
SELECT * FROM idem_call('k', 'SELECT 1', lease_token => rl_token('w1'));
SELECT idem_run_extend('ret-1', gen_random_uuid(), '1 h');
SELECT * FROM idem_step_start('ret-1', 'label', NULL);
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;

-- the heartbeat moves the lease's end
SET ROLE regress_rl_agent;
SELECT idem_run_extend('ret-1', rl_token('w1'), '50 min') > now() + interval '40 min' AS extended;
SELECT idem_run_extend('ret-1', rl_token('w1'), '0 s');
SELECT idem_run_extend('ret-1', rl_token('w1'), '2 days');
RESET ROLE;
-- a ceiling of one second is spelt as one
SET idem.run_max_lease = 1;
SET ROLE regress_rl_agent;
SELECT idem_run_extend('ret-1', rl_token('w1'), '2 s');
RESET ROLE;
RESET idem.run_max_lease;

-- an external step: started (committed first), started again on resume,
-- then completed; a completed step is not started again
SET ROLE regress_rl_agent;
SELECT * FROM idem_step_start('ret-1', 'label', rl_token('w1'));
SELECT * FROM idem_step_start('ret-1', 'label', rl_token('w1'));
SELECT * FROM idem_step_start('ret-1', 'refund', rl_token('w1'));		-- out of sequence
SELECT * FROM idem_step_start('ret-1', 'ship', rl_token('w1'));		-- undeclared
RESET ROLE;
SET ROLE regress_rl_app;
SELECT ordinal, step, state, attempts FROM idem_run_steps('ret-1');
RESET ROLE;

-- the lease runs out and another worker takes the run over: its attempt
-- is the next, it learns of the started step, and the old holder is fenced
UPDATE idem.runs SET due_at = now() - interval '1 day' WHERE run_id = 'ret-1';
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w3', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w3');
SELECT who, run_id, attempt, next_step, results, started_step, started_attempts
  FROM rl_claimed WHERE who = 'w3';
RESET ROLE;
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_agent;
SELECT idem_step_complete('ret-1', 'label', '{"label_id": "LB-1"}', lease_token => rl_token('w1'));
SELECT idem_run_extend('ret-1', rl_token('w1'), '1 h');
SELECT idem_step_fail('ret-1', 'label', rl_token('w1'), 'late');
-- each act is named in its own hint
SELECT * FROM idem_step_start('ret-1', 'label', rl_token('w1'));
SELECT * FROM idem_run_await('ret-1', 'label', rl_token('w1'));
SELECT idem_run_release('ret-1', rl_token('w1'));
SELECT idem_run_sleep('ret-1', rl_token('w1'), now() + interval '1 h');
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SET ROLE regress_rl_agent;
SELECT idem_step_complete('ret-1', 'label', '{"label_id": "LB-1"}', lease_token => rl_token('w3'));
SELECT * FROM idem_step_start('ret-1', 'label', rl_token('w3'));
-- a failure: the lease ends, the run is due after the backoff window of
-- the step's first attempt (a completed step starts the count again; no
-- jitter: the whole window of 1 h)
SELECT due BETWEEN now() + interval '59 min' AND now() + interval '61 min' AS backoff
  FROM (SELECT idem_step_fail('ret-1', 'refund', rl_token('w3'), 'bank 503') AS due) f;
RESET ROLE;
SELECT run_id, status, state, attempt, last_error, holder FROM idem_runs WHERE run_id = 'ret-1';
-- not due yet: nothing to claim for it
UPDATE idem.runs SET due_at = now() - interval '1 day' WHERE run_id = 'ret-1';
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w4', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w4');
SELECT who, run_id, attempt, next_step, results FROM rl_claimed WHERE who = 'w4';
-- retry_after wins over a shorter backoff (attempt 2: 2 h)
SELECT due BETWEEN now() + interval '299 min' AND now() + interval '301 min' AS retry_after_kept
  FROM (SELECT idem_step_fail('ret-1', 'refund', rl_token('w4'), 'bank 429', retry_after => '5 h') AS due) f;
RESET ROLE;
-- the last attempt fails the run, with its error; it stays inspectable
UPDATE idem.runs SET due_at = now() - interval '1 day' WHERE run_id = 'ret-1';
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w5', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w5');
SELECT who, attempt FROM rl_claimed WHERE who = 'w5';
SELECT idem_step_fail('ret-1', 'refund', rl_token('w5'), 'bank down') AS due_again;
RESET ROLE;
SELECT run_id, status, state, attempt, last_error FROM idem_runs WHERE run_id = 'ret-1';
-- every attempt is on record, with how it ended
SELECT run_id, claim, attempt, step, worker, leased_by, outcome, error
  FROM idem_run_attempts WHERE run_id = 'ret-1' ORDER BY claim;
-- and the check's business write happened once, the refund's never
SELECT * FROM rl_refunds ORDER BY id;

-- retry: the failed run is due now with fresh attempts; completed steps stay
SET ROLE regress_rl_app;
SELECT idem_run_retry('ret-1');
RESET ROLE;
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w6', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w6');
SELECT who, run_id, attempt, next_step, results FROM rl_claimed WHERE who = 'w6';
SELECT response FROM idem_call(NULL,
	'INSERT INTO rl_refunds VALUES ($1, 10) RETURNING id', ARRAY['ref-1'],
	run_id => 'ret-1', step => 'refund', lease_token => rl_token('w6'));
RESET ROLE;
-- the last step completes the run and ends its lease
SELECT run_id, status, state, holder FROM idem_runs WHERE run_id = 'ret-1';
SELECT claim, outcome FROM idem_run_attempts WHERE run_id = 'ret-1' ORDER BY claim DESC LIMIT 1;

-- release: due at once, the attempt not counted
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('ret-3', steps => ARRAY['s'], queue => 'rl');
RESET ROLE;
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed SELECT 'w7', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w7');
SELECT idem_run_release('ret-3', rl_token('w7'));
INSERT INTO rl_claimed SELECT 'w8', run_id, lease_token, attempt, next_step,
	results, started_step, started_attempts
  FROM idem_run_claim('rl', worker => 'w8');
SELECT who, run_id, attempt FROM rl_claimed WHERE who IN ('w7', 'w8') ORDER BY who;
RESET ROLE;

-- cancel: the holder is fenced off, the run executes nothing more
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_other;
SELECT idem_run_cancel('ret-2', owner => 'regress_rl_app');			-- 42501
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SET ROLE regress_rl_app;
SELECT idem_run_cancel('ret-2', 'customer withdrew');
SELECT idem_run_cancel('ret-2');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT idem_step_complete('ret-2', 'ship', '{}', lease_token => rl_token('w2'));
RESET ROLE;
SELECT run_id, status, state, last_error FROM idem_runs WHERE run_id = 'ret-2';
-- a cancelled run stays cancelled: failing or completing it would let
-- idem_run_resume() make it execute again, so they refuse it as resume does
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('ret-c');
SELECT idem_run_cancel('ret-c');
RESET ROLE;
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_app;
SELECT idem_run_complete('ret-c');										-- ID423
SELECT idem_run_fail('ret-c', 'stuck');									-- ID423
SELECT idem_run_complete('ret-2');										-- ID423
SELECT idem_run_fail('ret-2', 'stuck');									-- ID423
SELECT idem_run_resume('ret-2');										-- ID423
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SELECT run_id, status, state FROM idem_runs WHERE run_id IN ('ret-2', 'ret-c') ORDER BY 1;
-- administrators cancel any role's run
GRANT idem_admin TO regress_rl_other;
SET ROLE regress_rl_other;
SELECT idem_run_cancel('ret-3', owner => 'regress_rl_app');
RESET ROLE;
REVOKE idem_admin FROM regress_rl_other;
SELECT run_id, claim, worker, outcome, error FROM idem_run_attempts WHERE run_id IN ('ret-2', 'ret-3') ORDER BY 1, 2;

-- fail and resume are operators' verbs too; each verb that changes a run is
-- audited (at any idem.audit level but off) with the role that acted, and
-- one that changes nothing is not
SET idem.audit = executions;
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('ret-ops', steps => ARRAY['s'], queue => 'rl');
RESET ROLE;
SET ROLE regress_rl_other;
SELECT idem_run_fail('ret-ops', 'stuck', owner => 'regress_rl_app');		-- 42501
SELECT idem_run_resume('ret-ops', owner => 'regress_rl_app');			-- 42501
RESET ROLE;
SELECT status, state FROM idem_runs WHERE run_id = 'ret-ops';
GRANT idem_admin TO regress_rl_other;
SET ROLE regress_rl_other;
SELECT idem_run_fail('ret-ops', 'stuck', owner => 'regress_rl_app');
SELECT idem_run_retry('ret-ops', owner => 'regress_rl_app');
SELECT idem_run_fail('ret-ops', 'stuck again', owner => 'regress_rl_app');
SELECT idem_run_resume('ret-ops', owner => 'regress_rl_app');
SELECT idem_run_resume('ret-ops', owner => 'regress_rl_app');
RESET ROLE;
REVOKE idem_admin FROM regress_rl_other;
-- complete too: another role's run only for an administrator, audited
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('ret-done');
SELECT idem_step('ret-done', 's', 'SELECT 1 AS n') IS NOT NULL AS stepped;
RESET ROLE;
SET ROLE regress_rl_other;
SELECT idem_run_complete('ret-done', owner => 'regress_rl_app');		-- 42501
RESET ROLE;
GRANT idem_admin TO regress_rl_other;
SET ROLE regress_rl_other;
SELECT idem_run_complete('ret-done', owner => 'regress_rl_app');
SELECT idem_run_complete('ret-done', owner => 'regress_rl_app');
RESET ROLE;
REVOKE idem_admin FROM regress_rl_other;
SET ROLE regress_rl_app;
SELECT idem_run_cancel('ret-ops', 'withdrawn');
SELECT idem_run_cancel('ret-ops');
RESET ROLE;
RESET idem.audit;
SELECT key, owner, actor, outcome, step, sqlstate, fingerprint IS NULL AS no_fingerprint
  FROM idem_audit WHERE run_id IN ('ret-ops', 'ret-done') AND outcome <> 'executed' ORDER BY at;
DELETE FROM idem.audit WHERE run_id IN ('ret-ops', 'ret-done');

-- a lease that expires on the last attempt fails the run at the next claim
SELECT idem_queue_create('rl1', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}', max_attempts => 1);
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('x-1', steps => ARRAY['s'], queue => 'rl1');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT count(*) FROM idem_run_claim('rl1', lease => '1 ms');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idem_run_claim('rl1');
RESET ROLE;
SELECT run_id, status, state, last_error FROM idem_runs WHERE run_id = 'x-1';

-- bad input
SET ROLE regress_rl_agent;
SELECT * FROM idem_run_claim('rl', max_runs => 0);
SELECT * FROM idem_run_claim('rl', max_runs => 1001);
SELECT * FROM idem_run_claim('rl', lease => '0 s');
SELECT * FROM idem_run_claim('rl', lease => '1 year');
SELECT * FROM idem_run_claim('rl', wait => '2 h');
SELECT * FROM idem_run_claim('rl', wait => '-1 s');
SELECT * FROM idem_run_claim('rl', worker => '');
SELECT * FROM idem_run_claim('rl', worker => repeat('w', 256));
SELECT * FROM idem_run_claim('nope');
SELECT * FROM idem_run_claim(NULL);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT * FROM idem_run_claim('rl');
ROLLBACK;
SELECT idem_step_fail('ret-1', 'refund', NULL, 'x');
SELECT idem_step_fail('ret-1', 'refund', gen_random_uuid(), NULL);
SELECT idem_step_fail('ret-1', 'refund', gen_random_uuid(), repeat('x', 65537));
SELECT idem_step_fail('ret-1', 'refund', gen_random_uuid(), 'x', retry_after => '-1 s');
SELECT idem_step_fail('ret-1', 'refund', gen_random_uuid(), 'x', retry_after => '10 years');
RESET ROLE;
-- a ceiling of one second on retry_after is spelt as one too
SET idem.outbox_max_retry_after = 1;
SELECT idem_step_fail('ret-1', 'refund', gen_random_uuid(), 'x', retry_after => '2 s');
RESET idem.outbox_max_retry_after;

-- claims share a queue among roles: the role with the fewest leases goes
-- first, then the oldest due; one role's backlog holds no other role back
SELECT idem_queue_create('rlfair', producers => '{regress_rl_app,regress_rl_other}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT count(*) FROM (SELECT idem_run_begin('a-' || g, steps => ARRAY['s'], queue => 'rlfair') FROM generate_series(1, 3) g) s;
RESET ROLE;
UPDATE idem.runs SET due_at = now() - interval '1 h' + substr(run_id, 3)::int * interval '1 s'
 WHERE queue = 'rlfair';
SET ROLE regress_rl_other;
SELECT created FROM idem_run_begin('b-1', steps => ARRAY['s'], queue => 'rlfair');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT run_id, owner FROM idem_run_claim('rlfair', max_runs => 2) ORDER BY run_id;
SELECT run_id, owner FROM idem_run_claim('rlfair', max_runs => 1);
SELECT run_id, owner FROM idem_run_claim('rlfair', max_runs => 5);
RESET ROLE;
-- one run's token presented with another run's id, in the backend that
-- claimed both: ID412, as any backend answers it
SELECT lease_token AS tok_a1 FROM idem.runs WHERE run_id = 'a-1' \gset
SET ROLE regress_rl_agent;
\set VERBOSITY terse
SELECT idem_call(NULL, 'SELECT 1', run_id => 'b-1', step => 's', lease_token => :'tok_a1');
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- the share's order: with equal leases the role whose oldest due run is
-- oldest goes first, one run each per round; a role with fewer leases goes
-- first even though the other's due runs are older
SELECT idem_queue_create('rlfair2', producers => '{regress_rl_app,regress_rl_other}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT count(*) FROM (SELECT idem_run_begin('c-' || g, steps => ARRAY['s'], queue => 'rlfair2') FROM generate_series(5, 1, -1) g) s;
RESET ROLE;
SET ROLE regress_rl_other;
SELECT count(*) FROM (SELECT idem_run_begin('d-' || g, steps => ARRAY['s'], queue => 'rlfair2') FROM generate_series(3, 1, -1) g) s;
RESET ROLE;
-- regress_rl_app's runs are all due before regress_rl_other's
UPDATE idem.runs SET due_at = now() + substr(run_id, 3)::int * interval '1 s'
	- CASE WHEN run_id LIKE 'c-%' THEN interval '2 h' ELSE interval '1 h' END
 WHERE queue = 'rlfair2';
SET ROLE regress_rl_agent;
-- no leases: regress_rl_app first, then in turn
SELECT ordinality, run_id, owner FROM idem_run_claim('rlfair2', max_runs => 3) WITH ORDINALITY;
-- regress_rl_app holds 2 leases, regress_rl_other 1: d-2 before the older c-3
SELECT run_id, owner FROM idem_run_claim('rlfair2', max_runs => 1);
-- 2 leases each: the oldest due run's role
SELECT run_id, owner FROM idem_run_claim('rlfair2', max_runs => 1);
-- 3 and 2: regress_rl_other first, then regress_rl_app's backlog, oldest due first
SELECT ordinality, run_id, owner FROM idem_run_claim('rlfair2', max_runs => 5) WITH ORDINALITY;
RESET ROLE;

-- under a concurrency cap the share still reaches every role: a cap of 2,
-- regress_rl_app's backlog due first, one run each
SELECT idem_queue_create('rlfair3', producers => '{regress_rl_app,regress_rl_other}',
	workers => '{regress_rl_agent}', concurrency => 2);
SET ROLE regress_rl_app;
SELECT count(*) FROM (SELECT idem_run_begin('e-' || g, steps => ARRAY['s'], queue => 'rlfair3') FROM generate_series(1, 4) g) s;
RESET ROLE;
SET ROLE regress_rl_other;
SELECT created FROM idem_run_begin('f-1', steps => ARRAY['s'], queue => 'rlfair3');
RESET ROLE;
UPDATE idem.runs SET due_at = now() - interval '1 h' + substr(run_id, 3)::int * interval '1 s'
 WHERE queue = 'rlfair3' AND run_id LIKE 'e-%';
SET ROLE regress_rl_agent;
SELECT ordinality, run_id, owner FROM idem_run_claim('rlfair3', max_runs => 5) WITH ORDINALITY;
SELECT count(*) FROM idem_run_claim('rlfair3', max_runs => 5);
RESET ROLE;

-- the share reaches a role past the first thousand found: claims share
-- among at most 1000 roles, the first in the share's order (fewest leases,
-- oldest due run), not the first by OID, which every claim would take
-- again while their backlogs last.  The last role created has the oldest
-- due run of 1001 roles
DO $$
BEGIN
	FOR i IN 1..1001 LOOP
		EXECUTE format('CREATE ROLE regress_rl_many_%s', i);
	END LOOP;
END
$$;
SELECT idem_queue_create('rlmany',
	producers => (SELECT array_agg(format('regress_rl_many_%s', i)::regrole)
				  FROM generate_series(1, 1001) i),
	workers => '{regress_rl_agent}');
DO $$
BEGIN
	FOR i IN 1..1001 LOOP
		EXECUTE format('SET ROLE regress_rl_many_%s', i);
		PERFORM idem_run_begin('many-' || i, steps => ARRAY['s'], queue => 'rlmany');
		RESET ROLE;
	END LOOP;
END
$$;
UPDATE idem.runs SET due_at = now() - interval '1 h' - CASE WHEN run_id = 'many-1001' THEN interval '1 h' ELSE interval '0' END
 WHERE queue = 'rlmany';
SET ROLE regress_rl_agent;
SELECT run_id, owner FROM idem_run_claim('rlmany', max_runs => 1);
SELECT count(*) FROM idem_run_claim('rlmany', max_runs => 1000);
RESET ROLE;
DELETE FROM idem.runs WHERE queue = 'rlmany';
DELETE FROM idem.queues WHERE queue = 'rlmany';
DO $$
BEGIN
	FOR i IN 1..1001 LOOP
		EXECUTE format('DROP ROLE regress_rl_many_%s', i);
	END LOOP;
END
$$;

-- the work grant is checked at every call with a token, not only at the
-- claim (as a consumer's at every ack): a worker whose grant was revoked
-- while it holds a lease executes nothing (42501); a role that may not
-- work the run's queue learns nothing of the run from a token it does not
-- hold, not its state nor its holder (ID404, as for a run no one began)
SELECT idem_queue_create('rlgrant', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('g-1', steps => ARRAY['s1','s2'], queue => 'rlgrant');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT lease_token AS tok_g1 FROM idem_run_claim('rlgrant', worker => 'wg') \gset
RESET ROLE;
SELECT idem_queue_revoke('rlgrant', 'regress_rl_agent', 'work');
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_agent;
\set VERBOSITY terse
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''g'', 1)',
	run_id => 'g-1', step => 's1', lease_token => :'tok_g1');
\echo :LAST_ERROR_SQLSTATE
SET idem.lease_token = :'tok_g1';
SELECT idem_step('g-1', 's1', 'INSERT INTO rl_refunds VALUES (''g'', 1)');
RESET idem.lease_token;
SELECT idem_run_extend('g-1', :'tok_g1', '1 min');
SELECT * FROM idem_step_start('g-1', 's1', :'tok_g1');
SELECT idem_step_complete('g-1', 's1', '{}', :'tok_g1');
SELECT idem_step_fail('g-1', 's1', :'tok_g1', 'x');
SELECT * FROM idem_run_await('g-1', 's1', :'tok_g1');
SELECT idem_run_sleep('g-1', :'tok_g1', now() + interval '1 h');
SELECT idem_run_release('g-1', :'tok_g1');
-- another token: as if no run had the id, the same as for an id no one began
SELECT idem_run_extend('g-1', gen_random_uuid(), '1 min');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_extend('g-none', gen_random_uuid(), '1 min');
RESET ROLE;
SET ROLE regress_rl_other;
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'g-1', step => 's1',
	lease_token => gen_random_uuid());
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'g-1', step => 's1',
	lease_token => :'tok_g1');
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
-- granted again: the lease still holds, and the worker goes on
SELECT idem_queue_grant('rlgrant', 'regress_rl_agent', 'work');
SET ROLE regress_rl_agent;
SELECT response, replayed FROM idem_call(NULL, 'SELECT 1 AS one', run_id => 'g-1',
	step => 's1', lease_token => :'tok_g1');
RESET ROLE;

-- an operator who cancels or fails a run whose holder's lease ran out (a
-- dead worker's, as idem_runs shows it: ready) ends that attempt as
-- lease_expired, as a claim that took the run over would: the attempt
-- died, it was not cancelled; a lease that holds ends as the verb says
SELECT idem_queue_create('rlop', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT count(*) FROM (SELECT idem_run_begin('op-' || g, steps => ARRAY['s'], queue => 'rlop')
	FROM generate_series(1, 4) g) s;
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT count(*) FROM idem_run_claim('rlop', max_runs => 2, lease => '1 ms', worker => 'dead');
SELECT pg_sleep(0.01);
SELECT count(*) FROM idem_run_claim('rlop', max_runs => 2, lease => '1 h', worker => 'alive');
RESET ROLE;
SELECT run_id, state, holder FROM idem_runs WHERE queue = 'rlop' ORDER BY run_id;
SET ROLE regress_rl_app;
SELECT idem_run_cancel('op-1', 'stalled');
SELECT idem_run_fail('op-2', 'stalled');
SELECT idem_run_cancel('op-3', 'not needed');
SELECT idem_run_fail('op-4', 'not needed');
RESET ROLE;
SELECT run_id, claim, worker, outcome, error FROM idem_run_attempts
 WHERE run_id LIKE 'op-%' ORDER BY run_id, claim;

-- a worker's step publishes its outbox event as the run's owner (the
-- event's owner), with the worker's privileges as its statement runs: the
-- worker must be among the topic's publishers too, or any worker could
-- write events that consumers take for the owner's (42501, nothing written)
SELECT idem_outbox_create_topic('rl_payments', publishers => '{regress_rl_app}');
SELECT idem_queue_create('rlpub', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('pub-1', steps => ARRAY['pay', 'label'], queue => 'rlpub');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT lease_token AS tok_pub FROM idem_run_claim('rlpub', worker => 'wp') \gset
RESET ROLE;
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_agent;
SET idem.outbox_topic = 'rl_payments';
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''pub'', 1)',
	run_id => 'pub-1', step => 'pay', lease_token => :'tok_pub');
SELECT idem_step_complete('pub-1', 'pay', '{"paid": true}', :'tok_pub');
RESET idem.outbox_topic;
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged,
	   (SELECT count(*) FROM idem.outbox WHERE topic = 'rl_payments') AS events;
-- granted publish, the worker's step writes the owner's event
SELECT idem_outbox_grant('rl_payments', 'regress_rl_agent', 'publish');
SET ROLE regress_rl_agent;
SELECT response FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES (''pub'', 1)',
	run_id => 'pub-1', step => 'pay', lease_token => :'tok_pub',
	outbox_topic => 'rl_payments');
RESET ROLE;
SELECT topic, owner, run_id, step FROM idem.outbox WHERE topic = 'rl_payments';

-- a step's statement that changes its own run (here its holder's
-- heartbeat, release or the owner's cancel, called from inside the
-- statement) is refused with ID508, as a call under its own key is, and
-- nothing changes: the step's record of the run would overwrite the change
SELECT idem_queue_create('rlnest', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('nest-1', steps => ARRAY['a', 'b'], queue => 'rlnest');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT lease_token AS tok_nest FROM idem_run_claim('rlnest', worker => 'wn') \gset
RESET ROLE;
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_agent;
SELECT * FROM idem_call(NULL, 'SELECT idem_run_extend(''nest-1'', $1::uuid, ''1 h'') IS NOT NULL AS x',
	ARRAY[:'tok_nest'], run_id => 'nest-1', step => 'a', lease_token => :'tok_nest');
SELECT * FROM idem_call(NULL, 'SELECT idem_run_release(''nest-1'', $1::uuid) IS NULL AS x',
	ARRAY[:'tok_nest'], run_id => 'nest-1', step => 'a', lease_token => :'tok_nest');
RESET ROLE;
-- the owner works its run's step itself, as a worker of the queue
SELECT idem_queue_grant('rlnest', 'regress_rl_app', 'work');
SET ROLE regress_rl_app;
SELECT * FROM idem_call(NULL, 'SELECT idem_run_cancel(''nest-1'') AS x',
	run_id => 'nest-1', step => 'a', lease_token => :'tok_nest');
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SELECT status, state, holder FROM idem_runs WHERE run_id = 'nest-1';

-- an operator's reason is the run's last error and its attempt's error, as
-- a failed step's error is: at most 64 kB (22001), and nothing changes
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_app;
SELECT idem_run_cancel('nest-1', repeat('x', 65537));
SELECT idem_run_fail('nest-1', repeat('x', 65537));
RESET ROLE;
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SET ROLE regress_rl_app;
SELECT idem_run_cancel('nest-1', repeat('x', 65536));
RESET ROLE;
SELECT status, length(last_error) FROM idem_runs WHERE run_id = 'nest-1';

-- a claim inside the caller's transaction block is that transaction's: its
-- lease and its attempt commit with it, and a rollback (a worker killed
-- before its commit) leaves the run due, unclaimed, with no attempt on record
SELECT idem_queue_create('rltx', producers => '{regress_rl_app}', workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('tx-1', steps => ARRAY['a'], queue => 'rltx');
RESET ROLE;
BEGIN;
SET LOCAL ROLE regress_rl_agent;
SELECT run_id, attempt FROM idem_run_claim('rltx', 1, '30 s', 'tx-worker-1');
RESET ROLE;
SELECT status, state, holder FROM idem_runs WHERE run_id = 'tx-1';
ROLLBACK;
SELECT status, state, holder FROM idem_runs WHERE run_id = 'tx-1';
SELECT count(*) AS attempts FROM idem_run_attempts WHERE run_id = 'tx-1';
SET ROLE regress_rl_agent;
SELECT run_id, attempt FROM idem_run_claim('rltx', 1, '30 s', 'tx-worker-2');
RESET ROLE;
SELECT claim, worker, outcome FROM idem_run_attempts WHERE run_id = 'tx-1';

-- a run whose owner role was dropped is not leased: its steps would write
-- records and events for a role that no longer exists (a new role given
-- its OID would own them), and the purge removes such a run, running or
-- not.  The claim fails it instead, off the queue, and leases the next
CREATE ROLE regress_rl_gone IN ROLE regress_rl_app;
SELECT idem_queue_create('rlgone', producers => '{regress_rl_app}', workers => '{regress_rl_agent}');
SET ROLE regress_rl_gone;
SELECT created FROM idem_run_begin('gone-0', steps => ARRAY['a'], queue => 'rlgone');
RESET ROLE;
SET ROLE regress_rl_agent;
INSERT INTO rl_claimed (who, run_id, token)
SELECT 'gone', run_id, lease_token FROM idem_run_claim('rlgone', 1, '30 s', 'gone-worker');
RESET ROLE;
SET ROLE regress_rl_gone;
SELECT created FROM idem_run_begin('gone-1', steps => ARRAY['a'], queue => 'rlgone');
RESET ROLE;
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('gone-2', steps => ARRAY['a'], queue => 'rlgone');
RESET ROLE;
DROP ROLE regress_rl_gone;
SELECT * FROM rl_digest \gset before_
SET ROLE regress_rl_agent;
-- a lease taken before the drop holds no more: its holder executes nothing
SELECT * FROM idem_call(NULL, 'INSERT INTO rl_refunds VALUES ($1, 1)', ARRAY['gone-0'],
	run_id => 'gone-0', step => 'a', lease_token => rl_token('gone'));
SELECT idem_step_complete('gone-0', 'a', '{}', lease_token => rl_token('gone'));
SELECT (SELECT digest FROM rl_digest) = :'before_digest' AS unchanged;
SELECT run_id, attempt FROM idem_run_claim('rlgone', 1, '30 s', 'gone-worker');
SELECT run_id, attempt FROM idem_run_claim('rlgone', 1, '30 s', 'gone-worker');
RESET ROLE;
SELECT run_id, status, state, last_error FROM idem_runs WHERE queue = 'rlgone' ORDER BY run_id;
SELECT count(*) AS attempts FROM idem_run_attempts WHERE run_id = 'gone-1';
-- alone on its queue (the claim's one-role scan), the same
SET ROLE regress_rl_app;
SELECT idem_run_cancel('gone-2');
RESET ROLE;
CREATE ROLE regress_rl_gone IN ROLE regress_rl_app;
SET ROLE regress_rl_gone;
SELECT created FROM idem_run_begin('gone-3', steps => ARRAY['a'], queue => 'rlgone');
RESET ROLE;
DROP ROLE regress_rl_gone;
SET ROLE regress_rl_agent;
SELECT run_id, attempt FROM idem_run_claim('rlgone', 1, '30 s', 'gone-worker');
RESET ROLE;
SELECT run_id, status, state, last_error FROM idem_runs WHERE run_id = 'gone-3';

-- release with retry_after and a reason, as a worker that has no code for
-- the next step releases (a rolling deploy): the run is not due before
-- retry_after, the attempt is not counted, and the reason is on record
SELECT idem_queue_create('rlrel', producers => '{regress_rl_app}',
	workers => '{regress_rl_agent}');
SET ROLE regress_rl_app;
SELECT created FROM idem_run_begin('rel-1', steps => ARRAY['a', 'b'], queue => 'rlrel');
RESET ROLE;
SET ROLE regress_rl_agent;
SELECT run_id, lease_token AS rel_tok, attempt FROM idem_run_claim('rlrel', worker => 'old') \gset
SELECT :attempt AS attempt;
SELECT idem_run_release('rel-1', :'rel_tok', retry_after => '-1 s');			-- 22023
SELECT idem_run_release('rel-1', :'rel_tok', reason => repeat('x', 70000));	-- 22001
SELECT idem_run_release('rel-1', :'rel_tok', retry_after => '1 year');		-- 22023
SELECT idem_run_release('rel-1', gen_random_uuid(), '1 h', 'no');			-- ID412
-- nothing changed: still leased by the same holder
RESET ROLE;
SELECT status, state, holder, attempt, last_error FROM idem_runs WHERE run_id = 'rel-1';
SET ROLE regress_rl_agent;
SELECT idem_run_release('rel-1', :'rel_tok', retry_after => '1 h',
	reason => 'worker old has no function for step "a"');
-- not due: nobody claims it, the old holder's token is spent
SELECT count(*) AS claimed FROM idem_run_claim('rlrel', worker => 'new');
SELECT idem_run_extend('rel-1', :'rel_tok', '30 s');						-- ID412
RESET ROLE;
SELECT status, state, holder, attempt, last_error,
	next_due > now() + interval '59 min' AS due_in_an_hour
  FROM idem_runs WHERE run_id = 'rel-1';
SELECT claim, worker, outcome, error FROM idem_run_attempts WHERE run_id = 'rel-1';
-- once due, a worker claims it with the attempt still the first
UPDATE idem.runs SET due_at = now() WHERE run_id = 'rel-1';
SET ROLE regress_rl_agent;
SELECT run_id, attempt, next_step FROM idem_run_claim('rlrel', worker => 'new');
RESET ROLE;

-- cleanup
DELETE FROM idem.outbox WHERE topic = 'rl_payments';
DELETE FROM idem.outbox_topics WHERE topic = 'rl_payments';
DELETE FROM idem.runs WHERE queue IN ('rl', 'rl1', 'rlfair', 'rlfair2', 'rlfair3', 'rlgrant', 'rlop', 'rlpub', 'rlnest', 'rltx', 'rlgone', 'rlrel');
DELETE FROM idem.keys WHERE owner = 'regress_rl_other'::regrole;
DELETE FROM idem.keys WHERE owner = 'regress_rl_app'::regrole;
DELETE FROM idem.queues;
DROP VIEW rl_digest;
DROP FUNCTION rl_token(text);
DROP TABLE rl_claimed, rl_refunds;
DROP ROLE regress_rl_app, regress_rl_agent, regress_rl_other;
