-- consumer, pgmq: read 10 messages with a 30 s visibility timeout, then
-- delete them in one call
SELECT coalesce(array_agg(msg_id), '{}') AS ids
  FROM pgmq.read('payments', 30, 10) \gset
SELECT count(*) FROM pgmq.delete('payments', :ids::bigint[]);
