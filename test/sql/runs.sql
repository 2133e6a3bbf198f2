--
-- runs: workflow runs with declared steps, replay, sequencing, external
-- steps, failure and resume, ownership, bad input
--
CREATE TABLE refunds (id serial PRIMARY KEY, return_id text NOT NULL, amount numeric NOT NULL);
CREATE TABLE notices (id serial PRIMARY KEY, return_id text NOT NULL);
CREATE VIEW counts AS
SELECT (SELECT count(*) FROM refunds) AS refunds, (SELECT count(*) FROM notices) AS notices;

-- begin is idempotent: the same arguments return the existing run
SELECT status, next_step, created, started_at = now() AS started_now
  FROM idem_run_begin('ret-1',
       steps => ARRAY['check_inventory', 'create_label', 'refund', 'notify'],
       input => '{"return_id": "ret-1", "amount": 25.00}');
SELECT status, next_step, created FROM idem_run_begin('ret-1',
       steps => ARRAY['check_inventory', 'create_label', 'refund', 'notify'],
       input => '{"amount": 25.00, "return_id": "ret-1"}');
-- other steps or another input under the same run id: ID422, nothing changes
SELECT * FROM idem_run_begin('ret-1', steps => ARRAY['refund'],
       input => '{"return_id": "ret-1", "amount": 25.00}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('ret-1',
       steps => ARRAY['check_inventory', 'create_label', 'refund', 'notify'],
       input => '{"return_id": "ret-1", "amount": 2500}');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('ret-1');
\echo :LAST_ERROR_SQLSTATE
SELECT status, next_step, steps_done, steps_total, finished_at, last_error, input
  FROM idem_run_status('ret-1');

-- sequencing: refund cannot skip the earlier steps, and nothing executes
SELECT idem_step('ret-1', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING id', 'ret-1', 25.00::numeric);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM counts;
-- a name the run did not declare
SELECT idem_step('ret-1', 'payout', 'SELECT 1 AS one');
\echo :LAST_ERROR_SQLSTATE

-- the steps in order; a completed step replays byte for byte
SELECT idem_step('ret-1', 'check_inventory', 'SELECT $1::int AS in_stock', 3);
SELECT idem_step('ret-1', 'check_inventory', 'SELECT $1::int AS in_stock', 3);
-- a different request under a completed step: ID422
SELECT idem_step('ret-1', 'check_inventory', 'SELECT $1::int AS in_stock', 4);
\echo :LAST_ERROR_SQLSTATE

-- an external step: its key, then its result
SELECT idem_step_key('ret-1', 'create_label');
SELECT idem_step_key('ret-1', 'create_label') = idem_step_key('ret-1', 'create_label') AS stable;
SELECT idem_step_complete('ret-1', 'create_label', '{"label_id": "LB-991"}');
SELECT idem_step_complete('ret-1', 'create_label', '{"label_id": "LB-991"}');
-- completed again with another result: ID422, the first stays
SELECT idem_step_complete('ret-1', 'create_label', '{"label_id": "LB-992"}');
\echo :LAST_ERROR_SQLSTATE

-- the refund, retried: executed once
SELECT idem_step('ret-1', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'ret-1', 25.00::numeric);
SELECT idem_step('ret-1', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'ret-1', 25.00::numeric);
SELECT * FROM counts;
SELECT status, next_step, steps_done FROM idem_run_status('ret-1');

-- the last step completes the run in its own transaction: rolled back, the
-- run is still running and nothing was written
BEGIN;
SELECT idem_step('ret-1', 'notify', 'INSERT INTO notices (return_id) VALUES ($1) RETURNING return_id', 'ret-1');
SELECT status, next_step FROM idem_run_status('ret-1');
ROLLBACK;
SELECT status, next_step, finished_at IS NULL AS unfinished FROM idem_run_status('ret-1');
SELECT * FROM counts;
-- a failing statement records nothing either
SELECT idem_step('ret-1', 'notify', 'INSERT INTO notices (return_id) VALUES (NULL)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('ret-1', 'notify', 'INSERT INTO notices (return_id) VALUES ($1) RETURNING return_id', 'ret-1');
SELECT status, next_step, steps_done, finished_at IS NOT NULL AS finished FROM idem_run_status('ret-1');

-- the whole sequence re-run after a "crash": every step replays
SELECT idem_step('ret-1', 'check_inventory', 'SELECT $1::int AS in_stock', 3) IS NOT NULL AS replayed;
SELECT idem_step_complete('ret-1', 'create_label', '{"label_id": "LB-991"}');
SELECT idem_step('ret-1', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'ret-1', 25.00::numeric);
SELECT idem_step('ret-1', 'notify', 'INSERT INTO notices (return_id) VALUES ($1) RETURNING return_id', 'ret-1');
SELECT * FROM counts;
-- ordinal, step, state, response, attempts: executions and committed replays
SELECT ordinal, step, state, response, executed_at IS NOT NULL AS executed, attempts
  FROM idem_run_steps('ret-1');

-- the step's key belongs to the run: idem_execute under it is refused (22023)
SELECT replayed, response FROM idem_execute_ex(idem_step_key('ret-1', 'refund'),
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'ret-1', 25.00::numeric);
\echo :LAST_ERROR_SQLSTATE
-- and steps do not expire
SELECT expires_at = 'infinity' AS never_expires FROM idem.keys
 WHERE key = idem_step_key('ret-1', 'refund');

-- a completed run executes no new step
SELECT status, next_step, created FROM idem_run_begin('free');
SELECT idem_step('free', 'b', 'SELECT 2 AS two');
SELECT idem_step('free', 'a', 'SELECT 1 AS one');
SELECT ordinal, step, state FROM idem_run_steps('free');
SELECT status, next_step, steps_done, steps_total FROM idem_run_status('free');
SELECT idem_run_complete('free');
SELECT idem_step('free', 'c', 'SELECT 3 AS three');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('free', 'a', 'SELECT 1 AS one');
SELECT idem_run_fail('free', 'too late');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_resume('free');
\echo :LAST_ERROR_SQLSTATE
-- a run with pending declared steps does not complete by decree
SELECT idem_run_complete('ret-1');
SELECT status, next_step, created FROM idem_run_begin('ret-2', steps => ARRAY['a', 'b']);
SELECT idem_run_complete('ret-2');
\echo :LAST_ERROR_SQLSTATE
-- one declared step: the detail's noun is singular
SELECT status, next_step, created FROM idem_run_begin('ret-one', steps => ARRAY['only']);
SELECT idem_run_complete('ret-one');
DELETE FROM idem.runs WHERE run_id = 'ret-one';

-- failure: a failed run refuses new steps until resumed; completed steps
-- still replay
SELECT idem_step('ret-2', 'a', 'SELECT 1 AS one');
SELECT idem_run_fail('ret-2', 'model timeout');
SELECT status, last_error, finished_at IS NOT NULL AS finished FROM idem_run_status('ret-2');
SELECT idem_step('ret-2', 'b', 'SELECT 2 AS two');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('ret-2', 'a', 'SELECT 1 AS one');
SELECT idem_step_complete('ret-2', 'b', '{}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_resume('ret-2');
SELECT status, last_error, finished_at IS NULL AS unfinished FROM idem_run_status('ret-2');
SELECT idem_step('ret-2', 'b', 'SELECT 2 AS two');
SELECT status, last_error FROM idem_run_status('ret-2');

-- a declared list is renumbered from 1 however it was written
SELECT status, next_step FROM idem_run_begin('ret-3', steps => '[0:1]={x,y}');
SELECT idem_step('ret-3', 'y', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT ordinal, step, state FROM idem_run_steps('ret-3');

-- outbox events written by a step
SELECT idem_outbox_create_topic('run_returns');
SET idem.outbox_topic = 'run_returns';
SELECT status, next_step, created FROM idem_run_begin('ret-4', steps => ARRAY['notify']);
SELECT idem_step('ret-4', 'notify', 'SELECT $1 AS return_id', 'ret-4');
SELECT idem_step('ret-4', 'notify', 'SELECT $1 AS return_id', 'ret-4');
RESET idem.outbox_topic;
SELECT key = idem_step_key('ret-4', 'notify') AS step_key, run_id, step, topic, payload
  FROM idem.outbox WHERE key LIKE 'idem.step:%';

-- bad input: a documented SQLSTATE, and nothing changes
SELECT * FROM idem_run_begin(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin(repeat('r', 256));
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY['a', 'b', 'a']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY['a', NULL]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY[]::text[]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY[['a', 'b'], ['c', 'd']]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY['a', '']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', steps => ARRAY[repeat('s', 256)]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_begin('bad', input => '{"a":');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('no-such-run', 'a', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('ret-2', NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('ret-2', '', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('ret-2', 'b', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step_complete('ret-2', 'b', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step_complete('ret-2', 'b', 'not json');
\echo :LAST_ERROR_SQLSTATE
SET idem.max_response_size = 1024;
SELECT idem_step_complete('ret-2', 'b', jsonb_build_object('blob', repeat('x', 2000)));
\echo :LAST_ERROR_SQLSTATE
RESET idem.max_response_size;
SELECT idem_step_key(NULL, 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_fail('ret-2', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_status('no-such-run');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_run_steps('no-such-run');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS runs FROM idem.runs WHERE run_id IN ('bad', 'no-such-run');
-- a read-only transaction cannot step
BEGIN READ ONLY;
SELECT idem_step('ret-2', 'b', 'SELECT 2 AS two');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;

-- runs belong to the role that began them
CREATE ROLE regress_idem_alice;
CREATE ROLE regress_idem_bob;
GRANT INSERT, SELECT ON refunds TO regress_idem_alice, regress_idem_bob;
GRANT USAGE ON SEQUENCE refunds_id_seq TO regress_idem_alice, regress_idem_bob;
SET ROLE regress_idem_alice;
SELECT status, created FROM idem_run_begin('shared-id', steps => ARRAY['refund']);
SELECT idem_step('shared-id', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id', 'alice', 1.00::numeric);
-- alice sees her own run
SELECT status, next_step, steps_done FROM idem_run_status('shared-id');
SELECT step, state, response FROM idem_run_steps('shared-id');
SET ROLE regress_idem_bob;
-- bob sees, steps and fails nothing of alice's run
SELECT * FROM idem_run_status('shared-id');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('shared-id', 'refund', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_fail('shared-id', 'squatting');
\echo :LAST_ERROR_SQLSTATE
-- the same run id is bob's own run
SELECT status, created FROM idem_run_begin('shared-id', steps => ARRAY['refund']);
SELECT idem_step('shared-id', 'refund',
       'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id', 'bob', 2.00::numeric);
SELECT step, state, response FROM idem_run_steps('shared-id');
-- and the tables stay out of reach
SELECT * FROM idem.runs;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_purge(now());
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT owner, run_id, status FROM idem.runs WHERE run_id = 'shared-id' ORDER BY owner::text;
SELECT return_id FROM refunds WHERE return_id IN ('alice', 'bob') ORDER BY 1;

-- purge: finished runs go with their steps and key records; running runs stay
SELECT idem_run_purge(now() + interval '1 minute') AS purged;
SELECT run_id, status FROM idem.runs ORDER BY owner::text, run_id;
SELECT count(*) AS purged_runs_left FROM idem.runs WHERE run_id IN ('ret-1', 'free', 'ret-2');
SELECT count(*) AS step_keys FROM idem.keys WHERE key LIKE 'idem.step:ret-1:%';
-- a purged run can begin anew
SELECT status, created FROM idem_run_begin('ret-1', steps => ARRAY['a']);

-- batch_size: at most that many runs a call, each with its steps' records
-- (each keeps its lock until the commit); NULL is every run at once
SELECT count(idem_run_begin('batch-' || g, steps => ARRAY['a'])) AS begun,
       count(idem_step('batch-' || g, 'a', 'SELECT 1 AS one')) AS stepped
  FROM generate_series(1, 5) g;
BEGIN;
SELECT idem_run_purge(now() + interval '1 minute', 2) AS purged;
SELECT count(*) AS run_locks FROM pg_locks
 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted;
COMMIT;
SELECT count(*) AS runs_left FROM idem.runs WHERE run_id LIKE 'batch-%';
SELECT count(*) AS step_records_left FROM idem.keys WHERE key LIKE 'idem.step:batch-%';
SELECT count(*) AS runs_with_records FROM idem.runs r
 WHERE run_id LIKE 'batch-%' AND EXISTS (SELECT FROM idem.keys k
	WHERE k.owner = r.owner AND k.key = idem_step_key(r.run_id, 'a'));
SELECT idem_run_purge(now() + interval '1 minute', 2) AS purged;
SELECT idem_run_purge(now() + interval '1 minute', NULL) AS purged;
SELECT count(*) AS runs_left FROM idem.runs WHERE run_id LIKE 'batch-%';
-- a batch_size below 1 is refused, and nothing is removed
SELECT count(idem_run_begin('batch-' || g, steps => ARRAY['a'])) AS begun,
       count(idem_step('batch-' || g, 'a', 'SELECT 1 AS one')) AS stepped
  FROM generate_series(1, 2) g;
SELECT idem_run_purge(now() + interval '1 minute', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_purge(now() + interval '1 minute', -1);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS runs_left FROM idem.runs WHERE run_id LIKE 'batch-%';
SELECT idem_run_purge(now() + interval '1 minute', 1000) AS purged;

DROP OWNED BY regress_idem_alice, regress_idem_bob;
DROP ROLE regress_idem_alice;
DROP ROLE regress_idem_bob;
DELETE FROM idem.keys;
DELETE FROM idem.runs;
DELETE FROM idem.outbox;
DROP VIEW counts;
DROP TABLE refunds, notices;

-- issue 19: a step's key belongs to its run.  Outside the run's functions
-- it is refused (22023) and nothing runs: no business row, no record, no
-- step listed, whatever the run declared.
CREATE TABLE sk_rows (id serial PRIMARY KEY, what text);
SELECT status FROM idem_run_begin('sk-free');
SELECT status FROM idem_run_begin('sk-seq', steps => ARRAY['a', 'b']);
SET idem.ttl = 1;
SELECT idem_execute(idem_step_key('sk-free', 'a'),
       'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'free/a');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_execute_ex(idem_step_key('sk-seq', 'b'),
       'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'seq/b');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call(idem_step_key('sk-seq', 'a'),
       'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', ARRAY['seq/a']);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_dry_run(idem_step_key('sk-seq', 'a'),
       'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'seq/a');
\echo :LAST_ERROR_SQLSTATE
-- the same string however it is built
SELECT idem_execute(idem_key('idem.step', 'sk-free', 'a'), 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
RESET idem.ttl;
-- a key that only looks alike is an ordinary key
SELECT idem_execute('idem.steps:x', 'SELECT 1 AS one') ->> 'rowcount' AS rowcount;
SELECT count(*) AS business_rows FROM sk_rows;
SELECT count(*) AS step_records FROM idem.keys WHERE key LIKE 'idem.step:sk-%';
SELECT run_id, done_steps FROM idem.runs WHERE run_id LIKE 'sk-%' ORDER BY run_id;
-- through the run's functions the steps run in order, once
SELECT idem_step('sk-seq', 'b', 'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'seq/b');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_step('sk-free', 'a', 'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'free/a') ->> 'rowcount' AS rowcount;
SELECT expires_at AS step_record_expires FROM idem.keys WHERE key = idem_step_key('sk-free', 'a');

-- a record under a step's key that its run did not write (idem 1.1's
-- idem_execute() could: with an expiry, or a cached error) is never
-- adopted as the step: ID422, nothing runs, the run does not move
SELECT idem_execute('sk-legacy', 'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'legacy') ->> 'rowcount' AS rowcount;
UPDATE idem.keys SET key = idem_step_key('sk-seq', 'a') WHERE key = 'sk-legacy';
SELECT idem_step('sk-seq', 'a', 'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'legacy');
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '23';
SELECT idem_execute('sk-legacy-err', 'INSERT INTO sk_rows (id, what) VALUES (1, $1) RETURNING what', 'dup') -> 'error' ->> 'sqlstate' AS cached;
RESET idem.cache_errors;
UPDATE idem.keys SET key = idem_step_key('sk-free', 'e') WHERE key = 'sk-legacy-err';
SELECT idem_step('sk-free', 'e', 'INSERT INTO sk_rows (id, what) VALUES (1, $1) RETURNING what', 'dup');
\echo :LAST_ERROR_SQLSTATE
SELECT run_id, status, done_steps FROM idem.runs WHERE run_id LIKE 'sk-%' ORDER BY run_id;
DELETE FROM idem.keys WHERE key IN (idem_step_key('sk-seq', 'a'), idem_step_key('sk-free', 'e'));

-- a completed step whose record is gone never runs again, declared or not
-- (XX001), and is never listed twice
DELETE FROM idem.keys WHERE key = idem_step_key('sk-free', 'a');
SELECT idem_step('sk-free', 'a', 'INSERT INTO sk_rows (what) VALUES ($1) RETURNING what', 'free/a');
\echo :LAST_ERROR_SQLSTATE
SELECT what, count(*) FROM sk_rows GROUP BY what ORDER BY what;
SELECT step, state FROM idem_run_steps('sk-free');

-- a run has at most 1000 steps (54000), declared or completed; a long
-- declared list is checked in n log n and reported like a short one
SELECT status FROM idem_run_begin('sk-many', steps => array_fill('s'::text, ARRAY[1001]));
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM idem_run_begin('sk-many',
       steps => (SELECT array_agg('s' || i) FROM generate_series(1, 999) i) || ARRAY['s500']);
\echo :LAST_ERROR_SQLSTATE
SELECT status FROM idem_run_begin('sk-many',
       steps => ARRAY['x', 'y', 'z', 'y', 'x']);
\echo :LAST_ERROR_SQLSTATE
SELECT status, next_step FROM idem_run_begin('sk-many',
       steps => (SELECT array_agg('s' || i ORDER BY i) FROM generate_series(1, 1000) i));
SELECT count(*) AS rows, count(*) FILTER (WHERE state = 'pending') AS pending,
       min(ordinal), max(ordinal) FROM idem_run_steps('sk-many');
SELECT status FROM idem_run_begin('sk-undeclared');
DO $$
BEGIN
	FOR i IN 1..1000 LOOP
		PERFORM idem_step_complete('sk-undeclared', 's' || i, '{}');
	END LOOP;
END $$;
SELECT idem_step_complete('sk-undeclared', 's1001', '{}');
\echo :LAST_ERROR_SQLSTATE
-- a completed step still replays at the limit
SELECT idem_step_complete('sk-undeclared', 's1000', '{}');
SELECT count(*) AS rows, count(DISTINCT step) AS steps, max(ordinal),
       bool_and(state = 'completed') AS completed FROM idem_run_steps('sk-undeclared');

-- ID422 from idem_run_begin changes nothing; a resumed run shows why it
-- failed until it completes
SELECT status FROM idem_run_begin('sk-free', input => '{"other": true}');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_fail('sk-free', 'carrier down');
SELECT status, last_error FROM idem_run_status('sk-free');
SELECT idem_run_resume('sk-free');
SELECT status, last_error FROM idem_run_status('sk-free');
SELECT idem_run_complete('sk-free');
SELECT status, last_error FROM idem_run_status('sk-free');

-- listing 1000 completed steps takes memory linear in them: in a new
-- session, once the library, the catalog caches and the plans are loaded
-- by a short listing, the backend's peak resident set (VmHWM) grows by
-- less than 8 MB; a listing that split the done list once per step would
-- take tens of megabytes
\c
SELECT count(*) AS warm_up FROM idem_run_steps('sk-free');
SELECT substring(pg_read_file('/proc/self/status'), 'VmHWM:\s*(\d+)')::bigint AS hwm_before \gset
SELECT count(*) AS steps FROM idem_run_steps('sk-undeclared');
SELECT substring(pg_read_file('/proc/self/status'), 'VmHWM:\s*(\d+)')::bigint - :hwm_before < 8192
       AS linear_memory;

DELETE FROM idem.keys;
DELETE FROM idem.runs;
DROP TABLE sk_rows;
