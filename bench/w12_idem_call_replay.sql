-- 12. idem_call replay: workload 11's call shape on the keys workload 5
-- replays (seeded with typed arguments; the text array is typed from the
-- statement, so it is the same request)
\set n random(1, :seeds)
SELECT response FROM idem_call('seed-' || :n,
	'INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	ARRAY['inv-' || :n, :n::text], outbox_topic => 'payments');
