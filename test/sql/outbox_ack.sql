--
-- outbox_ack: what an acknowledgement leaves behind (issue 24).  By default
-- nothing: the acknowledged event is deleted, so a second ack finds no
-- event (IDE04).  With idem.outbox_keep_delivered (superuser only) it stays
-- as delivered until the purge.  The fence holds either way, and a batch is
-- all or nothing either way.  idem.outbox_notify is off by default.
--
CREATE ROLE regress_ack_app;
CREATE ROLE regress_ack_consumer;
CREATE ROLE regress_ack_other;
SELECT idem_outbox_create_topic('acks', '{regress_ack_app}', '{regress_ack_consumer}');
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]),
	idem_outbox_fail(uuid, uuid, text, interval)
	TO regress_ack_consumer, regress_ack_other;
CREATE TABLE ack_claimed (event_id uuid, token uuid, key text);
GRANT ALL ON ack_claimed TO PUBLIC;
CREATE VIEW ack_digest AS
SELECT count(*) AS events,
	   md5(coalesce(string_agg(o::text, ',' ORDER BY event_id), '')) AS digest
  FROM idem.outbox o;

SELECT name, setting, context FROM pg_settings
 WHERE name IN ('idem.outbox_keep_delivered', 'idem.outbox_notify') ORDER BY name;

-- eight events
SET ROLE regress_ack_app;
SET idem.outbox_topic = 'acks';
SELECT count(idem_execute('ack:' || i, 'SELECT $1::int AS i', i))
  FROM generate_series(1, 8) i;
RESET idem.outbox_topic;
RESET ROLE;

SET ROLE regress_ack_consumer;
INSERT INTO ack_claimed
SELECT event_id, lease_token, key FROM idem_outbox_claim('acks', 8, '30 s');
RESET ROLE;
SELECT count(*) AS claimed FROM ack_claimed;

--
-- the default: an ack deletes the event
--
SET ROLE regress_ack_consumer;
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:1';
RESET ROLE;
SELECT count(*) AS left_of_ack_1 FROM idem.outbox WHERE key = 'ack:1';
-- a second ack, with its token or another: the event is gone (IDE04)
SET ROLE regress_ack_consumer;
\set VERBOSITY sqlstate
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:1';
SELECT idem_outbox_ack(event_id, gen_random_uuid()) FROM ack_claimed WHERE key = 'ack:1';
SELECT idem_outbox_fail(event_id, token, 'late') FROM ack_claimed WHERE key = 'ack:1';
\set VERBOSITY default
RESET ROLE;

-- fenced as before: a forged token, or a role that may not consume the
-- topic, deletes nothing
SELECT * FROM ack_digest \gset before_
SET ROLE regress_ack_consumer;
\set VERBOSITY sqlstate
SELECT idem_outbox_ack(event_id, gen_random_uuid()) FROM ack_claimed WHERE key = 'ack:2';
SELECT idem_outbox_ack_batch(array_agg(event_id ORDER BY key),
	   array_agg(CASE WHEN key = 'ack:4' THEN gen_random_uuid() ELSE token END ORDER BY key))
  FROM ack_claimed WHERE key IN ('ack:2', 'ack:3', 'ack:4');
-- arrays of different lengths (one id, two tokens)
\set VERBOSITY default
SELECT idem_outbox_ack_batch(ARRAY[event_id], ARRAY[token, token])
  FROM ack_claimed WHERE key = 'ack:2';
\set VERBOSITY sqlstate
-- an event twice in one batch
SELECT idem_outbox_ack_batch(ARRAY[event_id, event_id], ARRAY[token, token])
  FROM ack_claimed WHERE key = 'ack:2';
-- a batch with an event already acknowledged (and deleted)
SELECT idem_outbox_ack_batch(array_agg(event_id ORDER BY key), array_agg(token ORDER BY key))
  FROM ack_claimed WHERE key IN ('ack:1', 'ack:2');
SET ROLE regress_ack_other;
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:2';
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token))
  FROM ack_claimed WHERE key IN ('ack:2', 'ack:3');
\set VERBOSITY default
RESET ROLE;
SELECT (SELECT digest FROM ack_digest) = :'before_digest' AS outbox_unchanged,
	   (SELECT events FROM ack_digest) = :before_events AS same_count;

-- a batch ack deletes every event of the batch
SET ROLE regress_ack_consumer;
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token)) AS acked
  FROM ack_claimed WHERE key IN ('ack:2', 'ack:3', 'ack:4');
RESET ROLE;
SELECT count(*) AS left_of_batch FROM idem.outbox WHERE key IN ('ack:2', 'ack:3', 'ack:4');
-- nothing delivered is left for the purge
SET idem.outbox_retention = 0;
SELECT idem_outbox_purge() AS purged;
RESET idem.outbox_retention;

--
-- idem.outbox_keep_delivered: the event stays, delivered, until the purge
--
-- a superuser's setting: a consumer may not choose what happens to rows
SET ROLE regress_ack_consumer;
\set VERBOSITY sqlstate
SET idem.outbox_keep_delivered = on;
\set VERBOSITY default
RESET ROLE;
SET idem.outbox_keep_delivered = on;
SET ROLE regress_ack_consumer;
SHOW idem.outbox_keep_delivered;
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:5';
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token)) AS acked
  FROM ack_claimed WHERE key IN ('ack:6', 'ack:7');
\set VERBOSITY sqlstate
-- a second ack now says the event was delivered (ID410)
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:5';
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(token))
  FROM ack_claimed WHERE key IN ('ack:6', 'ack:8');
\set VERBOSITY default
RESET ROLE;
SELECT key, state, delivered_at IS NOT NULL AS delivered_at_set, lease_token IS NOT NULL AS token_kept
  FROM idem.outbox WHERE topic = 'acks' ORDER BY key;
SET idem.outbox_retention = 0;
SELECT idem_outbox_purge() AS purged;
RESET idem.outbox_retention;
RESET idem.outbox_keep_delivered;
-- the setting off again: the last event's ack deletes it
SET ROLE regress_ack_consumer;
SELECT idem_outbox_ack(event_id, token) FROM ack_claimed WHERE key = 'ack:8';
RESET ROLE;
SELECT count(*) AS acks_left FROM idem.outbox WHERE topic = 'acks';

-- one transaction that writes, claims and acknowledges, at every
-- isolation level: the claim sees the event the transaction wrote, the
-- ack the lease the transaction took, a second ack of it IDE04
SET idem.outbox_topic = 'acks';
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT count(*) FROM idem.outbox WHERE topic = 'acks';	-- a snapshot before the write
SELECT idem_execute('ack:rc', 'SELECT 1 AS i') ->> 'rowcount' AS written;
CREATE TEMP TABLE ack_txn_claimed AS
SELECT event_id, lease_token FROM idem_outbox_claim('acks', 10, '30 s');
SELECT sum(idem_outbox_ack_batch(ARRAY[event_id], ARRAY[lease_token])) AS acked FROM ack_txn_claimed;
SELECT count(*) AS left_after FROM idem.outbox WHERE key = 'ack:rc';
DROP TABLE ack_txn_claimed;
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) FROM idem.outbox WHERE topic = 'acks';	-- the snapshot, before the write
SELECT idem_execute('ack:rr', 'SELECT 1 AS i') ->> 'rowcount' AS written;
CREATE TEMP TABLE ack_txn_claimed AS
SELECT event_id, lease_token FROM idem_outbox_claim('acks', 10, '30 s');
SELECT count(*) AS claimed FROM ack_txn_claimed;
SELECT idem_outbox_ack(event_id, lease_token) FROM ack_txn_claimed;
SELECT count(*) AS left_after FROM idem.outbox WHERE key = 'ack:rr';
\set VERBOSITY sqlstate
SAVEPOINT again;
SELECT idem_outbox_ack(event_id, lease_token) FROM ack_txn_claimed;
ROLLBACK TO again;
\set VERBOSITY default
DROP TABLE ack_txn_claimed;
COMMIT;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT count(*) FROM idem.outbox WHERE topic = 'acks';
SELECT idem_execute('ack:sr', 'SELECT 1 AS i') ->> 'rowcount' AS written;
SELECT count(*) AS claimed_and_acked
  FROM idem_outbox_claim('acks', 10, '30 s') c, idem_outbox_ack(c.event_id, c.lease_token);
SELECT count(*) AS left_after FROM idem.outbox WHERE key = 'ack:sr';
COMMIT;
RESET idem.outbox_topic;

DROP VIEW ack_digest;
DROP TABLE ack_claimed;
REVOKE EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]),
	idem_outbox_fail(uuid, uuid, text, interval)
	FROM regress_ack_consumer, regress_ack_other;
DELETE FROM idem.outbox_topics WHERE topic = 'acks';
DROP ROLE regress_ack_app, regress_ack_consumer, regress_ack_other;
