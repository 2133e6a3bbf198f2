--
-- run_fold: a worker's step carries the bookkeeping of the external steps
-- around it (idem_call's complete_step/complete_result and start_step), in
-- the step's transaction: recorded as idem_step_complete() and
-- idem_step_start() record them, fenced by the same lease, all or nothing
-- with the step (issue 22)
--
CREATE ROLE regress_rf_app;
CREATE ROLE regress_rf_agent;
CREATE TABLE rf_stock (sku text PRIMARY KEY, on_hand int NOT NULL);
INSERT INTO rf_stock VALUES ('sku-1', 0);
CREATE TABLE rf_refunds (id text PRIMARY KEY, label_id text NOT NULL);
GRANT ALL ON rf_stock, rf_refunds TO regress_rf_agent;
SELECT idem_outbox_create_topic('rf_refunds');
SELECT idem_outbox_grant('rf_refunds', 'regress_rf_app', 'publish');
-- a worker writes the owner's events only on topics it may publish to
SELECT idem_outbox_grant('rf_refunds', 'regress_rf_agent', 'publish');
SELECT idem_queue_create('rf', producers => '{regress_rf_app}',
	workers => '{regress_rf_agent}', max_attempts => 5, jitter => 'none');
-- what a step's bookkeeping left: the run's progress and its started step
CREATE VIEW rf_state AS
SELECT r.run_id, array_to_string(r.done_steps, ',') AS done, r.started_step,
	   r.started_count, r.status
  FROM idem.runs r WHERE r.queue = 'rf';
GRANT SELECT ON rf_state TO PUBLIC;
SET ROLE regress_rf_app;
SELECT created FROM idem_run_begin('rf-1', steps => '{check,label,refund,notify}',
	queue => 'rf');
SET ROLE regress_rf_agent;
SELECT lease_token AS tok FROM idem_run_claim('rf', worker => 'w1') \gset

-- the check, and the label's start in its transaction: attempt 1 of the
-- label is on record when the call returns, under the step's key
SELECT response->'rows' AS rows, replayed,
	   started_key = idem_step_key('rf-1', 'label') AS label_key, started_attempt
  FROM idem_call(NULL, 'UPDATE rf_stock SET on_hand = on_hand + 1 RETURNING on_hand',
	run_id => 'rf-1', step => 'check', lease_token => :'tok', start_step => 'label');
SELECT * FROM rf_state WHERE run_id = 'rf-1';
-- a resumed label is the next attempt of the same count
SELECT attempt, completed FROM idem_step_start('rf-1', 'label', :'tok');

-- a start that cannot happen undoes the step it came with: out of
-- sequence (the refund before the label completed), undeclared
SET ROLE regress_rf_app;
SELECT created FROM idem_run_begin('rf-2', steps => '{check,label,refund,notify}',
	queue => 'rf');
SET ROLE regress_rf_agent;
SELECT lease_token AS tok2 FROM idem_run_claim('rf', worker => 'w1') \gset
SELECT * FROM idem_call(NULL, 'UPDATE rf_stock SET on_hand = on_hand + 1 RETURNING on_hand',
	run_id => 'rf-2', step => 'check', lease_token => :'tok2', start_step => 'refund');
SELECT * FROM idem_call(NULL, 'UPDATE rf_stock SET on_hand = on_hand + 1 RETURNING on_hand',
	run_id => 'rf-2', step => 'check', lease_token => :'tok2', start_step => 'ship');
SELECT * FROM rf_state ORDER BY run_id;
SELECT on_hand FROM rf_stock;

-- the run comes back to another worker, which learns of the started label
SELECT idem_run_release('rf-1', :'tok');
SELECT next_step, started_step, started_attempts, lease_token AS tok
  FROM idem_run_claim('rf', worker => 'w2') WHERE run_id = 'rf-1' \gset
SELECT :'next_step' AS next_step, :'started_step' AS started_step,
	   :'started_attempts' AS started_attempts;

-- the label's result with the refund: the refund's transaction fails, and
-- the label's completion is undone with it (the label stays started)
SELECT * FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2) RETURNING 1 / 0',
	ARRAY['rf-1', 'LBL-1'], outbox_topic => 'rf_refunds', run_id => 'rf-1', step => 'refund',
	lease_token => :'tok', complete_step => 'label', complete_result => '{"label_id": "LBL-1"}');
SELECT * FROM rf_state WHERE run_id = 'rf-1';
-- a completion under a token that no longer holds the run: fenced
SELECT * FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2)',
	ARRAY['rf-1', 'LBL-1'], run_id => 'rf-1', step => 'refund',
	lease_token => gen_random_uuid(), complete_step => 'label',
	complete_result => '{"label_id": "LBL-1"}');
SELECT * FROM rf_state WHERE run_id = 'rf-1';
-- then both commit together; the outbox event is the refund's response,
-- not the label's result
SELECT response, replayed, started_key, started_attempt
  FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2) RETURNING id',
	ARRAY['rf-1', 'LBL-1'], outbox_topic => 'rf_refunds', run_id => 'rf-1', step => 'refund',
	lease_token => :'tok', complete_step => 'label', complete_result => '{"label_id": "LBL-1"}');
SELECT * FROM rf_state WHERE run_id = 'rf-1';
RESET ROLE;
SELECT step, payload FROM idem.outbox WHERE run_id = 'rf-1' ORDER BY step;
SET ROLE regress_rf_app;
SELECT ordinal, step, state, attempts, response FROM idem_run_steps('rf-1');
SET ROLE regress_rf_agent;
-- the call again (its acknowledgement lost): both replay, nothing doubles
SELECT response, replayed
  FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2) RETURNING id',
	ARRAY['rf-1', 'LBL-1'], outbox_topic => 'rf_refunds', run_id => 'rf-1', step => 'refund',
	lease_token => :'tok', complete_step => 'label', complete_result => '{"label_id": "LBL-1"}');
-- with another result for the completed label: ID422, the first stays
SELECT * FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2) RETURNING id',
	ARRAY['rf-1', 'LBL-1'], run_id => 'rf-1', step => 'refund',
	lease_token => :'tok', complete_step => 'label', complete_result => '{"label_id": "LBL-2"}');
-- starting a completed step starts nothing: its key, no attempt
SELECT started_key = idem_step_key('rf-1', 'label') AS label_key, started_attempt
  FROM idem_call(NULL, 'INSERT INTO rf_refunds VALUES ($1, $2) RETURNING id',
	ARRAY['rf-1', 'LBL-1'], run_id => 'rf-1', step => 'refund',
	lease_token => :'tok', start_step => 'label');
SELECT idem_step_complete('rf-1', 'notify', '{"to": "cust-1"}', lease_token => :'tok');
SELECT * FROM rf_state WHERE run_id = 'rf-1';
RESET ROLE;
SELECT (SELECT count(*) FROM rf_refunds) AS refunds,
	   (SELECT count(*) FROM idem.outbox WHERE run_id = 'rf-1') AS events;

-- the completion, the step and the start act on the run read once: a
-- statement that changes its own run after the completion moved it (the
-- holder's heartbeat) is ID508 as alone, and none of the three is kept
SET ROLE regress_rf_app;
SELECT created FROM idem_run_begin('rf-3', steps => '{check,label,refund,notify}',
	queue => 'rf');
SET ROLE regress_rf_agent;
SELECT lease_token AS tok3 FROM idem_run_claim('rf', worker => 'w3') \gset
SELECT started_attempt
  FROM idem_call(NULL, 'SELECT 1 AS checked', run_id => 'rf-3', step => 'check',
	lease_token => :'tok3', start_step => 'label');
SELECT * FROM idem_call(NULL, 'SELECT idem_run_extend(''rf-3'', $1::uuid, ''1 h'') IS NOT NULL AS x',
	ARRAY[:'tok3'], run_id => 'rf-3', step => 'refund', lease_token => :'tok3',
	complete_step => 'label', complete_result => '{"label_id": "LBL-3"}',
	start_step => 'notify');
SELECT * FROM rf_state WHERE run_id = 'rf-3';
-- the same call without the heartbeat: each act sees the one before it
SELECT response->'rows' AS rows, started_attempt
  FROM idem_call(NULL, 'SELECT 2 AS refunded', run_id => 'rf-3', step => 'refund',
	lease_token => :'tok3', complete_step => 'label',
	complete_result => '{"label_id": "LBL-3"}', start_step => 'notify');
SELECT * FROM rf_state WHERE run_id = 'rf-3';
SET ROLE regress_rf_app;
SELECT ordinal, step, state, attempts FROM idem_run_steps('rf-3');
RESET ROLE;

-- bad input
SELECT * FROM idem_call('rf-k', 'SELECT 1', start_step => 'label');
SELECT * FROM idem_call('rf-k', 'SELECT 1', complete_step => 'label', complete_result => '{}');
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'rf-1', step => 'refund',
	complete_step => 'label');
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'rf-1', step => 'refund',
	complete_result => '{}');
-- a run without a queue has no lease: no start, as idem_step_start()
SELECT created FROM idem_run_begin('rf-plain', steps => '{a,b}');
SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'rf-plain', step => 'a',
	start_step => 'b');
-- a plain run's external step completes with its next step, no token
SELECT response, started_key, started_attempt
  FROM idem_call(NULL, 'SELECT 2 AS b', run_id => 'rf-plain', step => 'b',
	complete_step => 'a', complete_result => '{"a": 1}');
SELECT ordinal, step, state, response FROM idem_run_steps('rf-plain');

-- cleanup
DELETE FROM idem.outbox WHERE topic = 'rf_refunds';
DELETE FROM idem.outbox_topics WHERE topic = 'rf_refunds';
DELETE FROM idem.keys WHERE key IN (SELECT idem_step_key(r.run_id, s)
	FROM idem.runs r, unnest(r.steps) s WHERE r.run_id LIKE 'rf-%');
DELETE FROM idem.runs WHERE run_id LIKE 'rf-%';
DELETE FROM idem.queues WHERE queue = 'rf';
DROP VIEW rf_state;
DROP TABLE rf_stock, rf_refunds;
DROP ROLE regress_rf_app, regress_rf_agent;
