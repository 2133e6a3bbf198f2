--
-- atomicity: the business write, the key record and the outbox event
-- commit or roll back together, with the caller's transaction
--
CREATE TABLE orders (id serial PRIMARY KEY, sku text NOT NULL);
SELECT idem_outbox_create_topic('orders');
SET idem.outbox_topic = 'orders';

-- the caller rolls back: nothing is recorded, and the retry executes
BEGIN;
SELECT idem_execute('atom:1', 'INSERT INTO orders(sku) VALUES ($1) RETURNING sku', 'A');
ROLLBACK;
SELECT (SELECT count(*) FROM orders) AS orders,
       (SELECT count(*) FROM idem.keys WHERE key = 'atom:1') AS keys,
       (SELECT count(*) FROM idem.outbox WHERE key = 'atom:1') AS events;
SELECT replayed FROM idem_execute_ex('atom:1',
       'INSERT INTO orders(sku) VALUES ($1) RETURNING sku', 'A');
SELECT (SELECT count(*) FROM orders) AS orders,
       (SELECT count(*) FROM idem.keys WHERE key = 'atom:1') AS keys,
       (SELECT count(*) FROM idem.outbox WHERE key = 'atom:1') AS events;

-- the business statement fails: nothing is recorded, and the retry executes
SELECT idem_execute('atom:2', 'INSERT INTO orders(sku) VALUES ($1) RETURNING 1 / 0', 'B');
SELECT (SELECT count(*) FROM orders WHERE sku = 'B') AS orders,
       (SELECT count(*) FROM idem.keys WHERE key = 'atom:2') AS keys,
       (SELECT count(*) FROM idem.outbox WHERE key = 'atom:2') AS events;

-- a later statement of the caller's transaction fails: all of it goes
BEGIN;
SELECT idem_execute('atom:3', 'INSERT INTO orders(sku) VALUES ($1)', 'C') ->> 'rowcount';
SELECT 1 / 0;
COMMIT;
SELECT (SELECT count(*) FROM orders WHERE sku = 'C') AS orders,
       (SELECT count(*) FROM idem.keys WHERE key = 'atom:3') AS keys;

-- a rolled-back savepoint takes its key with it; a released one keeps it
BEGIN;
SAVEPOINT s1;
SELECT idem_execute('atom:4', 'INSERT INTO orders(sku) VALUES ($1)', 'D') ->> 'rowcount';
ROLLBACK TO SAVEPOINT s1;
SELECT replayed FROM idem_execute_ex('atom:4', 'INSERT INTO orders(sku) VALUES ($1)', 'D');
SAVEPOINT s2;
SELECT idem_execute('atom:5', 'INSERT INTO orders(sku) VALUES ($1)', 'E') ->> 'rowcount';
RELEASE SAVEPOINT s2;
SELECT replayed FROM idem_execute_ex('atom:5', 'INSERT INTO orders(sku) VALUES ($1)', 'E');
COMMIT;
SELECT sku, count(*) FROM orders WHERE sku IN ('D', 'E') GROUP BY sku ORDER BY sku;

-- no subtransaction: the business row and the key record carry the same
-- transaction id (a subtransaction would give the business row its own)
BEGIN;
SELECT idem_execute('atom:6', 'INSERT INTO orders(sku) VALUES ($1)', 'F') ->> 'rowcount';
SELECT (SELECT xmin FROM orders WHERE sku = 'F')
     = (SELECT xmin FROM idem.keys WHERE key = 'atom:6') AS same_xid,
       (SELECT xmin FROM idem.keys WHERE key = 'atom:6')::text::bigint
     = pg_current_xact_id()::text::bigint AS callers_xid;
COMMIT;

-- the key record is inserted once, at the end: never updated afterwards
SELECT count(*) AS keys_updated
  FROM idem.keys WHERE key LIKE 'atom:%' AND xmax <> 0;

RESET idem.outbox_topic;
DROP TABLE orders;
