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
