-- The baseline in the leased script's shape: four idem_call() steps of a
-- run on no queue, each in a transaction of its own.
SELECT 'b' || nextval('bseq') AS run_id \gset
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's1'], run_id => :run_id, step => 's1');
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's2'], run_id => :run_id, step => 's2');
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's3'], run_id => :run_id, step => 's3');
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's4'], run_id => :run_id, step => 's4');
