--
-- cache: with idem.cache_errors, a listed business error becomes the key's
-- recorded outcome, replayed to every retry; nothing else changes
--
CREATE TABLE accounts (id int PRIMARY KEY, balance numeric NOT NULL CHECK (balance >= 0));
INSERT INTO accounts VALUES (1, 10);
CREATE TABLE ledger (id serial PRIMARY KEY, account int NOT NULL, amount numeric NOT NULL);
CREATE FUNCTION withdraw(acct int, amt numeric) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ledger (account, amount) VALUES (acct, -amt);
	IF amt > 100 THEN
		RAISE EXCEPTION 'amount % is above the limit', amt
			USING DETAIL = 'The limit is 100.', HINT = 'Split the payment.';
	END IF;
	UPDATE accounts SET balance = balance - amt WHERE id = acct;
	RETURN (SELECT balance FROM accounts WHERE id = acct);
END
$$;
CREATE VIEW state AS
SELECT (SELECT balance FROM accounts WHERE id = 1) AS balance,
       (SELECT count(*) FROM ledger) AS ledger,
       (SELECT count(*) FROM idem.keys WHERE key LIKE 'w:%') AS keys,
       (SELECT count(*) FROM idem.outbox WHERE key LIKE 'w:%') AS events;

-- off by default: the error is raised and nothing is recorded
SELECT idem_execute('w:1', 'SELECT withdraw($1, $2) AS balance', 1, 500::numeric);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM state;

-- listed: the error is the response, recorded, and the statement's own
-- writes (the ledger row) are undone
SET idem.cache_errors = '23, P0001';
SELECT idem_outbox_create_topic('cache_payments');
SET idem.outbox_topic = 'cache_payments';
SELECT response, replayed FROM idem_execute_ex('w:1', 'SELECT withdraw($1, $2) AS balance', 1, 500::numeric);
SELECT * FROM state;
-- a retry replays the same error, without running; so does one with the
-- setting off, since it is the key's outcome now
SELECT response, replayed FROM idem_execute_ex('w:1', 'SELECT withdraw($1, $2) AS balance', 1, 500::numeric);
RESET idem.cache_errors;
SELECT response, replayed FROM idem_execute_ex('w:1', 'SELECT withdraw($1, $2) AS balance', 1, 500::numeric);
SELECT * FROM state;
-- a different request under the key is still ID422
SELECT idem_execute('w:1', 'SELECT withdraw($1, $2) AS balance', 1, 5::numeric);
\echo :LAST_ERROR_SQLSTATE

-- a class: an integrity violation (CHECK) is cached; the caller's
-- transaction goes on and commits the record
SET idem.cache_errors = '23';
BEGIN;
SELECT idem_execute('w:2', 'UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance', 1, 50::numeric) -> 'error' ->> 'sqlstate' AS sqlstate;
SELECT 1 AS still_usable;
COMMIT;
SELECT idem_execute('w:2', 'UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance', 1, 50::numeric) -> 'error' ->> 'message' AS message;
-- an error not listed is raised as always, and not recorded
SELECT idem_execute('w:3', 'SELECT 1 / 0 AS boom');
\echo :LAST_ERROR_SQLSTATE
-- success is recorded as always
SELECT idem_execute('w:4', 'SELECT withdraw($1, $2) AS balance', 1, 4::numeric);
SELECT * FROM state;
-- a dry run shows the error it would record
SELECT * FROM idem_dry_run('w:5', 'UPDATE accounts SET balance = balance - $2 WHERE id = $1 RETURNING balance', 1, 50::numeric);
SELECT * FROM state;
RESET idem.cache_errors;
RESET idem.outbox_topic;

-- transient conditions, idem's own outcomes and internal errors can never
-- be listed; the setting is left as it was
SET idem.cache_errors = '23';
SET idem.cache_errors = '40';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '23, 40P01';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '57014';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '55P03';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '08006';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '53';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = 'ID422';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = 'XX000';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '2';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '23505x';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = 'p0001';
\echo :LAST_ERROR_SQLSTATE
SHOW idem.cache_errors;
SET idem.cache_errors = ' 23 ,P0001 ';
SHOW idem.cache_errors;
RESET idem.cache_errors;

-- nor can system errors (58: I/O), a snapshot too old (72) or a foreign
-- server's errors (HV), which are transient, nor the server's limits (54)
-- or the transaction's state (25), which are not the business's; whatever
-- the setting refuses as transient, idem_retry_advice() does not answer
-- "never" for
SET idem.cache_errors = '23';
SET idem.cache_errors = '58';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '58030';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '72';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = 'HV';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = 'P0001, HV00N';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '54';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '54001';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '25';
\echo :LAST_ERROR_SQLSTATE
SET idem.cache_errors = '25P02';
\echo :LAST_ERROR_SQLSTATE
SHOW idem.cache_errors;
SELECT s AS sqlstate, idem_retry_advice(s) AS advice
  FROM unnest(ARRAY['58000', '58030', '72000', 'HV000', 'HV00N']) AS s;

-- a listed class may hold a transient code (55 holds 55P03, a lock not
-- available): that code is raised, never recorded
CREATE FUNCTION raise_state(code text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'raised %', code USING ERRCODE = code;
END
$$;
SET idem.cache_errors = '55';
SELECT idem_execute('w:55', 'SELECT raise_state($1)', '55P03');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('w:55', 'SELECT raise_state($1)', '55000');
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'w:55';
RESET idem.cache_errors;

-- a cached error is held to idem.max_response_size like any response: one
-- above it is refused (54000) and nothing is recorded
CREATE FUNCTION raise_long(n int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'too long' USING DETAIL = repeat('x', n);
END
$$;
SET idem.max_response_size = '1kB';
SET idem.cache_errors = 'P0001';
SELECT idem_execute('w:big', 'SELECT raise_long($1)', 10000);
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'w:big';
-- one below it is recorded
SELECT idem_execute('w:big', 'SELECT raise_long($1)', 100) -> 'error' ->> 'message';
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'w:big';
RESET idem.cache_errors;
RESET idem.max_response_size;
-- idem's own refusals of what a statement did are never recorded, even in
-- a listed class: two result columns of one name (42701), a setting the
-- statement changed (0A000); each is raised, and the key stays free
SET idem.cache_errors = '42, 0A, 22';
SELECT idem_execute('w:dup-cols', 'SELECT 1 AS a, 2 AS a');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('w:set', 'SELECT set_config(''idem.ttl'', ''5'', false)');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS recorded FROM idem.keys WHERE key IN ('w:dup-cols', 'w:set');
-- a refusal leaves nothing behind for the next call: an error of preparing
-- the statement (a missing table) is the statement's own, recorded as in a
-- backend that never refused anything
SELECT idem_execute('w:missing', 'SELECT * FROM no_such_table') -> 'error' ->> 'sqlstate';
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'w:missing';
-- while a listed error of the statement itself still is
SELECT idem_execute('w:div', 'SELECT 1 / 0') -> 'error' ->> 'sqlstate';
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'w:div';
RESET idem.cache_errors;
DROP FUNCTION raise_state(text), raise_long(int);

DROP VIEW state;
DROP FUNCTION withdraw(int, numeric);
DROP TABLE accounts, ledger;
DELETE FROM idem.keys WHERE key LIKE 'w:%';
