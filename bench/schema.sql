--
-- idem benchmark schema: the business table every workload writes, and the
-- hand-written alternative's own key and outbox tables, defined exactly like
-- idem's (LIKE ... INCLUDING ALL), so every design pays for the same rows
-- and indexes.  Run as a superuser (it reads idem's table definitions);
-- the workloads run as the ordinary role "bench".
--
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS bench CASCADE;
DROP EXTENSION IF EXISTS idem CASCADE;
RESET client_min_messages;

DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bench') THEN
		CREATE ROLE bench LOGIN;
	END IF;
END
$$;
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('payments', publishers => '{bench}', consumers => '{bench}');
CREATE SCHEMA bench AUTHORIZATION bench;

-- the business table
CREATE TABLE bench.payments (
	id			bigserial PRIMARY KEY,
	invoice		text NOT NULL,
	amount		numeric(12,2) NOT NULL,
	paid_at		timestamptz NOT NULL DEFAULT now()
);

-- the hand-written design's catalog and outbox: the same definitions as idem's
CREATE TABLE bench.keys (LIKE idem.keys INCLUDING ALL);
CREATE TABLE bench.outbox (LIKE idem.outbox INCLUDING ALL);

ALTER TABLE bench.payments OWNER TO bench;
ALTER TABLE bench.keys OWNER TO bench;
ALTER TABLE bench.outbox OWNER TO bench;

-- Snapshots of the seeded key records, restored before every run (the
-- replay workloads look these keys up).
CREATE TABLE bench.idem_seed (LIKE idem.keys);
CREATE TABLE bench.plpgsql_seed (LIKE bench.keys);

--
-- The classic hand-written idempotency function, what users write today:
-- advisory lock on (role, key), look the key up by (role, key) as idem's
-- primary key is, replay a live record (after checking the request
-- fingerprint) or EXECUTE the business statement
-- capturing its rows as jsonb, then INSERT the key record with the response
-- and an outbox event.  Like idem_execute() it takes the statement as text
-- and its arguments (here fixed to the benchmark's two).
--
CREATE FUNCTION bench.plpgsql_execute(p_key text, p_sql text,
									  p_arg1 text, p_arg2 numeric)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
	v_owner		oid := current_user::text::regrole::oid;
	v_fp		bytea := sha256(convert_to(concat_ws(E'\x1f', p_sql, p_arg1, p_arg2), 'UTF8'));
	v_rec		record;
	v_rows		jsonb;
	v_count		bigint;
	v_response	jsonb;
BEGIN
	PERFORM pg_advisory_xact_lock(v_owner::int, hashtext(p_key));

	SELECT fingerprint, response, expires_at INTO v_rec
	  FROM bench.keys WHERE owner = v_owner AND key = p_key;
	IF FOUND THEN
		IF v_rec.expires_at > now() THEN
			IF v_rec.fingerprint <> v_fp THEN
				RAISE EXCEPTION 'idempotency key "%" was already used for a different request', p_key
					USING ERRCODE = 'ID422';
			END IF;
			RETURN v_rec.response;
		END IF;
		DELETE FROM bench.keys WHERE owner = v_owner AND key = p_key;
	END IF;

	EXECUTE format('WITH r AS (%s) SELECT count(*), coalesce(jsonb_agg(to_jsonb(r)), ''[]'') FROM r',
				   p_sql)
	   INTO v_count, v_rows
	  USING p_arg1, p_arg2;
	v_response := jsonb_build_object('rows', v_rows,
									 'command', upper(split_part(btrim(p_sql), ' ', 1)),
									 'rowcount', v_count);

	INSERT INTO bench.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
	VALUES (p_key, v_owner, v_fp, v_response, now(), now() + interval '1 day', 2);
	INSERT INTO bench.outbox (event_id, key, owner, topic, payload, created_at,
							  state, attempts, next_attempt_at)
	VALUES (gen_random_uuid(), p_key, v_owner, 'payments', v_response, now(),
			'pending', 0, now());
	RETURN v_response;
END
$$;
ALTER FUNCTION bench.plpgsql_execute(text, text, text, numeric) OWNER TO bench;

--
-- Reset to the state every run starts from: no payments, no outbox events,
-- and exactly the seeded key records in both catalogs.
--
CREATE FUNCTION bench.reset() RETURNS void
LANGUAGE sql
AS $$
	TRUNCATE bench.payments, bench.outbox, bench.keys, idem.outbox, idem.keys,
		idem.runs, idem.run_attempts, idem.run_signals;
	INSERT INTO idem.keys SELECT * FROM bench.idem_seed;
	INSERT INTO bench.keys SELECT * FROM bench.plpgsql_seed;
$$;

--
-- Bounded memory: run idem_execute() on distinct SQL texts, one transaction
-- per call (a transaction holds every key lock it takes until it ends).
--
CREATE PROCEDURE bench.distinct_statements(p_prefix text, p_from int, p_to int)
LANGUAGE plpgsql
AS $$
BEGIN
	FOR i IN p_from .. p_to LOOP
		PERFORM idem_execute(p_prefix || i, 'SELECT ' || i || ' AS v');
		COMMIT;
	END LOOP;
END
$$;
ALTER PROCEDURE bench.distinct_statements(text, int, int) OWNER TO bench;

-- The same with statements kb kilobytes long (a string constant), which the
-- cache must bound by its bytes (idem.statement_cache_memory), not only by
-- its number of entries.
CREATE PROCEDURE bench.large_statements(p_prefix text, p_from int, p_to int, kb int)
LANGUAGE plpgsql
AS $$
DECLARE
	pad text := repeat('x', kb * 1024);
BEGIN
	FOR i IN p_from .. p_to LOOP
		PERFORM idem_execute(p_prefix || i,
							 'SELECT length(''' || pad || ''') AS n, ' || i || ' AS v');
		COMMIT;
	END LOOP;
END
$$;
ALTER PROCEDURE bench.large_statements(text, int, int, int) OWNER TO bench;

-- This backend's memory, for the bounded-memory measurement (superuser).
-- A context's parent is its column parent up to PostgreSQL 17 and, from 18
-- (which dropped that column), the context whose path ends with the
-- next-to-last element of its path (17 added path); read through jsonb so
-- that the body is valid on every major.
CREATE FUNCTION bench.memory_usage(OUT backend_total_bytes bigint,
								   OUT idem_cache_bytes bigint,
								   OUT idem_cached_statements bigint,
								   OUT kept_plans bigint,
								   OUT rss_anon_kb bigint)
LANGUAGE sql
AS $$
	WITH m AS (SELECT c.*, to_jsonb(c) AS j FROM pg_backend_memory_contexts c),
	n AS (SELECT m.*, coalesce(m.j ->> 'parent', p.name) AS parent_name
			FROM m LEFT JOIN m p ON m.j ->> 'parent' IS NULL
								AND (p.j -> 'path' -> -1) = (m.j -> 'path' -> -2))
	SELECT sum(total_bytes)::bigint,
		   (sum(total_bytes) FILTER (WHERE name = 'idem statement cache'
										OR parent_name = 'idem statement cache'))::bigint,
		   count(*) FILTER (WHERE name = 'idem statement'),
		   count(*) FILTER (WHERE name = 'CachedPlanSource' AND ident LIKE 'SELECT % AS v'),
		   (SELECT substring(pg_read_file('/proc/' || pg_backend_pid() || '/status')
							 FROM 'RssAnon:\s+(\d+)')::bigint)
	  FROM n
$$;
