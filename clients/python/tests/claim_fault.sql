-- idem_run_claim shadowed, for the sessions whose search_path puts claimfault
-- first: the claims of the worker named in claimfault.plan raise its
-- SQLSTATE (a server's error, as a driver reads any) the first `times`
-- times, then claim.  The tests of claim errors (Python and Node).
CREATE SCHEMA IF NOT EXISTS claimfault;
CREATE TABLE IF NOT EXISTS claimfault.plan (worker text PRIMARY KEY, sqlstate text NOT NULL,
    times int NOT NULL, calls regclass NOT NULL);
CREATE OR REPLACE FUNCTION claimfault.fault(w text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE p claimfault.plan;
BEGIN
    SELECT * INTO p FROM claimfault.plan WHERE worker = w;
    -- a sequence counts the calls: the raise rolls back everything else
    IF FOUND AND nextval(p.calls) <= p.times THEN
        RAISE EXCEPTION 'claim fault %', p.sqlstate USING ERRCODE = p.sqlstate;
    END IF;
END $$;
CREATE OR REPLACE FUNCTION claimfault.idem_run_claim(queue text, max_runs integer DEFAULT 1,
    lease interval DEFAULT '30 s', worker text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS TABLE (run_id text, owner regrole, input jsonb, steps text[], next_step text,
    attempt integer, lease_token uuid, lease_until timestamptz, results jsonb,
    started_step text, started_attempts integer)
LANGUAGE sql AS $$
    SELECT claimfault.fault($4);
    SELECT * FROM public.idem_run_claim($1, $2, $3, $4, $5);
$$;
-- the outbox's claim likewise, for the consumer named in claimfault.plan
-- (its first argument renamed: a parameter may not share a result column's name)
CREATE OR REPLACE FUNCTION claimfault.idem_outbox_claim(topic_ text, max_events integer DEFAULT 10,
    lease interval DEFAULT '30 s', consumer text DEFAULT NULL, wait interval DEFAULT NULL)
RETURNS TABLE (event_id uuid, key text, owner regrole, topic text, payload jsonb, run_id text,
    step text, attempt integer, lease_token uuid, created_at timestamptz, lease_until timestamptz)
LANGUAGE sql AS $$
    SELECT claimfault.fault($4);
    SELECT * FROM public.idem_outbox_claim($1, $2, $3, $4, $5);
$$;
