/* idem--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '1.2'" to load this file. \quit

-- A fresh installation of 1.2 runs idem--1.0.sql, idem--1.0--1.1.sql and
-- this script in turn: there is no separate full script to keep in step.

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
