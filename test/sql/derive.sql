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

DROP TABLE keys_seen, hashes, claims;
DROP TYPE mood;
DROP DOMAIN cents;
