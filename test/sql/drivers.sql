--
-- drivers: a retry from any client is the same request (issue 23).  What
-- drivers do differently from psql: parameters of unknown type next to
-- typed ones, their own settings at connect, their own spelling of numbers.
--
CREATE TABLE dr_pay (id serial PRIMARY KEY, ref text NOT NULL,
                     amount numeric(12,2) NOT NULL, rate float8);
CREATE VIEW dr_seen AS
SELECT (SELECT count(*) FROM dr_pay) AS pays,
       (SELECT count(*) FROM idem.keys WHERE key LIKE 'dr:%') AS keys;

-- The hook works where the library is loaded when the statement is
-- parsed.  This session has not loaded it yet, so its first statement gets
-- PostgreSQL's 42P18; once any idem function ran (or with
-- session_preload_libraries = 'idem'), the same statement works.
PREPARE mixed AS SELECT replayed, response -> 'rows' AS rows
  FROM idem_execute_ex($1, $2, $3, $4::numeric);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_retry_advice('ID422');

-- Parameters of unknown type next to typed ones (psycopg 3's str next to a
-- Decimal, PgJDBC's stringtype=unspecified next to setBigDecimal): the call
-- reaches the VARIADIC "any" form, where the unknown ones are strings the
-- statement types.  PREPARE without types is what the extended protocol's
-- Parse does.
PREPARE mixed AS SELECT replayed, response -> 'rows' AS rows
  FROM idem_execute_ex($1, $2, $3, $4::numeric);
EXECUTE mixed('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', 25.00);
EXECUTE mixed('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', 25.00);
-- the same request as psql's and as an all-string driver's
SELECT replayed FROM idem_execute_ex('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', 25.00);
SELECT replayed FROM idem_execute_ex('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', '25.00');
-- another value is another request
EXECUTE mixed('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-2', 25.00);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM dr_seen;
-- the parameter is text wherever else the statement uses it
PREPARE mixed_twice AS SELECT idem_execute($1, $2, $3, $4::int) ->> 'command' AS command,
  pg_typeof($3) AS elsewhere;
EXECUTE mixed_twice('dr:2', 'SELECT $1 || $2 AS v', 'a', 1);
-- the key, the statement and the other functions' parameters
PREPARE mixed_key AS SELECT idem_key($1, $2::int, $3);
EXECUTE mixed_key('order', 42, 'refund');
SELECT idem_key('order', 42, 'refund');
PREPARE mixed_step AS SELECT idem_step($1, $2, $3, $4, $5::numeric);
SELECT status FROM idem_run_begin('dr-run', steps => ARRAY['pay']);
EXECUTE mixed_step('dr-run', 'pay', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING amount', 'inv-3', 3.00);
PREPARE mixed_dry AS SELECT action FROM idem_dry_run($1, $2, $3, $4::numeric);
EXECUTE mixed_dry('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', 25.00);
-- other functions' unknown parameters are PostgreSQL's business
PREPARE other AS SELECT format('%s %s', $1, $2::int);
\echo :LAST_ERROR_SQLSTATE

-- All-string calls reach the idem_untyped[] overloads, whose parameters a
-- driver sees as idem_untyped (text inside); typed ones reach "any"
PREPARE strings AS SELECT replayed FROM idem_execute_ex($1, $2, $3, $4);
SELECT parameter_types FROM pg_prepared_statements WHERE name = 'strings';
EXECUTE strings('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', '25.00');
PREPARE typed_varchar(text, text, varchar, numeric) AS
  SELECT replayed FROM idem_execute_ex($1, $2, $3, $4);
EXECUTE typed_varchar('dr:1', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-1', 25.00);

-- Numbers spelled differently: an argument is compared as a value of the
-- type the statement gives it, so '0.25e2' (ruby-pg's BigDecimal), '25'
-- (Go, Perl, PHP) and ' +25 ' are one numeric.  numeric keeps its scale,
-- and where the statement can show it (RETURNING $1, $1::text, a column
-- without a scale) '25.00' is another value and another request: when
-- unsure, refuse.
SELECT idem_execute('dr:8', 'SELECT $1::numeric AS amount', '0.25e2');
SELECT replayed FROM idem_execute_ex('dr:8', 'SELECT $1::numeric AS amount', '25');
SELECT replayed FROM idem_execute_ex('dr:8', 'SELECT $1::numeric AS amount', ' +25 ');
SELECT idem_execute('dr:8', 'SELECT $1::numeric AS amount', '25.00');
\echo :LAST_ERROR_SQLSTATE
-- Where the statement gives no type, the argument is text: its spelling
-- is its value.
SELECT idem_execute('dr:7', 'SELECT $1 AS amount', '0.25e2');
SELECT idem_execute('dr:7', 'SELECT $1 AS amount', '25');
\echo :LAST_ERROR_SQLSTATE
-- Where the statement uses the argument only through a numeric(p,s)
-- column, it stores and returns every spelling as that column's value:
-- they are one request, typed or untyped, and a value that rounds to the
-- same cents too.  Anything else the statement makes of the argument
-- (here RETURNING it) brings the scale back.
PREPARE pay AS SELECT replayed, response -> 'rows' AS rows FROM idem_execute_ex($1, $2, $3, $4);
EXECUTE pay('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', '0.25e2');
EXECUTE pay('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', '25');
EXECUTE pay('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', '25.00');
EXECUTE pay('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', '25.001');
SELECT replayed FROM idem_execute_ex('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', 25::numeric);
SELECT replayed FROM idem_execute_ex('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', 25.0000::numeric);
EXECUTE pay('dr:9', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount', 'inv-9', '25.01');
\echo :LAST_ERROR_SQLSTATE
EXECUTE pay('dr:10', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount, $2 AS sent', 'inv-10', '25');
EXECUTE pay('dr:10', 'INSERT INTO dr_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount, $2 AS sent', 'inv-10', '25.00');
\echo :LAST_ERROR_SQLSTATE
-- an UPDATE's SET is such a use too; its WHERE is not
EXECUTE pay('dr:11', 'UPDATE dr_pay SET amount = $2 WHERE ref = $1 RETURNING amount', 'inv-9', '26');
EXECUTE pay('dr:11', 'UPDATE dr_pay SET amount = $2 WHERE ref = $1 RETURNING amount', 'inv-9', '26.00');
EXECUTE pay('dr:12', 'SELECT count(*) AS n FROM dr_pay WHERE amount = $2 AND ref = $1', 'inv-9', '26');
EXECUTE pay('dr:12', 'SELECT count(*) AS n FROM dr_pay WHERE amount = $2 AND ref = $1', 'inv-9', '26.00');
\echo :LAST_ERROR_SQLSTATE
-- a column whose scale changes is looked at again: after ALTER TABLE the
-- very call first made would store 7, not the 7.00 it stored, and is
-- refused; 7.00 is still what was stored
CREATE TABLE dr_free (amount numeric(12,2));
EXECUTE pay('dr:13', 'INSERT INTO dr_free (amount) VALUES ($2) RETURNING $1 AS ref', 'x', '7');
EXECUTE pay('dr:13', 'INSERT INTO dr_free (amount) VALUES ($2) RETURNING $1 AS ref', 'x', '7.00');
ALTER TABLE dr_free ALTER COLUMN amount TYPE numeric;
EXECUTE pay('dr:13', 'INSERT INTO dr_free (amount) VALUES ($2) RETURNING $1 AS ref', 'x', '7');
\echo :LAST_ERROR_SQLSTATE
EXECUTE pay('dr:13', 'INSERT INTO dr_free (amount) VALUES ($2) RETURNING $1 AS ref', 'x', '7.00');
DROP TABLE dr_free;
SELECT * FROM dr_seen;

-- Settings count by the behaviour they select.  Every positive
-- extra_float_digits selects the shortest exact float output, so PgJDBC's 3
-- and lib/pq's 2 are psql's 1; zero and below round, each differently.
SET extra_float_digits = 1;
SELECT idem_execute('dr:4', 'INSERT INTO dr_pay (ref, amount, rate) VALUES ($1, $2, $3) RETURNING rate::text', 'inv-4', '1', 0.1::float8 + 0.2::float8);
SET extra_float_digits = 3;
SELECT replayed, response FROM idem_execute_ex('dr:4', 'INSERT INTO dr_pay (ref, amount, rate) VALUES ($1, $2, $3) RETURNING rate::text', 'inv-4', '1', 0.1::float8 + 0.2::float8);
SET extra_float_digits = 2;
SELECT replayed FROM idem_execute_ex('dr:4', 'INSERT INTO dr_pay (ref, amount, rate) VALUES ($1, $2, $3) RETURNING rate::text', 'inv-4', '1', 0.1::float8 + 0.2::float8);
-- 0 prints 0.3: another request
SET extra_float_digits = 0;
SELECT 0.1::float8 + 0.2::float8 AS rounded;
SELECT idem_execute('dr:4', 'INSERT INTO dr_pay (ref, amount, rate) VALUES ($1, $2, $3) RETURNING rate::text', 'inv-4', '1', 0.1::float8 + 0.2::float8);
\echo :LAST_ERROR_SQLSTATE
SET extra_float_digits = -1;
SELECT idem_execute('dr:4', 'INSERT INTO dr_pay (ref, amount, rate) VALUES ($1, $2, $3) RETURNING rate::text', 'inv-4', '1', 0.1::float8 + 0.2::float8);
\echo :LAST_ERROR_SQLSTATE
-- a statement may switch between spellings of one behaviour, not between
-- behaviours
SET extra_float_digits = 1;
SELECT idem_execute('dr:5', 'SELECT set_config(''extra_float_digits'', ''3'', false) AS efd') ->> 'command';
SHOW extra_float_digits;
SELECT idem_execute('dr:6', 'SELECT set_config(''extra_float_digits'', ''0'', false) AS efd');
\echo :LAST_ERROR_SQLSTATE
SHOW extra_float_digits;
RESET extra_float_digits;
SELECT * FROM dr_seen;

DEALLOCATE ALL;
DROP VIEW dr_seen;
DROP TABLE dr_pay;
DELETE FROM idem.keys WHERE key LIKE 'dr:%' OR key LIKE 'idem.step:dr-run:%';
DELETE FROM idem.runs WHERE run_id = 'dr-run';
