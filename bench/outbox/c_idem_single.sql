-- consumer, idem: claim one event under a 30 s lease, then acknowledge it
-- (the single-event ack)
SELECT event_id AS id, lease_token AS tok
  FROM idem_outbox_claim('payments', 1, '30 s') \gset
SELECT idem_outbox_ack(:id, :tok);
