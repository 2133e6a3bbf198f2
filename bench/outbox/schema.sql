--
-- Outbox benchmark schema (issue 24): idem's outbox with the topic
-- "payments", and the two designs a user would pick instead:
--
--   bench.q   the lean queue a user writes by hand: a bigint identity, the
--             topic, the payload, a due time, an attempt count and a lease
--             token (fencing), one index on (topic, due); the claim moves
--             the due time to the lease end, the ack deletes.
--   pgmq      pgmq 1.5.1's queue "payments" (read with a visibility
--             timeout, delete), built from ../../shared/vendor by run.sh.
--
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS bench CASCADE;
DROP EXTENSION IF EXISTS idem CASCADE;
DROP EXTENSION IF EXISTS pgmq CASCADE;
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
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]),
	idem_outbox_purge(integer) TO bench;

CREATE EXTENSION pgmq;
SELECT pgmq.create('payments');
GRANT USAGE ON SCHEMA pgmq TO bench;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgmq TO bench;
GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgmq TO bench;

CREATE SCHEMA bench AUTHORIZATION bench;
CREATE TABLE bench.payments (
	id			bigserial PRIMARY KEY,
	invoice		text NOT NULL,
	amount		numeric(12,2) NOT NULL,
	paid_at		timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bench.q (
	id			bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	topic		text NOT NULL,
	payload		jsonb NOT NULL,
	due			timestamptz NOT NULL DEFAULT now(),
	attempts	int NOT NULL DEFAULT 0,
	lease_token uuid
);
CREATE INDEX ON bench.q (topic, due);
ALTER TABLE bench.payments OWNER TO bench;
ALTER TABLE bench.q OWNER TO bench;

-- The payload every design carries: what idem_execute() records for the
-- producer's INSERT.
CREATE FUNCTION bench.payload(i bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
SELECT jsonb_build_object('rows', jsonb_build_array(jsonb_build_object('id', i,
		'invoice', 'inv-' || i, 'amount', 1.00)), 'command', 'INSERT', 'rowcount', 1)
$$;

-- Top a design's queue up to n pending events, due in creation order in
-- the past, written straight into its table (the same rows a producer
-- writes, without the producer's cost).
CREATE FUNCTION bench.top_up(design text, n bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	have bigint;
BEGIN
	IF design = 'idem' THEN
		SELECT count(*) INTO have FROM idem.outbox WHERE state IN ('pending', 'leased');
		INSERT INTO idem.outbox (event_id, key, owner, topic, payload, created_at,
								 state, attempts, next_attempt_at)
		SELECT gen_random_uuid(), 'pre-' || i, 'bench'::regrole, 'payments',
			   bench.payload(i), t, 'pending', 0, t
		  FROM generate_series(1, greatest(n - have, 0)) i,
			   LATERAL (SELECT now() - interval '1 hour' + i * interval '1 microsecond') AS x(t);
	ELSIF design = 'lean' THEN
		SELECT count(*) INTO have FROM bench.q;
		INSERT INTO bench.q (topic, payload, due)
		SELECT 'payments', bench.payload(i),
			   now() - interval '1 hour' + i * interval '1 microsecond'
		  FROM generate_series(1, greatest(n - have, 0)) i;
	ELSIF design = 'pgmq' THEN
		SELECT count(*) INTO have FROM pgmq.q_payments;
		INSERT INTO pgmq.q_payments (vt, message)
		SELECT now() - interval '1 hour' + i * interval '1 microsecond', bench.payload(i)
		  FROM generate_series(1, greatest(n - have, 0)) i;
	ELSE
		RAISE 'unknown design %', design;
	END IF;
	RETURN greatest(n - have, 0);
END
$$;
