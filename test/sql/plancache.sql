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

-- The statement cache is bounded in bytes as well as in entries: 40
-- statements of 200 kB each (SQL text, parse tree and plan) stay within
-- idem.statement_cache_memory (issue 8, part 2).
CREATE FUNCTION idem_cache_bytes() RETURNS bigint LANGUAGE sql AS $$
	SELECT coalesce(sum(total_bytes), 0)::bigint FROM pg_backend_memory_contexts
	 WHERE name IN ('idem statement cache', 'idem statement')
		OR (name LIKE 'CachedPlan%' AND ident LIKE '%/* big %')
$$;
SET idem.statement_cache_memory = '1MB';
SELECT count(*) AS calls FROM generate_series(1, 40) g,
	LATERAL (SELECT idem_execute('cm-' || g,
		'SELECT ' || g || ' AS n /* big ' || repeat('x', 200000) || ' */')) s;
SELECT idem_cache_bytes() < 2 * 1024 * 1024 AS bounded;
-- the same load with a larger bound keeps far more, so the bound is what
-- held it down
SET idem.statement_cache_memory = '64MB';
SELECT count(*) AS calls FROM generate_series(41, 80) g,
	LATERAL (SELECT idem_execute('cm-' || g,
		'SELECT ' || g || ' AS n /* big ' || repeat('x', 200000) || ' */')) s;
SELECT idem_cache_bytes() > 8 * 1024 * 1024 AS unbounded_keeps_more;
-- a statement larger than the whole cache runs, and is not kept
SET idem.statement_cache_memory = '1MB';
SELECT idem_execute('cm-huge', 'SELECT 1 AS n /* big ' || repeat('y', 2000000) || ' */') ->> 'command';
SELECT idem_cache_bytes() < 2 * 1024 * 1024 AS huge_not_kept;
SELECT replayed FROM idem_execute_ex('cm-huge', 'SELECT 1 AS n /* big ' || repeat('y', 2000000) || ' */');
RESET idem.statement_cache_memory;
DELETE FROM idem.keys WHERE key LIKE 'cm-%';
DROP FUNCTION idem_cache_bytes();
