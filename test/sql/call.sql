--
-- call: idem_call() takes the call's options in the same statement, for
-- this call only, and a plain array of strings typed by the statement
--
CREATE TABLE payments (id serial PRIMARY KEY, invoice text NOT NULL, amount numeric NOT NULL);
SELECT idem_outbox_create_topic('call_payments');
SELECT response, replayed FROM idem_call('c:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount',
       ARRAY['inv-1', '25.00'], outbox_topic => 'call_payments', ttl => '2 hours');
-- the retry replays; the options changed nothing in the session
SELECT response, replayed FROM idem_call('c:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount',
       ARRAY['inv-1', '25.00']);
SHOW idem.outbox_topic;
SHOW idem.ttl;
SELECT topic, payload FROM idem.outbox WHERE key = 'c:1';
SELECT expires_at - created_at BETWEEN interval '2 hours' AND interval '2 hours 5 seconds' AS two_hours
  FROM idem.keys WHERE key = 'c:1';
-- the same request as idem_execute's typed form
SELECT replayed FROM idem_execute_ex('c:1',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount',
       'inv-1', 25.00::numeric);
-- no arguments, and NULL elements
SELECT response FROM idem_call('c:2', 'SELECT 1 AS one');
SELECT response FROM idem_call('c:3', 'SELECT $1::int AS n, $2 AS t', ARRAY['7', NULL]);
-- wait => false with a free key is an ordinary call
SELECT replayed FROM idem_call('c:4', 'SELECT 4 AS four', wait => false);

-- a workflow step: run_id and step instead of a key
SELECT status FROM idem_run_begin('c-run', steps => ARRAY['pay']);
SELECT response, replayed FROM idem_call(NULL,
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING amount',
       ARRAY['inv-5', '5.00'], run_id => 'c-run', step => 'pay');
SELECT replayed FROM idem_call(NULL,
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING amount',
       ARRAY['inv-5', '5.00'], run_id => 'c-run', step => 'pay');
SELECT status FROM idem_run_status('c-run');

-- bad input: a documented SQLSTATE, nothing written, the options undone
SELECT * FROM idem_call('c:9', 'SELECT 1', run_id => 'c-run', step => 'pay');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'c-run');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call(NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call('c:9', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call('c:9', 'SELECT 1', ttl => '0 s');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call('c:9', 'SELECT 1', ttl => '100 days');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_call('c:9', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2)', ARRAY['x', 'abc']);
\echo :LAST_ERROR_SQLSTATE
BEGIN;
SAVEPOINT s;
SELECT * FROM idem_call('c:9', 'SELECT 1 / 0', outbox_topic => 'call_payments', ttl => '1 min');
ROLLBACK TO SAVEPOINT s;
SHOW idem.outbox_topic;
SHOW idem.ttl;
COMMIT;
SELECT count(*) AS c9 FROM idem.keys WHERE key = 'c:9';
SELECT count(*) AS payments FROM payments;

DROP TABLE payments;
DELETE FROM idem.keys WHERE key LIKE 'c:%' OR key LIKE 'idem.step:c-run:%';
DELETE FROM idem.outbox WHERE key LIKE 'c:%';
DELETE FROM idem.runs WHERE run_id = 'c-run';
