-- One claim of one due run (leased for an hour, so it stays out of the
-- way): the claim's latency against the number of runs in idem.runs.
SELECT run_id FROM idem_run_claim('lat', 1, '1 h', 'w');
