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

-- runs: idem_run_purge() takes each run's lock before it removes the run,
-- and leaves a run that a step or a run verb holds for the next purge, so
-- that they find the run or ID404, never a row deleted under them.
CREATE FUNCTION @extschema@.idem_run_try_lock(owner regrole, run_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_run_try_lock'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE COST 1000;
REVOKE ALL ON FUNCTION @extschema@.idem_run_try_lock(regrole, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION @extschema@.idem_run_purge(finished_before timestamptz)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
WITH runs AS (
	SELECT r.owner, r.run_id, r.status, r.finished_at,
		NOT EXISTS (SELECT FROM pg_catalog.pg_roles a
					 WHERE a.oid OPERATOR(pg_catalog.=) r.owner)
			AS owner_gone
	  FROM idem.runs r
), candidates AS MATERIALIZED (
	SELECT r.owner, r.run_id, r.owner_gone
	  FROM runs r
	 WHERE r.owner_gone OR (r.status OPERATOR(pg_catalog.<>) 'running'
		AND r.finished_at OPERATOR(pg_catalog.<) finished_before)
), locked AS MATERIALIZED (
	SELECT c.owner, c.run_id, c.owner_gone
	  FROM candidates c
	 WHERE @extschema@.idem_run_try_lock(c.owner, c.run_id)
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
)
SELECT pg_catalog.count(*) FROM gone
$$;
REVOKE ALL ON FUNCTION @extschema@.idem_run_purge(timestamptz) FROM PUBLIC;

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

-- outbox delivery (issue 24): no CHECK on an event's state.  PostgreSQL
-- reads a table's CHECK constraints from their stored text and plans them
-- again in every statement that writes a row, which cost each claim (and
-- each producer's event) more than the lease update itself.  Only idem's
-- functions write idem.outbox, as its owner, and each sets one of pending,
-- leased, delivered and dead (tested in outbox_delivery and outbox_ack).
ALTER TABLE idem.outbox DROP CONSTRAINT outbox_state_check;
