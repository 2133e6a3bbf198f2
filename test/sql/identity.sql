--
-- identity: what is the same request (issue 8, part 3).  A different
-- request must never replay; a genuine retry must.
--
CREATE TABLE invoices (id serial PRIMARY KEY, due date, note text);
CREATE DOMAIN due_date AS date;

-- A domain used to be hashed by its text output, so under another
-- DateStyle a different date rendered the same and replayed January's
-- response.  DateStyle is now part of the request, and the value is hashed
-- as its base type's binary form.
SET DateStyle = 'SQL, MDY';
SELECT idem_execute('ds-1', 'INSERT INTO invoices(due) VALUES ($1) RETURNING due::text', '2024-01-02'::due_date);
SET DateStyle = 'SQL, DMY';
SELECT idem_execute('ds-1', 'INSERT INTO invoices(due) VALUES ($1) RETURNING due::text', '2024-02-01'::due_date);
\echo :LAST_ERROR_SQLSTATE
-- the February request did not run, and January's was not replayed to it
SELECT count(*) AS invoices FROM invoices;
-- the genuine retry, under the settings of the first call, replays
SET DateStyle = 'SQL, MDY';
SELECT replayed FROM idem_execute_ex('ds-1', 'INSERT INTO invoices(due) VALUES ($1) RETURNING due::text', '2024-01-02'::due_date);
RESET DateStyle;

-- A domain whose text output loses information: with extra_float_digits
-- at its minimum, 0.3 and 0.1 + 0.2 print alike.  extra_float_digits only
-- changes output, so it is no part of the request; the values differ.
CREATE DOMAIN amount AS float8;
SET extra_float_digits = -15;
SELECT 0.3::float8 AS a, (0.1::float8 + 0.2::float8) AS b;
SELECT idem_execute('dom-1', 'SELECT $1 AS v', 0.3::amount) ->> 'command';
SELECT idem_execute('dom-1', 'SELECT $1 AS v', (0.1::float8 + 0.2::float8)::amount);
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('dom-1', 'SELECT $1 AS v', 0.3::amount);
-- the same holds for arrays of a domain, element by element
SELECT idem_execute('dom-2', 'SELECT $1 AS v', ARRAY[0.3::amount]) ->> 'command';
SELECT idem_execute('dom-2', 'SELECT $1 AS v', ARRAY[(0.1::float8 + 0.2::float8)::amount]);
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('dom-2', 'SELECT $1 AS v', ARRAY[0.3::amount]);
RESET extra_float_digits;
-- a domain and its base type are different argument types
SELECT idem_execute('dom-1', 'SELECT $1 AS v', 0.3::float8);
\echo :LAST_ERROR_SQLSTATE

-- Records are hashed field by field with each field's type: ROW(1, 'a')
-- and ROW('1', 'a') print alike but are different requests.
SELECT idem_execute('r1', 'SELECT to_jsonb($1) AS j', ROW(1, 'a'));
SELECT idem_execute('r1', 'SELECT to_jsonb($1) AS j', ROW('1', 'a'));
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('r1', 'SELECT to_jsonb($1) AS j', ROW(1, 'a'));
-- a NULL field is not the string 'NULL' nor an empty string
SELECT idem_execute('r2', 'SELECT to_jsonb($1) AS j', ROW(NULL::text, 'a')) ->> 'command';
SELECT idem_execute('r2', 'SELECT to_jsonb($1) AS j', ROW(''::text, 'a'));
\echo :LAST_ERROR_SQLSTATE
-- named composites, nested, and arrays of them
CREATE TYPE order_line AS (sku text, qty int, price numeric);
SELECT idem_execute('r3', 'SELECT $1 AS lines',
       ARRAY[ROW('a', 1, 2.50)::order_line, ROW('b', 2, 1.00)::order_line]) ->> 'command';
SELECT replayed FROM idem_execute_ex('r3', 'SELECT $1 AS lines',
       ARRAY[ROW('a', 1, 2.50)::order_line, ROW('b', 2, 1.00)::order_line]);
SELECT idem_execute('r3', 'SELECT $1 AS lines',
       ARRAY[ROW('a', 1, 2.50)::order_line, ROW('b', 2, 1.0)::order_line]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('r3', 'SELECT $1 AS lines',
       ARRAY[ROW('a', 1, 2.50)::order_line]);
\echo :LAST_ERROR_SQLSTATE
-- array shape counts: {{1,2}} is not {1,2}, nor '[0:1]={1,2}'
SELECT idem_execute('a1', 'SELECT $1 AS a', ARRAY[1, 2]) ->> 'command';
SELECT idem_execute('a1', 'SELECT $1 AS a', ARRAY[[1, 2]]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('a1', 'SELECT $1 AS a', '[0:1]={1,2}'::int[]);
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('a1', 'SELECT $1 AS a', '{1,2}'::int[]);
-- enums by label; ranges by their binary form (canonical ranges are equal)
CREATE TYPE mood AS ENUM ('calm', 'angry');
SELECT idem_execute('e1', 'SELECT $1 AS m, $2 AS r', 'calm'::mood, int4range(1, 3)) ->> 'command';
SELECT replayed FROM idem_execute_ex('e1', 'SELECT $1 AS m, $2 AS r', 'calm'::mood, '[1,2]'::int4range);
SELECT idem_execute('e1', 'SELECT $1 AS m, $2 AS r', 'angry'::mood, int4range(1, 3));
\echo :LAST_ERROR_SQLSTATE

-- search_path changes what a statement's names mean: the same text under
-- another search_path is another request, never tenant_a's replay
CREATE SCHEMA tenant_a;
CREATE SCHEMA tenant_b;
CREATE TABLE tenant_a.acct (id int PRIMARY KEY, bal int);
CREATE TABLE tenant_b.acct (id int PRIMARY KEY, bal int);
INSERT INTO tenant_a.acct VALUES (1, 100);
INSERT INTO tenant_b.acct VALUES (1, 500);
SET search_path = tenant_a, public;
SELECT idem_execute('sp-1', 'UPDATE acct SET bal = bal - $1 WHERE id = 1 RETURNING bal', 10);
SET search_path = tenant_b, public;
SELECT idem_execute('sp-1', 'UPDATE acct SET bal = bal - $1 WHERE id = 1 RETURNING bal', 10);
\echo :LAST_ERROR_SQLSTATE
SELECT bal AS tenant_b_bal FROM tenant_b.acct;
-- a statement cached under one path is not reused under another
SELECT idem_execute('sp-2', 'UPDATE acct SET bal = bal - $1 WHERE id = 1 RETURNING bal', 10);
SET search_path = tenant_a, public;
SELECT replayed, response FROM idem_execute_ex('sp-1', 'UPDATE acct SET bal = bal - $1 WHERE id = 1 RETURNING bal', 10);
SELECT (SELECT bal FROM tenant_a.acct) AS a_bal, (SELECT bal FROM tenant_b.acct) AS b_bal;
-- the path counts by schema name, so creating a temporary table (which
-- puts this session's temporary schema on the path) changes nothing
CREATE TEMP TABLE scratch (x int);
SELECT replayed FROM idem_execute_ex('sp-1', 'UPDATE acct SET bal = bal - $1 WHERE id = 1 RETURNING bal', 10);
DROP TABLE scratch;
RESET search_path;

-- standard_conforming_strings changes the token stream itself: 'a\nb' is
-- four characters with it on and three with it off
SET escape_string_warning = off;
SET standard_conforming_strings = on;
SELECT idem_execute('scs-1', 'SELECT length(''a\nb'') AS n');
SET standard_conforming_strings = off;
SELECT idem_execute('scs-1', 'SELECT length(''a\nb'') AS n');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('scs-2', 'SELECT length(''a\nb'') AS n');
RESET standard_conforming_strings;
RESET escape_string_warning;

-- A literal's meaning can depend on a setting: '2026-01-01 12:00' as
-- timestamptz depends on TimeZone.  The plan that coerced it is cached per
-- setting, so the same call inserts the same instant in every backend, and
-- a retry under another TimeZone is another request.
CREATE TABLE events (k text PRIMARY KEY, at timestamptz);
SET TimeZone = 'UTC';
SELECT idem_execute('tz-a', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-a') ->> 'command';
SET TimeZone = 'Asia/Tokyo';
SELECT idem_execute('tz-b', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-b') ->> 'command';
SELECT idem_execute('tz-a', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-a');
\echo :LAST_ERROR_SQLSTATE
\c
SET TimeZone = 'Asia/Tokyo';
SELECT idem_execute('tz-c', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-c') ->> 'command';
SELECT k, at FROM events ORDER BY k;
SELECT count(DISTINCT at) AS tokyo_instants FROM events WHERE k IN ('tz-b', 'tz-c');
-- the zone counts by its name, whatever its case: another name of the same
-- zone is another request (doc/semantics.md)
SET TimeZone = 'asia/tokyo';
SELECT replayed FROM idem_execute_ex('tz-c', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-c');
SET TimeZone = 'UTC';
SELECT replayed FROM idem_execute_ex('tz-a', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-a');
SET TimeZone = 'Etc/UTC';
SELECT idem_execute('tz-a', 'INSERT INTO events VALUES ($1, ''2026-01-01 12:00'') RETURNING k', 'tz-a');
\echo :LAST_ERROR_SQLSTATE
RESET TimeZone;

-- Pass-by-value arguments are hashed by their typlen bytes, not the Datum
-- word: an oid above 2^31 is the same request spread, as VARIADIC ARRAY,
-- and read from a table; so is an int4 computed by hashtext()
SELECT idem_execute('se3', 'SELECT $1 AS v', 4000000000::oid) ->> 'command';
SELECT replayed FROM idem_execute_ex('se3', 'SELECT $1 AS v', VARIADIC ARRAY[4000000000::oid]);
CREATE TABLE oids (o oid, h int4);
INSERT INTO oids VALUES (4000000000, hashtext('idem'));
SELECT replayed FROM idem_execute_ex('se3', 'SELECT $1 AS v', (SELECT o FROM oids));
SELECT idem_execute('se4', 'SELECT $1 AS v', hashtext('idem')) ->> 'command';
SELECT h < 0 AS negative FROM oids;
SELECT replayed FROM idem_execute_ex('se4', 'SELECT $1 AS v', (SELECT h FROM oids));
SELECT replayed FROM idem_execute_ex('se4', 'SELECT $1 AS v', VARIADIC (SELECT array_agg(h) FROM oids));

-- More settings that change what text means, found by an adversarial
-- probe: timezone_abbreviations (IST is Israel or India), a text search
-- configuration, and output settings a statement can store by casting to
-- text.  Each was a false replay.
CREATE TABLE ev (id serial PRIMARY KEY, at timestamptz, note text);
SET TimeZone = 'UTC';
SET timezone_abbreviations = 'Default';
SELECT idem_execute('abbr', 'INSERT INTO ev(at) VALUES ($1::timestamptz) RETURNING at', '2026-01-01 12:00 IST');
SET timezone_abbreviations = 'India';
SELECT idem_execute('abbr', 'INSERT INTO ev(at) VALUES ($1::timestamptz) RETURNING at', '2026-01-01 12:00 IST');
\echo :LAST_ERROR_SQLSTATE
RESET timezone_abbreviations;
RESET TimeZone;
SET default_text_search_config = 'english';
SELECT idem_execute('ts', 'SELECT to_tsvector($1) AS v', 'running dogs');
SET default_text_search_config = 'simple';
SELECT idem_execute('ts', 'SELECT to_tsvector($1) AS v', 'running dogs');
\echo :LAST_ERROR_SQLSTATE
RESET default_text_search_config;
SET extra_float_digits = -14;
SELECT idem_execute('efd', 'INSERT INTO ev(note) VALUES ($1::text) RETURNING note', 3.14159265358979::float8);
SET extra_float_digits = 1;
SELECT idem_execute('efd', 'INSERT INTO ev(note) VALUES ($1::text) RETURNING note', 3.14159265358979::float8);
\echo :LAST_ERROR_SQLSTATE
RESET extra_float_digits;
SET bytea_output = 'escape';
SELECT idem_execute('bo', 'INSERT INTO ev(note) VALUES ($1::text) RETURNING note', '\x41ff'::bytea);
SET bytea_output = 'hex';
SELECT idem_execute('bo', 'INSERT INTO ev(note) VALUES ($1::text) RETURNING note', '\x41ff'::bytea);
\echo :LAST_ERROR_SQLSTATE
RESET bytea_output;
SELECT count(*) AS ev_rows FROM ev;

-- A renamed schema keeps its OID but not its name: the search path is
-- compared by name, in this backend and in a fresh one alike
CREATE SCHEMA sa;
CREATE TABLE sa.t (id int);
SET search_path = sa, public;
SELECT idem_execute('warm', 'SELECT 1 AS one') ->> 'command';
ALTER SCHEMA sa RENAME TO sc;
SET search_path = sc, public;
SELECT idem_execute('stale', 'INSERT INTO t VALUES ($1) RETURNING id', 1);
\c
SET search_path = sc, public;
SELECT replayed FROM idem_execute_ex('stale', 'INSERT INTO t VALUES ($1) RETURNING id', 1);
CREATE SCHEMA sa;
CREATE TABLE sa.t (id int);
SET search_path = sa, public;
SELECT idem_execute('stale', 'INSERT INTO t VALUES ($1) RETURNING id', 1);
\echo :LAST_ERROR_SQLSTATE
RESET search_path;
SELECT (SELECT count(*) FROM sa.t) AS sa_rows, (SELECT count(*) FROM sc.t) AS sc_rows;
DROP SCHEMA sa, sc CASCADE;

-- Ranges are hashed by their bounds, not by a send function whose text
-- follows client_encoding: a genuine retry under another client encoding
-- replays
CREATE TYPE trange AS RANGE (subtype = text);
SET client_encoding = 'UTF8';
SELECT idem_execute('tr1', 'SELECT $1::text AS v', trange(U&'\00e9', U&'\00ff')) ->> 'command';
SET client_encoding = 'LATIN1';
SELECT replayed FROM idem_execute_ex('tr1', 'SELECT $1::text AS v', trange(U&'\00e9', U&'\00ff'));
RESET client_encoding;
SELECT idem_execute('tr2', 'SELECT $1 AS r', numrange(1.0, 2.0)) ->> 'command';
SELECT idem_execute('tr2', 'SELECT $1 AS r', numrange(1.00, 2.00));
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('tr2', 'SELECT $1 AS r', '[1.0,2.0)'::numrange);
SELECT idem_execute('tr3', 'SELECT $1 AS r', int4multirange(int4range(1, 3), int4range(5, 7))) ->> 'command';
SELECT replayed FROM idem_execute_ex('tr3', 'SELECT $1 AS r', '{[1,2], [5,6]}'::int4multirange);
SELECT idem_execute('tr3', 'SELECT $1 AS r', int4multirange(int4range(1, 3)));
\echo :LAST_ERROR_SQLSTATE

-- Field names are part of a record's meaning (to_jsonb, row_to_json): a
-- record with another field name is another request, a genuine retry
-- replays
CREATE TABLE evr (id serial PRIMARY KEY, payload jsonb);
SELECT idem_execute('rn-1', 'INSERT INTO evr(payload) VALUES (to_jsonb($1)) RETURNING payload', r)
  FROM (SELECT 25 AS amount) r;
SELECT idem_execute('rn-1', 'INSERT INTO evr(payload) VALUES (to_jsonb($1)) RETURNING payload', r)
  FROM (SELECT 25 AS refund_id) r;
\echo :LAST_ERROR_SQLSTATE
SELECT (idem_execute_ex('rn-1', 'INSERT INTO evr(payload) VALUES (to_jsonb($1)) RETURNING payload', r)).replayed AS replayed
  FROM (SELECT 25 AS amount) r;
SELECT payload FROM evr ORDER BY id;
-- nested records, arrays of records, records passed with VARIADIC
SELECT idem_execute('rn-2', 'SELECT to_jsonb($1) AS j', r) ->> 'command'
  FROM (SELECT s AS inner_row FROM (SELECT 25 AS amount) s) r;
SELECT idem_execute('rn-2', 'SELECT to_jsonb($1) AS j', r)
  FROM (SELECT s AS inner_row FROM (SELECT 25 AS refund_id) s) r;
\echo :LAST_ERROR_SQLSTATE
SELECT (idem_execute_ex('rn-2', 'SELECT to_jsonb($1) AS j', r)).replayed AS replayed
  FROM (SELECT s AS inner_row FROM (SELECT 25 AS amount) s) r;
SELECT idem_execute('rn-3', 'SELECT to_jsonb($1) AS j', ARRAY[r]) ->> 'command'
  FROM (SELECT 25 AS amount) r;
SELECT idem_execute('rn-3', 'SELECT to_jsonb($1) AS j', ARRAY[r])
  FROM (SELECT 25 AS refund_id) r;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('rn-4', 'SELECT to_jsonb($1) AS j', VARIADIC ARRAY[r]) ->> 'command'
  FROM (SELECT 25 AS amount) r;
SELECT idem_execute('rn-4', 'SELECT to_jsonb($1) AS j', VARIADIC ARRAY[r])
  FROM (SELECT 25 AS refund_id) r;
\echo :LAST_ERROR_SQLSTATE
-- a composite type is not the anonymous record with the same fields
CREATE TYPE amount_row AS (amount int);
SELECT idem_execute('rn-5', 'SELECT to_jsonb($1) AS j', ROW(25)::amount_row) ->> 'command';
SELECT idem_execute('rn-5', 'SELECT to_jsonb($1) AS j', r)
  FROM (SELECT 25 AS amount) r;
\echo :LAST_ERROR_SQLSTATE
SELECT replayed FROM idem_execute_ex('rn-5', 'SELECT to_jsonb($1) AS j', ROW(25)::amount_row);
DROP TABLE evr;
DROP TYPE amount_row;

-- quote_all_identifiers changes what $1::regclass::text stores: part of
-- the request
CREATE TABLE qi (id int);
SELECT idem_execute('qi-1', 'SELECT $1::regclass::text AS t', 'qi'::text);
SET quote_all_identifiers = on;
SELECT idem_execute('qi-1', 'SELECT $1::regclass::text AS t', 'qi'::text);
\echo :LAST_ERROR_SQLSTATE
RESET quote_all_identifiers;
SELECT replayed FROM idem_execute_ex('qi-1', 'SELECT $1::regclass::text AS t', 'qi'::text);
DROP TABLE qi;

-- A business statement must not change a setting that is part of every
-- later request's identity (search_path, TimeZone, ...): refused, and the
-- aborted transaction takes the change back
CREATE FUNCTION set_identity(name text, value text, is_local boolean) RETURNS text
  LANGUAGE sql AS 'SELECT set_config(name, value, is_local)';
SELECT idem_execute('sc-1', 'SELECT set_identity(''search_path'', ''pg_catalog'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SHOW search_path;
SELECT count(*) AS recorded FROM idem.keys WHERE key = 'sc-1';
BEGIN;
SELECT idem_execute('sc-2', 'SELECT set_identity(''TimeZone'', ''Asia/Tokyo'', true) AS v');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('sc-3', 'SELECT set_identity(''quote_all_identifiers'', ''on'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SHOW quote_all_identifiers;
-- a setting outside the identity may change, and one set to the value it
-- has is no change
SELECT idem_execute('sc-4', 'SELECT set_identity(''application_name'', ''sc4'', false) AS v');
SELECT idem_execute('sc-5', 'SELECT set_identity(''search_path'', current_setting(''search_path''), false) AS v') ->> 'command';
-- nor the role, nor idem's own settings: whose keys later requests use
-- (role, idem.key_owner) and what idem records for them (idem.ttl,
-- idem.cache_errors, idem.outbox_topic, ...) are the caller's to decide
CREATE ROLE regress_idem_other;
GRANT regress_idem_other TO current_user;
SELECT idem_execute('sc-6', 'SELECT set_identity(''role'', ''regress_idem_other'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SELECT current_user = session_user AS role_kept;
SELECT idem_execute('sc-7', 'SELECT set_identity(''idem.key_owner'', ''regress_idem_other'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.key_owner;
BEGIN;
SELECT idem_execute('sc-8', 'SELECT set_identity(''idem.cache_errors'', ''23'', true) AS v');
ROLLBACK;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_execute('sc-9', 'SELECT set_identity(''idem.ttl'', ''1h'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.ttl;
SELECT idem_execute('sc-10', 'SELECT set_identity(''idem.wait'', ''off'', false) AS v');
\echo :LAST_ERROR_SQLSTATE
SHOW idem.wait;
SELECT count(*) AS recorded FROM idem.keys WHERE key IN ('sc-6', 'sc-7', 'sc-8', 'sc-9', 'sc-10');
-- set to the value it has, or in a SET clause that restores it: no change
SELECT idem_execute('sc-11', 'SELECT set_identity(''idem.ttl'', current_setting(''idem.ttl''), false) AS v') ->> 'command';
CREATE FUNCTION ttl_in_clause() RETURNS text LANGUAGE sql
  SET idem.ttl = '1h' AS 'SELECT current_setting(''idem.ttl'')';
SELECT idem_execute('sc-12', 'SELECT ttl_in_clause() AS v') -> 'rows';
DROP FUNCTION ttl_in_clause();
DROP ROLE regress_idem_other;
RESET application_name;
DROP FUNCTION set_identity(text, text, boolean);

DROP TABLE invoices, events, oids, ev;
DROP TYPE trange;
DROP SCHEMA tenant_a, tenant_b CASCADE;
DROP TYPE order_line, mood;
DROP DOMAIN due_date, amount;
