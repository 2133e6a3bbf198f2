--
-- internals: idem writes its tables without the executor, yet the
-- partial indexes and CHECK constraints an administrator adds to them are
-- maintained and obeyed on every write (insert and in-place update), and
-- the outbox's queries leave the session's jit setting alone
--
CREATE TABLE int_biz (id serial PRIMARY KEY, what text NOT NULL);

-- A partial unique index on idem.runs: one running 'int-' run per owner.
-- Completing a run rewrites its row (status is in the predicate, so the
-- update is not HOT); the completed version must not enter the index.
CREATE UNIQUE INDEX runs_int_one_running ON idem.runs (owner)
  WHERE status = 'running' AND run_id LIKE 'int-%';
SELECT created FROM idem_run_begin('int-r1', steps => ARRAY['a']);
SELECT idem_step('int-r1', 'a', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'r1 a') ->> 'rowcount';
SELECT status FROM idem_run_status('int-r1');
-- the next run starts: r1 is not running any more
SELECT created FROM idem_run_begin('int-r2', steps => ARRAY['a', 'b']);
-- and the index still enforces its rule on new runs
SELECT created FROM idem_run_begin('int-r3', steps => ARRAY['a']);
\echo :LAST_ERROR_SQLSTATE
-- read through the index alone: exactly the running run
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT run_id FROM idem.runs WHERE status = 'running' AND run_id LIKE 'int-%';
RESET enable_seqscan;
RESET enable_bitmapscan;
-- steps that leave status alone stay HOT updates
BEGIN;
SELECT idem_step('int-r2', 'a', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'r2 a') ->> 'rowcount';
SELECT pg_stat_get_xact_tuples_hot_updated('idem.runs'::regclass) > 0 AS hot;
COMMIT;

-- A CHECK constraint on idem.runs, NOT VALID (rows of other tests may
-- break it): enforced on the update a step makes.  The refused step
-- changes nothing, its business row included.
ALTER TABLE idem.runs ADD CONSTRAINT runs_int_two_steps
  CHECK (run_id NOT LIKE 'int-%' OR pg_catalog.cardinality(done_steps) <= 1) NOT VALID;
SELECT idem_step('int-r2', 'b', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'r2 b') ->> 'rowcount';
\echo :LAST_ERROR_SQLSTATE
SELECT what FROM int_biz ORDER BY id;
SELECT status, steps_done FROM idem_run_status('int-r2');
ALTER TABLE idem.runs DROP CONSTRAINT runs_int_two_steps;
-- dropped, the step goes through
SELECT idem_step('int-r2', 'b', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'r2 b') ->> 'rowcount';
SELECT status, steps_done FROM idem_run_status('int-r2');

-- A CHECK constraint on idem.keys: enforced on the key record's insert,
-- and the refused call leaves neither a record nor its business row.
ALTER TABLE idem.keys ADD CONSTRAINT keys_int_short
  CHECK (key NOT LIKE 'int-%' OR pg_catalog.octet_length(key) <= 12) NOT VALID;
SELECT idem_execute('int-k-too-long', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'too long') ->> 'rowcount';
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem.keys WHERE key = 'int-k-too-long';
SELECT count(*) FROM int_biz WHERE what = 'too long';
SELECT idem_execute('int-k-ok', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'short') ->> 'rowcount';
SELECT replayed FROM idem_execute_ex('int-k-ok', 'INSERT INTO int_biz (what) VALUES ($1) RETURNING what', 'short');

-- The same constraint on the restamp of a record whose transaction
-- outlived the commit slack: the record's expiry moves at commit, and a
-- constraint on expires_at is checked then.
ALTER TABLE idem.keys ADD CONSTRAINT keys_int_expiry
  CHECK (key <> 'int-k-late' OR expires_at < created_at + interval '1 hour 1.5 seconds') NOT VALID;
BEGIN;
SET LOCAL idem.ttl = '1h';
SELECT idem_execute('int-k-late', 'SELECT 1 AS one') ->> 'rowcount';
SELECT pg_sleep(1.2);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem.keys WHERE key = 'int-k-late';
ALTER TABLE idem.keys DROP CONSTRAINT keys_int_expiry;

-- A CHECK constraint on idem.keys whose function runs a query, at the
-- restamp of a lingering transaction's records: COMMIT has popped its
-- statement's snapshot, and the query needs one.  The record is
-- restamped; a key the function refuses fails the COMMIT.
CREATE TABLE int_blocked (key text PRIMARY KEY);
CREATE FUNCTION int_key_allowed(k text) RETURNS boolean STABLE LANGUAGE plpgsql
  AS $$ BEGIN RETURN NOT EXISTS (SELECT FROM public.int_blocked b WHERE b.key = k); END $$;
ALTER TABLE idem.keys ADD CONSTRAINT keys_int_allowed
  CHECK (key NOT LIKE 'int-c-%' OR public.int_key_allowed(key)) NOT VALID;
BEGIN;
SET LOCAL idem.ttl = '1d';
SELECT idem_execute('int-c-ok', 'SELECT 1 AS one') ->> 'rowcount';
SELECT pg_sleep(1.2);
COMMIT;
SELECT expires_at - created_at > interval '1 day 1 second' AS restamped
  FROM idem.keys WHERE key = 'int-c-ok';
BEGIN;
SELECT idem_execute('int-c-banned', 'SELECT 1 AS one') ->> 'rowcount';
INSERT INTO int_blocked VALUES ('int-c-banned');
SELECT pg_sleep(1.2);
COMMIT;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem.keys WHERE key = 'int-c-banned';
ALTER TABLE idem.keys DROP CONSTRAINT keys_int_allowed;
DROP FUNCTION int_key_allowed(text);
DROP TABLE int_blocked;

-- A partial unique index on idem.keys: one 'int-u-' key per owner.  A
-- restamp rewrites the record (expires_at is indexed, so not HOT); the
-- restamped record, outside the predicate, must not enter the index.
CREATE UNIQUE INDEX keys_int_one_u ON idem.keys (owner) WHERE key LIKE 'int-u-%';
BEGIN;
SELECT idem_execute('int-late', 'SELECT 1 AS one') ->> 'rowcount';
SELECT pg_sleep(1.2);
COMMIT;
SELECT expires_at - created_at > interval '1 day 1 second' AS restamped
  FROM idem.keys WHERE key = 'int-late';
SELECT idem_execute('int-u-1', 'SELECT 1 AS one') ->> 'rowcount';
SELECT idem_execute('int-u-2', 'SELECT 1 AS one') ->> 'rowcount';
\echo :LAST_ERROR_SQLSTATE
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT key FROM idem.keys WHERE key LIKE 'int-u-%';
RESET enable_seqscan;
RESET enable_bitmapscan;

DROP INDEX idem.keys_int_one_u;
DROP INDEX idem.runs_int_one_running;
ALTER TABLE idem.keys DROP CONSTRAINT keys_int_short;
-- gone, the writes are unconstrained again
SELECT idem_execute('int-k-now-long-enough', 'SELECT 1 AS one') ->> 'rowcount';
DELETE FROM idem.keys WHERE key LIKE 'int-%'
   OR key IN (idem_step_key('int-r1', 'a'), idem_step_key('int-r2', 'a'), idem_step_key('int-r2', 'b'));
DELETE FROM idem.runs WHERE run_id LIKE 'int-%';
DROP TABLE int_biz;

-- The outbox's queries are planned without JIT by idem's planner hook,
-- not by changing the setting: code they run (here a trigger an
-- administrator put on idem.outbox, fired by the purge's DELETE of a
-- delivered event)
-- sees the session's jit, and a session-level SET it makes holds
-- afterwards.
-- (test/t/140_outbox_jit.pl checks that nothing idem plans is
-- JIT-compiled.)
SELECT idem_outbox_create_topic('int-jit');
CREATE TABLE int_jit_seen (during text);
CREATE FUNCTION int_jit_note() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO public.int_jit_seen VALUES (pg_catalog.current_setting('jit'));
	PERFORM pg_catalog.set_config('jit', 'off', false);
	RETURN NULL;
END $$;
CREATE TRIGGER int_jit_note AFTER DELETE ON idem.outbox
  FOR EACH ROW EXECUTE FUNCTION int_jit_note();
SET idem.outbox_keep_delivered = on;
SET idem.outbox_retention = 0;
SET jit = on;
SET idem.outbox_topic = 'int-jit';
SELECT idem_execute('int-j1', 'SELECT 1 AS one') ->> 'rowcount';
RESET idem.outbox_topic;
SELECT count(idem_outbox_ack(event_id, lease_token)) AS acked FROM idem_outbox_claim('int-jit');
SELECT idem_outbox_purge() AS purged;
SELECT during FROM int_jit_seen;
SHOW jit;
-- without the trigger's SET, the session's own setting comes back
RESET jit;
SET jit = on;
SET idem.outbox_topic = 'int-jit';
SELECT idem_execute('int-j2', 'SELECT 1 AS one') ->> 'rowcount';
RESET idem.outbox_topic;
DROP TRIGGER int_jit_note ON idem.outbox;
SELECT count(idem_outbox_ack(event_id, lease_token)) AS acked FROM idem_outbox_claim('int-jit');
SELECT idem_outbox_purge() AS purged;
SHOW jit;
RESET jit;
RESET idem.outbox_keep_delivered;
RESET idem.outbox_retention;
DROP FUNCTION int_jit_note();
DROP TABLE int_jit_seen;
DELETE FROM idem.outbox WHERE topic = 'int-jit';
DELETE FROM idem.outbox_topics WHERE topic = 'int-jit';
DELETE FROM idem.keys WHERE key IN ('int-j1', 'int-j2');
