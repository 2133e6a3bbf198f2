--
-- execute: first call runs the statement, later calls replay its response
--
CREATE TABLE refunds (
	id			serial PRIMARY KEY,
	return_id	text NOT NULL,
	amount		numeric NOT NULL
);

-- the example from the README, unqualified, with two arguments
SELECT idem_execute('refund:acme:ret-4471',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4471', 25.00::numeric);

-- the retry does not run the INSERT again and returns the same document
SELECT idem_execute('refund:acme:ret-4471',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4471', 25.00::numeric);
SELECT count(*) AS refunds FROM refunds;

-- byte for byte: the replayed datum equals the stored one
SELECT idem_execute('refund:acme:ret-4471',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4471', 25.00::numeric)::text::bytea
     = (SELECT response::text::bytea FROM idem.keys
         WHERE key = 'refund:acme:ret-4471') AS identical;

-- idem_execute_ex says whether the call replayed, and when it first ran
SELECT response, replayed,
       first_executed_at = (SELECT created_at FROM idem.keys
                             WHERE key = 'refund:acme:ret-4471') AS same_time
  FROM idem_execute_ex('refund:acme:ret-4471',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4471', 25.00::numeric);
SELECT response, replayed, first_executed_at = now() AS executed_now
  FROM idem_execute_ex('refund:acme:ret-4472',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4472', 10::numeric);

-- no arguments at all
SELECT idem_execute('exec:noargs',
       'INSERT INTO refunds(return_id, amount) VALUES (''ret-9'', 9)');
SELECT idem_execute('exec:noargs',
       'INSERT INTO refunds(return_id, amount) VALUES (''ret-9'', 9)');

-- an explicit VARIADIC array is the same request as the spread form
SELECT idem_execute('exec:variadic',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2::numeric) RETURNING return_id',
       VARIADIC ARRAY['ret-10', '10']);
SELECT (idem_execute_ex('exec:variadic',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2::numeric) RETURNING return_id',
       'ret-10', '10')).replayed;

-- VARIADIC NULL means no arguments, as for format()
SELECT idem_execute('exec:variadic-null', 'SELECT 42 AS answer',
       VARIADIC NULL::text[]);

-- arguments keep their own types; untyped literals bind as text
SELECT idem_execute('exec:types',
       'SELECT $1 AS t, $2 AS i, $3 AS n, $4 AS b, $5 AS d, $6 AS a, $7 AS j, $8 AS nul',
       'lit', 7, 1.50, true, date '2026-01-02', ARRAY[1,2],
       jsonb_build_object('k', 1), NULL::int);

-- each statement kind reports its command and row count
SELECT idem_execute('exec:update',
       'UPDATE refunds SET amount = amount WHERE amount < $1', 100);
SELECT idem_execute('exec:delete',
       'DELETE FROM refunds WHERE return_id = $1 RETURNING return_id', 'ret-9');
SELECT idem_execute('exec:select-none',
       'SELECT id FROM refunds WHERE false');
SELECT idem_execute('exec:select-many',
       'SELECT g AS n FROM generate_series(1, 3) g');
SELECT idem_execute('exec:merge',
       'MERGE INTO refunds r USING (SELECT $1::text AS rid) s ON r.return_id = s.rid
        WHEN MATCHED THEN UPDATE SET amount = r.amount + 1
        WHEN NOT MATCHED THEN INSERT (return_id, amount) VALUES (s.rid, 1)',
       'ret-11');
SELECT idem_execute('exec:cte',
       'WITH r AS (INSERT INTO refunds(return_id, amount) VALUES ($1, 5) RETURNING id)
        SELECT count(*) AS inserted FROM r', 'ret-12');

-- the response shape
SELECT jsonb_typeof(r -> 'rows') AS rows, jsonb_typeof(r -> 'command') AS command,
       jsonb_typeof(r -> 'rowcount') AS rowcount,
       (SELECT array_agg(k ORDER BY k) FROM jsonb_object_keys(r) k) AS keys
  FROM idem_execute('refund:acme:ret-4471',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING id, amount',
       'ret-4471', 25.00::numeric) r;

-- the same key twice in one transaction: the second call replays
BEGIN;
SELECT replayed FROM idem_execute_ex('exec:twice',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, 1) RETURNING id', 'ret-13');
SELECT replayed FROM idem_execute_ex('exec:twice',
       'INSERT INTO refunds(return_id, amount) VALUES ($1, 1) RETURNING id', 'ret-13');
COMMIT;
SELECT count(*) AS rows_for_ret_13 FROM refunds WHERE return_id = 'ret-13';

-- works from PL/pgSQL too, where the arguments are variables
DO $$
DECLARE
	r jsonb;
	rid text := 'ret-14';
BEGIN
	r := idem_execute('exec:plpgsql',
		'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING return_id',
		rid, 3::numeric);
	RAISE NOTICE '%', r;
	r := idem_execute('exec:plpgsql',
		'INSERT INTO refunds(return_id, amount) VALUES ($1, $2) RETURNING return_id',
		rid, 3::numeric);
	RAISE NOTICE '%', r;
END
$$;
SELECT count(*) AS rows_for_ret_14 FROM refunds WHERE return_id = 'ret-14';

-- the response is the jsonb that core builds from the same rows, of the
-- same size: rows of every kind of value, none, and more than 32 (every 32nd
-- element of a jsonb array records its offset)
CREATE FUNCTION core_response(sql text, command text, n bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
	rows jsonb;
BEGIN
	EXECUTE format('SELECT COALESCE(jsonb_agg(to_jsonb(t)), ''[]'') FROM (%s) t', sql) INTO rows;
	RETURN jsonb_build_object('rows', rows, 'command', command, 'rowcount', n);
END
$$;
WITH q(k, sql, command, n) AS (VALUES
	('exec:shape:1', 'SELECT 1 AS a, ''x'' AS b, 1.5::numeric AS c, NULL::int AS d, true AS e, false AS f, ARRAY[1, 2] AS g, ''{"k": [1, {"z": 2.25}], "": "e"}''::jsonb AS h', 'SELECT', 1),
	('exec:shape:2', 'SELECT g, repeat(''v'', g % 5) AS s, g * 1.5 AS n FROM generate_series(1, 100) g', 'SELECT', 100),
	('exec:shape:3', 'SELECT 1 AS a WHERE false', 'SELECT', 0),
	('exec:shape:4', 'SELECT FROM generate_series(1, 40)', 'SELECT', 40)
)
SELECT k, r = c AS same, pg_column_size(r) = pg_column_size(c) AS same_size,
       r -> 'rows' -> (n::int - 1) = c -> 'rows' -> (n::int - 1) AS same_last
  FROM q, LATERAL (SELECT idem_execute(k, sql) AS r, core_response(sql, command, n) AS c) x
 ORDER BY k;
DROP FUNCTION core_response(text, text, bigint);

DROP TABLE refunds;
