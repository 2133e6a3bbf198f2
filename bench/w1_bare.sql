-- 1. bare: the business INSERT alone, the physical floor of the work
\set a random(1, 1000000)
INSERT INTO bench.payments (invoice, amount) VALUES ('inv-' || :a, :a)
RETURNING id, invoice, amount;
