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

-- Workflow runs (idem_run_begin, idem_step, ...).  A run belongs to the
-- role that began it, like a key.  steps is the declared order (NULL: any
-- steps in any order).  done_steps names the completed steps in the order
-- they completed (under a declared order: its first ones), attempts counts,
-- per completed step, its execution and every committed replay.  Each
-- completed step's response is an ordinary record in idem.keys, under the
-- key idem_step_key(run_id, step), with no expiry: finished work stays
-- finished until idem_run_purge() removes the finished run.  One row per
-- run, updated in place (HOT), so a step costs one row update.
CREATE TABLE idem.runs (
	run_id		text COLLATE "C" NOT NULL,
	owner		regrole NOT NULL,
	steps		text[] COLLATE "C",
	input		jsonb,
	status		text NOT NULL,
	started_at	timestamptz NOT NULL,
	finished_at	timestamptz,
	last_error	text,
	done_steps	text[] COLLATE "C" NOT NULL,
	attempts	integer[] NOT NULL,
	CONSTRAINT runs_pkey PRIMARY KEY (owner, run_id),
	CONSTRAINT runs_status_check
		CHECK (status OPERATOR(pg_catalog.=) ANY ('{running,completed,failed}'::pg_catalog.text[]))
);
SELECT pg_catalog.pg_extension_config_dump('idem.runs', '');

-- Settings that change a built-in type's text output are pinned, so that a
-- derived key is the same string in every session.
CREATE FUNCTION @extschema@.idem_key(VARIADIC parts "any")
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_key'
LANGUAGE C STABLE PARALLEL SAFE
SET DateStyle = 'ISO, YMD' SET TimeZone = 'UTC' SET IntervalStyle = 'postgres'
SET extra_float_digits = 1 SET bytea_output = 'hex' SET lc_monetary = 'C'
SET xmlbinary = 'base64';

CREATE FUNCTION @extschema@.idem_state_hash(value anyelement)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_state_hash'
LANGUAGE C STABLE PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_run_begin(run_id text,
	steps text[] DEFAULT NULL, input pg_catalog.jsonb DEFAULT NULL,
	OUT status text, OUT next_step text, OUT created boolean,
	OUT started_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_run_begin'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step(run_id text, step text, sql text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step(run_id text, step text, sql text,
	VARIADIC args "any")
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step_complete(run_id text, step text,
	result pg_catalog.jsonb)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step_key(run_id text, step text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_step_key'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION @extschema@.idem_run_fail(run_id text, reason text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_resume(run_id text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_resume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_complete(run_id text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_status(run_id text)
RETURNS TABLE (status text, next_step text, steps_done integer,
	steps_total integer, started_at timestamptz, finished_at timestamptz,
	last_error text, input pg_catalog.jsonb)
AS 'MODULE_PATHNAME', 'idem_run_status'
LANGUAGE C STABLE PARALLEL UNSAFE ROWS 1;

CREATE FUNCTION @extschema@.idem_run_steps(run_id text)
RETURNS TABLE (ordinal integer, step text, state text,
	response pg_catalog.jsonb, executed_at timestamptz, attempts integer,
	step_key text)
AS 'MODULE_PATHNAME', 'idem_run_steps'
LANGUAGE C STABLE PARALLEL UNSAFE ROWS 10;

-- Removing finished runs crosses roles, so it is not for everyone.  A run
-- goes with its steps' key records.  Runs of roles that no longer exist go
-- too, whatever their status.
CREATE FUNCTION @extschema@.idem_run_purge(finished_before timestamptz)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH gone AS (
	DELETE FROM idem.runs r
	 WHERE (r.status OPERATOR(pg_catalog.<>) 'running'
			AND r.finished_at OPERATOR(pg_catalog.<) finished_before)
		OR NOT EXISTS (SELECT FROM pg_catalog.pg_roles a
						WHERE a.oid OPERATOR(pg_catalog.=) r.owner)
	RETURNING r.owner, r.run_id, r.done_steps
), keys AS (
	DELETE FROM idem.keys k
	 USING gone g CROSS JOIN LATERAL pg_catalog.unnest(g.done_steps) AS s(step)
	 WHERE k.owner OPERATOR(pg_catalog.=) g.owner
	   AND k.key OPERATOR(pg_catalog.=) @extschema@.idem_step_key(g.run_id, s.step)
)
SELECT pg_catalog.count(*) FROM gone
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_run_purge(timestamptz) FROM PUBLIC;

-- What a client should do after an error with this SQLSTATE: retry,
-- retry_later or never.  Every error idem raises says the same in its hint.
CREATE FUNCTION @extschema@.idem_retry_advice(sqlstate text)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_retry_advice'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- What idem_execute() would do now, and for execute the response it would
-- give, computed and rolled back: nothing is recorded, no lock is kept.
CREATE FUNCTION @extschema@.idem_dry_run(key text, sql text,
	OUT action text, OUT response pg_catalog.jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_dry_run'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_dry_run(key text, sql text,
	VARIADIC args "any", OUT action text, OUT response pg_catalog.jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_dry_run'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Drivers that send parameters without types (node-postgres, postgres.js,
-- psycopg 3 for strings) reach these: every argument is given the type the
-- statement infers for its $n and converted from its text, so
-- ['inv-1', '25.00'] is the same request as 'inv-1'::text, 25.00::numeric.
CREATE FUNCTION @extschema@.idem_execute(key text, sql text, VARIADIC args text[])
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	VARIADIC args text[],
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step(run_id text, step text, sql text,
	VARIADIC args text[])
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_dry_run(key text, sql text,
	VARIADIC args text[], OUT action text, OUT response pg_catalog.jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_dry_run'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- One statement, one round trip: the call and its options (for this call
-- only); args are typed by the statement.  With run_id and step (key NULL)
-- it is a workflow step.
CREATE FUNCTION @extschema@.idem_call(key text, sql text,
	args text[] DEFAULT '{}'::pg_catalog.text[],
	outbox_topic text DEFAULT NULL, ttl interval DEFAULT NULL,
	wait boolean DEFAULT NULL, run_id text DEFAULT NULL, step text DEFAULT NULL,
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_call'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
/*
 * ------------------------------------------------------------------------
 * Outbox delivery (issue 10): leases, retries, dead letters, topic
 * registry, states view, purge of delivered events.  src/outbox.c
 * implements the functions; it reaches the tables by OID (writer, topic
 * check) or through SPI with schema-qualified names and operators.
 * ------------------------------------------------------------------------
 */

-- Topics and the roles that may publish to / consume from each.  A topic
-- that is not registered here cannot be written or claimed, by anyone.
-- Membership counts (a role granted to a listed role may use the topic);
-- superusers may use every registered topic.
CREATE TABLE idem.outbox_topics (
	topic		text COLLATE "C" NOT NULL,
	publishers	regrole[] NOT NULL,
	consumers	regrole[] NOT NULL,
	created_at	timestamptz NOT NULL,
	CONSTRAINT outbox_topics_pkey PRIMARY KEY (topic)
);
SELECT pg_catalog.pg_extension_config_dump('idem.outbox_topics', '');
-- Backends keep the topic checks that passed until the registry changes,
-- however it is written.
CREATE FUNCTION @extschema@.idem_outbox_topics_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_outbox_topics_changed'
LANGUAGE C;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_topics_changed() FROM PUBLIC;
CREATE TRIGGER outbox_topics_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem.outbox_topics
	FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_outbox_topics_changed();

-- Delivery state of each event.  next_attempt_at is the due time: a claim
-- moves it to the end of the lease, so leased events leave the head of the
-- claim's index scan and an expired lease is simply due again.
-- Topics, run ids and steps are names compared byte by byte, as keys are:
-- COLLATE "C" spares every index insert and claim a strcoll() per
-- comparison.
ALTER TABLE idem.outbox
	ALTER COLUMN topic TYPE text COLLATE "C",
	ADD COLUMN run_id text COLLATE "C",
	ADD COLUMN step text COLLATE "C",
	ADD COLUMN state text NOT NULL DEFAULT 'pending',
	ADD COLUMN attempts integer NOT NULL DEFAULT 0,
	ADD COLUMN next_attempt_at timestamptz NOT NULL DEFAULT '-infinity',
	ADD COLUMN lease_token uuid,
	ADD COLUMN leased_by regrole,
	ADD COLUMN lease_holder text,
	ADD COLUMN last_error text,
	ADD COLUMN delivered_at timestamptz,
	ADD CONSTRAINT outbox_state_check
		CHECK (state OPERATOR(pg_catalog.=) ANY
			   (ARRAY['pending', 'leased', 'delivered', 'dead']::pg_catalog.text[]));
UPDATE idem.outbox SET next_attempt_at = created_at;
ALTER TABLE idem.outbox
	ALTER COLUMN state DROP DEFAULT,
	ALTER COLUMN attempts DROP DEFAULT,
	ALTER COLUMN next_attempt_at DROP DEFAULT;
-- Events written before delivery existed belong to topics that must exist.
INSERT INTO idem.outbox_topics (topic, publishers, consumers, created_at)
SELECT DISTINCT topic, '{}'::pg_catalog.regrole[], '{}'::pg_catalog.regrole[],
	pg_catalog.now() FROM idem.outbox;

-- No reader used it, and every non-HOT update (claim, ack) would pay it.
DROP INDEX idem.outbox_created_at_idx;
-- The claim's scan: due events of a topic, oldest due first.
CREATE INDEX outbox_due_idx ON idem.outbox (topic, next_attempt_at)
	WHERE state OPERATOR(pg_catalog.=) ANY
		  (ARRAY['pending', 'leased']::pg_catalog.text[]);
-- The purge's scan: delivered events by delivery time.
CREATE INDEX outbox_delivered_idx ON idem.outbox (delivered_at)
	WHERE state OPERATOR(pg_catalog.=) 'delivered'::pg_catalog.text;
-- The claim's holdback: a run's undelivered events (a run has few; the
-- probe filters topic and age on them).  One narrow column: every event of
-- a workflow step pays this insert.
CREATE INDEX outbox_run_idx ON idem.outbox (run_id)
	WHERE run_id IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY
		  (ARRAY['pending', 'leased']::pg_catalog.text[]);

-- With wait, a claim that finds nothing sleeps until an event of the topic
-- commits (as idem_outbox_wait does, at most wait) and claims once more:
-- one statement, so one server session even behind a transaction pooler.
CREATE FUNCTION @extschema@.idem_outbox_claim(topic text,
	max_events integer DEFAULT 10, lease interval DEFAULT '30 s',
	consumer text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS TABLE (event_id uuid, key text, owner regrole, topic text,
	payload pg_catalog.jsonb, run_id text, step text, attempt integer,
	lease_token uuid, created_at timestamptz, lease_until timestamptz)
AS 'MODULE_PATHNAME', 'idem_outbox_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 10;

CREATE FUNCTION @extschema@.idem_outbox_ack(event_id uuid, lease_token uuid)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_ack'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The acks of a batch in one statement, all or nothing.
CREATE FUNCTION @extschema@.idem_outbox_ack_batch(event_ids uuid[], lease_tokens uuid[])
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_outbox_ack_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_fail(event_id uuid, lease_token uuid,
	error text, retry_after interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_outbox_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_requeue(event_id uuid)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_requeue'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A handler that needs longer keeps its event: the lease runs on from now
-- (fenced by the token, as an ack is); returns the lease's new end.
CREATE FUNCTION @extschema@.idem_outbox_extend(event_id uuid, lease_token uuid,
	lease interval)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_outbox_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A consumer hands back an event it did not deliver: due now, the claim's
-- attempt not counted, no error recorded.
CREATE FUNCTION @extschema@.idem_outbox_release(event_id uuid, lease_token uuid)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Sleep until an event of topic commits after this session's last claim
-- of it, or timeout passes; true if one came.  Needs shared_preload_libraries.
CREATE FUNCTION @extschema@.idem_outbox_wait(topic text,
	timeout interval DEFAULT '30 s')
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_outbox_wait'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_purge(batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_outbox_purge'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_create_topic(topic text,
	publishers regrole[] DEFAULT '{}', consumers regrole[] DEFAULT '{}')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_create_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_grant(topic text, role regrole,
	privilege text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_grant'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_outbox_revoke(topic text, role regrole,
	privilege text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_revoke'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- One row per event for operators.  An expired lease shows as pending: the
-- event is due again.
CREATE VIEW @extschema@.idem_outbox_events AS
SELECT o.event_id, o.topic, o.key, o.owner, o.run_id, o.step,
	   CASE WHEN o.state OPERATOR(pg_catalog.=) 'leased'
				 AND o.next_attempt_at OPERATOR(pg_catalog.<=) pg_catalog.now()
			THEN 'pending'::pg_catalog.text ELSE o.state END AS state,
	   o.attempts,
	   CASE WHEN o.state OPERATOR(pg_catalog.=) ANY
				 (ARRAY['pending', 'leased']::pg_catalog.text[])
			THEN o.next_attempt_at END AS next_attempt_at,
	   CASE WHEN o.state OPERATOR(pg_catalog.=) 'leased'
			THEN o.next_attempt_at END AS lease_until,
	   CASE WHEN o.state OPERATOR(pg_catalog.=) 'leased'
			THEN o.leased_by END AS leased_by,
	   CASE WHEN o.state OPERATOR(pg_catalog.=) 'leased'
			THEN o.lease_holder END AS lease_holder,
	   o.last_error, o.created_at, o.delivered_at
  FROM idem.outbox o;

-- Consuming, operating and administering topics are granted by an
-- administrator, never to PUBLIC.
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_claim(text, integer, interval, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_ack(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_ack_batch(uuid[], uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_fail(uuid, uuid, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_requeue(uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_extend(uuid, uuid, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_release(uuid, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_wait(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_purge(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_create_topic(text, regrole[], regrole[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_grant(text, regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_revoke(text, regrole, text) FROM PUBLIC;
REVOKE ALL ON @extschema@.idem_outbox_events FROM PUBLIC;
/*
 * ---- Operations (issue 11): stats, purge worker, audit trail ----
 */

-- idem_stats: counters per database, kept in shared memory (requires
-- shared_preload_libraries = 'idem'; without it one row of zeros and a
-- notice).  Readable by everyone, like pg_stat_database; resetting is for
-- administrators.
CREATE FUNCTION @extschema@.idem_stats(
	by_role boolean DEFAULT false,
	OUT dbid oid,
	OUT roleid oid,
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
	OUT outbox_claimed bigint,
	OUT outbox_acked bigint,
	OUT outbox_failed bigint,
	OUT outbox_dead bigint,
	OUT purged_outbox_events bigint,
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
	   s.outbox_written, s.outbox_claimed, s.outbox_acked, s.outbox_failed,
	   s.outbox_dead, s.purged_outbox_events, s.audit_written, s.audit_queued, s.audit_dropped,
	   s.stats_reset
  FROM @extschema@.idem_stats(false) s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.dbid;
GRANT SELECT ON @extschema@.idem_stats TO PUBLIC;

-- idem_stats_roles: the same counters per database and role (up to
-- idem.stats_max_roles pairs; further ones in a row with both NULL).  A
-- call counts for its role, the key's owner.  Readable by everyone, as
-- idem_stats is: counts, not keys.
CREATE VIEW @extschema@.idem_stats_roles AS
SELECT s.dbid, d.datname, s.roleid, r.rolname, s.executions, s.replays, s.mismatches,
	   s.in_progress, s.conflicts, s.sequencing_errors, s.errors,
	   s.lock_waits, s.lock_wait_time, s.purged_keys, s.purged_audit_entries,
	   s.outbox_written, s.outbox_claimed, s.outbox_acked, s.outbox_failed,
	   s.outbox_dead, s.purged_outbox_events, s.audit_written, s.audit_queued, s.audit_dropped,
	   s.stats_reset
  FROM @extschema@.idem_stats(true) s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.dbid
  LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) s.roleid;
GRANT SELECT ON @extschema@.idem_stats_roles TO PUBLIC;

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
-- BRIN: entries arrive in time order, and an insert into the range being
-- filled costs next to nothing, which an audited replay (otherwise a
-- read) pays on every call; the purge finds old entries through it.
CREATE INDEX audit_at_idx ON idem.audit USING brin (at);
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

-- Everything the purge worker does (expired keys, old audit entries,
-- delivered outbox events past idem.outbox_retention), for installations without
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
	LOOP
		n := @extschema@.idem_outbox_purge(batch);
		COMMIT;
		EXIT WHEN n OPERATOR(pg_catalog.<) batch;
	END LOOP;
END
$$;
REVOKE ALL ON PROCEDURE @extschema@.idem_purge_all(integer) FROM PUBLIC;
