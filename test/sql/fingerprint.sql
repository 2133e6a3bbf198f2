--
-- fingerprint: what counts as "the same request"
--
-- Same request: the same token stream (whitespace, comments, keyword case,
-- identifier and string quoting style do not matter) and the same argument
-- types and values.  Anything else under a used key is SQLSTATE ID422.
--
CREATE TABLE payments (id serial PRIMARY KEY, invoice text, amount numeric);
CREATE TYPE fp_pair AS (n int, s text);

SELECT idem_execute('fp:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, 10) RETURNING id',
       'inv-1');

-- cosmetic differences: replays, nothing runs again
SELECT (idem_execute_ex('fp:1',
       E'insert   into payments(invoice,amount)\n  values ($1, 10) -- retried\n returning id',
       'inv-1')).replayed AS whitespace_case_comment;
SELECT (idem_execute_ex('fp:1',
       'INSERT /* block comment */ INTO "payments" ("invoice", "amount") VALUES ($1, 10) RETURNING "id"',
       'inv-1')).replayed AS quoted_identifiers;
SELECT count(*) AS payments FROM payments;

-- string literal quoting style does not matter either
SELECT idem_execute('fp:2', 'SELECT ''abc'' AS s');
SELECT (idem_execute_ex('fp:2', 'SELECT E''abc'' AS s')).replayed AS escape_string;
SELECT (idem_execute_ex('fp:2', 'SELECT $q$abc$q$ AS s')).replayed AS dollar_quoted;

\set VERBOSITY terse
-- a different constant is a different request
SELECT idem_execute('fp:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, 11) RETURNING id',
       'inv-1');
\echo :LAST_ERROR_SQLSTATE
-- a different argument value
SELECT idem_execute('fp:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, 10) RETURNING id',
       'inv-2');
\echo :LAST_ERROR_SQLSTATE
-- a different argument type with an equal value
SELECT idem_execute('fp:3', 'SELECT $1 AS v', 1);
SELECT idem_execute('fp:3', 'SELECT $1 AS v', 1::bigint);
\echo :LAST_ERROR_SQLSTATE
-- numeric values are compared as written: 1.0 is not 1.00
SELECT idem_execute('fp:4', 'SELECT $1 AS v', 1.0);
SELECT idem_execute('fp:4', 'SELECT $1 AS v', 1.00);
\echo :LAST_ERROR_SQLSTATE
-- NULL is not an empty string
SELECT idem_execute('fp:5', 'SELECT $1::text AS v', NULL::text);
SELECT idem_execute('fp:5', 'SELECT $1::text AS v', ''::text);
\echo :LAST_ERROR_SQLSTATE
-- a different identifier, a different operator
SELECT idem_execute('fp:6', 'SELECT 1 + 2 AS v');
SELECT idem_execute('fp:6', 'SELECT 1 - 2 AS v');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('fp:6', 'SELECT 1 + 2 AS w');
\echo :LAST_ERROR_SQLSTATE
-- a different number of arguments
SELECT idem_execute('fp:7', 'SELECT $1::int AS v', 1);
SELECT idem_execute('fp:7', 'SELECT $1::int AS v, $2::int AS w', 1, 2);
\echo :LAST_ERROR_SQLSTATE
-- the mismatch is reported before anything runs
SELECT count(*) AS payments FROM payments;
\set VERBOSITY default

-- the full message, with its hint
SELECT idem_execute('fp:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, 12) RETURNING id',
       'inv-1');

-- timestamps hash in their binary form: the same instant written with
-- another offset is the same request
SELECT idem_execute('fp:8', 'SELECT $1 AS at', timestamptz '2026-01-01 12:00:00+00')
       ->> 'command';
SELECT replayed FROM idem_execute_ex('fp:8', 'SELECT $1 AS at',
        timestamptz '2026-01-01 21:00:00+09') AS other_offset;
-- but TimeZone is part of the request: it changes what text in the
-- statement or its arguments means (see identity.sql)
SET TimeZone = 'Asia/Tokyo';
SELECT replayed FROM idem_execute_ex('fp:8', 'SELECT $1 AS at',
        timestamptz '2026-01-01 21:00:00+09') AS other_timezone;
\echo :LAST_ERROR_SQLSTATE
RESET TimeZone;

-- floats compare by value: 0.1 and 1e-1 are one request, and so is every
-- NaN; extra_float_digits is part of the request, since a statement that
-- casts a float to text stores what it makes of it
SELECT idem_execute('fp:9', 'SELECT $1 AS x', 0.1::float8) ->> 'command';
SELECT replayed FROM idem_execute_ex('fp:9', 'SELECT $1 AS x', 1e-1::float8) AS same_value;
SELECT idem_execute('fp:9n', 'SELECT $1 AS x', 'NaN'::float8) ->> 'command';
SELECT replayed FROM idem_execute_ex('fp:9n', 'SELECT $1 AS x', 'Infinity'::float8 - 'Infinity'::float8) AS nan;
SELECT idem_execute('fp:9f', 'SELECT $1 AS x', 'NaN'::float4) ->> 'command';
SELECT replayed FROM idem_execute_ex('fp:9f', 'SELECT $1 AS x', ('Infinity'::float8 - 'Infinity'::float8)::float4) AS nan4;
SET extra_float_digits = 0;
SELECT replayed FROM idem_execute_ex('fp:9', 'SELECT $1 AS x', 0.1::float8) AS float_digits;
\echo :LAST_ERROR_SQLSTATE
RESET extra_float_digits;

-- arrays and jsonb arguments
SELECT idem_execute('fp:10', 'SELECT $1 AS a, $2 AS j',
       ARRAY['x', 'y'], '{"b": 2, "a": 1}'::jsonb) ->> 'command';
SELECT (idem_execute_ex('fp:10', 'SELECT $1 AS a, $2 AS j',
       ARRAY['x', 'y'], '{"a": 1, "b": 2}'::jsonb)).replayed AS jsonb_key_order;
SELECT idem_execute('fp:10', 'SELECT $1 AS a, $2 AS j',
       ARRAY['y', 'x'], '{"a": 1, "b": 2}'::jsonb);

-- an explicit VARIADIC array of more than one dimension is refused, not
-- flattened into the request of its elements; as one argument it is
-- one argument
SELECT idem_execute('fp:11', 'SELECT $1::int + $2 + $3 + $4 AS s', VARIADIC ARRAY[[1, 2], [3, 4]]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('fp:11', 'SELECT $1::text AS s', VARIADIC ARRAY[['1', '2'], ['3', '4']]::text[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('fp:11', 'SELECT $1 AS a', ARRAY[[1, 2], [3, 4]]);
SELECT idem_execute('fp:11', 'SELECT $1 AS a', ARRAY[1, 2, 3, 4]);
\echo :LAST_ERROR_SQLSTATE
-- a VARIADIC array of more arguments than a client can bind (65,535) is
-- refused from its dimensions, before it is unpacked (54000); one of
-- 65,535 is unpacked and checked against the statement
SELECT idem_execute('fp:11a', 'SELECT $1 AS a', VARIADIC array_fill(1, ARRAY[65536]));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call('fp:11a', 'SELECT $1 AS a', array_fill('1'::text, ARRAY[65536]));
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('fp:11a', 'SELECT $1 AS a', VARIADIC array_fill(1, ARRAY[65535]));
\echo :LAST_ERROR_SQLSTATE

-- Records written by idem 1.1 (fingerprint version 2) did not hash an
-- anonymous record's field names: such a record is refused, never
-- replayed; one without anonymous records still replays
SELECT idem_execute('fp:12', 'SELECT to_jsonb($1) AS j', r) ->> 'command'
  FROM (SELECT 25 AS amount) r;
SELECT idem_execute('fp:13', 'SELECT $1 AS v', ROW(1, 'x')::fp_pair) ->> 'command';
SELECT idem_execute('fp:14', 'SELECT $1 AS v', 7) ->> 'command';
SELECT key, fingerprint_version FROM idem.keys WHERE key IN ('fp:12', 'fp:13', 'fp:14') ORDER BY key;
UPDATE idem.keys SET fingerprint_version = 2 WHERE key IN ('fp:12', 'fp:13', 'fp:14');
SELECT idem_execute('fp:12', 'SELECT to_jsonb($1) AS j', r)
  FROM (SELECT 25 AS amount) r;
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('fp:13', 'SELECT $1 AS v', ROW(1, 'x')::fp_pair);
SELECT replayed FROM idem_execute_ex('fp:14', 'SELECT $1 AS v', 7);
SELECT idem_execute('fp:14', 'SELECT $1 AS v', 8);
\echo :LAST_ERROR_SQLSTATE

-- An argument's type enters the fingerprint by its qualified name, as it
-- is when the call is made: after the type or its schema is renamed, a
-- backend that cached the statement under the old name fingerprints a call
-- as a new backend does, so the retry of a call from another connection
-- replays
CREATE SCHEMA fp_s;
CREATE TYPE fp_s.mood AS ENUM ('calm', 'glad');
SELECT replayed FROM idem_execute_ex('fp:15', 'SELECT $1::text AS m', 'calm'::fp_s.mood);
ALTER TYPE fp_s.mood RENAME TO mood2;
SELECT replayed FROM idem_execute_ex('fp:16', 'SELECT $1::text AS m', 'calm'::fp_s.mood2);
\c
SELECT replayed FROM idem_execute_ex('fp:16', 'SELECT $1::text AS m', 'calm'::fp_s.mood2);
ALTER SCHEMA fp_s RENAME TO fp_s2;
SELECT replayed FROM idem_execute_ex('fp:17', 'SELECT $1::text AS m', 'calm'::fp_s2.mood2);
\c
SELECT replayed FROM idem_execute_ex('fp:17', 'SELECT $1::text AS m', 'calm'::fp_s2.mood2);
DROP SCHEMA fp_s2 CASCADE;

DROP TABLE payments;
DROP TYPE fp_pair;
