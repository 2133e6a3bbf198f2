--
-- Outbox benchmark schema: idem's outbox with the topic "payments", and the
-- hand-written queue it is compared with: a table defined exactly like
-- idem.outbox (LIKE ... INCLUDING ALL: the same columns, state check, due
-- index and delivered index), so both designs pay for the same rows.
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
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]) TO bench;
CREATE SCHEMA bench AUTHORIZATION bench;
CREATE TABLE bench.payments (
	id			bigserial PRIMARY KEY,
	invoice		text NOT NULL,
	amount		numeric(12,2) NOT NULL,
	paid_at		timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bench.keys (LIKE idem.keys INCLUDING ALL);
CREATE TABLE bench.queue (LIKE idem.outbox INCLUDING ALL);
ALTER TABLE bench.payments OWNER TO bench;
ALTER TABLE bench.keys OWNER TO bench;
ALTER TABLE bench.queue OWNER TO bench;

-- n pending events due in creation order, written straight into a table
-- shaped like idem.outbox
CREATE FUNCTION bench.backlog_sql(tab text, n bigint) RETURNS text
LANGUAGE sql AS $f$
SELECT format($$
INSERT INTO %s (event_id, key, owner, topic, payload, created_at, state,
				attempts, next_attempt_at)
SELECT gen_random_uuid(), 'pre-' || i, 'bench'::regrole, 'payments',
	   jsonb_build_object('rows', jsonb_build_array(jsonb_build_object('id', i,
			'invoice', 'inv-' || i, 'amount', 1.00)), 'command', 'INSERT', 'rowcount', 1),
	   t, 'pending', 0, t
  FROM generate_series(1, %s) i,
	   LATERAL (SELECT now() - interval '1 hour' + i * interval '1 microsecond') AS x(t)
$$, tab, n)
$f$;
