-- consumer, idem: claim 10 events under a 30 s lease (one transaction),
-- then acknowledge the batch in one call (a second transaction)
SELECT coalesce(array_agg(event_id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS toks
  FROM idem_outbox_claim('payments', 10, '30 s') \gset
SELECT idem_outbox_ack_batch(:ids::uuid[], :toks::uuid[]);
