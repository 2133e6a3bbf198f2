-- consumer, pgmq: read one message, then delete it
SELECT msg_id AS id FROM pgmq.read('payments', 30, 1) \gset
SELECT pgmq.delete('payments', :id::bigint);
