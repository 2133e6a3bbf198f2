/* idem--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '1.2'" to load this file. \quit

-- A fresh installation of 1.2 runs idem--1.0.sql, idem--1.0--1.1.sql and
-- this script in turn: there is no separate full script to keep in step.

-- runs: a step's place among its run's completed steps, on its outbox
-- events.  The claim holds a run's event back behind the run's earlier
-- steps' events by this place, the order the steps committed in under the
-- run's lock; created_at, the start of the step's transaction, can be the
-- other way round.  NULL outside a run.  Events written before 1.2 take
-- their step's place from the run, while it exists.
ALTER TABLE idem.outbox ADD COLUMN run_position integer;
UPDATE idem.outbox o
   SET run_position = pg_catalog.array_position(r.done_steps, o.step)
  FROM idem.runs r
 WHERE o.run_id IS NOT NULL
   AND r.owner OPERATOR(pg_catalog.=) o.owner
   AND r.run_id OPERATOR(pg_catalog.=) o.run_id;

-- roles: the NOTIFY channel of a topic's events (issue 19).  Any role may
-- LISTEN on any channel, so each topic notifies a channel named by a hash
-- keyed by the database's secret, with an empty payload; a consumer asks
-- for its topic's channel here.  Like the other consumer functions it is
-- granted by the administrator, and it checks the consume privilege too.
CREATE FUNCTION @extschema@.idem_outbox_channel(topic text)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_outbox_channel'
LANGUAGE C STABLE PARALLEL RESTRICTED;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_channel(text) FROM PUBLIC;

-- identity: a regclass (or other reg*) part of a derived key names its
-- object the same way whatever the caller's search_path and quoting.
ALTER FUNCTION @extschema@.idem_key(VARIADIC "any")
	SET search_path = pg_catalog SET quote_all_identifiers = off;

-- probe (issue 19): a step's record never expires.  idem 1.1's idem_step
-- adopted a record idem_execute() had written under the step's key, with
-- that call's ttl; 1.2 writes step records without expiry and adopts none.
-- Each record a run lists as a completed step is made to never expire
-- here, expired or not (an expired one not yet purged is still the step's
-- result), so that the step replays instead of raising XX001 or running
-- again.  A record already purged cannot be brought back.  A record
-- holding an error that idem.cache_errors recorded is left to expire:
-- the step's statement never took effect, and idem_step() refuses to
-- replay it (ID422) rather than count an error as the step's result.
UPDATE idem.keys k
   SET expires_at = 'infinity'
  FROM idem.runs r CROSS JOIN LATERAL pg_catalog.unnest(r.done_steps) AS s(step)
 WHERE k.owner OPERATOR(pg_catalog.=) r.owner
   AND k.key OPERATOR(pg_catalog.=) @extschema@.idem_step_key(r.run_id, s.step)
   AND k.expires_at OPERATOR(pg_catalog.<>) 'infinity'::timestamptz
   AND NOT (k.response OPERATOR(pg_catalog.?) 'error'
			AND pg_catalog.jsonb_typeof(k.response OPERATOR(pg_catalog.->) 'error')
				OPERATOR(pg_catalog.=) 'object'
			AND (k.response OPERATOR(pg_catalog.->) 'error') OPERATOR(pg_catalog.?) 'sqlstate');
/*
 * ------------------------------------------------------------------------
 * Runs on queues (issue 21): queues with producer, worker and signal
 * grants; runs leased to workers (the outbox's lease, src/common/lease.c),
 * fenced steps, retries with backoff and jitter, waits for signals and
 * sleeps, cancel and retry, the operators' view idem_runs, and every
 * attempt on record.  src/workflow/queue.c, claim.c, signal.c, control.c.
 * ------------------------------------------------------------------------
 */

-- A queue and who may use it: producers enqueue runs (idem_run_begin with
-- queue), workers claim them, signallers signal other roles' runs.  Like
-- outbox topics: membership counts, superusers may use every queue.  The
-- retry policy applies to each step of a run (a completed step starts the
-- count again); a run may override it.  concurrency caps the runs leased
-- at once, cluster-wide (NULL: no cap).
CREATE TABLE idem.queues (
	queue			text COLLATE "C" NOT NULL,
	producers		regrole[] NOT NULL,
	workers			regrole[] NOT NULL,
	signallers		regrole[] NOT NULL,
	concurrency		integer,
	max_attempts	integer NOT NULL,
	backoff_base	interval NOT NULL,
	backoff_cap		interval NOT NULL,
	jitter			text NOT NULL,
	created_at		timestamptz NOT NULL,
	CONSTRAINT queues_pkey PRIMARY KEY (queue),
	CONSTRAINT queues_jitter_check
		CHECK (jitter OPERATOR(pg_catalog.=) ANY ('{full,equal,none}'::pg_catalog.text[]))
);
SELECT pg_catalog.pg_extension_config_dump('idem.queues', '');
-- Backends keep the queues they read until the registry changes, however
-- it is written (idem.outbox_topics' trigger function is the same C
-- function under its 1.1 name).
CREATE FUNCTION @extschema@.idem_registry_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_registry_changed'
LANGUAGE C;
REVOKE ALL ON FUNCTION @extschema@.idem_registry_changed() FROM PUBLIC;
CREATE TRIGGER queues_changed
	AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem.queues
	FOR EACH STATEMENT EXECUTE FUNCTION @extschema@.idem_registry_changed();
-- Whatever session_replication_role the writer runs under (a superuser's
-- replica session, a logical replication subscriber's table sync): a
-- revoke that other backends did not see would let a worker go on
-- claiming.  A subscriber's apply worker fires row triggers only, hence
-- the row triggers, which fire in replica sessions only (elsewhere the
-- statement trigger has done it once for the whole statement).
ALTER TABLE idem.queues ENABLE ALWAYS TRIGGER queues_changed;
ALTER TABLE idem.outbox_topics ENABLE ALWAYS TRIGGER outbox_topics_changed;
CREATE TRIGGER queues_applied
	AFTER INSERT OR UPDATE OR DELETE ON idem.queues
	FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_registry_changed();
CREATE TRIGGER outbox_topics_applied
	AFTER INSERT OR UPDATE OR DELETE ON idem.outbox_topics
	FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_registry_changed();
ALTER TABLE idem.queues ENABLE REPLICA TRIGGER queues_applied;
ALTER TABLE idem.outbox_topics ENABLE REPLICA TRIGGER outbox_topics_applied;

-- A queued run's place in its queue, on its row, so that a step's fence
-- check reads nothing the step does not read already.  queue_state is
-- ready (due at due_at), leased (until due_at), waiting (for the signal
-- awaiting, or until wait_until) or sleeping (until due_at); NULL once the
-- run is finished, which takes it out of the partial indexes below: a
-- queue of a million finished runs claims as fast as an empty one.
-- attempt counts the current step's attempts; claims numbers the rows of
-- idem.run_attempts.  started_step: an external step begun
-- (idem_step_start) and not completed, started_count times.
ALTER TABLE idem.runs
	ADD COLUMN queue text COLLATE "C",
	ADD COLUMN queue_state text,
	ADD COLUMN due_at timestamptz,
	ADD COLUMN attempt integer NOT NULL DEFAULT 1,
	ADD COLUMN claims integer NOT NULL DEFAULT 0,
	ADD COLUMN lease_token uuid,
	ADD COLUMN leased_by regrole,
	ADD COLUMN lease_holder text,
	ADD COLUMN awaiting text COLLATE "C",
	ADD COLUMN wait_until timestamptz,
	ADD COLUMN started_step text COLLATE "C",
	ADD COLUMN started_count integer NOT NULL DEFAULT 0,
	ADD COLUMN max_attempts integer,
	ADD COLUMN backoff_base interval,
	ADD COLUMN backoff_cap interval,
	ADD COLUMN jitter text,
	DROP CONSTRAINT runs_status_check,
	ADD CONSTRAINT runs_status_check
		CHECK (status OPERATOR(pg_catalog.=) ANY ('{running,completed,failed,cancelled}'::pg_catalog.text[])),
	ADD CONSTRAINT runs_queue_state_check
		CHECK (queue_state OPERATOR(pg_catalog.=) ANY ('{ready,leased,waiting,sleeping}'::pg_catalog.text[]));
ALTER TABLE idem.runs
	ALTER COLUMN attempt DROP DEFAULT,
	ALTER COLUMN claims DROP DEFAULT,
	ALTER COLUMN started_count DROP DEFAULT;
-- The claim's scan: a queue's unfinished runs, oldest due first; also the
-- concurrency cap's count of the leases that hold (due_at after now).
-- Runs begun in one transaction share a due time; deduplicated into one
-- posting list, their entries could only be marked dead all together, so
-- each claim would visit again every one already claimed.  Apart, each
-- claimed run's entry is marked dead by the first scan that finds it so.
CREATE INDEX runs_due_idx ON idem.runs (queue, due_at)
	WITH (deduplicate_items = off)
	WHERE queue_state IS NOT NULL;
-- The claim's share per role: each role's due runs, oldest first.
CREATE INDEX runs_owner_due_idx ON idem.runs (queue, owner, due_at)
	WITH (deduplicate_items = off)
	WHERE queue_state IS NOT NULL;
-- A worker names a run by its id and lease token, and an operator by its
-- id in idem_runs, neither by its owner, which leads the primary key.
CREATE INDEX runs_run_id_idx ON idem.runs (run_id);
-- The outbox's due index is not deduplicated for the same reason: the
-- events of one transaction share their due time.
ALTER INDEX idem.outbox_due_idx SET (deduplicate_items = off);
-- Between vacuums the outbox fills with dead row versions: each claim and
-- each ack leaves one, and claims walk the dead entries they left at the
-- head of the due index until VACUUM removes them.  The default trigger,
-- a fifth of the table, lets millions pile up under a large backlog before
-- the first autovacuum; a hundredth keeps the head of the index clean.
ALTER TABLE idem.runs SET (fillfactor = 80);
ALTER TABLE idem.outbox SET (autovacuum_vacuum_scale_factor = 0.01,
							 autovacuum_vacuum_threshold = 10000);

-- Every claim of a run, committed with the claim, and how it ended:
-- completed (the run), step_failed, failed (the run, on its last attempt),
-- lease_expired, waiting, sleeping, released or cancelled; NULL while the
-- lease holds.
CREATE TABLE idem.run_attempts (
	owner		regrole NOT NULL,
	run_id		text COLLATE "C" NOT NULL,
	claim		integer NOT NULL,
	attempt		integer NOT NULL,
	step		text COLLATE "C",
	worker		text NOT NULL,
	leased_by	regrole NOT NULL,
	claimed_at	timestamptz NOT NULL,
	ended_at	timestamptz,
	outcome		text,
	error		text,
	CONSTRAINT run_attempts_pkey PRIMARY KEY (owner, run_id, claim),
	CONSTRAINT run_attempts_run_fkey FOREIGN KEY (owner, run_id)
		REFERENCES idem.runs (owner, run_id) ON DELETE CASCADE
);
SELECT pg_catalog.pg_extension_config_dump('idem.run_attempts', '');

-- Signals, one per run and event, kept until the run is purged: a signal
-- sent before its await waits for it.
CREATE TABLE idem.run_signals (
	owner			regrole NOT NULL,
	run_id			text COLLATE "C" NOT NULL,
	event			text COLLATE "C" NOT NULL,
	payload			pg_catalog.jsonb NOT NULL,
	signalled_by	regrole NOT NULL,
	signalled_at	timestamptz NOT NULL,
	CONSTRAINT run_signals_pkey PRIMARY KEY (owner, run_id, event),
	CONSTRAINT run_signals_run_fkey FOREIGN KEY (owner, run_id)
		REFERENCES idem.runs (owner, run_id) ON DELETE CASCADE
);
SELECT pg_catalog.pg_extension_config_dump('idem.run_signals', '');

-- runs: idem_run_purge() takes each run's lock before it removes the run,
-- and leaves for the next purge a run that a step or a run verb holds, or
-- that a queue drop or a claim has written and not yet committed (they
-- give the lock back once the run is written), so that they find the run
-- or ID404, never a row deleted under them.
CREATE FUNCTION @extschema@.idem_run_try_lock(owner regrole, run_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_run_try_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE COST 1000;
REVOKE ALL ON FUNCTION @extschema@.idem_run_try_lock(regrole, text) FROM PUBLIC;

-- Each run removed keeps its lock until the transaction commits, one slot
-- of the shared lock table: batch_size bounds how many one call removes
-- (NULL: all of them), so that a backlog of any size goes in transactions
-- the table can hold.  The purge worker, idem_purge() and
-- idem_purge_all() pass at most max_locks_per_transaction.  A run that
-- cannot be locked does not count, and the next one is tried.  The
-- statement reads idem.runs only as far as its batch, which the planner
-- cannot know: a plan made for any batch_size deletes through a scan of
-- the whole table, and JIT compiles for the whole table's cost, so each
-- call is planned for its own batch_size, without JIT.
ALTER FUNCTION @extschema@.idem_run_purge(timestamptz) RENAME TO idem_1_1_run_purge;
CREATE FUNCTION @extschema@.idem_run_purge(finished_before timestamptz,
	batch_size integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
DECLARE
	n bigint;
BEGIN
	IF batch_size OPERATOR(pg_catalog.<=) 0 THEN
		RAISE EXCEPTION USING ERRCODE = '22023',
			MESSAGE = 'batch_size must be greater than zero',
			DETAIL = pg_catalog.format('batch_size was %s.', batch_size),
			HINT = 'Pass NULL to remove every run at once. Retry advice: never.';
	END IF;
	WITH runs AS (
		SELECT r.owner, r.run_id, r.status, r.finished_at,
			NOT EXISTS (SELECT FROM pg_catalog.pg_roles a
						 WHERE a.oid OPERATOR(pg_catalog.=) r.owner)
				AS owner_gone
		  FROM idem.runs r
	), candidates AS MATERIALIZED (
		-- read only as far as locked needs
		SELECT r.owner, r.run_id, r.owner_gone
		  FROM runs r
		 WHERE r.owner_gone OR (r.status OPERATOR(pg_catalog.<>) 'running'
			AND r.finished_at OPERATOR(pg_catalog.<) finished_before)
	), locked AS MATERIALIZED (
		SELECT c.owner, c.run_id, c.owner_gone
		  FROM candidates c
		 WHERE @extschema@.idem_run_try_lock(c.owner, c.run_id)
		 LIMIT batch_size
	), gone AS (
		-- checked again: a run resumed after this statement's snapshot stays
		DELETE FROM idem.runs r
		 USING locked l
		 WHERE r.owner OPERATOR(pg_catalog.=) l.owner
		   AND r.run_id OPERATOR(pg_catalog.=) l.run_id
		   AND (l.owner_gone OR (r.status OPERATOR(pg_catalog.<>) 'running'
			AND r.finished_at OPERATOR(pg_catalog.<) finished_before))
		RETURNING r.owner, r.run_id, r.done_steps
	), keys AS (
		DELETE FROM idem.keys k
		 USING gone g CROSS JOIN LATERAL pg_catalog.unnest(g.done_steps) AS s(step)
		 WHERE k.owner OPERATOR(pg_catalog.=) g.owner
		   AND k.key OPERATOR(pg_catalog.=) @extschema@.idem_step_key(g.run_id, s.step)
	), attempts AS (
		-- not left to the foreign keys' cascade, which does not fire under
		-- session_replication_role = replica: a run begun again under the id
		-- would find the old run's attempts and signals
		DELETE FROM idem.run_attempts a
		 USING gone g
		 WHERE a.owner OPERATOR(pg_catalog.=) g.owner
		   AND a.run_id OPERATOR(pg_catalog.=) g.run_id
	), signals AS (
		DELETE FROM idem.run_signals s
		 USING gone g
		 WHERE s.owner OPERATOR(pg_catalog.=) g.owner
		   AND s.run_id OPERATOR(pg_catalog.=) g.run_id
	)
	SELECT pg_catalog.count(*) INTO n FROM gone;
	RETURN n;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_run_purge(timestamptz, integer) FROM PUBLIC;

-- Administrators of runs: every role's rows in idem_runs, and cancel and
-- retry of any role's run.  A cluster-wide role, kept if it exists and can
-- be trusted: a role of that name that can log in, or that a role other
-- than a superuser granted or administers, may be someone's way to every
-- role's runs (55000).
CREATE FUNCTION idem.admin_role_check()
RETURNS void
AS 'MODULE_PATHNAME', 'idem_admin_role_check'
LANGUAGE C VOLATILE PARALLEL SAFE;
REVOKE ALL ON FUNCTION idem.admin_role_check() FROM PUBLIC;

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.=) 'idem_admin') THEN
		CREATE ROLE idem_admin NOLOGIN;
	ELSE
		PERFORM idem.admin_role_check();
	END IF;
END
$$;

CREATE FUNCTION @extschema@.idem_queue_create(queue text,
	producers regrole[] DEFAULT '{}', workers regrole[] DEFAULT '{}',
	concurrency integer DEFAULT NULL, max_attempts integer DEFAULT 5,
	backoff_base interval DEFAULT '1 s', backoff_cap interval DEFAULT '1 h',
	jitter text DEFAULT 'full', signallers regrole[] DEFAULT '{}')
RETURNS void
AS 'MODULE_PATHNAME', 'idem_queue_create'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_queue_grant(queue text, role regrole,
	privilege text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_queue_grant'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_queue_revoke(queue text, role regrole,
	privilege text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_queue_revoke'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- idem_run_begin with a queue and a run's own retry policy.
ALTER FUNCTION @extschema@.idem_run_begin(text, text[], pg_catalog.jsonb)
	RENAME TO idem_1_1_run_begin;
CREATE FUNCTION @extschema@.idem_run_begin(run_id text,
	steps text[] DEFAULT NULL, input pg_catalog.jsonb DEFAULT NULL,
	queue text DEFAULT NULL, max_attempts integer DEFAULT NULL,
	backoff_base interval DEFAULT NULL, backoff_cap interval DEFAULT NULL,
	jitter text DEFAULT NULL,
	OUT status text, OUT next_step text, OUT created boolean,
	OUT started_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_run_begin'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A claim commits on its own: its lease and its attempt's record.
CREATE FUNCTION @extschema@.idem_run_claim(queue text,
	max_runs integer DEFAULT 1, lease interval DEFAULT '30 s',
	worker text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS TABLE (run_id text, owner regrole, input pg_catalog.jsonb,
	steps text[], next_step text, attempt integer, lease_token uuid,
	lease_until timestamptz, results pg_catalog.jsonb, started_step text,
	started_attempts integer)
AS 'MODULE_PATHNAME', 'idem_run_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

CREATE FUNCTION @extschema@.idem_run_extend(run_id text, lease_token uuid,
	lease interval DEFAULT '30 s')
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_run_extend'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_release(run_id text, lease_token uuid,
	retry_after interval DEFAULT NULL, reason text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_run_release'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- idem_call with the lease token a queued run's steps need, and the
-- bookkeeping of the external steps around a worker's step (the completion
-- of the one before, the start of the one after) in the step's transaction.
ALTER FUNCTION @extschema@.idem_call(text, text, text[], text, interval,
	boolean, text, text) RENAME TO idem_1_1_call;
CREATE FUNCTION @extschema@.idem_call(key text, sql text,
	args text[] DEFAULT '{}'::pg_catalog.text[],
	outbox_topic text DEFAULT NULL, ttl interval DEFAULT NULL,
	wait boolean DEFAULT NULL, run_id text DEFAULT NULL, step text DEFAULT NULL,
	lease_token uuid DEFAULT NULL, complete_step text DEFAULT NULL,
	complete_result pg_catalog.jsonb DEFAULT NULL, start_step text DEFAULT NULL,
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz, OUT started_key text,
	OUT started_attempt integer)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_call'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

ALTER FUNCTION @extschema@.idem_step_complete(text, text, pg_catalog.jsonb)
	RENAME TO idem_1_1_step_complete;
CREATE FUNCTION @extschema@.idem_step_complete(run_id text, step text,
	result pg_catalog.jsonb, lease_token uuid DEFAULT NULL)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- An external step's attempt, recorded before the worker calls out.
CREATE FUNCTION @extschema@.idem_step_start(run_id text, step text,
	lease_token uuid)
RETURNS TABLE (step_key text, attempt integer, completed boolean,
	result pg_catalog.jsonb)
AS 'MODULE_PATHNAME', 'idem_step_start'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

CREATE FUNCTION @extschema@.idem_step_fail(run_id text, step text,
	lease_token uuid, error text, retry_after interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'idem_step_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_await(run_id text, event text,
	lease_token uuid, timeout interval DEFAULT NULL,
	OUT state text, OUT payload pg_catalog.jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_run_await'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_signal(run_id text, event text,
	payload pg_catalog.jsonb DEFAULT '{}', owner regrole DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_run_signal'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_sleep(run_id text, lease_token uuid,
	until timestamptz)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_run_sleep'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Operators' verbs: an administrator fails or resumes another role's run
-- by naming its owner, as it cancels or retries one; each verb that
-- changes a run is audited, with the role that acted.
ALTER FUNCTION @extschema@.idem_run_fail(text, text) RENAME TO idem_1_1_run_fail;
CREATE FUNCTION @extschema@.idem_run_fail(run_id text, reason text,
	owner pg_catalog.regrole DEFAULT NULL)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

ALTER FUNCTION @extschema@.idem_run_resume(text) RENAME TO idem_1_1_run_resume;
CREATE FUNCTION @extschema@.idem_run_resume(run_id text,
	owner pg_catalog.regrole DEFAULT NULL)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_resume'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

ALTER FUNCTION @extschema@.idem_run_complete(text) RENAME TO idem_1_1_run_complete;
CREATE FUNCTION @extschema@.idem_run_complete(run_id text,
	owner pg_catalog.regrole DEFAULT NULL)
RETURNS pg_catalog.text
AS 'MODULE_PATHNAME', 'idem_run_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

ALTER TABLE idem.audit ADD COLUMN actor pg_catalog.regrole;
CREATE OR REPLACE VIEW @extschema@.idem_audit AS
SELECT at, key, owner, run_id, step, outcome, fingerprint, sqlstate,
	   xid, pid AS backend_pid, application_name, client_addr, actor
  FROM idem.audit;

CREATE FUNCTION @extschema@.idem_run_cancel(run_id text,
	reason text DEFAULT NULL, owner regrole DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_run_cancel'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_run_retry(run_id text,
	owner regrole DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_run_retry'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Whether the current role sees every role's runs: superusers, members of
-- pg_monitor and of idem_admin (while it can be trusted: see
-- idem.admin_role_check).  idem_admin is the cluster's, not the
-- extension's: an administrator may have dropped it.
CREATE FUNCTION @extschema@.idem_runs_admin()
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_runs_admin'
LANGUAGE C STABLE PARALLEL SAFE;

-- Runs for operators: every role's for superusers and members of
-- pg_monitor or idem_admin, the current role's own otherwise.  An expired
-- lease shows as ready: the run is due again.
CREATE VIEW @extschema@.idem_runs WITH (security_barrier) AS
SELECT r.run_id, r.owner, r.queue, r.status,
	   CASE WHEN r.queue_state OPERATOR(pg_catalog.=) 'leased'
				 AND r.due_at OPERATOR(pg_catalog.<=) pg_catalog.now()
			THEN 'ready'::pg_catalog.text ELSE r.queue_state END AS state,
	   CASE WHEN r.steps IS NOT NULL
				 AND pg_catalog.cardinality(r.done_steps) OPERATOR(pg_catalog.<) pg_catalog.cardinality(r.steps)
			THEN r.steps[pg_catalog.cardinality(r.done_steps) OPERATOR(pg_catalog.+) 1] END AS next_step,
	   pg_catalog.cardinality(r.done_steps) AS steps_done,
	   pg_catalog.cardinality(r.steps) AS steps_total,
	   r.attempt,
	   COALESCE(r.max_attempts, q.max_attempts) AS max_attempts,
	   CASE WHEN r.queue_state OPERATOR(pg_catalog.=) 'leased' THEN r.lease_holder END AS holder,
	   CASE WHEN r.queue_state OPERATOR(pg_catalog.=) 'leased' THEN r.leased_by END AS leased_by,
	   CASE WHEN r.queue_state OPERATOR(pg_catalog.=) 'leased' THEN r.due_at END AS lease_until,
	   CASE WHEN r.queue_state OPERATOR(pg_catalog.<>) 'leased' THEN r.due_at END AS next_due,
	   r.awaiting, r.last_error, r.started_at, r.finished_at,
	   pg_catalog.now() OPERATOR(pg_catalog.-) r.started_at AS age
  FROM idem.runs r
  LEFT JOIN idem.queues q ON q.queue OPERATOR(pg_catalog.=) r.queue
 WHERE pg_catalog.pg_has_role(CURRENT_USER, r.owner, 'USAGE')
	OR @extschema@.idem_runs_admin();
GRANT SELECT ON @extschema@.idem_runs TO PUBLIC;

CREATE VIEW @extschema@.idem_run_attempts WITH (security_barrier) AS
SELECT a.owner, a.run_id, a.claim, a.attempt, a.step, a.worker, a.leased_by,
	   a.claimed_at, a.ended_at, a.outcome, a.error
  FROM idem.run_attempts a
 WHERE pg_catalog.pg_has_role(CURRENT_USER, a.owner, 'USAGE')
	OR @extschema@.idem_runs_admin();
GRANT SELECT ON @extschema@.idem_run_attempts TO PUBLIC;

-- Queues are administered, claimed and worked by grant, never by PUBLIC.
REVOKE ALL ON FUNCTION @extschema@.idem_queue_create(text, regrole[], regrole[], integer, integer, interval, interval, text, regrole[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_queue_grant(text, regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_queue_revoke(text, regrole, text) FROM PUBLIC;

-- idem_stats: the runtime's counters.
ALTER VIEW @extschema@.idem_stats RENAME TO idem_1_1_stats_view;
ALTER VIEW @extschema@.idem_stats_roles RENAME TO idem_1_1_stats_roles_view;
ALTER FUNCTION @extschema@.idem_stats(boolean) RENAME TO idem_1_1_stats;
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
	OUT runs_claimed bigint,
	OUT run_lease_expiries bigint,
	OUT run_retries bigint,
	OUT run_signals bigint,
	OUT runs_failed bigint,
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
	   s.runs_claimed, s.run_lease_expiries, s.run_retries, s.run_signals, s.runs_failed,
	   s.stats_reset
  FROM @extschema@.idem_stats(false) s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.dbid;
GRANT SELECT ON @extschema@.idem_stats TO PUBLIC;

CREATE VIEW @extschema@.idem_stats_roles AS
SELECT s.dbid, d.datname, s.roleid, r.rolname, s.executions, s.replays, s.mismatches,
	   s.in_progress, s.conflicts, s.sequencing_errors, s.errors,
	   s.lock_waits, s.lock_wait_time, s.purged_keys, s.purged_audit_entries,
	   s.outbox_written, s.outbox_claimed, s.outbox_acked, s.outbox_failed,
	   s.outbox_dead, s.purged_outbox_events, s.audit_written, s.audit_queued, s.audit_dropped,
	   s.runs_claimed, s.run_lease_expiries, s.run_retries, s.run_signals, s.runs_failed,
	   s.stats_reset
  FROM @extschema@.idem_stats(true) s
  LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.dbid
  LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) s.roleid;
GRANT SELECT ON @extschema@.idem_stats_roles TO PUBLIC;
-- drivers (issue 23): the forms of the calls that untyped arguments reach.
-- 1.1's VARIADIC text[] overloads also took domains over text, char(n)
-- and name through their implicit casts to text, and so lost their types.
-- idem_untyped is text inside, but no type casts to it: only literals and
-- parameters without a type (unknown) reach these overloads, every typed
-- argument reaches VARIADIC "any" and keeps its type there (text and
-- varchar are strings the statement types, in both forms).  Its category
-- is S, so PostgreSQL prefers these overloads for untyped arguments as it
-- preferred text[].
CREATE TYPE @extschema@.idem_untyped;
CREATE FUNCTION @extschema@.idem_untyped_in(pg_catalog.cstring)
RETURNS @extschema@.idem_untyped AS 'textin' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION @extschema@.idem_untyped_out(@extschema@.idem_untyped)
RETURNS pg_catalog.cstring AS 'textout' LANGUAGE internal IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION @extschema@.idem_untyped_recv(pg_catalog.internal)
RETURNS @extschema@.idem_untyped AS 'textrecv' LANGUAGE internal STABLE STRICT PARALLEL SAFE;
CREATE FUNCTION @extschema@.idem_untyped_send(@extschema@.idem_untyped)
RETURNS pg_catalog.bytea AS 'textsend' LANGUAGE internal STABLE STRICT PARALLEL SAFE;
CREATE TYPE @extschema@.idem_untyped (
	INPUT = @extschema@.idem_untyped_in,
	OUTPUT = @extschema@.idem_untyped_out,
	RECEIVE = @extschema@.idem_untyped_recv,
	SEND = @extschema@.idem_untyped_send,
	INTERNALLENGTH = VARIABLE, STORAGE = extended, ALIGNMENT = int4,
	CATEGORY = 'S'
);

ALTER FUNCTION @extschema@.idem_execute(text, text, VARIADIC text[])
	RENAME TO idem_1_1_execute;
ALTER FUNCTION @extschema@.idem_execute_ex(text, text, VARIADIC text[])
	RENAME TO idem_1_1_execute_ex;
ALTER FUNCTION @extschema@.idem_step(text, text, text, VARIADIC text[])
	RENAME TO idem_1_1_step;
ALTER FUNCTION @extschema@.idem_dry_run(text, text, VARIADIC text[])
	RENAME TO idem_1_1_dry_run;

CREATE FUNCTION @extschema@.idem_execute(key text, sql text,
	VARIADIC args @extschema@.idem_untyped[])
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	VARIADIC args @extschema@.idem_untyped[],
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_step(run_id text, step text, sql text,
	VARIADIC args @extschema@.idem_untyped[])
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_step'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_dry_run(key text, sql text,
	VARIADIC args @extschema@.idem_untyped[], OUT action text,
	OUT response pg_catalog.jsonb)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_dry_run'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
-- citus (issue 26, doc/citus.md): an administrator declares the Citus
-- distributed table whose colocation group idem's tenant records follow.
-- It creates idem.citus_keys (distributed by a tenant column of the table's
-- distribution type, co-located with it) and idem_citus_call(tenant, key,
-- sql [, VARIADIC args]) with that tenant type, which Citus delegates to the
-- node of the tenant's shard.  Without Citus it raises IDC01.
CREATE FUNCTION @extschema@.idem_citus_colocate(distributed_table regclass)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_citus_colocate'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_citus_colocate(regclass) FROM PUBLIC;

-- Expired tenant key records, and those of dropped roles, on every shard
-- of idem.citus_keys at once (Citus runs the DELETE on each shard's node);
-- 0 before colocation.  A record's owner is its role's name, which Citus
-- keeps the same on every node, so the coordinator's roles are the
-- cluster's; a role created later under a dropped one's name must not
-- replay its records.  idem_purge_all() calls it, and so does the purge
-- worker on a Citus coordinator; idem_purge() purges the node's own
-- idem.keys only.  plpgsql resolves the table when the statement first
-- runs, so it need not exist before then.  Tenant outbox events delivered
-- and kept (idem.outbox_keep_delivered) are in idem.citus_outbox, on the
-- shards, which each node's idem_outbox_purge() reaches for the shards
-- placed there: they go here too, all shards at once, once
-- idem.outbox_retention (as this node has it; 7 days, its default, where
-- idem's library is not loaded yet) has passed, and count.
CREATE FUNCTION @extschema@.idem_citus_purge()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint := 0;
	deleted bigint;
	kept interval;
	cutoff timestamptz;
	roles text[];
BEGIN
	IF pg_catalog.to_regclass('idem.citus_keys') IS NOT NULL THEN
		roles := ARRAY(SELECT a.rolname::pg_catalog.text
			       FROM pg_catalog.pg_roles a);
		DELETE FROM idem.citus_keys
		 WHERE expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
		    OR owner OPERATOR(pg_catalog.<>) ALL (roles);
		GET DIAGNOSTICS n = ROW_COUNT;
	END IF;
	IF pg_catalog.to_regclass('idem.citus_outbox') IS NOT NULL THEN
		kept := COALESCE(pg_catalog.current_setting(
			'idem.outbox_retention', true), '7d');
		cutoff := pg_catalog.now() OPERATOR(pg_catalog.-) kept;
		DELETE FROM idem.citus_outbox
		 WHERE state OPERATOR(pg_catalog.=) 'delivered'
		   AND delivered_at OPERATOR(pg_catalog.<=) cutoff;
		GET DIAGNOSTICS deleted = ROW_COUNT;
		n := n OPERATOR(pg_catalog.+) deleted;
	END IF;
	RETURN n;
END
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_citus_purge() FROM PUBLIC;

-- With idem.run_retention set, idem_purge_all() also removes the runs
-- that finished longer ago, and always those of dropped roles, with their
-- steps' records; tenant runs too once idem_citus_colocate() made
-- idem_citus_run_purge().  The setting shows its unit ('7d'), which is an
-- interval's.  Runs go in batches of at most max_locks_per_transaction:
-- each keeps its lock until the batch commits (idem_run_purge()).
CREATE OR REPLACE PROCEDURE @extschema@.idem_purge_all(batch_size integer DEFAULT NULL)
LANGUAGE plpgsql
AS $$
DECLARE
	batch integer := COALESCE(batch_size,
		pg_catalog.current_setting('idem.purge_batch_size', true)::integer,
		10000);
	retention interval := COALESCE(pg_catalog.current_setting(
		'idem.run_retention', true), '0')::interval;
	cutoff pg_catalog.timestamptz := pg_catalog.now() OPERATOR(pg_catalog.-) retention;
	run_batch integer;
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
	PERFORM @extschema@.idem_citus_purge();
	COMMIT;
	run_batch := LEAST(batch, pg_catalog.current_setting(
		'max_locks_per_transaction')::integer);
	-- without a retention, the runs of dropped roles only; a role granted
	-- this procedure and not idem_run_purge() has idem_purge() remove
	-- them, a batch a call
	IF retention OPERATOR(pg_catalog.>) '0' OR pg_catalog.has_function_privilege(
		'@extschema@.idem_run_purge(pg_catalog.timestamptz, integer)', 'EXECUTE') THEN
		LOOP
			n := @extschema@.idem_run_purge(CASE
				WHEN retention OPERATOR(pg_catalog.>) '0' THEN cutoff
				ELSE '-infinity' END, run_batch);
			COMMIT;
			EXIT WHEN n OPERATOR(pg_catalog.<) run_batch;
		END LOOP;
	END IF;
	IF retention OPERATOR(pg_catalog.>) '0' THEN
		IF pg_catalog.to_regprocedure(
			'@extschema@.idem_citus_run_purge(pg_catalog.timestamptz)') IS NOT NULL THEN
			PERFORM @extschema@.idem_citus_run_purge(cutoff);
			COMMIT;
		END IF;
	END IF;
END
$$;

-- outbox delivery (issue 24): no CHECK on an event's state.  PostgreSQL
-- reads a table's CHECK constraints from their stored text and plans them
-- again in every statement that writes a row, which cost each claim (and
-- each producer's event) more than the lease update itself.  Only idem's
-- functions write idem.outbox, as its owner, and each sets one of pending,
-- leased, delivered and dead (tested in outbox_delivery and outbox_ack).
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_state_check;

-- The functions and views this update replaces (renamed idem_1_1_* above)
-- pass an administrator's GRANTs and REVOKEs on to their replacements,
-- which would otherwise come with a new installation's privileges: a
-- function revoked from PUBLIC would be executable by every role again.
-- Granted here, during the update, the privileges would also be recorded as
-- the extension's initial ones (pg_init_privs), which pg_dump leaves out of
-- a dump; the initial ones are put back to a new installation's, so that a
-- dump restores the administrator's.
DO $$
DECLARE
	m record;
	e record;
	init pg_catalog.aclitem[];
	acl pg_catalog.aclitem[];
	had_init boolean;
BEGIN
	FOR m IN
		SELECT v.cls, v.kind, v.old, v.new,
			   (pg_catalog.pg_identify_object(v.cls, v.new, 0)).identity AS name,
			   CASE WHEN v.cls OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
					THEN (SELECT p.proacl FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) v.old)
					ELSE (SELECT c.relacl FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) v.old)
			   END AS acl,
			   CASE WHEN v.cls OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
					THEN (SELECT p.proowner FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) v.new)
					ELSE (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) v.new)
			   END AS owner,
			   (SELECT i.initprivs FROM pg_catalog.pg_init_privs i
				 WHERE i.classoid OPERATOR(pg_catalog.=) v.cls AND i.objoid OPERATOR(pg_catalog.=) v.old
				   AND i.objsubid OPERATOR(pg_catalog.=) 0) AS old_init
		  FROM (VALUES
			('pg_catalog.pg_proc'::pg_catalog.regclass, 'FUNCTION',
			 '@extschema@.idem_1_1_run_begin(text, text[], pg_catalog.jsonb)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_run_begin(text, text[], pg_catalog.jsonb, text, integer, interval, interval, text)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_call(text, text, text[], text, interval, boolean, text, text)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_call(text, text, text[], text, interval, boolean, text, text, uuid, text, pg_catalog.jsonb, text)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_step_complete(text, text, pg_catalog.jsonb)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_step_complete(text, text, pg_catalog.jsonb, uuid)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_run_fail(text, text)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_run_fail(text, text, pg_catalog.regrole)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_run_resume(text)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_run_resume(text, pg_catalog.regrole)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_run_complete(text)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_run_complete(text, pg_catalog.regrole)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_stats(boolean)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_stats(boolean)'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_class', 'TABLE',
			 '@extschema@.idem_1_1_stats_view'::pg_catalog.regclass::pg_catalog.oid,
			 '@extschema@.idem_stats'::pg_catalog.regclass::pg_catalog.oid),
			('pg_catalog.pg_class', 'TABLE',
			 '@extschema@.idem_1_1_stats_roles_view'::pg_catalog.regclass::pg_catalog.oid,
			 '@extschema@.idem_stats_roles'::pg_catalog.regclass::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_execute(text, text, text[])'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_execute(text, text, @extschema@.idem_untyped[])'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_execute_ex(text, text, text[])'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_execute_ex(text, text, @extschema@.idem_untyped[])'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_step(text, text, text, text[])'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_step(text, text, text, @extschema@.idem_untyped[])'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_dry_run(text, text, text[])'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_dry_run(text, text, @extschema@.idem_untyped[])'::pg_catalog.regprocedure::pg_catalog.oid),
			('pg_catalog.pg_proc', 'FUNCTION',
			 '@extschema@.idem_1_1_run_purge(timestamptz)'::pg_catalog.regprocedure::pg_catalog.oid,
			 '@extschema@.idem_run_purge(timestamptz, integer)'::pg_catalog.regprocedure::pg_catalog.oid)
		  ) v(cls, kind, old, new)
	LOOP
		-- as installed (the ACL as the installation script left it): nothing to pass on
		CONTINUE WHEN (m.acl IS NULL AND m.old_init IS NULL)
			OR m.acl OPERATOR(pg_catalog.=) m.old_init;
		-- (no ACL of its own but initial privileges: the default's)
		acl := COALESCE(m.acl, pg_catalog.acldefault(
			CASE WHEN m.kind OPERATOR(pg_catalog.=) 'FUNCTION' THEN 'f' ELSE 'r' END::pg_catalog."char", m.owner));
		SELECT i.initprivs, true INTO init, had_init
		  FROM pg_catalog.pg_init_privs i
		 WHERE i.classoid OPERATOR(pg_catalog.=) m.cls AND i.objoid OPERATOR(pg_catalog.=) m.new
		   AND i.objsubid OPERATOR(pg_catalog.=) 0;
		EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM PUBLIC', m.kind, m.name);
		FOR e IN
			SELECT a.grantee, a.privilege_type, a.is_grantable
			  FROM pg_catalog.aclexplode(acl) a
			 WHERE a.grantee OPERATOR(pg_catalog.<>) m.owner
		LOOP
			EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %s%s',
				e.privilege_type, m.kind, m.name,
				CASE WHEN e.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
					 ELSE pg_catalog.quote_ident(e.grantee::pg_catalog.regrole::pg_catalog.text) END,
				CASE WHEN e.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
		END LOOP;
		DELETE FROM pg_catalog.pg_init_privs i
		 WHERE i.classoid OPERATOR(pg_catalog.=) m.cls AND i.objoid OPERATOR(pg_catalog.=) m.new
		   AND i.objsubid OPERATOR(pg_catalog.=) 0;
		IF had_init THEN
			INSERT INTO pg_catalog.pg_init_privs (objoid, classoid, objsubid, privtype, initprivs)
			VALUES (m.new, m.cls, 0, 'e', init);
		END IF;
		-- PostgreSQL 17 and later make the roles of initial privileges
		-- depend on the object (deptype 'i'), which DROP ROLE would trip on
		DELETE FROM pg_catalog.pg_shdepend d
		 WHERE d.dbid OPERATOR(pg_catalog.=) (SELECT b.oid FROM pg_catalog.pg_database b
												WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
		   AND d.classid OPERATOR(pg_catalog.=) m.cls AND d.objid OPERATOR(pg_catalog.=) m.new
		   AND d.objsubid OPERATOR(pg_catalog.=) 0 AND d.deptype OPERATOR(pg_catalog.=) 'i'
		   AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(init) a
							WHERE d.refobjid OPERATOR(pg_catalog.=) a.grantee
							   OR d.refobjid OPERATOR(pg_catalog.=) a.grantor);
	END LOOP;
END
$$;
DROP VIEW @extschema@.idem_1_1_stats_view;
DROP VIEW @extschema@.idem_1_1_stats_roles_view;
DROP FUNCTION @extschema@.idem_1_1_stats(boolean);
DROP FUNCTION @extschema@.idem_1_1_run_begin(text, text[], pg_catalog.jsonb);
DROP FUNCTION @extschema@.idem_1_1_call(text, text, text[], text, interval,
	boolean, text, text);
DROP FUNCTION @extschema@.idem_1_1_step_complete(text, text, pg_catalog.jsonb);
DROP FUNCTION @extschema@.idem_1_1_run_fail(text, text);
DROP FUNCTION @extschema@.idem_1_1_run_resume(text);
DROP FUNCTION @extschema@.idem_1_1_run_complete(text);
DROP FUNCTION @extschema@.idem_1_1_execute(text, text, VARIADIC text[]);
DROP FUNCTION @extschema@.idem_1_1_execute_ex(text, text, VARIADIC text[]);
DROP FUNCTION @extschema@.idem_1_1_step(text, text, text, VARIADIC text[]);
DROP FUNCTION @extschema@.idem_1_1_dry_run(text, text, VARIADIC text[]);
DROP FUNCTION @extschema@.idem_1_1_run_purge(timestamptz);

-- Lifecycle of queues and topics: an administrator changes a queue's cap
-- and retry policy, and drops a queue or a topic (refused while it has
-- unfinished runs or undelivered events, unless cascade cancels the runs
-- or deletes the events).  src/workflow/queue.c, control.c,
-- src/outbox/outbox.c.
CREATE FUNCTION @extschema@.idem_queue_alter(queue text,
	concurrency integer DEFAULT NULL, max_attempts integer DEFAULT NULL,
	backoff_base interval DEFAULT NULL, backoff_cap interval DEFAULT NULL,
	jitter text DEFAULT NULL, uncapped boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_queue_alter'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_queue_alter(text, integer, integer, interval, interval, text, boolean) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_queue_drop(queue text,
	cascade boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_queue_drop'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_queue_drop(text, boolean) FROM PUBLIC;

CREATE FUNCTION @extschema@.idem_outbox_drop_topic(topic text,
	cascade boolean DEFAULT false)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_outbox_drop_topic'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_outbox_drop_topic(text, boolean) FROM PUBLIC;

-- Logical replication of idem's tables to a server with idem installed
-- (a move to another server, FOR ALL TABLES or FOR TABLES IN SCHEMA idem).
-- idem.lock_seed keeps the subscriber's own secret: the publisher's row,
-- copied by the table sync or the apply worker (which run as replica
-- sessions), is skipped.
CREATE FUNCTION @extschema@.idem_lock_seed_local() RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_lock_seed_local'
LANGUAGE C;
REVOKE ALL ON FUNCTION @extschema@.idem_lock_seed_local() FROM PUBLIC;
CREATE TRIGGER lock_seed_local
	BEFORE INSERT ON idem.lock_seed
	FOR EACH ROW EXECUTE FUNCTION @extschema@.idem_lock_seed_local();
ALTER TABLE idem.lock_seed ENABLE REPLICA TRIGGER lock_seed_local;
-- The audit purge deletes with a publication that publishes deletes (the
-- default), which needs a replica identity; the table has no key.
ALTER TABLE idem.audit REPLICA IDENTITY FULL;
