--
-- run_settings: the runtime under settings a session or database may carry
-- (ALTER DATABASE/ROLE ... SET, PGOPTIONS) that change how PostgreSQL runs
-- idem's own statements, and under queries that read part of a claim
--
CREATE ROLE regress_st_app;
CREATE ROLE regress_st_agent;
SELECT idem_queue_create('st', producers => '{regress_st_app}',
	workers => '{regress_st_agent}');
CREATE TABLE st_claimed (run_id text, token uuid);
GRANT ALL ON st_claimed TO regress_st_agent;

-- session_replication_role = replica fires no foreign key's cascade: the
-- purge removes a run's attempts and signals itself, so a run begun again
-- under the id is claimed from its first attempt and does not get the old
-- run's signal
SET ROLE regress_st_app;
SELECT created FROM idem_run_begin('st-1', steps => ARRAY['approve', 'ship'], queue => 'st');
RESET ROLE;
SET ROLE regress_st_agent;
INSERT INTO st_claimed SELECT run_id, lease_token FROM idem_run_claim('st');
SELECT state FROM idem_run_await('st-1', 'approve', (SELECT token FROM st_claimed), '1 h');
RESET ROLE;
SET ROLE regress_st_app;
SELECT idem_run_signal('st-1', 'approve', '{"by": "old"}');
SELECT idem_run_cancel('st-1', 'replaced');
RESET ROLE;
SET session_replication_role = replica;
SELECT idem_run_purge('infinity') > 0 AS purged;
RESET session_replication_role;
SELECT (SELECT count(*) FROM idem.run_attempts WHERE run_id = 'st-1') AS attempts,
	   (SELECT count(*) FROM idem.run_signals WHERE run_id = 'st-1') AS signals;
SET ROLE regress_st_app;
SELECT created FROM idem_run_begin('st-1', steps => ARRAY['approve', 'ship'], queue => 'st');
RESET ROLE;
SET ROLE regress_st_agent;
DELETE FROM st_claimed;
INSERT INTO st_claimed SELECT run_id, lease_token FROM idem_run_claim('st');
SELECT run_id FROM st_claimed;
SELECT state, payload FROM idem_run_await('st-1', 'approve', (SELECT token FROM st_claimed), '1 h');
RESET ROLE;
SELECT claim, step, outcome FROM idem_run_attempts WHERE run_id = 'st-1';
-- the registry's triggers fire whatever the role; the row triggers (and
-- the lock seed's) in replica sessions, as a subscriber's apply worker
-- writes (test/t/183_logical_cutover.pl)
SELECT tgrelid::regclass, tgname, tgenabled FROM pg_trigger
 WHERE tgrelid IN ('idem.queues'::regclass, 'idem.outbox_topics'::regclass,
				   'idem.lock_seed'::regclass)
 ORDER BY 1, 2;

-- a claim leases every run it returns, whatever part of its result the
-- query reads: LIMIT 1 over max_runs => 3 leases three runs and shows one;
-- the other two wait for their lease to run out (runtime.md)
SELECT idem_run_cancel('st-1', owner => 'regress_st_app');
SET ROLE regress_st_app;
SELECT count(idem_run_begin('st-lim-' || i, steps => ARRAY['a'], queue => 'st'))
  FROM generate_series(1, 3) i;
RESET ROLE;
SET ROLE regress_st_agent;
SELECT count(*) AS shown
  FROM (SELECT run_id FROM idem_run_claim('st', max_runs => 3) LIMIT 1) s;
RESET ROLE;
SELECT state, count(*) FROM idem_runs WHERE run_id LIKE 'st-lim-%' GROUP BY 1;
-- the same of an outbox claim: three events leased, one shown
SELECT idem_outbox_create_topic('st-events');
SET idem.outbox_topic = 'st-events';
SELECT count(idem_execute('st-ev-' || i, 'SELECT 1 AS one')) FROM generate_series(1, 3) i;
RESET idem.outbox_topic;
SELECT count(*) AS shown
  FROM (SELECT event_id FROM idem_outbox_claim('st-events', 3) LIMIT 1) s;
SELECT state, attempts, count(*) FROM idem.outbox WHERE topic = 'st-events' GROUP BY 1, 2;

-- cleanup
SELECT count(idem_run_cancel(run_id, owner => owner)) FROM idem.runs
 WHERE status = 'running' AND queue = 'st';
SELECT idem_run_purge('infinity') > 0 AS purged;
DELETE FROM idem.queues WHERE queue = 'st';
SELECT idem_outbox_drop_topic('st-events', cascade => true);
DELETE FROM idem.keys WHERE key LIKE 'st-ev-%';
DROP TABLE st_claimed;
DROP ROLE regress_st_app, regress_st_agent;
