--
-- expiry: key records expire; an expired record counts as absent
--
CREATE TABLE pings (id serial PRIMARY KEY);

-- idem.* can be set before the library is loaded in this session (it is
-- loaded by the first call); the value applies once it is
SET idem.ttl = '2h';
SELECT idem_execute('exp:early', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
SELECT expires_at - created_at AS lifetime FROM idem.keys WHERE key = 'exp:early';
RESET idem.ttl;

-- the default lifetime is 24 hours, like Stripe's window
SHOW idem.ttl;
SELECT idem_execute('exp:default', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
SELECT expires_at - created_at AS lifetime FROM idem.keys WHERE key = 'exp:default';

-- a per-call override: SET LOCAL for the calls of one transaction
BEGIN;
SET LOCAL idem.ttl = '15min';
SELECT idem_execute('exp:short', 'INSERT INTO pings DEFAULT VALUES') ->> 'rowcount';
COMMIT;
SHOW idem.ttl;
SELECT expires_at - created_at AS lifetime FROM idem.keys WHERE key = 'exp:short';

-- once expired, the next call executes again and replaces the record
SET idem.ttl = 1;
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT pg_sleep(1.2);
SELECT replayed FROM idem_execute_ex('exp:1', 'INSERT INTO pings DEFAULT VALUES');
SELECT count(*) AS keys FROM idem.keys WHERE key = 'exp:1';
RESET idem.ttl;

-- an expired key is free for a different request, too
UPDATE idem.keys SET expires_at = now() - interval '1 second' WHERE key = 'exp:short';
SELECT replayed FROM idem_execute_ex('exp:short', 'SELECT 2 AS different');

-- purge removes expired records in batches and nothing else
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at)
SELECT 'exp:old:' || g, current_user::regrole, '\x00'::bytea, '{}'::jsonb,
       now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 25) g;
SELECT idem_purge(10) AS batch1;
SELECT idem_purge(10) AS batch2;
SELECT idem_purge(10) AS batch3;
SELECT idem_purge() AS batch4;
SELECT count(*) AS expired_left FROM idem.keys WHERE expires_at <= now();
SELECT key FROM idem.keys WHERE key LIKE 'exp:%' ORDER BY key;

DROP TABLE pings;
