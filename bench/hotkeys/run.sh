#!/usr/bin/env bash
#
# Hot-key stress, the large version of test/t/020_hot_keys.pl (which runs a
# few seconds of it in the suite).  Not part of the test suite.
#
#   bench/hotkeys/run.sh                  # 32 clients, 50 keys, 60 s per level
#   bench/hotkeys/run.sh --clients 64 --seconds 300
#   bench/hotkeys/run.sh --help
#
# On one throwaway PostgreSQL 15 cluster (Unix socket only), pgbench runs
# CLIENTS clients on KEYS hot keys at READ COMMITTED, REPEATABLE READ and
# SERIALIZABLE in turn, retrying transactions that fail with 40001/40P01
# (--max-tries).  The set of keys changes every ROUND_MS milliseconds (the
# key carries a round number), so first executions and the races around
# them go on all through the run.  Each transaction calls idem_execute_ex()
# on one key and logs the response it got into "seen", in the same
# transaction; the business statement inserts one row into "orders" whose
# response names the row's id and the executing backend's pid.
#
# Afterwards, per level: keys with more than one business row (dup_rows),
# business rows and key records without each other (orphans), stored
# responses that are not their business row, logged calls whose response
# differs from the stored one (mismatches), keys with other than one
# executing call (multi_exec), and unique violations in the server log.  All
# must be 0, and every 40001 from idem must have been retried (or, at the
# very end of the run, where pgbench does not retry, counted as a failed
# transaction: end_40001); the script exits 1 otherwise.  The table goes to stdout and to
# bench/hotkeys/results/latest.txt.
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

clients=32
keys=50
seconds=60
round_ms=500
levels="rc rr ser"
install=1

usage() {
	cat <<USAGE
usage: $0 [options]
  --clients N     pgbench clients (default $clients)
  --keys N        hot keys per round (default $keys)
  --seconds S     pgbench duration per isolation level (default $seconds)
  --round-ms MS   how often the set of keys changes (default $round_ms)
  --levels "L"    any of rc rr ser (default "$levels")
  --no-install    do not build and install idem first
USAGE
}

while [ $# -gt 0 ]; do
	case "$1" in
		--clients) clients=$2; shift ;;
		--keys) keys=$2; shift ;;
		--seconds) seconds=$2; shift ;;
		--round-ms) round_ms=$2; shift ;;
		--levels) levels=$2; shift ;;
		--no-install) install=0 ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

"$top/scripts/deps.sh" --bench
. "$top/scripts/env.sh"

[ $install -eq 1 ] && idem_build_install "$top"

port=5498
idem_throwaway_cluster hotkeys
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
max_connections = $((clients + 10))
shared_buffers = 256MB
max_wal_size = 4GB
CONF
run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
sql() { run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U postgres -d postgres "$@"; }

sql <<'SQL'
CREATE EXTENSION idem;
CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	key			text NOT NULL,
	amount		int NOT NULL,
	executed_by	int NOT NULL
);
CREATE TABLE seen (
	key			text NOT NULL,
	client		int NOT NULL,
	replayed	boolean NOT NULL,
	response	jsonb NOT NULL
);
SQL

declare -A names=([rc]="READ COMMITTED" [rr]="REPEATABLE READ" [ser]="SERIALIZABLE")
mkdir -p "$here/results"
table="$dir/table.txt"
printf '%-16s %7s %8s %6s %7s %9s %8s %6s %8s %8s %8s %7s %10s %10s %5s\n' \
	level seconds xacts tps retries end_40001 idem40001 keys calls replays dup_rows orphans mismatches multi_exec 23505 >"$table"
status=0

for l in $levels; do
	level=${names[$l]}
	script="$dir/$l.sql"
	cat >"$script" <<PGB
\\set n random(1, $keys)
SELECT (extract(epoch FROM clock_timestamp()) * 1000 / $round_ms)::bigint AS round \\gset
BEGIN ISOLATION LEVEL $level;
WITH k AS (SELECT '$l-' || :round || '-' || :n AS key)
INSERT INTO seen (key, client, replayed, response)
SELECT k.key, :client_id, e.replayed, e.response
  FROM k, idem_execute_ex(k.key,
	'INSERT INTO orders (key, amount, executed_by) VALUES (\$1, \$2, pg_backend_pid()) RETURNING id, key, amount, executed_by',
	k.key, :n) AS e;
END;
PGB
	[ "$(id -u)" -eq 0 ] && chown postgres: "$script"
	offset=$(stat -c %s "$dir/server.log")
	echo "$level: $clients clients, $keys keys per round of ${round_ms} ms, ${seconds} s" >&2
	pgb_status=0
	run pgbench --no-vacuum --client "$clients" --jobs "$(nproc)" --time "$seconds" \
		--max-tries 1000 --failures-detailed --file "$script" -h "$dir" -p $port -U postgres postgres \
		>"$dir/$l.out" 2>"$dir/$l.err" || pgb_status=$?
	if [ $pgb_status -ne 0 ] || grep -q aborted "$dir/$l.err"; then
		echo "$level: pgbench failed (status $pgb_status)" >&2
		tail -n 20 "$dir/$l.err" >&2
		status=1
	fi
	xacts=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/$l.out")
	failed=$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' "$dir/$l.out")
	retries=$(sed -n 's/^total number of retries: \([0-9]*\).*/\1/p' "$dir/$l.out")
	# pgbench does not retry once --time is up: a 40001 in the last moment
	# ends as a failed transaction
	serfail=$(sed -n 's/^number of serialization failures: \([0-9]*\).*/\1/p' "$dir/$l.out")
	tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$dir/$l.out")
	tail -c +"$((offset + 1))" "$dir/server.log" >"$dir/$l.log"
	conflicts=$(grep -c 'concurrent use of idempotency key' "$dir/$l.log" || true)
	uniq=$(grep -c 'duplicate key value' "$dir/$l.log" || true)
	[ "${failed:-1}" = "${serfail:-0}" ] ||
		{ echo "$level: $failed failed transactions, $serfail of them serialization failures" >&2; status=1; }
	[ "$conflicts" = "$(( ${retries:-0} + ${serfail:-0} ))" ] ||
		{ echo "$level: $conflicts 40001 from idem, but $retries retries + $serfail final failures" >&2; status=1; }

	like="'$l-%'"
	read -r nkeys calls replays dups orphans badresp mismatches multi <<<"$(sql -F ' ' <<SQL
SELECT (SELECT count(*) FROM idem.keys WHERE key LIKE $like),
	   (SELECT count(*) FROM seen WHERE key LIKE $like),
	   (SELECT count(*) FROM seen WHERE key LIKE $like AND replayed),
	   (SELECT count(*) FROM (SELECT key FROM orders WHERE key LIKE $like
							  GROUP BY key HAVING count(*) > 1) d),
	   (SELECT count(*) FROM (SELECT * FROM orders WHERE key LIKE $like) o
			FULL JOIN (SELECT * FROM idem.keys WHERE key LIKE $like) k USING (key)
		 WHERE o.id IS NULL OR k.response IS NULL),
	   (SELECT count(*) FROM orders o JOIN idem.keys k USING (key)
		 WHERE o.key LIKE $like
		   AND k.response <> jsonb_build_object('rows', jsonb_build_array(to_jsonb(o)),
												'command', 'INSERT', 'rowcount', 1)),
	   (SELECT count(*) FROM seen s LEFT JOIN idem.keys k USING (key)
		 WHERE s.key LIKE $like AND k.response IS DISTINCT FROM s.response),
	   (SELECT count(*) FROM (SELECT key FROM seen WHERE key LIKE $like GROUP BY key
							  HAVING count(*) FILTER (WHERE NOT replayed) <> 1) m);
SQL
)"
	orphans=$((orphans + badresp))
	for v in "$dups" "$orphans" "$mismatches" "$multi" "$uniq"; do
		[ "$v" = 0 ] || status=1
	done
	[ "$calls" = "$xacts" ] || { echo "$level: pgbench counted $xacts transactions, $calls logged" >&2; status=1; }
	printf '%-16s %7s %8s %6.0f %7s %9s %8s %6s %8s %8s %8s %7s %10s %10s %5s\n' \
		"$level" "$seconds" "$xacts" "$tps" "${retries:-0}" "${serfail:-0}" "$conflicts" "$nkeys" "$calls" "$replays" \
		"$dups" "$orphans" "$mismatches" "$multi" "$uniq" >>"$table"
done

{
	echo "# idem hot-key stress, $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "# $(nproc) vCPU, PostgreSQL $(sql -c 'SHOW server_version'), $clients clients, $keys keys per ${round_ms} ms round, 1-minute load at end $(cut -d' ' -f1 /proc/loadavg)"
	echo "# dup_rows, orphans, mismatches, multi_exec and 23505 must all be 0"
	cat "$table"
	[ $status -eq 0 ] && echo "# PASS" || echo "# FAIL"
} | tee "$here/results/latest.txt"
exit $status
