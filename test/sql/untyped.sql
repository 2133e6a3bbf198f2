--
-- untyped: arguments sent without a type (psql literals, drivers that send
-- every parameter untyped) take the types the statement infers for them,
-- so the request is the one a caller who typed them makes
--
CREATE TABLE refunds (id serial PRIMARY KEY, return_id text NOT NULL,
                      amount numeric NOT NULL, at timestamptz);
CREATE VIEW seen AS
SELECT (SELECT count(*) FROM refunds) AS refunds,
       (SELECT count(*) FROM idem.keys WHERE key LIKE 'u:%') AS keys;

-- literals without casts: '25.00' becomes the numeric the column wants
SELECT idem_execute('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-1', '25.00');
-- the same request, typed as psql users type it, and as an explicit array
SELECT replayed FROM idem_execute_ex('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-1'::text, 25.00::numeric);
SELECT replayed FROM idem_execute_ex('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-1', 25.00::numeric);
SELECT replayed FROM idem_execute_ex('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', VARIADIC ARRAY['inv-1', '25.00']);
SELECT * FROM seen;
-- a different value is a different request, even one that compares equal
-- as a number: 25.0 is stored as 25.0, not 25.00
SELECT idem_execute('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-1', '25.0');
\echo :LAST_ERROR_SQLSTATE
-- a value of another type is another request: 25 as an integer is not the
-- numeric 25.00
SELECT idem_execute('u:1', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-1', 25);
\echo :LAST_ERROR_SQLSTATE

-- what a driver does: parameters of the outer call without types
PREPARE driver AS SELECT idem_execute($1, $2, $3, $4);
EXECUTE driver('u:2', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-2', '10.50');
EXECUTE driver('u:2', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-2', '10.50');
SELECT replayed FROM idem_execute_ex('u:2', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING return_id, amount', 'inv-2', 10.50);
PREPARE driver_ex AS SELECT replayed, response FROM idem_execute_ex($1, $2, $3, $4, $5);
EXECUTE driver_ex('u:3', 'INSERT INTO refunds (return_id, amount, at) VALUES ($1, $2, $3) RETURNING amount, at', 'inv-3', '1', '2026-12-01 10:00:00+00');
EXECUTE driver_ex('u:3', 'INSERT INTO refunds (return_id, amount, at) VALUES ($1, $2, $3) RETURNING amount, at', 'inv-3', '1', '2026-12-01 10:00:00+00');
SELECT * FROM seen;

-- where the statement leaves a type open, it is text
SELECT idem_execute('u:4', 'SELECT $1 AS v, $2 || $3 AS w', 'a', 'b', 'c');
SELECT idem_execute('u:5', 'SELECT $1::int + 1 AS v', '41');
SELECT idem_execute('u:6', 'SELECT $1 AS v', NULL);
-- untyped and typed arguments mix: the typed ones keep their type
SELECT idem_execute('u:7', 'SELECT $1 AS a, $2 AS b', 1, '2026-01-01'::date);

-- steps and dry runs take untyped arguments too
SELECT status FROM idem_run_begin('u-run', steps => ARRAY['refund']);
PREPARE driver_step AS SELECT idem_step($1, $2, $3, $4, $5);
EXECUTE driver_step('u-run', 'refund', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING amount', 'inv-8', '3.00');
SELECT idem_step('u-run', 'refund', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING amount', 'inv-8', 3.00);
PREPARE driver_dry AS SELECT * FROM idem_dry_run($1, $2, $3, $4);
EXECUTE driver_dry('u:9', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING amount', 'inv-9', '7.5');
SELECT * FROM seen;

-- bad input: text that is no value of the inferred type, and nothing is written
SELECT idem_execute('u:10', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING amount', 'inv-10', 'abc');
\echo :LAST_ERROR_SQLSTATE
EXECUTE driver('u:10', 'INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING amount', 'inv-10', '1e');
\echo :LAST_ERROR_SQLSTATE
-- a statement that cannot take them untyped still gets its own error
SELECT idem_execute('u:11', 'SELECT $1 FROM no_such_table', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('u:11', 'SELECT $1; SELECT 2', 'x');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM seen;

-- the inferred types are kept per backend, but not from an analysis that
-- failed: once the table exists, the same statement infers numeric
SELECT idem_execute('u:12', 'INSERT INTO later (amount) VALUES ($1) RETURNING amount', '4.50');
\echo :LAST_ERROR_SQLSTATE
CREATE TABLE later (amount numeric);
SELECT idem_execute('u:12', 'INSERT INTO later (amount) VALUES ($1) RETURNING amount', '4.50');
-- and they are kept per search_path: the same text infers each schema's type
CREATE SCHEMA u_int;
CREATE SCHEMA u_text;
CREATE TABLE u_int.t (v integer);
CREATE TABLE u_text.t (v text);
SET search_path = u_int, public;
SELECT idem_execute('u:13', 'INSERT INTO t (v) VALUES ($1) RETURNING v', '7');
SET search_path = u_text, public;
SELECT idem_execute('u:14', 'INSERT INTO t (v) VALUES ($1) RETURNING v', '7');
RESET search_path;
DROP SCHEMA u_int, u_text CASCADE;
-- and found again when a table changes: after its column becomes an
-- integer, this backend types the argument as a new backend does, so the
-- call is the request a typed integer makes (it used to keep numeric, and
-- a column that was text failed with 42804 until the backend reconnected)
ALTER TABLE later ALTER COLUMN amount TYPE integer;
SELECT idem_execute('u:12b', 'INSERT INTO later (amount) VALUES ($1) RETURNING amount', '4');
SELECT replayed FROM idem_execute_ex('u:12b', 'INSERT INTO later (amount) VALUES ($1) RETURNING amount', 4);
DROP TABLE later;
-- or a function: replaced by one of another parameter type, it types the
-- argument anew (it kept integer, and failed with 42883 until the backend
-- reconnected)
CREATE FUNCTION u_f(x integer) RETURNS integer LANGUAGE sql AS 'SELECT x + 1';
SELECT idem_execute('u:12c', 'SELECT u_f($1) AS v', '41');
DROP FUNCTION u_f(integer);
CREATE FUNCTION u_f(x text) RETURNS text LANGUAGE sql AS 'SELECT x || ''!''';
SELECT idem_execute('u:12d', 'SELECT u_f($1) AS v', '41');
DROP FUNCTION u_f(text);

-- text and varchar are strings too, in every form of the call: next to a
-- typed argument the statement types them ('40'::text for an integer $1)
SELECT idem_execute('u:15', 'SELECT $1 + $2 AS s', '40'::text, 2);
SELECT replayed FROM idem_execute_ex('u:15', 'SELECT $1 + $2 AS s', '40'::varchar, 2);
SELECT replayed FROM idem_execute_ex('u:15', 'SELECT $1 + $2 AS s', '40', 2);

-- domains over text, char(n), name and "char" keep their type, spread,
-- as a VARIADIC array, and next to a typed argument: they are not the
-- string 'a' (issue 19)
CREATE DOMAIN u_code AS text CHECK (VALUE <> '');
SELECT idem_execute('u:16', 'SELECT $1 AS v, pg_typeof($1)::text AS t', 'a'::u_code);
SELECT replayed FROM idem_execute_ex('u:16', 'SELECT $1 AS v, pg_typeof($1)::text AS t', 'a'::u_code);
SELECT replayed FROM idem_execute_ex('u:16', 'SELECT $1 AS v, pg_typeof($1)::text AS t', VARIADIC ARRAY['a'::u_code]);
SELECT idem_execute('u:16', 'SELECT $1 AS v, pg_typeof($1)::text AS t', 'a'::text);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('u:16', 'SELECT $1 AS v, pg_typeof($1)::text AS t', 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('u:17', 'SELECT $1 AS v, pg_typeof($1)::text AS t, octet_length($1) AS n', 'a'::char(3));
SELECT replayed FROM idem_execute_ex('u:17', 'SELECT $1 AS v, pg_typeof($1)::text AS t, octet_length($1) AS n', 'a'::char(3));
SELECT idem_execute('u:17', 'SELECT $1 AS v, pg_typeof($1)::text AS t, octet_length($1) AS n', 'a');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('u:18', 'SELECT pg_typeof($1)::text AS a, pg_typeof($2)::text AS b, $3 AS c', 'a'::name, 'b'::"char", 'c');
SELECT idem_execute('u:18', 'SELECT pg_typeof($1)::text AS a, pg_typeof($2)::text AS b, $3 AS c', 'a', 'b', 'c');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('u:19', 'SELECT pg_typeof($1)::text AS a, pg_typeof($2)::text AS b', 'a'::u_code, 1);
-- the domain's constraint holds
SELECT idem_execute('u:20', 'SELECT $1 AS v', ''::u_code);
\echo :LAST_ERROR_SQLSTATE
-- a VARIADIC array of more than one dimension is refused, not flattened
SELECT idem_execute('u:20', 'SELECT $1 AS v', VARIADIC ARRAY[['a', 'b'], ['c', 'd']]);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM seen;
DROP DOMAIN u_code;

DEALLOCATE ALL;
DROP VIEW seen;
DROP TABLE refunds;
DELETE FROM idem.keys WHERE key LIKE 'u:%' OR key LIKE 'idem.step:u-run:%';
DELETE FROM idem.runs WHERE run_id = 'u-run';
