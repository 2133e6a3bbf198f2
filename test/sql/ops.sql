--
-- ops: idem_stats, the audit trail, retention and idem_purge_all() in a
-- server that did not preload idem (issue 11).  The preloaded side (the
-- counters moving, the worker, the queue of rejected attempts) is
-- test/t/110_ops_preload.pl.
--
\set VERBOSITY default
CREATE ROLE regress_idem_payer;
CREATE ROLE regress_idem_reviewer;
CREATE TABLE ops_pay (id serial PRIMARY KEY, amount int);
GRANT INSERT, SELECT ON ops_pay TO regress_idem_payer;
GRANT USAGE ON SEQUENCE ops_pay_id_seq TO regress_idem_payer;

-- without shared_preload_libraries the view answers zeros for this
-- database, and says why once per session
SELECT datname = current_database() AS this_db, executions, replays,
       mismatches, lock_waits, lock_wait_time, audit_dropped, stats_reset
  FROM idem_stats;
SELECT count(*) AS rows_second_time FROM idem_stats;
-- per role too: one row of zeros for this database and the current role
SELECT datname = current_database() AS this_db, rolname = current_user AS this_role,
       executions, replays, stats_reset
  FROM idem_stats_roles;
-- everyone reads the stats; resetting them is for administrators
SET ROLE regress_idem_payer;
SELECT count(*) AS payer_reads FROM idem_stats;
SELECT rolname FROM idem_stats_roles;
SELECT idem_stats_reset();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT idem_stats_reset();

-- idem.audit: only a superuser sets it (so a role cannot lower the level
-- imposed on it), and only to a known level
SHOW idem.audit;
SET idem.audit = 'everything';
\echo :LAST_ERROR_SQLSTATE
ALTER ROLE regress_idem_payer SET idem.audit = 'executions';
SET ROLE regress_idem_payer;
SET idem.audit = 'off';
\echo :LAST_ERROR_SQLSTATE
SET idem.audit_retention = 0;
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- (the range in the message gains units in 17: the SQLSTATE alone)
\set VERBOSITY sqlstate
SET idem.audit_retention = -1;
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
-- the worker's settings come from the configuration file only
SET idem.purge_interval = 5;
\echo :LAST_ERROR_SQLSTATE
SET idem.purge_batch_size = 10;
\echo :LAST_ERROR_SQLSTATE
-- and these exist only when idem is preloaded
SHOW idem.audit_queue_size;
\echo :LAST_ERROR_SQLSTATE

-- off (the default) writes nothing
SET ROLE regress_idem_payer;
SELECT idem_execute('ops:0', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 5) ->> 'rowcount' AS rowcount;
RESET ROLE;
SELECT count(*) AS entries_with_audit_off FROM idem.audit;

-- executions: one entry per execution and per replay, in the caller's
-- transaction, named for the calling role
SET idem.audit = 'executions';
SET application_name = 'ops-test';
SET ROLE regress_idem_payer;
SELECT idem_execute('ops:1', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 10) ->> 'rowcount' AS rowcount;
SELECT idem_execute('ops:1', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 10) ->> 'rowcount' AS rowcount;
-- a mismatch is not an execution: not recorded at this level
SELECT idem_execute('ops:1', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 11);
\echo :LAST_ERROR_SQLSTATE
-- rolled back with the caller: no entry for what did not happen
BEGIN;
SELECT idem_execute('ops:2', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 20) ->> 'rowcount' AS rowcount;
ROLLBACK;
RESET ROLE;
SELECT key, owner, outcome, sqlstate, run_id, step, application_name,
       client_addr IS NOT DISTINCT FROM inet_client_addr() AS client_addr,
       backend_pid = pg_backend_pid() AS this_backend,
       xid IS NOT NULL AS has_xid, length(fingerprint) AS fingerprint_bytes
  FROM idem_audit ORDER BY at;
-- the replay's entry carries the fingerprint of the request it replayed
SELECT count(DISTINCT fingerprint) AS fingerprints,
       bool_and(fingerprint = (SELECT fingerprint FROM idem.keys WHERE key = 'ops:1')) AS same_as_record
  FROM idem_audit WHERE key = 'ops:1';

-- all, without preloading: executions and replays are recorded, rejected
-- attempts cannot be, and the first one in a session says so
SET idem.audit = 'all';
SET ROLE regress_idem_payer;
SELECT idem_execute('ops:1', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 12);
SELECT idem_execute('ops:1', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 13);
SELECT idem_execute('ops:3', 'INSERT INTO ops_pay (amount) VALUES ($1) RETURNING amount', 30) ->> 'rowcount' AS rowcount;
RESET ROLE;
SELECT key, outcome FROM idem_audit ORDER BY at;

-- reading needs a grant; nobody but the owner changes an entry
SET ROLE regress_idem_reviewer;
SELECT count(*) FROM idem_audit;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) FROM idem_audit_history(key => 'ops:1');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
GRANT SELECT ON idem_audit TO regress_idem_reviewer;
GRANT EXECUTE ON FUNCTION idem_audit_history(text, text) TO regress_idem_reviewer;
SET ROLE regress_idem_reviewer;
SELECT count(*) AS reviewer_sees FROM idem_audit;
DELETE FROM idem_audit;
\echo :LAST_ERROR_SQLSTATE
UPDATE idem_audit SET outcome = 'replayed';
\echo :LAST_ERROR_SQLSTATE
DELETE FROM idem.audit;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idem.audit (at, key, owner, outcome, pid) VALUES (now(), 'x', 'regress_idem_reviewer', 'executed', 1);
\echo :LAST_ERROR_SQLSTATE
-- the payer, who made the calls, cannot read them either
SET ROLE regress_idem_payer;
SELECT count(*) FROM idem_audit;
\echo :LAST_ERROR_SQLSTATE

-- export: one key's history as CSV and as JSON lines, oldest first
SET ROLE regress_idem_reviewer;
COPY (SELECT key, owner, outcome, sqlstate, application_name
        FROM idem_audit_history(key => 'ops:1'))
  TO STDOUT WITH (FORMAT csv, HEADER);
SELECT json_build_object('key', h.key, 'outcome', h.outcome, 'owner', h.owner)
  FROM idem_audit_history('ops:1') h;
-- one JSON object per entry with every column
SELECT array_agg(k ORDER BY k) AS json_keys
  FROM (SELECT json_object_keys(row_to_json(h)) AS k
          FROM idem_audit_history(key => 'ops:3') h) s;
-- a key nobody used has no history; NULL arguments mean "any"
SELECT count(*) AS unknown_key FROM idem_audit_history(key => 'ops:none');
SELECT count(*) AS all_entries FROM idem_audit_history();
RESET ROLE;

-- retention: idem_purge_audit() removes entries older than
-- idem.audit_retention, in batches; 0 keeps everything
UPDATE idem.audit SET at = at - interval '2 days' WHERE key = 'ops:1';
SELECT idem_purge_audit(100) AS purged_with_retention_0;
SET idem.audit_retention = '1d';
SELECT idem_purge_audit(1) AS first_batch;
SELECT idem_purge_audit(100) AS second_batch;
SELECT key, count(*) FROM idem_audit GROUP BY key ORDER BY key;
SELECT idem_purge_audit(0);
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_idem_payer;
SELECT idem_purge_audit(10);
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- idem_purge_all(): every expired key and old entry, committing between
-- batches, never a live key; for pg_cron, outside a transaction block
SET idem.audit = 'off';
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT 'ops:expired:' || g, 'regress_idem_payer', '\x00', '{}', now() - interval '2 days', now() - interval '1 day', 2
  FROM generate_series(1, 25) g;
UPDATE idem.audit SET at = at - interval '2 days' WHERE key = 'ops:3';
SELECT count(*) AS live_before FROM idem.keys WHERE expires_at > now() AND owner = 'regress_idem_payer'::regrole;
-- each batch is a transaction: the 25 expired keys take 3 batches of 10 and
-- the old entry 1, so the transaction counter moves by at least 4 (one
-- transaction for all would move it by 1)
SELECT txid_current() AS xid_before \gset
CALL idem_purge_all(10);
SELECT txid_current() - :xid_before >= 4 AS committed_per_batch;
SELECT count(*) AS expired_left FROM idem.keys WHERE expires_at <= now();
SELECT count(*) AS live_after FROM idem.keys WHERE expires_at > now() AND owner = 'regress_idem_payer'::regrole;
SELECT count(*) AS old_entries_left FROM idem.audit WHERE at < now() - interval '1 day';
BEGIN;
CALL idem_purge_all();
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_idem_payer;
CALL idem_purge_all();
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;

-- idem.run_retention: idem_purge_all() also removes the runs finished
-- longer ago, with their steps' records; 0 (the default) keeps them all,
-- but not a dropped role's run, which idem_purge() removes whatever the
-- setting (test/sql/security.sql)
CREATE ROLE regress_idem_gone;
SELECT status FROM idem_run_begin('ops-aged', steps => ARRAY['a']);
SELECT idem_step('ops-aged', 'a', 'SELECT 1 AS one') ->> 'rowcount' AS rowcount;
SELECT status FROM idem_run_begin('ops-young', steps => ARRAY['a']);
SELECT idem_step('ops-young', 'a', 'SELECT 1 AS one') ->> 'rowcount' AS rowcount;
SELECT status FROM idem_run_begin('ops-running', steps => ARRAY['a']);
SET ROLE regress_idem_gone;
SELECT status FROM idem_run_begin('ops-orphan');
RESET ROLE;
DROP ROLE regress_idem_gone;
UPDATE idem.runs SET finished_at = finished_at - interval '2 days' WHERE run_id = 'ops-aged';
CALL idem_purge_all();
SELECT run_id, status FROM idem.runs WHERE run_id LIKE 'ops-%' ORDER BY run_id;
SET idem.run_retention = '1d';
CALL idem_purge_all();
SELECT run_id, status FROM idem.runs WHERE run_id LIKE 'ops-%' ORDER BY run_id;
SELECT count(*) AS aged_step_records FROM idem.keys WHERE key = idem_step_key('ops-aged', 'a');
SELECT count(*) AS young_step_records FROM idem.keys WHERE key = idem_step_key('ops-young', 'a');
-- (PostgreSQL 17 prints the bounds with their unit: the code alone here)
\set VERBOSITY sqlstate
SET idem.run_retention = -1;
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_idem_payer;
SET idem.run_retention = '1d';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
RESET idem.run_retention;
DELETE FROM idem.runs WHERE run_id LIKE 'ops-%';
DELETE FROM idem.keys WHERE key LIKE 'idem.step:ops-%';

-- the audit table is checked like idem's others: 55000 on another shape
BEGIN;
SET LOCAL idem.audit = 'executions';
ALTER TABLE idem.audit ALTER COLUMN outcome DROP NOT NULL;
SELECT idem_execute('ops:4', 'SELECT 1 AS one');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
ALTER TABLE idem.audit RENAME TO audit_moved;
CREATE TABLE idem.audit (LIKE idem.audit_moved INCLUDING ALL);
SELECT idem_execute('ops:4', 'SELECT 1 AS one');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE

-- the audit index's insert state is kept between entries: a REINDEX (a
-- new relcache entry for the index) in between is picked up.  The REINDEX
-- summarizes the first entry's range, so the index finds the second entry
-- only if its insert widened that summary.
TRUNCATE idem.audit;
SET idem.audit = 'executions';
SELECT idem_execute('ops:5', 'SELECT 5 AS five') ->> 'rowcount' AS rowcount;
SELECT at AS first_at FROM idem.audit \gset
REINDEX INDEX idem.audit_at_idx;
SELECT idem_execute('ops:5', 'SELECT 5 AS five') ->> 'rowcount' AS rowcount;
BEGIN;
SET LOCAL idem.audit = 'off';
SET LOCAL enable_seqscan = off;
SELECT outcome FROM idem.audit WHERE at > :'first_at';
ROLLBACK;
SET idem.audit = 'off';

RESET idem.audit_retention;
RESET application_name;
ALTER ROLE regress_idem_payer RESET ALL;
REVOKE ALL ON idem_audit FROM regress_idem_reviewer;
REVOKE ALL ON FUNCTION idem_audit_history(text, text) FROM regress_idem_reviewer;
DROP TABLE ops_pay;
DROP ROLE regress_idem_payer;
DROP ROLE regress_idem_reviewer;
TRUNCATE idem.audit;
