--
-- upgrade: a database created at 1.0, with key records written by idem
-- 1.0 as two roles, keeps working across ALTER EXTENSION idem UPDATE
--
-- The records below were written by the real idem 1.0 (commit aef0364) on
-- PostgreSQL 15, x86_64, and dumped with pg_dump --data-only; the script
-- that made them is test/fixtures/make-1.0-records.sql.  Their version 1
-- fingerprints depend on PostgreSQL 15's token numbers, as 1.0's did.
--
SELECT current_database() AS regress_db \gset
CREATE DATABASE idem_upgrade;
\c idem_upgrade
CREATE EXTENSION idem VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'idem';
CREATE ROLE regress_idem_alice;
CREATE ROLE regress_idem_bob;
CREATE TABLE up_pay (id int PRIMARY KEY, who text NOT NULL DEFAULT current_user, amount numeric(12,2));
GRANT ALL ON up_pay TO regress_idem_alice, regress_idem_bob;
CREATE DOMAIN up_cents AS integer;
COPY idem.keys (key, owner, fingerprint, response, created_at, expires_at) FROM stdin;
up:alice:1	regress_idem_alice	\\x98ed7c7601c71b120d3bfd42d3aff19cebfb9c7beffcf6818da24f85609ffd73	{"rows": [{"id": 1, "who": "regress_idem_alice", "amount": 10.50}], "command": "INSERT", "rowcount": 1}	2026-12-01 09:18:38.54635+00	2094-12-19 12:32:45.54635+00
up:alice:2	regress_idem_alice	\\xc8cb3f3e0dabb14472b8b4e4664a387e84945a0db2fb1bef0c9dd959b6eba3e9	{"rows": [{"id": 2, "who": "regress_idem_alice", "amount": 20.00}], "command": "INSERT", "rowcount": 1}	2026-12-01 09:18:38.548491+00	2094-12-19 12:32:45.548491+00
up:alice:3	regress_idem_alice	\\xc457d38a3f8bae340cc7f08779defedfc5dfec1d7bfdbb2318eec3dd17bd80d0	{"rows": [{"b": true, "t": "hello"}], "command": "SELECT", "rowcount": 1}	2026-12-01 09:18:38.549277+00	2094-12-19 12:32:45.549277+00
up:bob:1	regress_idem_bob	\\x50d25196df83ddce9d8a3c5a9c959f3fc13dfa7f16b27c818e01c3f94be075a8	{"rows": [{"id": 3, "who": "regress_idem_bob", "amount": 7.25}], "command": "INSERT", "rowcount": 1}	2026-12-01 09:18:38.550029+00	2094-12-19 12:32:45.550029+00
up:alice:4	regress_idem_alice	\\x3273d6cc306aa55dd9f093c956738703e579a3dbdd5e69e323e61de120705e8c	{"rows": [{"c": 5}], "command": "SELECT", "rowcount": 1}	2026-12-01 09:18:42.098068+00	2094-12-19 12:32:49.098068+00
\.
-- outbox events as 1.0 wrote them (idem 1.0's table shape)
COPY idem.outbox (event_id, key, owner, topic, payload, created_at) FROM stdin;
7b7b0f4e-3c7a-4e0c-9a53-0d5c1a1e0001	up:alice:1	regress_idem_alice	payments	{"rows": [{"id": 1, "who": "regress_idem_alice", "amount": 10.50}], "command": "INSERT", "rowcount": 1}	2026-12-01 09:18:38.54635+00
7b7b0f4e-3c7a-4e0c-9a53-0d5c1a1e0002	up:bob:1	regress_idem_bob	mail	{"rows": [{"id": 3, "who": "regress_idem_bob", "amount": 7.25}], "command": "INSERT", "rowcount": 1}	2026-12-01 09:18:38.550029+00
\.
COPY public.up_pay (id, who, amount) FROM stdin;
1	regress_idem_alice	10.50
2	regress_idem_alice	20.00
3	regress_idem_bob	7.25
\.

-- the 1.2 library refuses the 1.0 definitions, and writes nothing
SET ROLE regress_idem_alice;
SELECT idem_execute('up:alice:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 1, 10.50::numeric);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_execute_ex('up:new', 'SELECT 1 AS one');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT idem_purge();
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS keys FROM idem.keys;

ALTER EXTENSION idem UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem';

-- the updated table is the one a fresh installation creates
SELECT attnum, attname, atttypid::regtype, attnotnull
  FROM pg_attribute WHERE attrelid = 'idem.keys'::regclass AND attnum > 0
 ORDER BY attnum;
SELECT indexrelid::regclass AS index, pg_get_indexdef(indexrelid) AS definition
  FROM pg_index WHERE indrelid = 'idem.keys'::regclass ORDER BY indexrelid::regclass::text;
SELECT key, owner, fingerprint_version FROM idem.keys ORDER BY key;

-- 1.0's outbox events are pending, due since they were written, and their
-- topics are registered (publishers and consumers: superusers until an
-- administrator grants them)
SELECT key, owner, topic, state, attempts, next_attempt_at = created_at AS due_since_written,
	   run_id, step, lease_token, last_error, delivered_at
  FROM idem.outbox ORDER BY key;
SELECT topic, publishers, consumers FROM idem.outbox_topics ORDER BY topic;
BEGIN;
SELECT key, attempt FROM idem_outbox_claim('payments');
ROLLBACK;

-- every object of the updated extension is the one a fresh installation creates:
-- members, columns, constraints, indexes, functions and their grants,
-- the view, the configuration tables
\set describe_idem 'SELECT d FROM (SELECT format($$member %s$$, pg_describe_object(classid, objid, objsubid)) FROM pg_depend WHERE refclassid = $$pg_extension$$::regclass AND refobjid = (SELECT oid FROM pg_extension WHERE extname = $$idem$$) AND deptype = $$e$$ UNION ALL SELECT format($$column %s.%s %s %s %s %s %s$$, a.attrelid::regclass, a.attname, a.attnum, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attcollation::regcollation, pg_get_expr(d.adbin, d.adrelid)) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum WHERE c.relnamespace = $$idem$$::regnamespace AND c.relkind IN ($$r$$, $$v$$) AND a.attnum > 0 AND NOT a.attisdropped UNION ALL SELECT format($$constraint %s %s %s$$, conrelid::regclass, conname, pg_get_constraintdef(oid)) FROM pg_constraint WHERE connamespace = $$idem$$::regnamespace UNION ALL SELECT format($$index %s$$, pg_get_indexdef(indexrelid)) FROM pg_index WHERE indrelid IN (SELECT oid FROM pg_class WHERE relnamespace = $$idem$$::regnamespace) UNION ALL SELECT format($$relation %s %s %s$$, oid::regclass, relkind, relacl) FROM pg_class WHERE relnamespace = $$idem$$::regnamespace OR relname LIKE $$idem%$$ UNION ALL SELECT format($$function %s %s (%s) %s %s %s %s %s %s %s$$, oid::regprocedure, pg_get_function_result(oid), pg_get_function_arguments(oid), prosrc, provolatile, proparallel, prosecdef, proisstrict, proacl, proconfig) FROM pg_proc WHERE proname LIKE $$idem%$$ UNION ALL SELECT format($$view %s %s$$, oid::regclass, md5(pg_get_viewdef(oid))) FROM pg_class WHERE relkind = $$v$$ AND relname LIKE $$idem%$$ UNION ALL SELECT format($$config %s %s$$, extconfig::regclass[], extcondition) FROM pg_extension WHERE extname = $$idem$$) s(d)'
SELECT string_agg(d, chr(30) ORDER BY d) AS upgraded_objects FROM (:describe_idem) x \gset
SELECT count(*) > 50 AS described FROM (:describe_idem) x;
CREATE DATABASE idem_fresh;
\c idem_fresh
CREATE EXTENSION idem;
-- in the fresh installation but not the updated one, and the other way
SELECT d AS only_fresh FROM (:describe_idem) x
EXCEPT SELECT unnest(string_to_array(:'upgraded_objects', chr(30)));
SELECT unnest(string_to_array(:'upgraded_objects', chr(30))) AS only_upgraded
EXCEPT SELECT d FROM (:describe_idem) x;
\c idem_upgrade
DROP DATABASE idem_fresh;

-- old keys replay, byte for byte, for their own role
SET ROLE regress_idem_alice;
SELECT replayed, response FROM idem_execute_ex('up:alice:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 1, 10.50::numeric);
SELECT replayed, response FROM idem_execute_ex('up:alice:2', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 2::bigint, 20.00::numeric);
SELECT replayed, response FROM idem_execute_ex('up:alice:3', 'SELECT $1::text AS t, $2 AS b', 'hello', true);
-- a different request under an old key is still refused
SELECT idem_execute('up:alice:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 1, 99.00::numeric);
\echo :LAST_ERROR_SQLSTATE
-- a 1.0 record whose arguments 1.0 hashed by text output (a domain) cannot
-- be told apart from a different request: refused, never replayed
SELECT idem_execute('up:alice:4', 'SELECT $1 AS c', 5::up_cents);
\echo :LAST_ERROR_SQLSTATE
SET ROLE regress_idem_bob;
SELECT replayed, response FROM idem_execute_ex('up:bob:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 3, 7.25::numeric);

-- the new key identity: bob's 'up:alice:1' is his own key, not alice's
SELECT replayed, response FROM idem_execute_ex('up:alice:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 4, 1.00::numeric);
SELECT replayed FROM idem_execute_ex('up:alice:1', 'INSERT INTO up_pay (id, amount) VALUES ($1, $2) RETURNING id, who, amount', 4, 1.00::numeric);
RESET ROLE;
SELECT id, who, amount FROM up_pay ORDER BY id;

-- new features work: version 2 records, the ttl ceiling
SELECT key, owner, fingerprint_version FROM idem.keys
 WHERE owner = 'regress_idem_bob'::regrole ORDER BY key;
SET idem.ttl = '100d';
SELECT idem_execute('up:ttl', 'SELECT 1 AS one');
\echo :LAST_ERROR_SQLSTATE
RESET idem.ttl;
SELECT idem_purge();

-- the upgraded installation is exactly what a fresh installation is:
-- every function, table, column, constraint, index, trigger and privilege
\set ECHO none
\i test/fixtures/describe-idem.sql
\set ECHO all
\set upgraded :idem_objects
CREATE DATABASE idem_fresh;
\c idem_fresh
CREATE EXTENSION idem;
\set ECHO none
\i test/fixtures/describe-idem.sql
\set ECHO all
SELECT :'upgraded' = :'idem_objects' AS same_objects;
-- (on a difference, show the lines that differ)
SELECT line FROM regexp_split_to_table(:'idem_objects', E'\n') AS line
EXCEPT SELECT line FROM regexp_split_to_table(:'upgraded', E'\n') AS line;
SELECT line FROM regexp_split_to_table(:'upgraded', E'\n') AS line
EXCEPT SELECT line FROM regexp_split_to_table(:'idem_objects', E'\n') AS line;

-- a database created at 1.1 updates to exactly what a fresh installation is
CREATE DATABASE idem_from_1_1;
\c idem_from_1_1
CREATE EXTENSION idem VERSION '1.1';
SELECT extversion FROM pg_extension WHERE extname = 'idem';
-- runs and step records as idem 1.1 wrote them (the real 1.1, commit
-- 1b5e56a; the script is test/fixtures/make-1.1-steps.sql).  1.1's
-- idem_step adopted a record that idem_execute() had written under the
-- step's key, with that record's ttl: step a's has run out, step b's runs
-- out in 30 days; step x's idem_step wrote itself, never to expire.
COPY idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version) FROM stdin;
idem.step:up\\:run\\:1:a	regress_idem_alice	\\x784b03d6612de298487d768626346f92c57cf81230e44c91fd9a6c52d0772a82	{"rows": [{"n": 1}], "command": "SELECT", "rowcount": 1}	2026-12-02 13:21:00.044318+00	2026-12-02 13:21:03.045456+00	2
idem.step:up\\:run\\:1:b	regress_idem_alice	\\xb19f441bae5f14de01879d1398295a0d45561d77a69a834e3298a3e83cabf35b	{"rows": [{"n": 2}], "command": "SELECT", "rowcount": 1}	2026-12-02 13:21:00.075924+00	2027-01-01 13:21:01.07614+00	2
idem.step:up\\:run\\:2:x	regress_idem_alice	\\x7f166d1f5b5d32ff581d1d03ea9072f2f65eafac3888abb784b03ae5f22bbad1	{"rows": [{"n": 3}], "command": "SELECT", "rowcount": 1}	2026-12-02 13:21:00.124672+00	infinity	2
\.
COPY idem.runs (run_id, owner, steps, input, status, started_at, finished_at, last_error, done_steps, attempts) FROM stdin;
up:run:1	regress_idem_alice	{a,b,c}	\N	running	2026-12-02 13:21:00.0203+00	\N	\N	{a,b}	{1,1}
up:run:2	regress_idem_alice	\N	\N	running	2026-12-02 13:21:00.1016+00	\N	\N	{x}	{1}
\.
-- and step e of up:run:3 as 1.1 adopted it from an idem_execute() under
-- the step's key with idem.cache_errors = '22': a cached error counted as
-- the step's result (its fingerprint is set below, from a probe call)
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
VALUES (idem_step_key('up:run:3', 'e'), 'regress_idem_alice',
		decode(repeat('00', 32), 'hex'),
		'{"error": {"sqlstate": "22012", "message": "division by zero"}}',
		'2026-12-02 13:21:00+00', '2099-01-01 00:00:00+00', 2);
INSERT INTO idem.runs (run_id, owner, steps, status, started_at, done_steps, attempts)
VALUES ('up:run:3', 'regress_idem_alice', '{e,f}', 'running', '2026-12-02 13:21:00+00', '{e}', '{1}');
-- outbox events in 1.1's states, in 1.1's table shape: pending (one of a
-- run's step), leased under a lease that holds, leased under one that
-- ran out, and a dead letter; alice consumes the topic
INSERT INTO idem.outbox_topics (topic, publishers, consumers, created_at)
VALUES ('up11', '{regress_idem_bob}', '{regress_idem_alice}', '2026-12-02 13:21:00+00');
COPY idem.outbox (event_id, key, owner, topic, payload, created_at, run_id, step, state, attempts, next_attempt_at, lease_token, leased_by, lease_holder, last_error, delivered_at) FROM stdin;
0b0b0b0b-0000-4000-8000-000000000001	up:ev:1	regress_idem_bob	up11	{"n": 1}	2026-12-02 13:21:00+00	\N	\N	pending	0	2026-12-02 13:21:00+00	\N	\N	\N	\N	\N
0b0b0b0b-0000-4000-8000-000000000002	up:ev:2	regress_idem_bob	up11	{"n": 2}	2026-12-02 13:21:01+00	\N	\N	leased	1	2099-01-01 00:00:00+00	1e1e1e1e-0000-4000-8000-000000000002	regress_idem_alice	w1	\N	\N
0b0b0b0b-0000-4000-8000-000000000003	up:ev:3	regress_idem_bob	up11	{"n": 3}	2026-12-02 13:21:02+00	\N	\N	leased	1	2026-12-02 13:22:00+00	1e1e1e1e-0000-4000-8000-000000000003	regress_idem_alice	w1	\N	\N
0b0b0b0b-0000-4000-8000-000000000004	up:ev:4	regress_idem_bob	up11	{"n": 4}	2026-12-02 13:21:03+00	\N	\N	dead	10	2026-12-02 13:21:03+00	\N	\N	\N	failed ten times	\N
0b0b0b0b-0000-4000-8000-000000000005	idem.step:up\\:run\\:1:b	regress_idem_alice	up11	{"n": 5}	2026-12-02 13:21:04+00	up:run:1	b	pending	0	2026-12-02 13:21:04+00	\N	\N	\N	\N	\N
\.
-- an update rolled back leaves 1.1's definitions: the session that used
-- the updated ones inside the transaction is refused again after it
BEGIN;
ALTER EXTENSION idem UPDATE;
SELECT idem_execute('up:rolled-back', 'SELECT 1 AS one') ->> 'command' AS updated_inside;
SELECT idem_queue_create('up:rolled-back');
ROLLBACK;
SELECT extversion FROM pg_extension WHERE extname = 'idem';
-- until the update the 1.2 library refuses the 1.1 definitions, and says
-- to update them: not to reinstall, which would drop every record
SELECT idem_execute('up:1.1', 'SELECT 1');
SELECT idem_outbox_claim('up11');
SELECT idem_purge();
ALTER EXTENSION idem UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem';
\set ECHO none
\i test/fixtures/describe-idem.sql
\set ECHO all
SELECT :'upgraded' = :'idem_objects' AS same_objects_from_1_1;
-- 1.1's events after the update: the lease that holds still fences (an
-- ack under another token is refused, its own token acks it), the pending
-- events and the one whose lease ran out are claimed (that one's second
-- attempt), the run's event in its step's place, the dead letter stays dead
SELECT event_id, run_position FROM idem.outbox WHERE run_id IS NOT NULL;
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) TO regress_idem_alice;
SET ROLE regress_idem_alice;
SELECT idem_outbox_ack('0b0b0b0b-0000-4000-8000-000000000002', '1e1e1e1e-0000-4000-8000-000000000003');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_outbox_ack('0b0b0b0b-0000-4000-8000-000000000002', '1e1e1e1e-0000-4000-8000-000000000002');
BEGIN;
SELECT key, attempt, payload FROM idem_outbox_claim('up11', 10) ORDER BY key;
ROLLBACK;
RESET ROLE;
SELECT event_id, state, attempts, last_error FROM idem.outbox WHERE topic = 'up11' ORDER BY event_id;
REVOKE EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) FROM regress_idem_alice;
-- a record a run lists as a completed step never expires after the
-- update, as the ones 1.2 writes: each step replays, never runs again,
-- and the run goes on and completes with its steps' records
SELECT key, expires_at FROM idem.keys ORDER BY key;
SET ROLE regress_idem_alice;
SELECT idem_step('up:run:1', 'a', 'SELECT $1::int AS n', 1) -> 'rows' AS a_replays;
SELECT idem_step('up:run:1', 'b', 'SELECT $1::int AS n', 2) -> 'rows' AS b_replays;
SELECT idem_step('up:run:1', 'c', 'SELECT $1::int AS n', 4) -> 'rows' AS c_runs;
SELECT idem_run_complete('up:run:1');
SELECT status FROM idem_run_status('up:run:1');
SELECT step, attempts FROM idem_run_steps('up:run:1') ORDER BY step;
SELECT idem_step('up:run:2', 'x', 'SELECT $1::int AS n', 3) -> 'rows' AS x_replays;
-- 1.1's runs are alice's own rows of the operators' views
SELECT run_id, status, queue, state FROM idem_runs ORDER BY run_id;
RESET ROLE;
SELECT idem_purge() AS purged;
SELECT count(*) AS step_records FROM idem.keys;
-- the update left step e's cached error to expire (it never took
-- effect), and idem_step refuses to replay it as the step's result
SELECT key, expires_at FROM idem.keys WHERE key = idem_step_key('up:run:3', 'e');
SET ROLE regress_idem_alice;
SET idem.cache_errors = '22';
SELECT idem_execute('up:probe', 'SELECT 1/$1::int AS n', 0) AS probe;
RESET idem.cache_errors;
RESET ROLE;
UPDATE idem.keys k SET fingerprint = p.fingerprint, response = p.response
  FROM idem.keys p
 WHERE p.key = 'up:probe' AND k.key = idem_step_key('up:run:3', 'e');
SET ROLE regress_idem_alice;
SELECT idem_step('up:run:3', 'e', 'SELECT 1/$1::int AS n', 0);
SELECT step, attempts FROM idem_run_steps('up:run:3');
RESET ROLE;

-- an administrator's privileges on the 1.1 functions and views that the
-- update replaces pass on to their replacements: what was revoked from
-- PUBLIC stays revoked, what was granted stays granted; and they stay the
-- administrator's, not the extension's initial ones (pg_init_privs as a
-- new installation's), so that pg_dump keeps them
CREATE DATABASE idem_acl_1_1;
\c idem_acl_1_1
CREATE EXTENSION idem VERSION '1.1';
REVOKE EXECUTE ON FUNCTION idem_run_begin(text, text[], jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_run_begin(text, text[], jsonb) TO regress_idem_alice;
REVOKE EXECUTE ON FUNCTION idem_execute(text, text, VARIADIC text[]) FROM PUBLIC;
REVOKE SELECT ON idem_stats FROM PUBLIC;
GRANT SELECT ON idem_stats TO regress_idem_bob WITH GRANT OPTION;
REVOKE EXECUTE ON FUNCTION idem_run_complete(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_run_purge(timestamptz) TO regress_idem_bob;
-- a role that may create objects in the extension's schema sets traps:
-- operators that match the update's comparisons more closely than
-- pg_catalog's, which would run as the superuser who updates; none runs
CREATE ROLE regress_idem_trapper;
GRANT CREATE ON SCHEMA public TO regress_idem_trapper;
CREATE TABLE trap_log (who text, what text);
GRANT INSERT ON trap_log TO regress_idem_trapper;
SET ROLE regress_idem_trapper;
CREATE FUNCTION trap_acl(aclitem[], aclitem[]) RETURNS boolean LANGUAGE plpgsql
	AS $$BEGIN INSERT INTO public.trap_log VALUES (current_user, 'aclitem[] ='); RETURN false; END$$;
CREATE OPERATOR = (LEFTARG = aclitem[], RIGHTARG = aclitem[], FUNCTION = trap_acl);
CREATE FUNCTION trap_role(regrole, regrole) RETURNS boolean LANGUAGE plpgsql
	AS $$BEGIN INSERT INTO public.trap_log VALUES (current_user, 'regrole ='); RETURN false; END$$;
CREATE OPERATOR = (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = trap_role);
RESET ROLE;
SET search_path = public, pg_catalog;
ALTER EXTENSION idem UPDATE;
RESET search_path;
DROP OWNED BY regress_idem_trapper;
DROP ROLE regress_idem_trapper;
SELECT * FROM trap_log;
\set acl_of 'SELECT pg_catalog.array_agg(pg_catalog.format($$%s %s%s$$, CASE a.grantee WHEN 0 THEN $$PUBLIC$$ ELSE a.grantee::regrole::text END, a.privilege_type, CASE WHEN a.is_grantable THEN $$*$$ ELSE $$$$ END) ORDER BY 1) FROM pg_catalog.aclexplode'
SELECT p.oid::regprocedure AS function,
	   (:acl_of(coalesce(p.proacl, acldefault('f', p.proowner))) a WHERE a.grantee <> p.proowner) AS privileges,
	   (SELECT count(*) FROM pg_init_privs i WHERE i.objoid = p.oid) AS initial
  FROM pg_proc p
 WHERE p.proname IN ('idem_run_begin', 'idem_execute', 'idem_call', 'idem_stats', 'idem_run_complete', 'idem_run_purge')
 ORDER BY p.oid::regprocedure::text;
SELECT c.relname AS view,
	   (:acl_of(c.relacl) a WHERE a.grantee <> c.relowner) AS privileges,
	   (:acl_of(i.initprivs) a WHERE a.grantee <> c.relowner) AS initial
  FROM pg_class c LEFT JOIN pg_init_privs i ON i.objoid = c.oid
 WHERE c.relname IN ('idem_stats', 'idem_stats_roles') ORDER BY 1;
SELECT count(*) AS renamed_left FROM pg_proc WHERE proname LIKE 'idem\_1\_1\_%';
-- (on PostgreSQL 17 and later, no role depends on an initial privilege
-- the update made and put back)
SELECT count(*) AS initial_privilege_roles FROM pg_shdepend
 WHERE deptype = 'i' AND refobjid IN ('regress_idem_alice'::regrole, 'regress_idem_bob'::regrole);
SET ROLE regress_idem_bob;
SELECT idem_run_purge('-infinity', 10);
SELECT idem_run_begin('acl:1');
SELECT idem_execute('acl:1', 'SELECT $1 AS a', 'x');
SELECT count(*) FROM idem_stats;
SET ROLE regress_idem_alice;
SELECT created FROM idem_run_begin('acl:1');
SELECT count(*) FROM idem_stats;
RESET ROLE;

\c :regress_db
DROP DATABASE idem_acl_1_1;
DROP DATABASE idem_fresh;
DROP DATABASE idem_from_1_1;
DROP DATABASE idem_upgrade;
DROP ROLE regress_idem_alice;
DROP ROLE regress_idem_bob;
