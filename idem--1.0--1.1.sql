/* idem--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '1.1'" to load this file. \quit

/*
 * Keys become per role: (owner, key).  Records written by 1.0 keep their
 * version 1 fingerprints, which idem 1.1 still compares for them.
 */
ALTER TABLE idem.keys
	ADD COLUMN fingerprint_version smallint NOT NULL DEFAULT 1;
ALTER TABLE idem.keys ALTER COLUMN fingerprint_version DROP DEFAULT;
ALTER TABLE idem.keys
	DROP CONSTRAINT keys_pkey,
	ADD CONSTRAINT keys_pkey PRIMARY KEY (owner, key);

-- The secret that keys the hash naming each key's lock, so that a role
-- reading pg_locks cannot confirm a guess of another role's key.  Exactly
-- one row, never changed while the server runs (every backend must agree on
-- a key's lock).  Not a configuration table: a restored database gets a
-- new secret from CREATE EXTENSION, which is fine because locks do not
-- outlive a server.
CREATE TABLE idem.lock_seed (
	seed		bigint NOT NULL
);
INSERT INTO idem.lock_seed (seed)
SELECT ('x' OPERATOR(pg_catalog.||)
		pg_catalog.substr(pg_catalog.md5(pg_catalog.gen_random_uuid()::pg_catalog.text), 1, 16)
	   )::pg_catalog.bit(64)::pg_catalog.int8;

-- The 1.0 entry points refuse to run; point every function at 1.1's.
CREATE OR REPLACE FUNCTION @extschema@.idem_execute(key text, sql text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION @extschema@.idem_execute(key text, sql text, VARIADIC args "any")
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	VARIADIC args "any",
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION @extschema@.idem_purge(batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

/*
 * ---- Operations (issue 11): stats, purge worker, audit trail ----
 */

-- idem_stats: counters per database, kept in shared memory (requires
-- shared_preload_libraries = 'idem'; without it one row of zeros and a
-- notice).  Readable by everyone, like pg_stat_database; resetting is for
-- administrators.
CREATE FUNCTION @extschema@.idem_stats(
	OUT dbid oid,
	OUT executions bigint,
	OUT replays bigint,
	OUT mismatches bigint,
	OUT in_progress bigint,
	OUT conflicts bigint,
	OUT sequencing_errors bigint,
	OUT errors bigint,
	OUT lock_waits bigint,
	OUT lock_wait_time double precision,
	OUT purged_keys bigint,
	OUT purged_audit_entries bigint,
	OUT outbox_written bigint,
	OUT audit_written bigint,
	OUT audit_queued bigint,
	OUT audit_dropped bigint,
	OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW @extschema@.idem_stats AS
SELECT s.dbid, d.datname, s.executions, s.replays, s.mismatches,
	   s.in_progress, s.conflicts, s.sequencing_errors, s.errors,
	   s.lock_waits, s.lock_wait_time, s.purged_keys, s.purged_audit_entries,
	   s.outbox_written, s.audit_written, s.audit_queued, s.audit_dropped,
	   s.stats_reset
  FROM @extschema@.idem_stats() s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.dbid;
GRANT SELECT ON @extschema@.idem_stats TO PUBLIC;

CREATE FUNCTION @extschema@.idem_stats_reset()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_stats_reset() FROM PUBLIC;

-- The audit trail (idem.audit = executions | all).  Append-only: no role
-- but the extension's owner can change it, since no role has any
-- privilege on the schema idem.  Read through idem_audit, which needs a
-- grant (GRANT SELECT ON idem_audit TO reviewer).  outcome is one of
-- executed, replayed, mismatch, in_progress, conflict, sequencing, error;
-- sqlstate is set for the last five.  run_id and step are set for calls
-- made by workflow runs.
CREATE TABLE idem.audit (
	at			timestamptz NOT NULL,
	key			text COLLATE "C" NOT NULL,
	owner		regrole NOT NULL,
	run_id		text,
	step		text,
	outcome		text NOT NULL,
	fingerprint	bytea,
	sqlstate	text,
	xid			xid8,
	pid			integer NOT NULL,
	application_name text,
	client_addr	inet
);
CREATE INDEX audit_at_idx ON idem.audit (at);
SELECT pg_catalog.pg_extension_config_dump('idem.audit', '');

CREATE VIEW @extschema@.idem_audit AS
SELECT at, key, owner, run_id, step, outcome, fingerprint, sqlstate,
	   xid, pid AS backend_pid, application_name, client_addr
  FROM idem.audit;
REVOKE ALL ON @extschema@.idem_audit FROM PUBLIC;

-- One key's or one run's history, oldest first: the export.
--   COPY (SELECT * FROM idem_audit_history(key => 'k')) TO STDOUT (FORMAT csv, HEADER)
--   psql -XAtc "SELECT row_to_json(h) FROM idem_audit_history(run_id => 'r') h"
CREATE FUNCTION @extschema@.idem_audit_history(key text DEFAULT NULL,
											   run_id text DEFAULT NULL)
RETURNS SETOF @extschema@.idem_audit
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
SELECT a.* FROM @extschema@.idem_audit a
 WHERE ($1 IS NULL OR a.key OPERATOR(pg_catalog.=) $1 COLLATE "C")
   AND ($2 IS NULL OR a.run_id OPERATOR(pg_catalog.=) $2)
 ORDER BY a.at
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_audit_history(text, text) FROM PUBLIC;

-- Entries older than idem.audit_retention (0 keeps them all).
CREATE FUNCTION @extschema@.idem_purge_audit(batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge_audit_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_purge_audit(integer) FROM PUBLIC;

-- Everything the purge worker does, for installations without
-- shared_preload_libraries (a pg_cron job: CALL idem_purge_all()).  It
-- commits after each batch, so it must be CALLed outside a transaction
-- block, and cannot carry a SET search_path clause (a procedure with one
-- may not commit): every name in it is qualified instead.
CREATE PROCEDURE @extschema@.idem_purge_all(batch_size integer DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
	batch integer := COALESCE(batch_size,
		pg_catalog.current_setting('idem.purge_batch_size', true)::integer,
		10000);
	n bigint;
BEGIN
	LOOP
		n := @extschema@.idem_purge(batch);
		COMMIT;
		EXIT WHEN n OPERATOR(pg_catalog.<) batch;
	END LOOP;
	LOOP
		n := @extschema@.idem_purge_audit(batch);
		COMMIT;
		EXIT WHEN n OPERATOR(pg_catalog.<) batch;
	END LOOP;
	-- MERGE POINT (issue 10): delivered outbox events past retention
END
$$;
REVOKE ALL ON PROCEDURE @extschema@.idem_purge_all(integer) FROM PUBLIC;
