--
-- tamper: idem reads only the tables the extension created, with the shape
-- it created them; anything else is 55000, never a wrong row (issue 8,
-- part 5).  Each case runs in a transaction that is rolled back.
--
SELECT idem_execute('tam:1', 'SELECT 1 AS one') ->> 'command';

-- a superuser renames idem.keys and puts a look-alike in its place
BEGIN;
ALTER TABLE idem.keys RENAME TO keys_moved;
CREATE TABLE idem.keys (LIKE idem.keys_moved INCLUDING ALL);
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- a look-alike outbox
BEGIN;
ALTER TABLE idem.outbox RENAME TO outbox_moved;
CREATE TABLE idem.outbox (LIKE idem.outbox_moved INCLUDING ALL);
SET LOCAL idem.outbox_topic = 't';
SELECT idem_execute('tam:2', 'SELECT 1 AS one');
ROLLBACK;

-- the extension's own table with another shape: owner read as an oid
-- from a text column would name an arbitrary role
BEGIN;
ALTER TABLE idem.keys ALTER COLUMN owner TYPE text;
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;
BEGIN;
ALTER TABLE idem.keys ADD COLUMN note text;
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;
BEGIN;
ALTER TABLE idem.keys DROP COLUMN fingerprint_version;
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;

-- an index of the right name on the wrong columns, or on another table
BEGIN;
ALTER TABLE idem.keys DROP CONSTRAINT keys_pkey;
CREATE UNIQUE INDEX keys_pkey ON idem.keys (key);
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;
BEGIN;
DROP INDEX idem.keys_expires_at_idx;
CREATE INDEX keys_expires_at_idx ON idem.outbox (created_at);
SELECT idem_purge();
ROLLBACK;

-- the claim reads the outbox's due index itself, and a run's events in
-- the index of undelivered run events: an index that leaves out events it
-- should cover (another predicate, another column), or covers more, would
-- make a claim miss events or lease them out of order without a word
SELECT idem_outbox_create_topic('tam-topic');
BEGIN;
DROP INDEX idem.outbox_due_idx;
CREATE INDEX outbox_due_idx ON idem.outbox (topic, next_attempt_at)
	WHERE state = 'pending';
SELECT count(*) FROM idem_outbox_claim('tam-topic');
ROLLBACK;
BEGIN;
DROP INDEX idem.outbox_due_idx;
CREATE INDEX outbox_due_idx ON idem.outbox (topic, created_at)
	WHERE state = ANY (ARRAY['pending', 'leased']);
SELECT count(*) FROM idem_outbox_claim('tam-topic');
ROLLBACK;
BEGIN;
DROP INDEX idem.outbox_run_idx;
CREATE INDEX outbox_run_idx ON idem.outbox (run_id)
	WHERE state = ANY (ARRAY['pending', 'leased']);
SELECT count(*) FROM idem_outbox_claim('tam-topic');
ROLLBACK;
-- as the install script made it (the same predicate written another way
-- is the same expression once parsed): claims work
BEGIN;
DROP INDEX idem.outbox_due_idx;
CREATE INDEX outbox_due_idx ON idem.outbox (topic, next_attempt_at)
	WHERE state IN ('pending', 'leased');
SELECT count(*) FROM idem_outbox_claim('tam-topic');
ROLLBACK;
DELETE FROM idem.outbox_topics WHERE topic = 'tam-topic';

-- the lock seed must be exactly one row: otherwise backends could
-- disagree on a key's lock
BEGIN;
INSERT INTO idem.lock_seed VALUES (1);
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;
BEGIN;
DELETE FROM idem.lock_seed;
SELECT idem_execute('tam:1', 'SELECT 1 AS one');
ROLLBACK;

-- the run tables: a look-alike, a changed type, a column made nullable
BEGIN;
ALTER TABLE idem.runs RENAME TO runs_moved;
CREATE TABLE idem.runs (LIKE idem.runs_moved INCLUDING ALL);
SELECT * FROM idem_run_begin('tam-run');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
ALTER TABLE idem.runs ALTER COLUMN attempts TYPE bigint[];
SELECT * FROM idem_run_begin('tam-run');
ROLLBACK;
BEGIN;
ALTER TABLE idem.runs ALTER COLUMN status DROP NOT NULL;
SELECT * FROM idem_run_begin('tam-run');
ROLLBACK;
BEGIN;
ALTER TABLE idem.runs RENAME TO runs_moved;
CREATE TABLE idem.runs (LIKE idem.runs_moved INCLUDING ALL);
SELECT * FROM idem_run_status('tam-run');
ROLLBACK;

-- the queue registry, which sessions keep what they read of: a look-alike,
-- a changed type, its primary key replaced by an index on another column
BEGIN;
ALTER TABLE idem.queues RENAME TO queues_moved;
CREATE TABLE idem.queues (LIKE idem.queues_moved INCLUDING ALL);
SELECT * FROM idem_run_claim('tam-queue', 1, '30 s');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
ALTER TABLE idem.queues ALTER COLUMN concurrency TYPE bigint;
SELECT * FROM idem_run_claim('tam-queue', 1, '30 s');
ROLLBACK;
BEGIN;
ALTER TABLE idem.queues DROP CONSTRAINT queues_pkey;
ALTER TABLE idem.queues ADD CONSTRAINT queues_pkey PRIMARY KEY (created_at);
SELECT * FROM idem_run_claim('tam-queue', 1, '30 s');
ROLLBACK;

-- a column added and dropped again leaves a dropped attribute after idem's
-- columns, which nothing short of recreating the table removes: idem goes
-- on reading and writing its tables, the dropped attribute null in every
-- row it writes (inserts, updates, the outbox's claim and ack, the end of
-- a run's attempt, the audit trail)
BEGIN;
ALTER TABLE idem.keys ADD COLUMN tam_x text;
ALTER TABLE idem.keys DROP COLUMN tam_x;
ALTER TABLE idem.runs ADD COLUMN tam_x text, ADD COLUMN tam_y text;
ALTER TABLE idem.runs DROP COLUMN tam_x, DROP COLUMN tam_y;
ALTER TABLE idem.run_attempts ADD COLUMN tam_x text;
ALTER TABLE idem.run_attempts DROP COLUMN tam_x;
ALTER TABLE idem.outbox ADD COLUMN tam_x text;
ALTER TABLE idem.outbox DROP COLUMN tam_x;
ALTER TABLE idem.audit ADD COLUMN tam_x text;
ALTER TABLE idem.audit DROP COLUMN tam_x;
SET LOCAL idem.audit = 'executions';
SET LOCAL idem.outbox_keep_delivered = on;
SELECT idem_outbox_create_topic('tam-drop');
SELECT idem_execute('tam:drop', 'SELECT 1 AS one') ->> 'rowcount' AS executed;
SELECT replayed FROM idem_execute_ex('tam:drop', 'SELECT 1 AS one');
SELECT idem_queue_create('tam-drop');
SELECT created FROM idem_run_begin('tam-run', steps => '{a,b}', queue => 'tam-drop');
SELECT lease_token AS tam_tok FROM idem_run_claim('tam-drop', 1, '30 s', 'w') \gset
SELECT response, started_attempt FROM idem_call(NULL, 'SELECT 2 AS two',
	outbox_topic => 'tam-drop', run_id => 'tam-run', step => 'a',
	lease_token => :'tam_tok', start_step => 'b');
SELECT idem_step_complete('tam-run', 'b', '{"b": 1}', :'tam_tok');
SELECT status, done_steps, queue_state FROM idem.runs WHERE run_id = 'tam-run';
SELECT claim, outcome FROM idem.run_attempts WHERE run_id = 'tam-run';
SELECT event_id AS tam_event, lease_token AS tam_etok
  FROM idem_outbox_claim('tam-drop') \gset
SELECT idem_outbox_ack(:'tam_event', :'tam_etok');
SELECT key, state, payload FROM idem.outbox WHERE topic = 'tam-drop';
SELECT key, response FROM idem.keys WHERE key = 'tam:drop';
SELECT key, outcome FROM idem.audit WHERE key = 'tam:drop' ORDER BY outcome;
ROLLBACK;

-- a run's step lists changed by hand into a shape its functions never
-- write are XX001, never read past their end: a null or missing declared
-- step, a list of two dimensions, a null completed step; an attempt count
-- missing reads as 0, as idem_run_steps shows it
BEGIN;
SELECT created FROM idem_run_begin('tam-lists', steps => '{a,b}');
SAVEPOINT s;
UPDATE idem.runs SET steps = '{NULL,b}' WHERE run_id = 'tam-lists';
SELECT next_step FROM idem_run_status('tam-lists');
ROLLBACK TO s;
UPDATE idem.runs SET steps = '[2:3]={a,b}' WHERE run_id = 'tam-lists';
SELECT next_step FROM idem_run_status('tam-lists');
ROLLBACK TO s;
UPDATE idem.runs SET steps = '{{a,b}}' WHERE run_id = 'tam-lists';
SELECT idem_step('tam-lists', 'a', 'SELECT 1 AS one');
ROLLBACK TO s;
SELECT idem_step('tam-lists', 'a', 'SELECT 1 AS one') ->> 'rowcount' AS a_ran;
SAVEPOINT t;
UPDATE idem.runs SET done_steps = '{NULL}' WHERE run_id = 'tam-lists';
SELECT idem_step('tam-lists', 'b', 'SELECT 2 AS two');
ROLLBACK TO t;
UPDATE idem.runs SET attempts = '{}' WHERE run_id = 'tam-lists';
SELECT replayed FROM idem_call(NULL, 'SELECT 1 AS one', run_id => 'tam-lists', step => 'a');
SELECT done_steps, attempts FROM idem.runs WHERE run_id = 'tam-lists';
UPDATE idem.runs SET attempts = '{}' WHERE run_id = 'tam-lists';
SELECT idem_step('tam-lists', 'b', 'SELECT 2 AS two') ->> 'rowcount' AS b_ran;
SELECT status, done_steps, attempts FROM idem.runs WHERE run_id = 'tam-lists';
ROLLBACK TO t;
-- untouched, the run goes on
SELECT replayed FROM idem_call(NULL, 'SELECT 1 AS one', run_id => 'tam-lists', step => 'a');
SELECT status, done_steps, attempts FROM idem.runs WHERE run_id = 'tam-lists';
ROLLBACK;

-- after every rollback the real tables serve again
SELECT replayed FROM idem_execute_ex('tam:1', 'SELECT 1 AS one');
SELECT count(*) AS tam_keys FROM idem.keys WHERE key LIKE 'tam:%';
DELETE FROM idem.keys WHERE key LIKE 'tam:%';
