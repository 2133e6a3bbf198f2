--
-- errors: bad input gets a clear error and a documented SQLSTATE, and
-- changes nothing
--
CREATE TABLE ledger (id serial PRIMARY KEY, amount int NOT NULL);
CREATE FUNCTION ledger_fail() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'ledger is closed'
		USING ERRCODE = 'P0001', DETAIL = 'Period 2026-11 was locked.',
			  HINT = 'Post to the next period.';
END
$$;

-- the key
SELECT idem_execute(NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute(repeat('k', 256), 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
-- the limit is in bytes: 128 two-byte characters are 256 bytes
SELECT idem_execute(repeat('é', 128), 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute(repeat('k', 255), 'SELECT 1 AS ok') ->> 'rowcount' AS longest_key;

-- the statement
SELECT idem_execute('err:1', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSRT INTO ledger VALUES (1)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSERT INTO no_such_table VALUES (1)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', '');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSERT INTO ledger(amount) VALUES (1); INSERT INTO ledger(amount) VALUES (2)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'COMMIT');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'SAVEPOINT s');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'COPY ledger FROM STDIN');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'CREATE TABLE t2 (a int)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'SELECT 1 INTO t3');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'SET work_mem = ''1GB''');
\echo :LAST_ERROR_SQLSTATE

-- the arguments
SELECT idem_execute('err:1', 'INSERT INTO ledger(amount) VALUES ($1)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSERT INTO ledger(amount) VALUES ($1)', 1, 2);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSERT INTO ledger(amount) VALUES ($1)', 'abc'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:1', 'INSERT INTO ledger(amount) VALUES ($1)', now());
\echo :LAST_ERROR_SQLSTATE

-- the business statement's own errors reach the caller unchanged
SELECT idem_execute('err:2', 'INSERT INTO ledger(amount) VALUES (1 / $1)', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:2', 'INSERT INTO ledger(amount) VALUES (NULL)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:2', 'SELECT ledger_fail()');
\echo :LAST_ERROR_SQLSTATE

-- the response size limit
SET idem.max_response_size = '1kB';
SELECT idem_execute('err:3', 'INSERT INTO ledger(amount) VALUES (1) RETURNING repeat(''x'', 2000) AS big');
\echo :LAST_ERROR_SQLSTATE
-- refused once its rows pass the limit, not after holding all of them:
-- 20 MB of rows against 64 kB stop at the 64th row, and nothing is recorded
SET idem.max_response_size = '64kB';
SELECT idem_execute('err:3', 'SELECT g, repeat(''x'', 1000) AS big FROM generate_series(1, 20000) AS g');
\echo :LAST_ERROR_SQLSTATE
SET idem.max_response_size = '1kB';
SELECT idem_execute('err:3', 'SELECT g FROM generate_series(1, 200) AS g');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'err:3';
RESET idem.max_response_size;
-- (the range in the message gains units in 17: the SQLSTATE alone)
\set VERBOSITY sqlstate
SET idem.max_response_size = 10;
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE

-- read-only transactions
BEGIN READ ONLY;
SELECT idem_execute('err:4', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SET default_transaction_read_only = on;
SELECT idem_execute('err:4', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
RESET default_transaction_read_only;

-- bad settings
-- (the range in the message gains units in 17: the SQLSTATE alone)
\set VERBOSITY sqlstate
SET idem.ttl = 0;
\set VERBOSITY default
\echo :LAST_ERROR_SQLSTATE
SET idem.statement_cache_size = 0;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_purge(0);
\echo :LAST_ERROR_SQLSTATE

-- SELECT INTO spelled through a set operation still creates a table: it
-- is refused before anything runs (issue 8, part 5)
SELECT idem_execute('err:into1', 'SELECT 1 INTO t4 UNION SELECT 2');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:into2', 'SELECT 1 INTO t4 EXCEPT SELECT 2');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:into3', 'SELECT 1 INTO TEMP t4 INTERSECT SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:into4', '(SELECT 1 INTO TEMP TABLE t4) UNION ALL (SELECT 2)');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:into5', 'WITH w AS (SELECT 1) SELECT * INTO UNLOGGED t4 FROM w UNION SELECT 3');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS tables_created FROM pg_class WHERE relname = 't4';

-- two result columns of one name would store a lossy response: refused,
-- and the statement's write is rolled back with the call
SELECT idem_execute('err:dup', 'INSERT INTO ledger(amount) VALUES (7) RETURNING id AS x, amount AS x');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:dup', 'SELECT 1 AS a, 2 AS "A", 3 AS a');
\echo :LAST_ERROR_SQLSTATE
-- distinct names, also ones that differ only in case, are kept
SELECT idem_execute('err:dup2', 'SELECT 1 AS a, 2 AS "A"');

-- a syntax error points into the business statement, which is shown as
-- the query, the way PL/pgSQL reports its statements
SELECT idem_execute('err:syn', 'INSERT INTO ledger(amount) VALUES (1) RETURNIN id');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('err:syn', 'SELECT ''unterminated');
\echo :LAST_ERROR_SQLSTATE

-- none of the above wrote anything
SELECT count(*) AS ledger_rows FROM ledger;
SELECT key FROM idem.keys WHERE key LIKE 'err:%' ORDER BY key;

-- and a failed key is free: it executes when the request is valid
SELECT idem_execute('err:2', 'INSERT INTO ledger(amount) VALUES (1 / $1) RETURNING amount', 1);

DROP TABLE ledger;
DROP FUNCTION ledger_fail();

--
-- settings made before the library is loaded: PostgreSQL keeps them as
-- unchecked placeholders, and when the library defines the parameters it
-- only warns about one it drops; the call that loads the library fails
-- with the error the SET would have had, and the setting is not applied
--
\c
SET idem.ttl = 0;
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.ttl;
SELECT idem_key('early') AS loaded_now;
-- once loaded, the SET itself is refused
SET idem.ttl = 0;
\echo :LAST_ERROR_SQLSTATE
-- a ceiling a role may not raise
\c
CREATE ROLE regress_early;
SET ROLE regress_early;
SET idem.max_response_size = '10MB';
SET idem.wait = off;
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.max_response_size;
SHOW idem.wait;
SET idem.max_response_size = '10MB';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
DROP ROLE regress_early;
-- a refused list of cached errors
\c
SET idem.cache_errors = '40';
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.cache_errors;
-- a name idem does not define, a setting only the configuration file sets
\c
SET idem.tll = 5;
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
\c
SET idem.purge_interval = 5;
LOAD 'idem';
\echo :LAST_ERROR_SQLSTATE
-- valid settings made before the load apply, SET LOCAL included
\c
SET idem.cache_errors = '23';
BEGIN;
SET LOCAL idem.ttl = 7;
SELECT idem_key('early') AS loaded;
SHOW idem.ttl;
COMMIT;
SHOW idem.ttl;
SHOW idem.cache_errors;
-- a database's or a role's settings (ALTER DATABASE / ALTER ROLE ... SET):
-- made by a superuser in a session that has not loaded idem, PostgreSQL
-- stores them unchecked; the call that loads idem in a later session fails
-- with the error (naming where the setting comes from), and the setting is
-- not applied
SELECT current_database() AS regress_db, current_user AS regress_user \gset
\c
ALTER DATABASE :"regress_db" SET idem.ttl = 0;
CREATE ROLE regress_early_role LOGIN;
GRANT USAGE ON SCHEMA public TO regress_early_role;
ALTER ROLE regress_early_role SET idem.audit = 'everything';
\c
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.ttl;
SELECT idem_key('early') AS loaded_now;
-- once loaded, the same ALTER is refused when it is made
ALTER DATABASE :"regress_db" SET idem.ttl = 0;
\echo :LAST_ERROR_SQLSTATE
ALTER DATABASE :"regress_db" RESET idem.ttl;
\c - regress_early_role
SELECT idem_key('early');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.audit;
\c - :regress_user
ALTER ROLE regress_early_role RESET ALL;
-- a role may not store a ceiling for itself, loaded or not (42501)
\c
SET ROLE regress_early_role;
ALTER ROLE regress_early_role SET idem.max_response_size = '10MB';
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key('early') AS loaded;
ALTER ROLE regress_early_role SET idem.max_response_size = '10MB';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
\c
REVOKE USAGE ON SCHEMA public FROM regress_early_role;
DROP ROLE regress_early_role;
-- valid ones apply
ALTER DATABASE :"regress_db" SET idem.ttl = '2h';
\c
SELECT idem_key('early') AS loaded;
SHOW idem.ttl;
ALTER DATABASE :"regress_db" RESET idem.ttl;
