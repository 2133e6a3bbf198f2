--
-- citus: without Citus, idem's Citus function refuses with IDC01 and
-- changes nothing; idem_execute() works as ever (test/citus/ runs the rest
-- on a Citus cluster: scripts/test-citus.sh)
--
CREATE EXTENSION IF NOT EXISTS idem;
CREATE TABLE citus_payments (tenant_id bigint, amount int);
SELECT idem_citus_colocate('citus_payments');
\echo :LAST_ERROR_SQLSTATE
SELECT to_regclass('idem.citus_keys') AS citus_keys,
       to_regproc('idem_citus_call') AS citus_call;
-- only an administrator declares the colocation
SELECT has_function_privilege('public', 'idem_citus_colocate(regclass)', 'EXECUTE');
SELECT idem_citus_colocate(NULL);
SELECT replayed FROM idem_execute_ex('citus-absent',
	'INSERT INTO citus_payments VALUES (1, 2)');
SELECT count(*) FROM citus_payments;
-- the purge of tenant records has nothing to purge before colocation, and
-- is an administrator's
SELECT idem_citus_purge() AS purged;
SELECT has_function_privilege('public', 'idem_citus_purge()', 'EXECUTE');
DROP TABLE citus_payments;
