--
-- run_signals: waits for an event and signals (a signal before the await
-- is kept, signals are idempotent per run and event, signalling needs a
-- grant), the timeout outcome, sleeps, and bad input (issue 21)
--
CREATE ROLE regress_rs_app;
CREATE ROLE regress_rs_agent;
CREATE ROLE regress_rs_ops;
CREATE ROLE regress_rs_other;
CREATE TABLE rs_claimed (who text, run_id text, token uuid, attempt int,
	next_step text, results jsonb);
GRANT ALL ON rs_claimed TO PUBLIC;
CREATE FUNCTION rs_token(w text) RETURNS uuid LANGUAGE sql
	AS $$ SELECT token FROM rs_claimed WHERE who = w $$;
CREATE VIEW rs_digest AS
SELECT md5(coalesce((SELECT string_agg(r::text, ',' ORDER BY owner, run_id) FROM idem.runs r), '') ||
		   coalesce((SELECT string_agg(s::text, ',' ORDER BY owner, run_id, event) FROM idem.run_signals s), '')) AS digest;

SELECT idem_queue_create('rs', producers => '{regress_rs_app}',
	workers => '{regress_rs_agent}', signallers => '{regress_rs_ops}');
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-1', steps => ARRAY['check','approve','refund'], queue => 'rs');
RESET ROLE;

-- await: no signal yet, the lease ends and the run waits (not claimable)
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w1', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w1');
SELECT idem_step_complete('ret-1', 'check', '{"ok": true}', lease_token => rs_token('w1'));
SELECT * FROM idem_run_await('ret-1', 'refund', rs_token('w1'));	-- out of sequence
SELECT * FROM idem_run_await('ret-1', 'approve', rs_token('w1'), timeout => '2 days');
-- the lease is gone: the holder's next call is fenced
SELECT idem_step_complete('ret-1', 'refund', '{}', lease_token => rs_token('w1'));
SELECT count(*) AS claimable FROM idem_run_claim('rs', worker => 'w2');
RESET ROLE;
SELECT run_id, state, awaiting, next_due > now() + interval '47 hours' AS timeout_kept
  FROM idem_runs WHERE run_id = 'ret-1';
SET ROLE regress_rs_app;
SELECT ordinal, step, state FROM idem_run_steps('ret-1');
RESET ROLE;

-- signalling needs a grant: the owner, the queue's signallers, admins
SELECT * FROM rs_digest \gset before_
SET ROLE regress_rs_other;
-- a run the caller may not signal is reported as one that does not
-- exist: whether another role has a run of that id is not its to know
SELECT idem_run_signal('ret-1', 'approve', '{"by": "x"}', owner => 'regress_rs_app');	-- ID404
SELECT idem_run_signal('no-such-run', 'approve', '{"by": "x"}', owner => 'regress_rs_app');	-- ID404
SELECT idem_run_signal('ret-1', 'approve', '{"by": "x"}');		-- its own runs: none
RESET ROLE;
SELECT (SELECT digest FROM rs_digest) = :'before_digest' AS unchanged;

-- a run with declared steps awaits only those: a signal of another name
-- would be stored and never used, and is refused as its await is (ID400)
SELECT * FROM rs_digest \gset before_
SET ROLE regress_rs_ops;
SELECT idem_run_signal('ret-1', 'aprove', '{"by": "ops"}', owner => 'regress_rs_app');	-- ID400
RESET ROLE;
SET ROLE regress_rs_app;
SELECT idem_run_signal('ret-1', 'aprove', '{"by": "app"}');		-- ID400
RESET ROLE;
SELECT (SELECT digest FROM rs_digest) = :'before_digest' AS unchanged;

-- the signal makes the run due; the payload becomes the step's result
SET ROLE regress_rs_ops;
SELECT idem_run_signal('ret-1', 'approve', '{"by": "ops"}', owner => 'regress_rs_app');
-- idempotent: the same signal again is a no-op, another payload is ID422
SELECT idem_run_signal('ret-1', 'approve', '{"by": "ops"}', owner => 'regress_rs_app');
SELECT idem_run_signal('ret-1', 'approve', '{"by": "eve"}', owner => 'regress_rs_app');
RESET ROLE;
SELECT run_id, state, awaiting FROM idem_runs WHERE run_id = 'ret-1';
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w2', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w2');
SELECT who, run_id, attempt, next_step, results FROM rs_claimed WHERE who = 'w2';
SELECT * FROM idem_run_await('ret-1', 'approve', rs_token('w2'), timeout => '2 days');
-- a replay of the await returns the same outcome
SELECT * FROM idem_run_await('ret-1', 'approve', rs_token('w2'));
RESET ROLE;
SET ROLE regress_rs_app;
SELECT ordinal, step, state, response FROM idem_run_steps('ret-1');
RESET ROLE;

-- a signal sent before the await is kept: the await completes at once
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-2', steps => ARRAY['approve','refund'], queue => 'rs');
SELECT idem_run_signal('ret-2', 'approve', '{"by": "app"}');
RESET ROLE;
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w3', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w3');
SELECT who, run_id FROM rs_claimed WHERE who = 'w3';
SELECT * FROM idem_run_await('ret-2', 'approve', rs_token('w3'), timeout => '1 h');
RESET ROLE;

-- a timeout without a signal: the step completes with JSON null
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-3', steps => ARRAY['approve'], queue => 'rs');
RESET ROLE;
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w4', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w4') WHERE run_id = 'ret-3';
SELECT state FROM idem_run_await('ret-3', 'approve', rs_token('w4'), timeout => '10 ms');
SELECT pg_sleep(0.02);
INSERT INTO rs_claimed SELECT 'w5', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w5') WHERE run_id = 'ret-3';
SELECT * FROM idem_run_await('ret-3', 'approve', rs_token('w5'), timeout => '10 ms');
RESET ROLE;
SELECT run_id, status, state FROM idem_runs WHERE run_id = 'ret-3';
-- a signal for a step that completed is refused, not kept unread: the
-- await timed out, the run goes on to its next step
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-3b', steps => ARRAY['approve', 'ship'], queue => 'rs');
RESET ROLE;
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w4b', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w4b') WHERE run_id = 'ret-3b';
SELECT state FROM idem_run_await('ret-3b', 'approve', rs_token('w4b'), timeout => '10 ms');
SELECT pg_sleep(0.02);
INSERT INTO rs_claimed SELECT 'w5b', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w5b') WHERE run_id = 'ret-3b';
SELECT * FROM idem_run_await('ret-3b', 'approve', rs_token('w5b'), timeout => '10 ms');
RESET ROLE;
SET ROLE regress_rs_app;
SELECT idem_run_signal('ret-3b', 'approve', '{"by": "ops"}');
-- the step the run is at still takes its signal
SELECT idem_run_signal('ret-3b', 'ship', '{}');
SELECT idem_run_cancel('ret-3b');
RESET ROLE;
SELECT event FROM idem.run_signals WHERE run_id = 'ret-3b';
-- a finished run takes no signals
SET ROLE regress_rs_app;
SELECT idem_run_signal('ret-3', 'late', '{}');
SELECT idem_run_signal('nope', 'approve', '{}');
RESET ROLE;
-- a failed run is not finished for good: resumed, it goes on, and its
-- await reads the signal sent while it was failed, which is kept
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-6', steps => ARRAY['approve'], queue => 'rs');
SELECT idem_run_fail('ret-6', 'a step failed its last attempt');
SELECT idem_run_signal('ret-6', 'approve', '{"by": "ops"}');
SELECT idem_run_resume('ret-6');
RESET ROLE;
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w9', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w9') WHERE run_id = 'ret-6';
SELECT * FROM idem_run_await('ret-6', 'approve', rs_token('w9'));
RESET ROLE;
SELECT run_id, status FROM idem_runs WHERE run_id = 'ret-6';

-- sleep: the lease ends and the run is due at until; once until has
-- passed, the call says go on
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-4', steps => ARRAY['s'], queue => 'rs');
RESET ROLE;
SET ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w6', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w6') WHERE run_id = 'ret-4';
SELECT idem_run_sleep('ret-4', rs_token('w6'), now() - interval '1 s') AS slept;
SELECT idem_run_sleep('ret-4', rs_token('w6'), now() + interval '1 h') AS slept;
SELECT count(*) AS claimable FROM idem_run_claim('rs', worker => 'w7');
RESET ROLE;
SELECT run_id, state, next_due > now() + interval '59 min' AS due_later FROM idem_runs WHERE run_id = 'ret-4';
SELECT run_id, claim, worker, outcome FROM idem_run_attempts ORDER BY run_id, claim;

-- an interval is a fixed length: a month counts 30 days, whatever the
-- calendar says (as PostgreSQL compares intervals)
SET ROLE regress_rs_app;
SELECT created FROM idem_run_begin('ret-5', steps => ARRAY['approve'], queue => 'rs');
RESET ROLE;
BEGIN;
SET LOCAL ROLE regress_rs_agent;
INSERT INTO rs_claimed SELECT 'w8', run_id, lease_token, attempt, next_step, results
  FROM idem_run_claim('rs', worker => 'w8') WHERE run_id = 'ret-5';
SELECT state FROM idem_run_await('ret-5', 'approve', rs_token('w8'), timeout => '1 mon');
RESET ROLE;
SELECT next_due BETWEEN now() + interval '30 days' AND clock_timestamp() + interval '30 days'
	   AS thirty_days
  FROM idem_runs WHERE run_id = 'ret-5';
COMMIT;

-- bad input
SET ROLE regress_rs_agent;
SELECT * FROM idem_run_await('ret-4', 'x', NULL);
SELECT * FROM idem_run_await('ret-4', NULL, gen_random_uuid());
SELECT * FROM idem_run_await('ret-4', 'x', gen_random_uuid(), timeout => '0 s');
SELECT * FROM idem_run_await('ret-4', 'x', gen_random_uuid(), timeout => '2 years');
SELECT idem_run_sleep('ret-4', gen_random_uuid(), 'infinity');
SELECT idem_run_sleep('ret-4', gen_random_uuid(), now() + interval '2 years');
SELECT idem_run_sleep('ret-4', gen_random_uuid(), NULL);
RESET ROLE;
SET ROLE regress_rs_app;
SELECT idem_run_signal('ret-4', 'x', NULL);
SELECT idem_run_signal('ret-4', 'x', 'null');
SELECT idem_run_signal('ret-4', NULL, '{}');
SELECT idem_run_signal('ret-4', '', '{}');
SELECT idem_run_signal('ret-4', repeat('e', 256), '{}');
-- a run on no queue never awaits (an await needs a claim's lease): its
-- signals would never be read, and are refused (55000), nothing stored
SELECT status FROM idem_run_begin('plain-1', steps => ARRAY['approve']);
SELECT status FROM idem_run_begin('plain-2');
SELECT idem_run_signal('plain-1', 'approve', '{}');
SELECT idem_run_signal('plain-2', 'approve', '{}');
-- as it is not retried (55000)
SELECT idem_run_retry('plain-1');
RESET ROLE;
SELECT count(*) AS stored FROM idem.run_signals WHERE run_id LIKE 'plain-%';
DELETE FROM idem.runs WHERE run_id LIKE 'plain-%';

-- cleanup
DELETE FROM idem.runs WHERE queue = 'rs';
DELETE FROM idem.keys WHERE owner = 'regress_rs_app'::regrole;
DELETE FROM idem.queues;
DROP VIEW rs_digest;
DROP FUNCTION rs_token(text);
DROP TABLE rs_claimed;
DROP ROLE regress_rs_app, regress_rs_agent, regress_rs_ops, regress_rs_other;
