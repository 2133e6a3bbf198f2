--
-- tokens: a statement's fingerprint is the same on every PostgreSQL major
--
-- The core scanner's token numbers differ between majors (keywords added
-- in 16 and 17 shift the ones after them).  idem hashes every token in the
-- numbering idem 1.1 recorded on PostgreSQL 15, so a record written on 15
-- and read on 17 or 18 after pg_upgrade matches a genuine retry.  The hex
-- constants below are the fingerprints idem 1.1 wrote on PostgreSQL 15;
-- the same expected output holds on every major.
--
-- Every setting that enters the fingerprint is fixed here, so the digests
-- do not depend on the cluster's locale or time zone.
SET TimeZone = 'UTC';
SET DateStyle = 'ISO, MDY';
SET IntervalStyle = 'postgres';
SET extra_float_digits = 1;
SET bytea_output = 'hex';
SET xmloption = 'content';
SET xmlbinary = 'base64';
SET standard_conforming_strings = on;
SET array_nulls = on;
SET transform_null_equals = off;
SET timezone_abbreviations = 'Default';
SET lc_monetary = 'C';
SET lc_numeric = 'C';
SET lc_time = 'C';
SET default_text_search_config = 'pg_catalog.simple';
SET search_path = public;

CREATE TABLE tok_t (a int, b text);

-- keywords on both sides of those 16 and 17 added (JSON_ARRAY, ...),
-- every token that carries a value, and the multi-character operators
SELECT idem_execute('tok:insert',
       'INSERT INTO tok_t (a, b) VALUES ($1, $2) RETURNING a, b', 1, 'one');
SELECT idem_execute('tok:values',
       'SELECT $1::text || U&''\0061'' AS u, E''x\ty'' AS e, b''101'' AS b,'
       ' x''1f'' AS x, 1.5 AS f, 2 AS i, U&"a" AS "Q"'
       ' FROM (SELECT 1 AS a) s WHERE 1 <> 2 AND 3 != 4 AND 5 >= 4 AND 4 <= 5'
       ' AND true IS NOT NULL ORDER BY 1 NULLS LAST LIMIT 1', 'v');
SELECT idem_execute('tok:named',
       'SELECT make_interval(days => $1) AS d, make_interval(hours := 2) AS h', 1);
SELECT idem_execute('tok:late',
       'WITH w AS (SELECT 1 AS v) SELECT v FROM w WHERE v BETWEEN 0 AND 2'
       ' GROUP BY v HAVING true OR false WINDOW x AS (ORDER BY v) ORDER BY v');
-- json became a keyword in 16: on 15 the word is an identifier
SELECT idem_execute('tok:json', 'SELECT ''{}''::json::text AS j');

SELECT key, encode(fingerprint, 'hex') = CASE key
         WHEN 'tok:insert' THEN '81eedadc12c2ba8f0e21309a4e8ed7f5fe38eb15018f8b64988b5da6d9b237fd'
         WHEN 'tok:values' THEN 'f7444447665127e4b8a42f055185c8ea50046738574cdbf0f8e8110c9d663f9f'
         WHEN 'tok:named'  THEN 'd0eefb36fbd0b37c2a8d89b1faa1bdeca20d7e6b26ed85bf0798cb3739c86c2c'
         WHEN 'tok:late'   THEN 'a5a5edf64259d25696915b4545e6633c8c91185b2b71f2e4e62f4d75bb3aabf6'
       END AS same_as_on_15
  FROM idem.keys WHERE key LIKE 'tok:%' AND key <> 'tok:json' ORDER BY key;

-- A keyword PostgreSQL 15 did not have is a different token from the
-- identifier 15 read: a record 15 wrote is refused (ID422), never replayed.
SELECT (encode(fingerprint, 'hex') = '7aacb961ebd594ff3c28690053076e420b03451942c95a5af65f784b2ea9dc42')
       = (current_setting('server_version_num')::int < 160000) AS as_documented
  FROM idem.keys WHERE key = 'tok:json';

-- a genuine retry replays
SELECT (idem_execute_ex('tok:insert',
       'insert into tok_t(a,b) values ($1,$2) returning a,b', 1, 'one')).replayed;
SELECT count(*) FROM tok_t;

-- a session whose first call runs with standard_conforming_strings off:
-- the numbering is built at the first call, from samples that include
-- U&'a', which the scanner refuses under that setting; the call must not
-- fail with it, and its retry replays
\c
SET standard_conforming_strings = off;
SELECT idem_execute('tok:scs-off', 'SELECT $1::int + 1 AS two', 1);
SELECT (idem_execute_ex('tok:scs-off', 'SELECT $1::int + 1 AS two', 1)).replayed;
SELECT response FROM idem_call('tok:scs-off-call', 'SELECT 1 AS one');
RESET standard_conforming_strings;
