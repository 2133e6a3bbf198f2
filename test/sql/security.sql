--
-- security: caller's privileges, records private to their role, and no
-- reliance on search_path
--
CREATE ROLE regress_idem_alice;
CREATE ROLE regress_idem_bob;
CREATE TABLE invoices (id serial PRIMARY KEY, who text DEFAULT current_user);
GRANT INSERT, SELECT ON invoices TO regress_idem_alice, regress_idem_bob;
GRANT USAGE ON SEQUENCE invoices_id_seq TO regress_idem_alice, regress_idem_bob;
CREATE TABLE secrets (s text);
INSERT INTO secrets VALUES ('top');

SET ROLE regress_idem_alice;

-- the statement runs as the caller (SECURITY INVOKER), with no more rights
SELECT idem_execute('sec:1', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
SELECT idem_execute('sec:2', 'SELECT s FROM secrets');
\echo :LAST_ERROR_SQLSTATE

-- idem's tables are out of reach: no reading, no forging
SELECT * FROM idem.keys;
\echo :LAST_ERROR_SQLSTATE
INSERT INTO idem.keys VALUES ('sec:forged', 0, '\x', '{}', now(), now());
\echo :LAST_ERROR_SQLSTATE
SELECT idem_purge(10);
\echo :LAST_ERROR_SQLSTATE

-- a key is (owner, key): bob presenting alice's key text has a key of his
-- own, never her response and never an error about hers (issue 8, part 2)
SET ROLE regress_idem_bob;
SELECT idem_execute('sec:1', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
SELECT replayed, response FROM idem_execute_ex('sec:1', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
-- bob's own record decides what his key means; alice's does not
SELECT idem_execute('sec:1', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT who, count(*) AS invoices FROM invoices GROUP BY who ORDER BY who;

-- squatting: bob records alice's next key first, for as long as he may;
-- alice's real call still executes, and replays for her
SET idem.ttl = '30d';
SELECT idem_execute('order-alice-3', 'SELECT 1');
RESET idem.ttl;
SET ROLE regress_idem_alice;
SELECT replayed, response FROM idem_execute_ex('order-alice-3', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
SELECT replayed FROM idem_execute_ex('order-alice-3', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
SET ROLE regress_idem_bob;
SELECT replayed, response FROM idem_execute_ex('order-alice-3', 'SELECT 1');

-- alice still replays her own
SET ROLE regress_idem_alice;
SELECT idem_execute('sec:1', 'INSERT INTO invoices DEFAULT VALUES RETURNING who');
RESET ROLE;
SELECT key, owner::regrole FROM idem.keys WHERE key LIKE 'sec:%' ORDER BY key;

-- a hostile search_path: shadowing tables, functions and operators in a
-- schema searched first changes nothing idem does
CREATE SCHEMA evil;
GRANT USAGE, CREATE ON SCHEMA evil TO regress_idem_bob;
SELECT idem_outbox_create_topic('billing', publishers => '{regress_idem_bob}');
SET ROLE regress_idem_bob;
CREATE TABLE evil.keys (key text, owner oid, fingerprint bytea,
	response jsonb, created_at timestamptz, expires_at timestamptz);
CREATE TABLE evil.outbox (event_id uuid, key text, owner oid, topic text,
	payload jsonb, created_at timestamptz);
CREATE FUNCTION evil.texteq(text, text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured'; RETURN true; END $$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.texteq);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured'; RETURN '2000-01-01'; END $$;
SET search_path = evil, public, pg_catalog;
SET idem.outbox_topic = 'billing';
SELECT idem_execute('sec:3', 'SELECT 3 AS n');
SELECT replayed FROM idem_execute_ex('sec:3', 'SELECT 3 AS n');
SELECT count(*) AS evil_keys FROM evil.keys;
SELECT count(*) AS evil_events FROM evil.outbox;
RESET idem.outbox_topic;
RESET search_path;
RESET ROLE;
SELECT key, owner::regrole, expires_at > now() AS live
  FROM idem.keys WHERE key = 'sec:3';
-- nor of the procedure a superuser's cron job CALLs, which cannot carry
-- a search_path of its own: a type it names is not taken from such a schema
SET ROLE regress_idem_bob;
CREATE FUNCTION evil.spy(pg_catalog.timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured as %', current_user; RETURN true; END $$;
CREATE DOMAIN evil.timestamptz AS pg_catalog.timestamptz CHECK (evil.spy(VALUE));
RESET ROLE;
SET search_path = evil, public, pg_catalog;
CALL idem_purge_all();
RESET search_path;
SELECT topic FROM idem.outbox WHERE key = 'sec:3';

-- pg_locks shows every key lock to every role; the hash in it is keyed by
-- a secret an ordinary role cannot read, so a guessed key text cannot be
-- confirmed against another role's lock
SET ROLE regress_idem_bob;
SELECT seed FROM idem.lock_seed;
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SELECT idem_execute('order-42', 'SELECT 42 AS n') ->> 'command';
SELECT l.objid = ((h # (h >> 32)) & 4294967295) AS guess_confirmed
  FROM pg_locks l,
	   (SELECT hashtextextended('order-42', x'6964656d6b657973'::bigint) AS h) g
 WHERE l.locktype = 'advisory' AND l.objsubid = 18756 AND l.pid = pg_backend_pid();
RESET ROLE;
SELECT l.objid = ((h # (h >> 32)) & 4294967295) AS with_the_secret
  FROM pg_locks l,
	   (SELECT hashtextextended('order-42', (SELECT seed FROM idem.lock_seed)) AS h) g
 WHERE l.locktype = 'advisory' AND l.objsubid = 18756 AND l.pid = pg_backend_pid();
COMMIT;
SELECT count(*) AS seeds FROM idem.lock_seed;

-- SECURITY DEFINER wrappers (issue 19): a call inside one runs as the
-- wrapper's owner, so every caller shares that owner's keys: bob replays
-- what alice recorded, and a mismatch answers for her key
CREATE ROLE regress_idem_definer;
CREATE TABLE payments (id serial PRIMARY KEY, payer text);
GRANT INSERT, SELECT ON payments TO regress_idem_definer;
GRANT USAGE ON SEQUENCE payments_id_seq TO regress_idem_definer;
CREATE FUNCTION pay_shared(k text) RETURNS jsonb SECURITY DEFINER
  LANGUAGE sql SET search_path = pg_catalog, public
  AS $$ SELECT idem_execute(k, 'INSERT INTO payments (payer) VALUES (session_user) RETURNING payer') -> 'rows' $$;
CREATE FUNCTION pay_own(k text) RETURNS jsonb SECURITY DEFINER
  LANGUAGE sql SET search_path = pg_catalog, public SET idem.key_owner = 'session_user'
  AS $$ SELECT idem_execute(k, 'INSERT INTO payments (payer) VALUES (session_user) RETURNING payer') -> 'rows' $$;
ALTER FUNCTION pay_shared(text) OWNER TO regress_idem_definer;
ALTER FUNCTION pay_own(text) OWNER TO regress_idem_definer;
SET SESSION AUTHORIZATION regress_idem_alice;
SELECT pay_shared('sec:pay');
SET SESSION AUTHORIZATION regress_idem_bob;
SELECT pay_shared('sec:pay') AS bob_gets_alices;
-- keyed by the session user: refused while the wrapper's owner lacks the
-- privileges of the caller, and nothing is written
SELECT pay_own('sec:pay');
\echo :LAST_ERROR_SQLSTATE
RESET SESSION AUTHORIZATION;
SELECT payer, count(*) FROM payments GROUP BY payer ORDER BY payer;
-- granted each caller, the wrapper keys each call by its caller
GRANT regress_idem_alice, regress_idem_bob TO regress_idem_definer;
SET SESSION AUTHORIZATION regress_idem_alice;
SELECT pay_own('sec:pay');
SELECT pay_own('sec:pay') AS alice_replays;
SET SESSION AUTHORIZATION regress_idem_bob;
SELECT pay_own('sec:pay') AS bob_executes;
RESET SESSION AUTHORIZATION;
SELECT owner, count(*) FROM idem.keys WHERE key = 'sec:pay' GROUP BY owner ORDER BY owner::text;
SELECT payer, count(*) FROM payments GROUP BY payer ORDER BY payer;
-- the setting is the wrapper's, never its caller's: inside a SECURITY
-- DEFINER function a value the caller set is ignored and the call keyed
-- by the wrapper's owner.  Otherwise bob, calling the wrapper that keys
-- every caller alike, could name alice (whom the wrapper's owner was
-- granted) and be served her response, or learn from a mismatch what she
-- sent; or leave the namespace the wrapper shares between its callers.
SET SESSION AUTHORIZATION regress_idem_alice;
SELECT pay_own('sec:pay-alice');
SET SESSION AUTHORIZATION regress_idem_bob;
SET idem.key_owner = 'regress_idem_alice';
SELECT pay_shared('sec:pay-alice') AS bob_named_alice;
SET idem.key_owner = 'session_user';
SELECT pay_shared('sec:pay-alice') AS bob_replays_the_shared_record;
-- a wrapper's own SET clause still wins over what the caller set
SET idem.key_owner = 'regress_idem_alice';
SELECT pay_own('sec:pay-alice') AS bob_keyed_as_bob;
RESET idem.key_owner;
RESET SESSION AUTHORIZATION;
-- nor a value from ALTER ROLE ... SET, which PostgreSQL records as set by
-- the bootstrap superuser: ignored inside a wrapper that superuser owns too
SELECT current_user AS superuser \gset
CREATE FUNCTION pay_super(k text) RETURNS jsonb SECURITY DEFINER
  LANGUAGE sql SET search_path = pg_catalog, public
  AS $$ SELECT idem_execute(k, 'INSERT INTO payments (payer) VALUES (session_user) RETURNING payer') -> 'rows' $$;
GRANT INSERT, SELECT ON payments TO regress_idem_alice;
GRANT USAGE ON SEQUENCE payments_id_seq TO regress_idem_alice;
SET SESSION AUTHORIZATION regress_idem_alice;
SELECT idem_execute('sec:pay-super', 'INSERT INTO payments (payer) VALUES (session_user) RETURNING payer') -> 'rows' AS alice_records;
RESET SESSION AUTHORIZATION;
ALTER ROLE regress_idem_bob LOGIN;
ALTER ROLE regress_idem_bob SET idem.key_owner = 'regress_idem_alice';
\c - regress_idem_bob
SHOW idem.key_owner;
SELECT pay_super('sec:pay-super') AS bob_keyed_as_the_wrapper_owner;
\c - :superuser
ALTER ROLE regress_idem_bob RESET idem.key_owner;
ALTER ROLE regress_idem_bob NOLOGIN;
REVOKE INSERT, SELECT ON payments FROM regress_idem_alice;
REVOKE USAGE ON SEQUENCE payments_id_seq FROM regress_idem_alice;
DROP FUNCTION pay_super(text);
SELECT owner = 'regress_idem_alice'::regrole AS alices, count(*) FROM idem.keys WHERE key = 'sec:pay-super' GROUP BY 1 ORDER BY 1;
SELECT owner, count(*) FROM idem.keys WHERE key = 'sec:pay-alice' GROUP BY owner ORDER BY owner::text;
SELECT payer, count(*) FROM payments GROUP BY payer ORDER BY payer;
-- and one that sets it in its body (set_config, as its owner) is honoured
CREATE FUNCTION pay_body(k text) RETURNS jsonb SECURITY DEFINER
  LANGUAGE plpgsql SET search_path = pg_catalog, public
  AS $$ BEGIN
	PERFORM set_config('idem.key_owner', 'session_user', true);
	RETURN idem_execute(k, 'INSERT INTO payments (payer) VALUES (session_user) RETURNING payer') -> 'rows';
  END $$;
ALTER FUNCTION pay_body(text) OWNER TO regress_idem_definer;
SET SESSION AUTHORIZATION regress_idem_alice;
SELECT pay_body('sec:pay-alice') AS alice_replays_via_body;
RESET SESSION AUTHORIZATION;
DROP FUNCTION pay_body(text);
-- a plain session may name a role only if it has that role's privileges
SET ROLE regress_idem_alice;
SET idem.key_owner = 'regress_idem_bob';
SELECT idem_execute('sec:as-bob', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('sec:as-bob', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_run_begin('sec:run-as-bob', ARRAY['a']);
\echo :LAST_ERROR_SQLSTATE
SET idem.key_owner = 'current_user';
SELECT idem_execute('sec:as-self', 'SELECT 1') ->> 'rowcount';
SET idem.key_owner = 'regress_idem_nobody';
SELECT idem_execute('sec:as-nobody', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
-- a superuser has every role's privileges: it may key as alice, and
-- replays her key
SET idem.key_owner = 'regress_idem_alice';
SELECT (idem_execute_ex('sec:as-self', 'SELECT 1')).replayed;
RESET idem.key_owner;
SELECT count(*) AS keys_as_bob FROM idem.keys WHERE key LIKE 'sec:%as-bob%';
DROP FUNCTION pay_shared(text), pay_own(text);
DROP TABLE payments;
DELETE FROM idem.keys WHERE key IN ('sec:pay', 'sec:pay-alice', 'sec:pay-super', 'sec:as-self');
DROP ROLE regress_idem_definer;

DROP SCHEMA evil CASCADE;
DROP TABLE invoices, secrets;
DELETE FROM idem.outbox WHERE key LIKE 'sec:%';
DELETE FROM idem.keys WHERE owner = 'regress_idem_bob'::regrole;
DROP ROLE regress_idem_bob;

-- a dropped role's live records block nobody, and idem_purge() removes
-- them whether or not they expired: a new role that got the same OID must
-- never be served them
SELECT 'regress_idem_alice'::regrole::oid AS alice_oid \gset
SELECT count(*) AS alice_records FROM idem.keys WHERE owner::oid = :alice_oid;
DROP ROLE regress_idem_alice;
SELECT idem_purge() >= 2 AS purged;
SELECT count(*) AS orphan_records FROM idem.keys WHERE owner::oid = :alice_oid;

-- a role list keeps no dropped role.  DROP ROLE cannot see the lists (a
-- regrole[] records no dependency), and the OID left in one would grant
-- the dropped role's privilege to whichever role gets that OID later:
-- after the OID counter wraps around, or in the cluster a dump is
-- restored into, since pg_dump writes a role that no longer exists as its
-- number.  Nor do the dropped role's runs stay, which would show that role
-- their input and results.  idem_purge() takes such OIDs out of every list
-- and removes the runs, as it removes the dropped role's records, whatever
-- idem.run_retention says
CREATE ROLE regress_idem_gone;
CREATE ROLE regress_idem_kept;
SET ROLE regress_idem_gone;
SELECT created FROM idem_run_begin('sec:gone', ARRAY['a', 'b'], '{"card": "4242"}');
SELECT idem_step('sec:gone', 'a', 'SELECT 1 AS one') ->> 'rowcount' AS step_a;
RESET ROLE;
SELECT idem_queue_create('sec_gone',
	producers => '{regress_idem_gone,regress_idem_kept}',
	workers => '{regress_idem_gone}',
	signallers => '{regress_idem_kept,regress_idem_gone}');
SELECT idem_outbox_create_topic('sec_gone', publishers => '{regress_idem_gone}',
	consumers => '{regress_idem_gone,regress_idem_kept}');
SELECT 'regress_idem_gone'::regrole::oid AS gone_oid \gset
DROP ROLE regress_idem_gone;
SELECT workers::text = '{' || :gone_oid || '}' AS dumped_as_a_number
  FROM idem.queues WHERE queue = 'sec_gone';
SELECT count(*) AS runs_left_behind FROM idem.runs WHERE owner::oid = :gone_oid;
SELECT idem_purge() >= 0 AS purged;
SELECT count(*) AS runs_left FROM idem.runs WHERE owner::oid = :gone_oid;
SELECT count(*) AS records_left FROM idem.keys WHERE owner::oid = :gone_oid;
SELECT producers, workers, signallers FROM idem.queues WHERE queue = 'sec_gone';
SELECT topic, publishers, consumers FROM idem.outbox_topics
 WHERE topic IN ('sec_gone', 'billing') ORDER BY topic;
DELETE FROM idem.queues WHERE queue = 'sec_gone';
DELETE FROM idem.outbox_topics WHERE topic = 'sec_gone';
DROP ROLE regress_idem_kept;

-- the runtime's and the outbox delivery's own statements (claims, fences,
-- signals, grants, the purge), which idem runs as the extension's owner,
-- take nothing from the caller's search_path: operators and functions of
-- the names they use, in a schema searched first, capture none of them
-- (the test's own queries qualify theirs).  A worker's step runs as the
-- worker, with no more rights; and idem_runs keeps other roles' rows from
-- a leaky function in a query on it (security_barrier)
CREATE ROLE regress_idem_app;
CREATE ROLE regress_idem_worker;
CREATE SCHEMA trap AUTHORIZATION regress_idem_worker;
GRANT USAGE ON SCHEMA trap TO PUBLIC;
SELECT idem_queue_create('sec_q', producers => '{regress_idem_app,regress_idem_worker}',
	workers => '{regress_idem_worker}', signallers => '{regress_idem_worker}',
	concurrency => 2);
SELECT idem_outbox_create_topic('sec_t', publishers => '{regress_idem_app}',
	consumers => '{regress_idem_worker}');
GRANT EXECUTE ON FUNCTION
	idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) TO regress_idem_worker;
SET ROLE regress_idem_worker;
DO $$
DECLARE
	t text;
	op text;
BEGIN
	FOREACH t IN ARRAY ARRAY['text', 'regrole', 'oid', 'uuid', 'timestamptz',
							 'integer', 'bigint', 'boolean', 'jsonb', 'regrole[]'] LOOP
		EXECUTE format('CREATE FUNCTION trap.hit(%s, %s) RETURNS boolean'
			' LANGUAGE plpgsql AS $f$ BEGIN RAISE NOTICE %L, current_user;'
			' RETURN true; END $f$', t, t, 'captured as %');
		FOREACH op IN ARRAY ARRAY['=', '<>', '<', '<=', '>', '>='] LOOP
			EXECUTE format('CREATE OPERATOR trap.%s (LEFTARG = %s, RIGHTARG = %s,'
				' FUNCTION = trap.hit)', op, t, t);
		END LOOP;
	END LOOP;
END
$$;
CREATE FUNCTION trap.now() RETURNS timestamptz LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured as %', current_user; RETURN '2000-01-01'; END $$;
CREATE FUNCTION trap.array_remove(regrole[], regrole) RETURNS regrole[]
	LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured as %', current_user; RETURN '{}'; END $$;
CREATE FUNCTION trap.array_append(regrole[], regrole) RETURNS regrole[]
	LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'captured as %', current_user; RETURN '{}'; END $$;
CREATE FUNCTION trap.peek(text, regrole) RETURNS boolean LANGUAGE plpgsql
	COST 0.0000001 AS $$
BEGIN RAISE NOTICE 'peeked at run % of %', $1, $2; RETURN true; END $$;
SET search_path = trap, public, pg_catalog;
SELECT created FROM idem_run_begin('sec:q2', ARRAY['a'], NULL, queue => 'sec_q');
SET ROLE regress_idem_app;
SET search_path = trap, public, pg_catalog;
SELECT created FROM idem_run_begin('sec:q1', ARRAY['a', 'b', 'c'], '{"card": "4242"}',
	queue => 'sec_q');
SELECT replayed FROM idem_call('sec:ev', 'SELECT 1 AS one', outbox_topic => 'sec_t');
SET ROLE regress_idem_worker;
SET search_path = trap, public, pg_catalog;
SELECT count(*) AS runs_seen FROM idem_runs WHERE trap.peek(run_id, owner);
SELECT pg_catalog.string_agg(run_id, ',' ORDER BY run_id) AS claimed,
	   (pg_catalog.array_agg(lease_token)
		 FILTER (WHERE run_id OPERATOR(pg_catalog.=) 'sec:q1'))[1] AS token
  FROM idem_run_claim('sec_q', 2, worker => 'w1') \gset
\echo :claimed
SELECT response -> 'rows' AS step_runs_as
  FROM idem_call(NULL, 'SELECT current_user AS runs_as', run_id => 'sec:q1',
	step => 'a', lease_token => :'token');
SELECT idem_run_signal('sec:q1', 'b', '{"ok": true}', 'regress_idem_app') AS signalled;
SELECT state, payload FROM idem_run_await('sec:q1', 'b', :'token');
SELECT idem_run_extend('sec:q1', :'token', '10 s') IS NOT NULL AS extended;
SELECT idem_run_release('sec:q1', :'token');
SELECT event_id, lease_token AS event_token FROM idem_outbox_claim('sec_t') \gset
SELECT idem_outbox_ack(:'event_id', :'event_token');
RESET ROLE;
SELECT idem_queue_grant('sec_q', 'regress_idem_app', 'signal');
SELECT idem_queue_revoke('sec_q', 'regress_idem_app', 'signal');
SELECT idem_outbox_grant('sec_t', 'regress_idem_worker', 'publish');
SELECT idem_outbox_revoke('sec_t', 'regress_idem_worker', 'publish');
SELECT idem_purge() IS NOT NULL AS purged;
RESET search_path;
SELECT run_id, owner, state, status, steps_done FROM idem_runs
 WHERE run_id LIKE 'sec:q%' ORDER BY run_id;
SELECT signallers, workers FROM idem.queues WHERE queue = 'sec_q';
SELECT publishers FROM idem.outbox_topics WHERE topic = 'sec_t';
SELECT count(*) AS events_left FROM idem.outbox WHERE key = 'sec:ev';
SET client_min_messages = warning;
DROP SCHEMA trap CASCADE;
RESET client_min_messages;
SELECT idem_run_cancel('sec:q1', 'done', 'regress_idem_app');
SELECT idem_run_cancel('sec:q2', 'done', 'regress_idem_worker');
SELECT idem_run_purge('infinity') >= 2 AS runs_purged;
DELETE FROM idem.keys WHERE owner IN ('regress_idem_app'::regrole, 'regress_idem_worker'::regrole);
DELETE FROM idem.queues WHERE queue = 'sec_q';
DELETE FROM idem.outbox_topics WHERE topic = 'sec_t';
REVOKE EXECUTE ON FUNCTION
	idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) FROM regress_idem_worker;
DROP ROLE regress_idem_app, regress_idem_worker;
