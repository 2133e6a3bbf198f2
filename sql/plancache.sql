--
-- plancache: idem's key lookup is an index probe, whatever idem.keys looked
-- like when the backend first used it
--
-- A plan that the plan cache keeps for "WHERE key = $1" after building it
-- while the catalog was empty and analyzed is a sequential scan, and stays
-- one after the catalog has grown, until the next ANALYZE or DDL.  The scan
-- counters of the current transaction (pg_stat_xact_user_tables) are exact
-- and are not flushed in the middle of a transaction block, so their
-- differences across a block count the scans of idem.keys in it.
--
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idem;
RESET client_min_messages;
SET plan_cache_mode = auto;

CREATE TABLE plancache_orders (id int PRIMARY KEY, note text);

-- no autoanalyze may replan behind the test's back
ALTER TABLE idem.keys SET (autovacuum_enabled = off);

-- an empty, analyzed catalog
TRUNCATE idem.keys;
ANALYZE idem.keys;
SELECT relpages, reltuples FROM pg_class WHERE oid = 'idem.keys'::regclass;

-- a hand-written lookup, run more than the five custom plans the plan cache
-- makes before it settles on a generic plan
PREPARE lookup(text) AS SELECT key FROM idem.keys WHERE key = $1;
EXECUTE lookup('pc-1');
EXECUTE lookup('pc-1');
EXECUTE lookup('pc-1');
EXECUTE lookup('pc-1');
EXECUTE lookup('pc-1');
EXECUTE lookup('pc-1');

-- idem_execute(), as many times, in separate transactions
SELECT replayed, response FROM idem_execute_ex('pc-1', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 1, 'one');
SELECT replayed, response FROM idem_execute_ex('pc-2', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 2, 'two');
SELECT replayed, response FROM idem_execute_ex('pc-3', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 3, 'three');
SELECT replayed, response FROM idem_execute_ex('pc-1', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 1, 'one');
SELECT replayed, response FROM idem_execute_ex('pc-2', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 2, 'two');
SELECT replayed, response FROM idem_execute_ex('pc-3', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 3, 'three');

-- bulk-load keys behind the plan cache's back: no ANALYZE, no DDL
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT 'bulk-' || i, current_user::regrole, '\x00', '{}', now(), now() + interval '1 day', 2
  FROM generate_series(1, 100000) i;
SELECT relpages, reltuples FROM pg_class WHERE oid = 'idem.keys'::regclass;

-- the hand-written lookup kept its plan from the empty catalog
EXPLAIN (COSTS OFF) EXECUTE lookup('pc-1');

BEGIN;
SELECT seq_scan AS seq0, idx_scan AS idx0
  FROM pg_stat_xact_user_tables WHERE relid = 'idem.keys'::regclass \gset
EXECUTE lookup('pc-1');
SELECT seq_scan - :seq0 AS seq_scans, idx_scan - :idx0 AS idx_scans
  FROM pg_stat_xact_user_tables WHERE relid = 'idem.keys'::regclass;
COMMIT;

-- idem's lookups in the same backend: a replay, a new key and a replay of
-- it, each an index probe, never a sequential scan
BEGIN;
SELECT seq_scan AS seq0, idx_scan AS idx0
  FROM pg_stat_xact_user_tables WHERE relid = 'idem.keys'::regclass \gset
SELECT replayed, response FROM idem_execute_ex('pc-2', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 2, 'two');
SELECT replayed, response FROM idem_execute_ex('pc-4', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 4, 'four');
SELECT replayed, response FROM idem_execute_ex('pc-4', 'INSERT INTO plancache_orders VALUES ($1, $2) RETURNING id', 4, 'four');
SELECT seq_scan - :seq0 AS seq_scans, idx_scan - :idx0 >= 3 AS index_probes
  FROM pg_stat_xact_user_tables WHERE relid = 'idem.keys'::regclass;
COMMIT;

SELECT id, note FROM plancache_orders ORDER BY id;

-- clean up
DEALLOCATE lookup;
DROP TABLE plancache_orders;
TRUNCATE idem.keys;
ALTER TABLE idem.keys RESET (autovacuum_enabled);
