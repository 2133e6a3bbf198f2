--
-- run_cap: a queue's concurrency cap holds against a holder whose lease ran
-- out.  With room left under the cap the lease still holds; once a claim
-- leased another run in its place, the old holder's extension, statement
-- step and external step's start are ID412 and change nothing (issue 21)
--
CREATE ROLE regress_rc_app;
CREATE ROLE regress_rc_agent;
CREATE TABLE rc_effects (run_id text, step text);
GRANT ALL ON rc_effects TO regress_rc_agent;
SELECT idem_queue_create('rc', producers => '{regress_rc_app}',
	workers => '{regress_rc_agent}', concurrency => 1);
SET ROLE regress_rc_app;
SELECT created FROM idem_run_begin('rc-a', steps => ARRAY['s1', 's2'], queue => 'rc');
SELECT created FROM idem_run_begin('rc-b', steps => ARRAY['s1'], queue => 'rc');
SET ROLE regress_rc_agent;
SELECT run_id, lease_token AS ta FROM idem_run_claim('rc', lease => '0.2 s', worker => 'wa') \gset
SELECT count(*) AS at_the_cap FROM idem_run_claim('rc', worker => 'wb');
SELECT pg_sleep(0.3);
-- nobody took its place: the lease that ran out still holds
SELECT idem_run_extend('rc-a', :'ta', '0.2 s') > now() AS extended_with_room;
SELECT pg_sleep(0.3);
SELECT run_id AS claimed_in_its_place FROM idem_run_claim('rc', lease => '5 min', worker => 'wb');
SELECT idem_run_extend('rc-a', :'ta', '5 min');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_call(NULL, 'INSERT INTO rc_effects VALUES ($1, $2)', ARRAY['rc-a', 's1'],
	run_id => 'rc-a', step => 's1', lease_token => :'ta');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM idem_step_start('rc-a', 's1', :'ta');
\echo :LAST_ERROR_SQLSTATE
RESET ROLE;
SELECT count(*) AS effects FROM rc_effects;
SELECT run_id, holder FROM idem_runs
 WHERE queue = 'rc' AND state = 'leased' AND lease_until > now() ORDER BY 1;

-- cleanup
DELETE FROM idem.runs WHERE queue = 'rc';
DELETE FROM idem.keys WHERE owner = 'regress_rc_app'::regrole;
DELETE FROM idem.queues WHERE queue = 'rc';
DROP TABLE rc_effects;
DROP ROLE regress_rc_app, regress_rc_agent;
