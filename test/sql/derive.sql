--
-- derive: idem_key(VARIADIC parts) and idem_state_hash(anyelement) are
-- canonical, unambiguous and independent of session settings
--

-- parts are joined unambiguously: ':' '\' '#' inside a part are escaped
SELECT idem_key('a:b', 'c') AS k1, idem_key('a', 'b:c') AS k2,
       idem_key('a:b', 'c') <> idem_key('a', 'b:c') AS differ;
SELECT idem_key('a\', 'b') AS k1, idem_key('a', '\b') AS k2, idem_key('a#1') AS k3;
SELECT idem_key('a', '') AS two_parts, idem_key('a') AS one_part;
-- an explicit VARIADIC array is the same key as its elements
SELECT idem_key(VARIADIC ARRAY['adjust', '42']) = idem_key('adjust', '42') AS same;
-- any type, written by its output function
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN cents AS bigint;
SELECT idem_key('refund', 4471, 25.00::numeric, true, 'happy'::mood, 7::cents,
                '2026-12-01'::date, '\x01ff'::bytea, ARRAY[1, 2]) AS key;

-- the same key under any setting that changes text output
CREATE TABLE keys_seen (label text, key text);
INSERT INTO keys_seen
SELECT 'default', idem_key('t', '2026-12-01 10:00:00+02'::timestamptz, 1.5::float8,
                           '1 day 2 hours'::interval, '\xdeadbeef'::bytea, 12.5::money);
SET TimeZone = 'America/New_York';
SET DateStyle = 'SQL, DMY';
SET IntervalStyle = 'iso_8601';
SET extra_float_digits = -3;
SET bytea_output = 'escape';
INSERT INTO keys_seen
SELECT 'changed', idem_key('t', '2026-12-01 10:00:00+02'::timestamptz, 1.5::float8,
                           '1 day 2 hours'::interval, '\xdeadbeef'::bytea, 12.5::money);
RESET ALL;
SELECT count(DISTINCT key) AS distinct_keys, min(key) AS key FROM keys_seen;
-- the caller's settings are untouched by the call
SET TimeZone = 'Asia/Tokyo';
SELECT idem_key(now()) IS NOT NULL AS ok, current_setting('TimeZone') AS tz;
RESET TimeZone;

-- within 255 bytes: longer keys keep a prefix and end in the hash of all
SELECT length(idem_key(repeat('x', 255))) AS fits, idem_key(repeat('x', 255)) = repeat('x', 255) AS unhashed;
SELECT octet_length(k) AS bytes, right(k, 65) ~ '^#[0-9a-f]{64}$' AS hashed
  FROM (SELECT idem_key(repeat('x', 300)) AS k) s;
SELECT idem_key(repeat('x', 300)) = idem_key(repeat('x', 300)) AS deterministic,
       idem_key(repeat('x', 300)) <> idem_key(repeat('x', 299), 'x') AS distinct_parts;
-- multibyte characters are never cut in half
SELECT octet_length(idem_key(repeat('é', 200))) <= 255 AS fits,
       convert_to(idem_key(repeat('é', 200)), 'UTF8') IS NOT NULL AS valid;
-- the cut never leaves a dangling escape before the '#'
SELECT k ~ '(^|[^\\])(\\\\)*#[0-9a-f]{64}$' AS unescaped_hash
  FROM (SELECT idem_key(repeat('x', 189) || ':' || repeat('y', 100)) AS k) s;

-- bad input
SELECT idem_key('a', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key(VARIADIC ARRAY['a', NULL]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key(VARIADIC ARRAY[]::text[]);
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key(VARIADIC NULL::text[]);
\echo :LAST_ERROR_SQLSTATE
-- more parts than a statement takes arguments (65,535) are refused before
-- they are unpacked (54000); 65,535 make a key, hashed
SELECT idem_key(VARIADIC array_fill('p'::text, ARRAY[65536]));
\echo :LAST_ERROR_SQLSTATE
SELECT length(k), right(k, 65) ~ '^#[0-9a-f]{64}$' AS hashed
FROM idem_key(VARIADIC array_fill('p'::text, ARRAY[65535])) AS k;

-- idem_state_hash: a row's current content as a revision tag
CREATE TABLE claims (id int PRIMARY KEY, status text, amount numeric, note jsonb, m mood);
INSERT INTO claims VALUES (1, 'open', 100.00, '{"b": 1, "a": 2}', 'sad');
CREATE TABLE hashes (label text, h text);
INSERT INTO hashes SELECT 'v1', idem_state_hash(c) FROM claims c;
SET TimeZone = 'Asia/Tokyo';
SET extra_float_digits = -3;
INSERT INTO hashes SELECT 'v1 again', idem_state_hash(c) FROM claims c;
RESET ALL;
UPDATE claims SET status = 'reopened';
INSERT INTO hashes SELECT 'v2', idem_state_hash(c) FROM claims c;
UPDATE claims SET status = 'open';
INSERT INTO hashes SELECT 'back to v1', idem_state_hash(c) FROM claims c;
SELECT label, h = (SELECT h FROM hashes WHERE label = 'v1') AS same_as_v1,
       h ~ '^[0-9a-f]{64}$' AS hex
  FROM hashes ORDER BY label;
-- a key computed against an old revision is another key
SELECT idem_key('adjust', c.id, idem_state_hash(c)) AS key FROM claims c \gset
UPDATE claims SET amount = 120.00;
SELECT idem_key('adjust', c.id, idem_state_hash(c)) <> :'key' AS new_key FROM claims c;
-- jsonb content, not spelling; a value and its type
SELECT idem_state_hash('{"a": 2, "b": 1}'::jsonb) = idem_state_hash('{"b":1,"a":2}'::jsonb) AS jsonb_canonical,
       idem_state_hash(1::int4) <> idem_state_hash(1::int8) AS typed,
       idem_state_hash(7::cents) <> idem_state_hash(7::bigint) AS domain_typed;
SELECT idem_state_hash(NULL::claims);
\echo :LAST_ERROR_SQLSTATE

-- a regclass part is the table, whatever the search_path and quoting
CREATE SCHEMA ledger;
CREATE TABLE ledger.pay (id int);
SET search_path = ledger, public;
SELECT idem_key('adjust', 'ledger.pay'::regclass) AS on_path;
RESET search_path;
SELECT idem_key('adjust', 'ledger.pay'::regclass) AS off_path;
SET quote_all_identifiers = on;
SELECT idem_key('adjust', 'ledger.pay'::regclass, 'int4'::regtype) AS quoting;
RESET quote_all_identifiers;
DROP SCHEMA ledger CASCADE;
-- an anonymous record's text leaves its field names out: refused
SELECT idem_key('refund', r) FROM (SELECT 25 AS amount) r;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key('refund', ARRAY[r]) FROM (SELECT 25 AS amount) r;
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key(VARIADIC ARRAY[r]) FROM (SELECT 25 AS amount) r;
\echo :LAST_ERROR_SQLSTATE
-- a void part has no text: it would add nothing, so pg_sleep(0) and ''
-- would name one request; refused
SELECT idem_key(pg_sleep(0), 'refund');
\echo :LAST_ERROR_SQLSTATE
SELECT idem_key('refund', pg_sleep(0), 'r-1');
\echo :LAST_ERROR_SQLSTATE
-- a composite type's fields are named by the type
CREATE TYPE refund_row AS (amount int);
SELECT idem_key('refund', ROW(25)::refund_row) AS composite;
-- the dimensions of an explicit VARIADIC array are not flattened
SELECT idem_key(VARIADIC ARRAY[['a', 'b'], ['c', 'd']]);
\echo :LAST_ERROR_SQLSTATE
-- idem_state_hash: an anonymous record's field names count, a composite
-- type's hash is the one idem 1.1 gave
SELECT idem_state_hash(a) <> idem_state_hash(b) AS field_names
  FROM (SELECT 25 AS amount) a, (SELECT 25 AS refund_id) b;
SELECT idem_state_hash(a) <> idem_state_hash(b) AS nested_field_names
  FROM (SELECT s AS r FROM (SELECT 25 AS amount) s) a,
       (SELECT s AS r FROM (SELECT 25 AS refund_id) s) b;
SELECT idem_state_hash(ARRAY[a]) <> idem_state_hash(ARRAY[b]) AS array_field_names
  FROM (SELECT 25 AS amount) a, (SELECT 25 AS refund_id) b;
SELECT idem_state_hash(a) = idem_state_hash(b) AS same_record
  FROM (SELECT 25 AS amount) a, (SELECT 25 AS amount) b;
SELECT idem_state_hash(ROW(25)::refund_row) AS composite_hash;
DROP TYPE refund_row;

DROP TABLE keys_seen, hashes, claims;
DROP TYPE mood;
DROP DOMAIN cents;
