-- Runs on queues benchmark (issue 21): the queues, the steps' business
-- table, and the run generators.
CREATE EXTENSION idem;
SELECT idem_queue_create('bench');
SELECT idem_queue_create('lat');
CREATE TABLE effects (run_id text NOT NULL, step text NOT NULL);
CREATE SEQUENCE bseq;

-- n runs of four steps, on queue (or none, with prefix 'b'), begun through
-- idem_run_begin() a thousand to a transaction.
CREATE PROCEDURE begin_runs(prefix text, n integer, queue text) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		PERFORM idem_run_begin(prefix || i, steps => ARRAY['s1', 's2', 's3', 's4'], queue => queue);
		IF i % 1000 = 0 THEN COMMIT; END IF;
	END LOOP;
END $$;

-- Runs written straight into idem.runs for the claim latency: due runs of
-- queue 'lat' and finished ones (completed, off the claim's index).
CREATE PROCEDURE fill_lat(due integer, finished integer) LANGUAGE sql AS $$
INSERT INTO idem.runs (run_id, owner, steps, status, started_at, finished_at,
	done_steps, attempts, queue, queue_state, due_at, attempt, claims, started_count)
SELECT 'd' || g, 'postgres'::regrole, ARRAY['s1'], 'running', now(), NULL,
	'{}', '{}', 'lat', 'ready', now() - g * interval '1 ms', 1, 0, 0
  FROM generate_series(1, due) g;
INSERT INTO idem.runs (run_id, owner, steps, status, started_at, finished_at,
	done_steps, attempts, queue, queue_state, due_at, attempt, claims, started_count)
SELECT 'f' || g, 'postgres'::regrole, ARRAY['s1'], 'completed', now(), now(),
	'{s1}', '{1}', 'lat', NULL, NULL, 1, 1, 0
  FROM generate_series(1, finished) g;
$$;

-- The same work as leased.sql and plain_step.sql, n runs in one session
-- (every claim and step still a transaction of its own), for the backend's
-- CPU time per run: run.sh reads it from /proc, which a loaded machine
-- disturbs far less than it does throughput.
CREATE PROCEDURE cpu_leased(n integer) LANGUAGE plpgsql AS $$
DECLARE
	r record;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	FOR i IN 1..n LOOP
		SELECT c.run_id, c.lease_token INTO r FROM idem_run_claim('bench', 1, '60 s', 'w') c;
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's1'], run_id => r.run_id, step => 's1', lease_token => r.lease_token);
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's2'], run_id => r.run_id, step => 's2', lease_token => r.lease_token);
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's3'], run_id => r.run_id, step => 's3', lease_token => r.lease_token);
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's4'], run_id => r.run_id, step => 's4', lease_token => r.lease_token);
		COMMIT;
	END LOOP;
END $$;

-- The same with a worker's batched claim: one claim of up to four runs,
-- then each run's four steps, for the share of a claim's fixed cost (its
-- transaction, its scan) in a leased run.
CREATE PROCEDURE cpu_leased4(n integer) LANGUAGE plpgsql AS $$
DECLARE
	ids text[];
	tokens uuid[];
	todo integer := n;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	WHILE todo > 0 LOOP
		SELECT array_agg(c.run_id), array_agg(c.lease_token) INTO ids, tokens
		  FROM idem_run_claim('bench', least(todo, 4), '60 s', 'w') c;
		COMMIT;
		FOR j IN 1..cardinality(ids) LOOP
			PERFORM idem_call(NULL, sql, ARRAY[ids[j], 's1'], run_id => ids[j], step => 's1', lease_token => tokens[j]);
			COMMIT;
			PERFORM idem_call(NULL, sql, ARRAY[ids[j], 's2'], run_id => ids[j], step => 's2', lease_token => tokens[j]);
			COMMIT;
			PERFORM idem_call(NULL, sql, ARRAY[ids[j], 's3'], run_id => ids[j], step => 's3', lease_token => tokens[j]);
			COMMIT;
			PERFORM idem_call(NULL, sql, ARRAY[ids[j], 's4'], run_id => ids[j], step => 's4', lease_token => tokens[j]);
			COMMIT;
		END LOOP;
		todo := todo - cardinality(ids);
	END LOOP;
END $$;

-- The returns workflow's shape as a worker folds it: a database step that
-- starts the external step after it, then a database step that completes
-- that one and starts the next, then the last external step's completion;
-- each folded idem_call() acts on its run three times in one statement.
CREATE PROCEDURE cpu_folded(n integer) LANGUAGE plpgsql AS $$
DECLARE
	r record;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	FOR i IN 1..n LOOP
		SELECT c.run_id, c.lease_token INTO r FROM idem_run_claim('bench', 1, '60 s', 'w') c;
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's1'], run_id => r.run_id, step => 's1', lease_token => r.lease_token, start_step => 's2');
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[r.run_id, 's3'], run_id => r.run_id, step => 's3', lease_token => r.lease_token, complete_step => 's2', complete_result => '{"label": 1}', start_step => 's4');
		COMMIT;
		PERFORM idem_step_complete(r.run_id, 's4', '{"sent": true}', r.lease_token);
		COMMIT;
	END LOOP;
END $$;

CREATE PROCEDURE cpu_plain_step(n integer) LANGUAGE plpgsql AS $$
DECLARE
	id text;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	FOR i IN 1..n LOOP
		id := 'b' || nextval('bseq');
		COMMIT;
		PERFORM idem_step(id, 's1', sql, id, 's1'::text);
		COMMIT;
		PERFORM idem_step(id, 's2', sql, id, 's2'::text);
		COMMIT;
		PERFORM idem_step(id, 's3', sql, id, 's3'::text);
		COMMIT;
		PERFORM idem_step(id, 's4', sql, id, 's4'::text);
		COMMIT;
	END LOOP;
END $$;

-- What a user writes for runs that resume without idem's queues: a table
-- of runs whose lease is its due time (as pgmq's visibility timeout), a
-- claim with FOR UPDATE SKIP LOCKED, the steps plain idem_step() calls,
-- the last one in the statement that marks the run done.  No fencing: a
-- holder whose lease expired is not stopped, and no attempt is recorded.
CREATE TABLE hand_runs (
	run_id text PRIMARY KEY,
	status text NOT NULL DEFAULT 'pending',
	due_at timestamptz NOT NULL DEFAULT now(),
	attempts integer NOT NULL DEFAULT 0
);
CREATE INDEX hand_runs_due ON hand_runs (due_at) WHERE status <> 'done';

-- n hand-queued runs, each also begun as a run on no queue for its steps.
CREATE PROCEDURE begin_hand_runs(n integer) LANGUAGE plpgsql AS $$
BEGIN
	CALL begin_runs('h', n, NULL);
	INSERT INTO hand_runs (run_id, due_at)
	SELECT 'h' || g, now() - (n - g) * interval '1 us' FROM generate_series(1, n) g;
END $$;

CREATE PROCEDURE cpu_hand_queue(n integer) LANGUAGE plpgsql AS $$
DECLARE
	id text;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	FOR i IN 1..n LOOP
		UPDATE hand_runs SET status = 'leased', due_at = now() + interval '60 s',
			   attempts = attempts + 1
		 WHERE run_id = (SELECT run_id FROM hand_runs
						  WHERE status <> 'done' AND due_at <= now()
						  ORDER BY due_at LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING run_id INTO id;
		COMMIT;
		PERFORM idem_step(id, 's1', sql, id, 's1'::text);
		COMMIT;
		PERFORM idem_step(id, 's2', sql, id, 's2'::text);
		COMMIT;
		PERFORM idem_step(id, 's3', sql, id, 's3'::text);
		COMMIT;
		WITH s AS (SELECT idem_step(id, 's4', sql, id, 's4'::text) AS r)
		UPDATE hand_runs SET status = 'done' FROM s WHERE run_id = id;
		COMMIT;
	END LOOP;
END $$;

CREATE PROCEDURE cpu_plain_call(n integer) LANGUAGE plpgsql AS $$
DECLARE
	id text;
	sql constant text := 'INSERT INTO effects (run_id, step) VALUES ($1, $2)';
BEGIN
	FOR i IN 1..n LOOP
		id := 'b' || nextval('bseq');
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[id, 's1'], run_id => id, step => 's1');
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[id, 's2'], run_id => id, step => 's2');
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[id, 's3'], run_id => id, step => 's3');
		COMMIT;
		PERFORM idem_call(NULL, sql, ARRAY[id, 's4'], run_id => id, step => 's4');
		COMMIT;
	END LOOP;
END $$;

-- n claims of one due run each, a transaction each, for the CPU time per
-- claim against the number of runs in idem.runs.
CREATE PROCEDURE cpu_claim(n integer) LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 1..n LOOP
		PERFORM idem_run_claim('lat', 1, '1 h', 'w');
		COMMIT;
	END LOOP;
END $$;
