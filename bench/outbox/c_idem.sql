-- consumer, idem: claim 10 events under a 30 s lease (one transaction),
-- then acknowledge each with its lease token (a second transaction)
SELECT coalesce(array_agg(event_id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS toks
  FROM idem_outbox_claim('payments', 10, '30 s') \gset
SELECT count(idem_outbox_ack(e, t)) FROM unnest(:ids::uuid[], :toks::uuid[]) AS u(e, t);
