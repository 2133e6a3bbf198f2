-- One run on a queue: claim it under a lease, then its four steps, each a
-- fenced idem_call() in a transaction of its own; the last completes the
-- run and ends the lease.
SELECT run_id, lease_token FROM idem_run_claim('bench', 1, '60 s', 'w') \gset
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's1'], run_id => :run_id, step => 's1', lease_token => :lease_token);
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's2'], run_id => :run_id, step => 's2', lease_token => :lease_token);
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's3'], run_id => :run_id, step => 's3', lease_token => :lease_token);
SELECT 1 FROM idem_call(NULL, 'INSERT INTO effects (run_id, step) VALUES ($1, $2)', ARRAY[:run_id, 's4'], run_id => :run_id, step => 's4', lease_token => :lease_token);
