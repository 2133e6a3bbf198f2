--
-- advice: idem_retry_advice(sqlstate) classifies every SQLSTATE, and every
-- error idem raises ends its hint with the same advice
--
SELECT s AS sqlstate, idem_retry_advice(s) AS advice
  FROM unnest(ARRAY[
       '40001', '40P01', '40003', '40000', '08006', '08000', '57P01', '57P02', '25P03', '57P05',
       'ID409', '55P03', '57014', '57P03', '53100', '53200', '53300',
       'ID422', 'ID400', 'ID404', 'ID423', 'ID425', 'ID508',
       '23505', '23502', '22P02', '42601', '42501', 'P0001', '54000', '55000',
       '25006', 'XX000', '58030', '72000', 'HV00N']) AS s;

-- bad input
SELECT idem_retry_advice(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_retry_advice('4000');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_retry_advice('40p01');
\echo :LAST_ERROR_SQLSTATE

-- errors idem raises carry the advice for their SQLSTATE in the hint
CREATE TABLE advice_seen (call text, sqlstate text, hint_advice text, advice text);
CREATE FUNCTION try(label text, q text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
	st text;
	h text;
BEGIN
	EXECUTE q;
	INSERT INTO advice_seen VALUES (label, NULL, NULL, NULL);
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, h = PG_EXCEPTION_HINT;
	INSERT INTO advice_seen
	VALUES (label, st, substring(h FROM 'Retry advice: ([a-z_]+)\.$'), idem_retry_advice(st));
END
$$;
SELECT idem_execute('adv:1', 'SELECT 1 AS one');
SELECT status FROM idem_run_begin('adv-run', steps => ARRAY['a', 'b']);
SELECT try('mismatch', $$SELECT idem_execute('adv:1', 'SELECT 2 AS two')$$);
SELECT try('null key', $$SELECT idem_execute(NULL, 'SELECT 1')$$);
SELECT try('long key', $$SELECT idem_execute(repeat('k', 300), 'SELECT 1')$$);
SELECT try('two statements', $$SELECT idem_execute('adv:2', 'SELECT 1; SELECT 2')$$);
SELECT try('nested', $$SELECT idem_execute('adv:3', 'SELECT idem_execute(''adv:3'', ''SELECT 1'')')$$);
SELECT try('no run', $$SELECT idem_step('adv-none', 'a', 'SELECT 1')$$);
SELECT try('sequence', $$SELECT idem_step('adv-run', 'b', 'SELECT 1')$$);
SELECT try('undeclared', $$SELECT idem_step('adv-run', 'c', 'SELECT 1')$$);
SELECT try('bad part', $$SELECT idem_key('a', NULL)$$);
SELECT try('bad sqlstate', $$SELECT idem_retry_advice('x')$$);
SELECT try('business error', $$SELECT idem_execute('adv:4', 'SELECT 1 / 0')$$);
SELECT call, sqlstate, hint_advice, advice,
       hint_advice IS NOT DISTINCT FROM advice OR sqlstate = '22012' AS agrees
  FROM advice_seen ORDER BY call;
DROP FUNCTION try(text, text);
DROP TABLE advice_seen;
DELETE FROM idem.keys;
DELETE FROM idem.runs;
