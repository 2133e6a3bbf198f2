--
-- nesting: a business statement that itself calls idem_execute()
--
CREATE TABLE steps (id serial PRIMARY KEY, name text NOT NULL);

-- another key inside: both run once, both are recorded
SELECT idem_execute('nest:outer',
       'SELECT idem_execute(''nest:inner'', ''INSERT INTO steps(name) VALUES ($1) RETURNING name'', $1::text) -> ''rows'' AS inner_rows',
       'inner');
SELECT idem_execute('nest:outer',
       'SELECT idem_execute(''nest:inner'', ''INSERT INTO steps(name) VALUES ($1) RETURNING name'', $1::text) -> ''rows'' AS inner_rows',
       'inner') -> 'rows' AS replayed_rows;
SELECT count(*) AS steps FROM steps;
SELECT key FROM idem.keys WHERE key LIKE 'nest:%' ORDER BY key;

-- the same key inside: an error (no deadlock on the key lock, no second
-- record), and nothing is written
SELECT idem_execute('nest:same',
       'SELECT idem_execute(''nest:same'', ''INSERT INTO steps(name) VALUES (''''x'''')'')');
\echo :LAST_ERROR_SQLSTATE
SELECT count(*) AS steps FROM steps;
SELECT count(*) AS keys FROM idem.keys WHERE key = 'nest:same';

-- the same statement text at two levels (the plan is shared and pinned)
CREATE FUNCTION add_step(k text, n text) RETURNS jsonb LANGUAGE sql AS $$
	SELECT idem_execute(k, 'SELECT add_step_inner($1) AS r', n)
$$;
CREATE FUNCTION add_step_inner(n text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	IF n = 'outer' THEN
		PERFORM add_step('nest:level2', 'inner');
	END IF;
	INSERT INTO steps(name) VALUES (n);
	RETURN n;
END
$$;
SELECT add_step('nest:level1', 'outer');
SELECT name FROM steps ORDER BY id;
SELECT add_step('nest:level1', 'outer');
SELECT count(*) AS steps FROM steps;

-- an inner failure caught by the business statement's own exception block
-- leaves the outer call to finish normally
CREATE FUNCTION try_inner() RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	PERFORM idem_execute('nest:caught', 'SELECT 1 / 0');
	RETURN 'not reached';
EXCEPTION WHEN division_by_zero THEN
	RETURN 'caught';
END
$$;
SELECT idem_execute('nest:catcher', 'SELECT try_inner() AS r') -> 'rows';
SELECT key FROM idem.keys WHERE key IN ('nest:caught', 'nest:catcher') ORDER BY key;

DROP FUNCTION try_inner();
DROP FUNCTION add_step(text, text);
DROP FUNCTION add_step_inner(text);
DROP TABLE steps;
