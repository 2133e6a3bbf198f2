--
-- expiry: key records expire; an expired record counts as absent; a record
-- lives at least idem.ttl after its commit; idem.ttl has a ceiling
--
CREATE TABLE pings (id serial PRIMARY KEY);

-- idem.* can be set before the library is loaded in this session (it is
-- loaded by the first call); the value applies once it is
SET idem.ttl = '2h';
SELECT idem_execute('exp:early', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
-- a record is written with one second of slack for its commit
SELECT date_trunc('second', expires_at - created_at) AS lifetime FROM idem.keys WHERE key = 'exp:early';
RESET idem.ttl;

-- the default lifetime is 24 hours, like Stripe's window
SHOW idem.ttl;
SELECT idem_execute('exp:default', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
SELECT date_trunc('second', expires_at - created_at) AS lifetime FROM idem.keys WHERE key = 'exp:default';

-- a per-call override: SET LOCAL for the calls of one transaction
BEGIN;
SET LOCAL idem.ttl = '15min';
SELECT idem_execute('exp:short', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
COMMIT;
SHOW idem.ttl;
SELECT date_trunc('second', expires_at - created_at) AS lifetime FROM idem.keys WHERE key = 'exp:short';

-- once expired, the next call executes again and replaces the record
SET idem.ttl = 1;
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT pg_sleep(2.2);
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT count(*) AS keys FROM idem.keys WHERE key = 'exp:1';
RESET idem.ttl;

-- an expired key is free for a different request, too
UPDATE idem.keys SET expires_at = now() - interval '1 second' WHERE key = 'exp:short';
SELECT replayed FROM idem_execute_ex('exp:short', 'SELECT 2 AS different');

-- purge removes expired records in batches and nothing else
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT 'exp:old:' || g, current_user::regrole, '\x00'::bytea, '{}'::jsonb,
       now() - interval '2 days', now() - interval '1 day', 2
  FROM generate_series(1, 25) g;
SELECT idem_purge(10) AS batch1;
SELECT idem_purge(10) AS batch2;
SELECT idem_purge(10) AS batch3;
SELECT idem_purge() AS batch4;
SELECT count(*) AS expired_left FROM idem.keys WHERE expires_at <= now();
SELECT key FROM idem.keys WHERE key LIKE 'exp:%' ORDER BY key;

-- The ttl counts from the commit, not from the call: a transaction that
-- commits long after its call still gets its full ttl (issue 8, part 4).
CREATE TABLE tx (id serial PRIMARY KEY, v text);
BEGIN;
SET LOCAL idem.ttl = '1s';
SELECT idem_execute('ttl-1', 'INSERT INTO tx(v) VALUES (''ttl'') RETURNING v');
SELECT pg_sleep(1.5);
COMMIT;
SELECT replayed, response FROM idem_execute_ex('ttl-1', 'INSERT INTO tx(v) VALUES (''ttl'') RETURNING v');
SELECT count(*) AS rows_written FROM tx;
-- restamped at commit: ttl plus the slack after the commit, not the call
SELECT expires_at - created_at > interval '3 seconds' AS counted_from_commit
  FROM idem.keys WHERE key = 'ttl-1';
-- and it still ends
SELECT pg_sleep(2.2);
SELECT replayed FROM idem_execute_ex('ttl-1', 'INSERT INTO tx(v) VALUES (''ttl'') RETURNING v');
-- a record that a rolled-back savepoint removed is not restamped into life
BEGIN;
SET LOCAL idem.ttl = '1s';
SAVEPOINT s;
SELECT idem_execute('ttl-2', 'INSERT INTO tx(v) VALUES (''gone'') RETURNING v');
ROLLBACK TO SAVEPOINT s;
SELECT pg_sleep(1.2);
COMMIT;
SELECT count(*) AS ttl2_records FROM idem.keys WHERE key = 'ttl-2';
-- nor does a rolled-back call's ttl move the record that replaced it: the
-- surviving call's own ttl counts from the commit, whichever was longer
BEGIN;
SET LOCAL idem.ttl = '10s';
SAVEPOINT s;
SELECT idem_execute('ttl-3', 'SELECT 3 AS n') ->> 'command';
ROLLBACK TO SAVEPOINT s;
SET LOCAL idem.ttl = '1h';
SELECT idem_execute('ttl-3', 'SELECT 3 AS n') ->> 'command';
SELECT pg_sleep(1.2);
COMMIT;
SELECT expires_at > now() + interval '59 minutes' AS own_ttl_kept
  FROM idem.keys WHERE key = 'ttl-3';
BEGIN;
SET LOCAL idem.ttl = '1h';
SAVEPOINT s;
SELECT idem_execute('ttl-4', 'SELECT 4 AS n') ->> 'command';
ROLLBACK TO SAVEPOINT s;
SET LOCAL idem.ttl = '10s';
SELECT idem_execute('ttl-4', 'SELECT 4 AS n') ->> 'command';
SELECT pg_sleep(1.2);
COMMIT;
SELECT expires_at < now() + interval '1 minute' AS rolled_back_ttl_ignored
  FROM idem.keys WHERE key = 'ttl-4';
-- a released savepoint keeps its call, and the call its restamp
BEGIN;
SET LOCAL idem.ttl = '1s';
SAVEPOINT s;
SELECT idem_execute('ttl-5', 'SELECT 5 AS n') ->> 'command';
RELEASE SAVEPOINT s;
SELECT pg_sleep(1.5);
COMMIT;
SELECT replayed FROM idem_execute_ex('ttl-5', 'SELECT 5 AS n');

-- Prepared transactions: the ttl counts from PREPARE TRANSACTION, the last
-- moment idem runs in that transaction; COMMIT PREPARED later takes the
-- time between the two out of the ttl.
BEGIN;
SET LOCAL idem.ttl = '1s';
SELECT idem_execute('ttl-2pc', 'INSERT INTO tx(v) VALUES (''2pc'') RETURNING v');
SELECT pg_sleep(1.2);
PREPARE TRANSACTION 'idem_ttl_2pc';
SELECT pg_sleep(0.5);
COMMIT PREPARED 'idem_ttl_2pc';
SELECT replayed FROM idem_execute_ex('ttl-2pc', 'INSERT INTO tx(v) VALUES (''2pc'') RETURNING v');
SELECT expires_at > now() + interval '1 second' AS stamped_at_prepare
  FROM idem.keys WHERE key = 'ttl-2pc';

-- idem.ttl has a ceiling only a superuser sets: squatting a key for 68
-- years, or filling idem.keys with records no purge removes, is refused
SHOW idem.max_ttl;
CREATE ROLE regress_idem_squatter;
GRANT INSERT, SELECT ON tx TO regress_idem_squatter;
GRANT USAGE ON SEQUENCE tx_id_seq TO regress_idem_squatter;
SET ROLE regress_idem_squatter;
SET idem.ttl = '2147483647';
SELECT idem_execute('ttl-squat', 'SELECT 1 AS one');
\echo :LAST_ERROR_SQLSTATE
SET idem.max_ttl = '100d';
\echo :LAST_ERROR_SQLSTATE
SET idem.max_response_size = '512MB';
\echo :LAST_ERROR_SQLSTATE
SET idem.statement_cache_memory = '1GB';
\echo :LAST_ERROR_SQLSTATE
SET idem.ttl = '30d';
SELECT idem_execute('ttl-squat', 'SELECT 1 AS one') ->> 'rowcount' AS at_the_ceiling;
-- nor can the business statement raise idem.ttl after the check: a
-- statement that changes an idem.* setting is refused, and records nothing
SELECT idem_execute('ttl-bypass', 'SELECT set_config(''idem.ttl'', ''3000d'', true) AS t') ->> 'rowcount';
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS squat_records FROM idem.keys WHERE key = 'ttl-squat';
SELECT count(*) AS bypass_records FROM idem.keys WHERE key = 'ttl-bypass';
-- an administrator raises the ceiling (here for the session; ALTER ROLE
-- or ALTER DATABASE ... SET idem.max_ttl for good)
SET idem.max_ttl = '400d';
SET ROLE regress_idem_squatter;
SHOW idem.max_ttl;
SET idem.ttl = '365d';
SELECT idem_execute('ttl-year', 'SELECT 1 AS one') ->> 'rowcount' AS within_raised_ceiling;
RESET ROLE;
-- a ceiling of one second is spelt as one
SET idem.max_ttl = 1;
SET idem.ttl = 2;
SELECT idem_execute('ttl-one', 'SELECT 1 AS one');
RESET idem.ttl;
RESET idem.max_ttl;
DELETE FROM idem.keys WHERE owner = 'regress_idem_squatter'::regrole;
DROP OWNED BY regress_idem_squatter;
DROP ROLE regress_idem_squatter;

DROP TABLE tx;
DROP TABLE pings;
