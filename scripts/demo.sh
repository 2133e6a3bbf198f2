#!/usr/bin/env bash
# Build and install idem, start a throwaway PostgreSQL 15 cluster on a Unix
# socket, create the extension and show a retried payment step executing
# once.  The cluster is removed on exit.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/deps.sh"
. "$top/scripts/env.sh"

idem_build_install "$top"
# the cluster user may not be allowed into the caller's directory (a clone
# in /root): initdb, pg_ctl and psql would each say they cannot go back to it
cd /

idem_throwaway_cluster demo
run pg_ctl -D "$dir/data" -l "$dir/log" -w \
	-o "-c listen_addresses='' -k $dir -p 5433" start >/dev/null
psql() { run /usr/lib/postgresql/15/bin/psql -X -h "$dir" -p 5433 -U postgres -d postgres "$@" 2>&1; }

psql -q -v ON_ERROR_STOP=1 <<'SQL'
\pset footer off
CREATE EXTENSION idem;
CREATE TABLE payments (
    id         bigserial PRIMARY KEY,
    invoice    text NOT NULL,
    amount     numeric(12,2) NOT NULL,
    paid_at    timestamptz NOT NULL DEFAULT now()
);
SELECT idem_outbox_create_topic('payments');
SET idem.outbox_topic = 'payments';

\echo '--- attempt 1: the agent pays invoice 4471 (then its connection times out)'
SELECT replayed, response
  FROM idem_execute_ex('pay:invoice-4471',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
       'invoice-4471', 99.50::numeric);

\echo '--- attempts 2 and 3: the agent retries the same step with the same key'
SELECT replayed, response
  FROM idem_execute_ex('pay:invoice-4471',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
       'invoice-4471', 99.50::numeric);
SELECT replayed, response
  FROM idem_execute_ex('pay:invoice-4471',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
       'invoice-4471', 99.50::numeric);

\echo '--- a buggy retry that changes the amount under the same key is refused'
\set ON_ERROR_STOP 0
\set VERBOSITY terse
SELECT idem_execute('pay:invoice-4471',
       'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
       'invoice-4471', 995.00::numeric);
\set ON_ERROR_STOP 1

\echo '--- result: one payment, one key record, one outbox event'
SELECT count(*) AS payments FROM payments;
SELECT count(*) AS key_records FROM idem.keys;
SELECT topic, payload->'rows'->0 AS event FROM idem.outbox;
SQL
