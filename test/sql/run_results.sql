--
-- run_results: a claim returns a run's results so far as one jsonb value.
-- A run whose completed steps' results are more than one jsonb value holds
-- (256 MB; each step's is within idem.max_response_size) fails at its
-- claim with its reason, instead of failing every claim that reaches it,
-- and the runs behind it, other roles' too, are claimed (issue 21)
--
CREATE ROLE regress_rr_app;
CREATE ROLE regress_rr_other;
CREATE ROLE regress_rr_agent;
SELECT idem_queue_create('rr', producers => '{regress_rr_app,regress_rr_other}',
	workers => '{regress_rr_agent}');
SET ROLE regress_rr_app;
SELECT created FROM idem_run_begin('rr-big',
	steps => (SELECT array_agg('s' || g ORDER BY g) FROM generate_series(1, 271) g),
	queue => 'rr');
SET ROLE regress_rr_agent;
SELECT lease_token AS tok FROM idem_run_claim('rr') \gset
SELECT count(*) AS steps_done
  FROM (SELECT idem_step_complete('rr-big', 's' || g,
			jsonb_build_object('x', repeat('x', 1000000)), lease_token => :'tok')
		  FROM generate_series(1, 270) g) x;
SELECT idem_run_release('rr-big', :'tok');
SET ROLE regress_rr_other;
SELECT created FROM idem_run_begin('rr-small', steps => ARRAY['s1'], queue => 'rr');
SET ROLE regress_rr_agent;
SELECT run_id, next_step FROM idem_run_claim('rr', max_runs => 10);
RESET ROLE;
SELECT run_id, status, last_error FROM idem_runs WHERE queue = 'rr' ORDER BY run_id;

-- cleanup
DELETE FROM idem.runs WHERE queue = 'rr';
DELETE FROM idem.keys WHERE owner IN ('regress_rr_app'::regrole, 'regress_rr_other'::regrole);
DELETE FROM idem.queues WHERE queue = 'rr';
DROP ROLE regress_rr_app, regress_rr_other, regress_rr_agent;
