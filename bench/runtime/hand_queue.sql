-- The baseline a user writes instead of idem's queues: claim a run of a
-- hand-written table of runs (FOR UPDATE SKIP LOCKED, the lease its due
-- time), then four plain idem_step() calls, each in a transaction of its
-- own, the last in the statement that marks the run done.
UPDATE hand_runs SET status = 'leased', due_at = now() + interval '60 s', attempts = attempts + 1
 WHERE run_id = (SELECT run_id FROM hand_runs WHERE status <> 'done' AND due_at <= now()
                  ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING run_id \gset
SELECT idem_step(:run_id, 's1', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's1'::text);
SELECT idem_step(:run_id, 's2', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's2'::text);
SELECT idem_step(:run_id, 's3', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's3'::text);
WITH s AS (SELECT idem_step(:run_id, 's4', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's4'::text) AS r)
UPDATE hand_runs SET status = 'done' FROM s WHERE run_id = :run_id;
