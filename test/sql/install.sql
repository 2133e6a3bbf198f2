--
-- install: what CREATE EXTENSION idem creates, and how
--
CREATE EXTENSION idem;

-- the functions land in the schema CREATE EXTENSION chose (public here),
-- SECURITY INVOKER, volatile, parallel unsafe
SELECT p.oid::regprocedure AS function, n.nspname AS schema,
       p.prosecdef AS security_definer, p.provolatile, p.proparallel
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE p.proname LIKE 'idem%'
 ORDER BY p.oid::regprocedure::text;

-- every member of the extension (the row types of its tables and views,
-- and every array type, are members of their own from PostgreSQL 17 on:
-- below)
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend d
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
   AND deptype = 'e'
   AND NOT (classid = 'pg_type'::regclass AND EXISTS
            (SELECT FROM pg_type t
              WHERE t.oid = d.objid AND (t.typrelid <> 0 OR t.typcategory = 'A')))
 ORDER BY 1;
SELECT (count(*) > 0) = (current_setting('server_version_num')::int >= 170000)
       AS row_types_are_members_from_17
  FROM pg_depend d JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
   AND d.deptype = 'e' AND t.typrelid <> 0;

-- the catalog and the outbox are dumped by pg_dump
SELECT extconfig::regclass[] AS config_tables
  FROM pg_extension WHERE extname = 'idem';

-- keys are opaque bytes: compared with the "C" collation whatever the
-- database's default
SELECT attrelid::regclass AS tab, attname, collname
  FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
 WHERE attrelid IN ('idem.keys'::regclass, 'idem.outbox'::regclass)
   AND attname = 'key'
 ORDER BY 1;

-- not a trusted extension, superuser-only install, not relocatable
SELECT version, superuser, trusted, relocatable
  FROM pg_available_extension_versions WHERE name = 'idem' ORDER BY version;
-- 1.2 is the default and what CREATE EXTENSION installed (through the
-- chain 1.0, 1.0--1.1, 1.1--1.2); 1.0 and 1.1 update to it
SELECT default_version, installed_version
  FROM pg_available_extensions WHERE name = 'idem';
SELECT * FROM pg_extension_update_paths('idem') WHERE path IS NOT NULL;
-- the entry points of the 1.2 definitions
SELECT p.oid::regprocedure AS function, p.prosrc
  FROM pg_proc p WHERE p.proname LIKE 'idem%' ORDER BY p.oid::regprocedure::text;

-- PUBLIC gets nothing on the private schema
SELECT has_schema_privilege('public', 'idem', 'USAGE') AS public_usage,
       has_schema_privilege('public', 'idem', 'CREATE') AS public_create;

-- callable unqualified with the default search_path
SHOW search_path;
SELECT idem_execute('install:1', 'SELECT 1 AS one');

-- the configuration parameters and their defaults
SELECT name, setting, unit, context, vartype
  FROM pg_settings WHERE name LIKE 'idem.%' ORDER BY name;
SHOW idem.ttl;

-- the idem. prefix is reserved: a typo is an error, not a silent no-op
SET idem.tll = '1h';

-- a schema named idem that the extension did not create is never adopted
DROP EXTENSION idem;
CREATE SCHEMA idem;
-- (18 adds the script's line as context)
\set SHOW_CONTEXT never
CREATE EXTENSION idem;
\set SHOW_CONTEXT errors
DROP SCHEMA idem;
CREATE EXTENSION idem;
SELECT count(*) AS keys_after_reinstall FROM idem.keys;

-- nor a role idem_admin that cannot be trusted (55000, nothing installed):
-- its members act on every role's runs, and CREATE ROLE needs only
-- CREATEROLE; one only superusers granted and administer is kept (another
-- database's install made it)
\set SHOW_CONTEXT never
DROP EXTENSION idem;
DROP ROLE idem_admin;
CREATE ROLE regress_inst_ops;
CREATE ROLE idem_admin LOGIN;
CREATE EXTENSION idem;
\echo :LAST_ERROR_SQLSTATE
ALTER ROLE idem_admin NOLOGIN;
GRANT idem_admin TO regress_inst_ops WITH ADMIN OPTION;
CREATE EXTENSION idem;
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS installed FROM pg_extension WHERE extname = 'idem';
DROP ROLE idem_admin;
-- made by a CREATEROLE role, which granted it to itself (from 16 on, it
-- holds ADMIN OPTION on what it made too: the error's detail differs)
CREATE ROLE regress_inst_squatter CREATEROLE;
SET ROLE regress_inst_squatter;
SET client_min_messages = warning;
CREATE ROLE idem_admin;
GRANT idem_admin TO regress_inst_squatter;
RESET client_min_messages;
RESET ROLE;
\set VERBOSITY terse
CREATE EXTENSION idem;
\echo :LAST_ERROR_SQLSTATE
\set VERBOSITY default
DROP ROLE idem_admin;
CREATE ROLE idem_admin;
GRANT idem_admin TO regress_inst_ops;
CREATE EXTENSION idem;
SELECT r.rolname, m.admin_option
  FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member
 WHERE m.roleid = 'idem_admin'::regrole;
REVOKE idem_admin FROM regress_inst_ops;
DROP ROLE regress_inst_ops, regress_inst_squatter;
\set SHOW_CONTEXT errors
-- the same session keeps working after the reinstall (cached OIDs reset)
SELECT idem_execute('install:1', 'SELECT 1 AS one') ->> 'rowcount' AS after_reinstall;
SELECT count(*) AS keys FROM idem.keys;

-- a queue's table and its due indexes: autovacuumed after a hundredth of
-- the outbox's rows died (not a fifth), and the due indexes not
-- deduplicated (the entries of one transaction's rows share a due time)
SELECT c.relname, c.reloptions FROM pg_class c
 WHERE c.oid IN ('idem.outbox'::regclass, 'idem.outbox_due_idx'::regclass,
				 'idem.runs_due_idx'::regclass, 'idem.runs_owner_due_idx'::regclass)
 ORDER BY 1;
