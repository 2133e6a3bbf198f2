-- 8. replay call shape (a diagnostic, not one of the issue's workloads): one
-- SELECT with the same four arguments as an idem replay, passed to a
-- VARIADIC "any" function (concat), returning the same jsonb response from a
-- constant.  What any replay through this call costs before doing any work:
-- the floor under workload 5, between it and the bare round trip of 0.
\set n random(1, :seeds)
SELECT CASE WHEN concat('seed-' || :n,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	'inv-' || :n, :n::numeric) IS NOT NULL
	THEN '{"rows": [{"id": 1, "amount": 1.00, "invoice": "inv-1"}], "command": "INSERT", "rowcount": 1}'::jsonb
END;
