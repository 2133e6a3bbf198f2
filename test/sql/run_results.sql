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

-- the results are the object core builds from them, of the same size:
-- keys of several lengths (jsonb orders them shorter first), results that
-- are objects, arrays and scalars of every kind
SELECT idem_queue_create('rr_shapes', producers => '{regress_rr_app}',
	workers => '{regress_rr_agent}');
SET ROLE regress_rr_app;
SELECT created FROM idem_run_begin('rr-shapes',
	steps => '{bb,a,ccc,d,e,f,gg,last}', queue => 'rr_shapes');
SET ROLE regress_rr_agent;
SELECT lease_token AS tok FROM idem_run_claim('rr_shapes') \gset
SELECT count(*) AS steps_done
  FROM (SELECT idem_step_complete('rr-shapes', s, r, lease_token => :'tok')
		  FROM (VALUES ('bb', '"text"'::jsonb), ('a', '12.5'), ('ccc', 'true'),
					   ('d', 'null'), ('e', '{"x": [1, 2.25, {"y": "z"}]}'),
					   ('f', '[1, "a", false]'), ('gg', '""')) v(s, r)) x;
SELECT idem_run_release('rr-shapes', :'tok');
SELECT results, results = '{"bb": "text", "a": 12.5, "ccc": true, "d": null,
		"e": {"x": [1, 2.25, {"y": "z"}]}, "f": [1, "a", false], "gg": ""}'::jsonb AS same,
	   pg_column_size(results) = pg_column_size('{"bb": "text", "a": 12.5, "ccc": true,
		"d": null, "e": {"x": [1, 2.25, {"y": "z"}]}, "f": [1, "a", false], "gg": ""}'::jsonb)
		AS same_size,
	   results -> 'a' AS a, results -> 'e' -> 'x' -> 2 AS e_x_2
  FROM idem_run_claim('rr_shapes');
-- a step listed twice in done_steps (only a hand edit of idem.runs makes
-- one) is one key of the results, as core keeps one of an object's keys
SET ROLE regress_rr_app;
SELECT created FROM idem_run_begin('rr-dup', steps => '{a,b,c,last}', queue => 'rr_shapes');
SET ROLE regress_rr_agent;
SELECT lease_token AS tok FROM idem_run_claim('rr_shapes') \gset
-- over 126 bytes, so that the claim's row keeps its 4-byte header too
SELECT idem_step_complete('rr-dup', 'a', jsonb_build_object('n', repeat('x', 120)),
	lease_token => :'tok') ->> 'n' = repeat('x', 120) AS recorded;
SELECT idem_step_complete('rr-dup', 'b', '[2]', lease_token => :'tok');
SELECT idem_run_release('rr-dup', :'tok');
RESET ROLE;
UPDATE idem.runs SET done_steps = '{a,b,a}' WHERE run_id = 'rr-dup';
SET ROLE regress_rr_agent;
SELECT run_id, next_step, jsonb_object_keys(results) AS key,
	   results = core AS same, pg_column_size(results) = pg_column_size(core) AS same_size
  FROM idem_run_claim('rr_shapes'),
	   jsonb_build_object('a', jsonb_build_object('n', repeat('x', 120)), 'b', '[2]'::jsonb) core;
RESET ROLE;

-- cleanup
DELETE FROM idem.runs WHERE queue IN ('rr', 'rr_shapes');
DELETE FROM idem.keys WHERE owner IN ('regress_rr_app'::regrole, 'regress_rr_other'::regrole);
DELETE FROM idem.queues WHERE queue IN ('rr', 'rr_shapes');
DROP ROLE regress_rr_app, regress_rr_other, regress_rr_agent;
