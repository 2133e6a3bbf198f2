--
-- dryrun: idem_dry_run() says what idem_execute() would do now, and for a
-- new key computes the response, all rolled back
--
CREATE TABLE payments (id serial PRIMARY KEY, invoice int NOT NULL, amount numeric NOT NULL);
CREATE VIEW seen AS
SELECT (SELECT count(*) FROM payments) AS payments,
       (SELECT count(*) FROM idem.keys WHERE key LIKE 'pay:%') AS keys,
       (SELECT count(*) FROM idem.outbox WHERE key LIKE 'pay:%') AS events,
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS locks;

-- a new key: execute, with the response it would give; nothing stays
SELECT idem_outbox_create_topic('payments');
SET idem.outbox_topic = 'payments';
SELECT * FROM idem_dry_run('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 25.00::numeric);
SELECT * FROM seen;
-- inside a transaction too: no lock is kept after it returns
BEGIN;
SELECT action FROM idem_dry_run('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 25.00::numeric);
SELECT * FROM seen;
COMMIT;
RESET idem.outbox_topic;

-- after the real call: replay, with the recorded response
SELECT idem_execute('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 25.00::numeric);
SELECT * FROM idem_dry_run('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 25.00::numeric);
-- a different request under the key: mismatch, no response
SELECT * FROM idem_dry_run('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 99.00::numeric);
SELECT * FROM seen;
-- in the transaction that recorded the key: replay
BEGIN;
SELECT idem_execute('pay:2', 'SELECT 2 AS two');
SELECT * FROM idem_dry_run('pay:2', 'SELECT 2 AS two');
ROLLBACK;

-- an expired record: expired, and the response a new execution would give;
-- the record stays (idem_execute would replace it)
UPDATE idem.keys SET expires_at = now() - interval '1 minute' WHERE key = 'pay:1';
SELECT * FROM idem_dry_run('pay:1', 'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING invoice, amount', 4471, 25.00::numeric);
SELECT * FROM seen;

-- what a rollback cannot undo: sequence values
SELECT last_value AS before FROM payments_id_seq \gset
SELECT action FROM idem_dry_run('pay:3', 'INSERT INTO payments (invoice, amount) VALUES (1, 1) RETURNING id');
SELECT last_value > :before AS sequence_advanced FROM payments_id_seq;

-- the statement's own error is raised, as idem_execute would
SELECT * FROM idem_dry_run('pay:4', 'SELECT 1 / 0 AS boom');
\echo :LAST_ERROR_SQLSTATE
-- and the same errors for bad input
SELECT * FROM idem_dry_run(NULL, 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_dry_run('pay:5', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_dry_run('pay:5', 'SELECT 1; SELECT 2');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_dry_run('pay:5', 'SELECT $1 AS a');
\echo :LAST_ERROR_SQLSTATE
BEGIN READ ONLY;
SELECT * FROM idem_dry_run('pay:5', 'SELECT 1');
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SELECT * FROM seen;

-- a dry run refuses what the call would refuse, before anything runs: an
-- unregistered topic (42704), a topic the role may not publish to (42501)
SET idem.outbox_topic = 'dry_unregistered';
SELECT * FROM idem_dry_run('pay:6', 'INSERT INTO payments (invoice, amount) VALUES (6, 6) RETURNING invoice');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('pay:6', 'INSERT INTO payments (invoice, amount) VALUES (6, 6) RETURNING invoice');
\echo :LAST_ERROR_SQLSTATE
CREATE ROLE regress_dry_agent;
GRANT SELECT, INSERT ON payments TO regress_dry_agent;
GRANT USAGE ON SEQUENCE payments_id_seq TO regress_dry_agent;
SET idem.outbox_topic = 'payments';
SET ROLE regress_dry_agent;
SELECT * FROM idem_dry_run('pay:6', 'INSERT INTO payments (invoice, amount) VALUES (6, 6) RETURNING invoice');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('pay:6', 'INSERT INTO payments (invoice, amount) VALUES (6, 6) RETURNING invoice');
\echo :LAST_ERROR_SQLSTATE
-- without a topic the role's dry run answers
RESET idem.outbox_topic;
SELECT action FROM idem_dry_run('pay:6', 'INSERT INTO payments (invoice, amount) VALUES (6, 6) RETURNING invoice');
RESET ROLE;
-- a replay writes no event, so neither it nor its dry run checks the topic
SELECT idem_execute('pay:7', 'SELECT 7 AS seven');
SET idem.outbox_topic = 'dry_unregistered';
SELECT action FROM idem_dry_run('pay:7', 'SELECT 7 AS seven');
SELECT idem_execute('pay:7', 'SELECT 7 AS seven');
RESET idem.outbox_topic;
SELECT * FROM seen;

DROP VIEW seen;
DROP TABLE payments;
DROP ROLE regress_dry_agent;
DELETE FROM idem.outbox_topics WHERE topic = 'payments';
DELETE FROM idem.keys WHERE key LIKE 'pay:%';
