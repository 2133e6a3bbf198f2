/* idem--1.1.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idem" to load this file. \quit

/*
 * The public functions live in the schema CREATE EXTENSION chose (by
 * default the first schema of search_path, normally "public"), so that
 * idem_execute() is callable unqualified.  The tables live in a schema of
 * their own that ordinary roles cannot even look into: the C code reaches
 * them by OID, never through search_path.
 */
CREATE SCHEMA idem;
REVOKE ALL ON SCHEMA idem FROM PUBLIC;

-- One row per idempotency key.  Inserted once, at the end of the call, in
-- the caller's transaction; updated only to move expires_at when the
-- transaction commits long after the call.  A key is (owner, key): each
-- role has a namespace of its own.  Keys are opaque bytes, hence
-- COLLATE "C" (a C.UTF-8 database would otherwise compare with strcoll).
-- owner is regrole, not oid, so that pg_dump writes the role's name and a
-- restore into another cluster maps it to that cluster's OID.
-- fingerprint_version says how fingerprint was computed (1: idem 1.0).
-- The column order is 1.0's plus one column, so that an updated and a
-- fresh installation have the same table.
CREATE TABLE idem.keys (
	key			text COLLATE "C" NOT NULL,
	owner		regrole NOT NULL,
	fingerprint	bytea NOT NULL,
	response	jsonb NOT NULL,
	created_at	timestamptz NOT NULL,
	expires_at	timestamptz NOT NULL,
	fingerprint_version smallint NOT NULL,
	CONSTRAINT keys_pkey PRIMARY KEY (owner, key)
);
CREATE INDEX keys_expires_at_idx ON idem.keys (expires_at);
SELECT pg_catalog.pg_extension_config_dump('idem.keys', '');

-- Side effects to deliver to the outside world, written in the same
-- transaction as the key record.  event_id is random, not a sequence, so a
-- failover can never hand the same id to two different events.
CREATE TABLE idem.outbox (
	event_id	uuid NOT NULL,
	key			text COLLATE "C" NOT NULL,
	owner		regrole NOT NULL,
	topic		text NOT NULL,
	payload		jsonb NOT NULL,
	created_at	timestamptz NOT NULL,
	CONSTRAINT outbox_pkey PRIMARY KEY (event_id)
);
CREATE INDEX outbox_created_at_idx ON idem.outbox (created_at);
SELECT pg_catalog.pg_extension_config_dump('idem.outbox', '');

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

CREATE FUNCTION @extschema@.idem_execute(key text, sql text)
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_execute(key text, sql text, VARIADIC args "any")
RETURNS pg_catalog.jsonb
AS 'MODULE_PATHNAME', 'idem_execute_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION @extschema@.idem_execute_ex(key text, sql text,
	VARIADIC args "any",
	OUT response pg_catalog.jsonb, OUT replayed boolean,
	OUT first_executed_at timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_execute_ex_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Purging crosses roles, so it is not for everyone.
CREATE FUNCTION @extschema@.idem_purge(batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION @extschema@.idem_purge(integer) FROM PUBLIC;
