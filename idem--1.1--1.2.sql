/* idem--1.1--1.2.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem UPDATE TO '1.2'" to load this file. \quit

-- A fresh installation of 1.2 runs idem--1.0.sql, idem--1.0--1.1.sql and
-- this script in turn: there is no separate full script to keep in step.

-- identity: a regclass (or other reg*) part of a derived key names its
-- object the same way whatever the caller's search_path and quoting.
ALTER FUNCTION @extschema@.idem_key(VARIADIC "any")
	SET search_path = pg_catalog SET quote_all_identifiers = off;
