--
-- outbox: an event per executed call, written with the key record
--
CREATE TABLE shipments (id serial PRIMARY KEY, parcel text NOT NULL);
-- topics are registered (the superuser may publish to every registered one)
SELECT idem_outbox_create_topic('shipping');
SELECT idem_outbox_create_topic('returns');

-- without a topic no event is written
SELECT idem_execute('out:0', 'INSERT INTO shipments(parcel) VALUES ($1) RETURNING parcel', 'p0') ->> 'rowcount';
SELECT count(*) AS events FROM idem.outbox WHERE key = 'out:0';

SET idem.outbox_topic = 'shipping';
SELECT idem_execute('out:1', 'INSERT INTO shipments(parcel) VALUES ($1) RETURNING parcel', 'p1');

-- the event carries the response as its payload
SELECT key, topic, payload,
       payload = (SELECT response FROM idem.keys WHERE key = 'out:1') AS payload_is_response,
       event_id::text ~ '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' AS uuid_v4,
       created_at = (SELECT created_at FROM idem.keys WHERE key = 'out:1') AS same_time
  FROM idem.outbox WHERE key = 'out:1';

-- a replay writes no second event
SELECT (idem_execute_ex('out:1', 'INSERT INTO shipments(parcel) VALUES ($1) RETURNING parcel', 'p1')).replayed;
SELECT count(*) AS events FROM idem.outbox WHERE key = 'out:1';

-- a rolled-back call leaves no event; a failing one neither
BEGIN;
SELECT idem_execute('out:2', 'INSERT INTO shipments(parcel) VALUES ($1)', 'p2') ->> 'rowcount';
SELECT count(*) AS events_inside FROM idem.outbox WHERE key = 'out:2';
ROLLBACK;
SELECT idem_execute('out:3', 'INSERT INTO shipments(parcel) VALUES (NULL)');
SELECT count(*) AS events FROM idem.outbox WHERE key IN ('out:2', 'out:3');

-- the topic is per call too: SET LOCAL
BEGIN;
SET LOCAL idem.outbox_topic = 'returns';
SELECT idem_execute('out:4', 'INSERT INTO shipments(parcel) VALUES ($1)', 'p4') ->> 'rowcount';
COMMIT;
SELECT key, topic FROM idem.outbox WHERE key LIKE 'out:%' ORDER BY key;

-- one event per executed call: events = key records = business rows
SELECT (SELECT count(*) FROM idem.outbox WHERE key LIKE 'out:%') AS events,
       (SELECT count(*) FROM idem.keys WHERE key LIKE 'out:%'
           AND key <> 'out:0') AS keys_with_topic,
       (SELECT count(*) FROM shipments WHERE parcel <> 'p0') AS shipments;

RESET idem.outbox_topic;
DROP TABLE shipments;
