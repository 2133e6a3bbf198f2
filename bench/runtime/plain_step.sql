-- The baseline: a run on no queue (begun beforehand, like the queued
-- ones), its next id from a sequence, and four plain idem_step() calls,
-- each in a transaction of its own.
SELECT 'b' || nextval('bseq') AS run_id \gset
SELECT idem_step(:run_id, 's1', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's1'::text);
SELECT idem_step(:run_id, 's2', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's2'::text);
SELECT idem_step(:run_id, 's3', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's3'::text);
SELECT idem_step(:run_id, 's4', 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', :run_id::text, 's4'::text);
