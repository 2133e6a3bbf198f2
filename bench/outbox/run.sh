#!/usr/bin/env bash
#
# Outbox delivery benchmark (issue 10): claim -> ack in separate
# transactions, 4 consumers, batches of 10, synchronous_commit off, with a
# producer writing events and the purge of delivered events running, for
# idem (idem_outbox_claim, then idem_outbox_ack per event or
# idem_outbox_ack_batch for the batch) and for the best hand-written
# SKIP LOCKED queue with the same semantics (bench.queue, defined exactly
# like idem.outbox; the claim moves the due time to the lease end), one
# after the other on one throwaway cluster (Unix socket only).
#
#   bench/outbox/run.sh                      # 10 minutes per design
#   bench/outbox/run.sh --seconds 120 --interval 30
#   bench/outbox/run.sh --help
#
# Each design starts from the same state: a backlog of pending events large
# enough that the consumers never run dry (so they, not the producer, set
# the pace), vacuumed, analyzed and checkpointed, statistics reset.  The
# report gives events/s per interval (pgbench --progress; one consumer
# transaction pair delivers one batch), the first and the last interval and
# their ratio, the ratio idem / hand-written, table and index sizes before
# and after, and the share of HOT updates.  Results go to
# bench/outbox/results/latest.txt and latest.csv.
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

seconds=600
interval=60
consumers=4
batch=10
rate=500
backlog_rate=12000
install=1
designs="idem idem_batch sql"

usage() {
	cat <<USAGE
usage: $0 [options]
  --seconds S     duration per design (default $seconds)
  --interval S    throughput reporting interval (default $interval)
  --consumers N   consumer clients (default $consumers)
  --rate R        producer calls per second while the consumers run (default $rate)
  --backlog-rate N  pending events made beforehand per second of the run (default
                  $backlog_rate; must exceed what the consumers deliver)
  --designs "L"   any of idem idem_batch sql (default "$designs")
  --no-install    do not build and install idem first
USAGE
}

while [ $# -gt 0 ]; do
	case "$1" in
		--seconds) seconds=$2; shift ;;
		--interval) interval=$2; shift ;;
		--consumers) consumers=$2; shift ;;
		--rate) rate=$2; shift ;;
		--backlog-rate) backlog_rate=$2; shift ;;
		--designs) designs=$2; shift ;;
		--no-install) install=0 ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

"$top/scripts/deps.sh" --bench
. "$top/scripts/env.sh"
[ $install -eq 1 ] && idem_build_install "$top"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$here/out/$stamp"
res="$here/results"
mkdir -p "$out" "$res"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/run.log" >&2; }

port=5496
db=idem_outbox_bench
idem_throwaway_cluster outbox-bench
[ "$(id -u)" -eq 0 ] && chown postgres: "$out"
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
max_connections = 50
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
synchronous_commit = off
CONF
run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
su_sql() { run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U postgres -d $db "$@"; }
run psql -X -q -h "$dir" -p $port -U postgres -d postgres -c "CREATE DATABASE $db"
su_sql -f "$here/schema.sql" >/dev/null

machine="$(nproc) vCPU ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), PostgreSQL $(su_sql -c 'SHOW server_version')"
rev=$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo "?")
log "$machine; idem at $rev"

# a backlog the consumers cannot drain (the report shows what is left)
backlog=$((seconds * backlog_rate))

table_of() { [ "$1" = sql ] && echo bench.queue || echo idem.outbox; }

purge_sql() {
	if [ "$1" != sql ]; then
		echo "SET idem.outbox_retention = '10s'; SELECT idem_outbox_purge(10000);"
	else
		echo "WITH d AS (DELETE FROM bench.queue WHERE ctid = ANY (ARRAY(SELECT ctid FROM bench.queue WHERE state = 'delivered' AND delivered_at <= clock_timestamp() - interval '10 s' ORDER BY delivered_at LIMIT 10000 FOR UPDATE SKIP LOCKED)) RETURNING 1) SELECT count(*) FROM d;"
	fi
}

sizes() {
	su_sql -c "SELECT pg_size_pretty(pg_table_size('$1')) || ' table, ' || pg_size_pretty(pg_indexes_size('$1')) || ' indexes'"
}

csv="$out/latest.csv"
echo "design,interval_end_s,events_per_s" >"$csv"
summary="$out/summary.txt"
: >"$summary"

for d in $designs; do
	tab=$(table_of "$d")
	log "$d: backlog of $backlog events"
	su_sql -c "TRUNCATE idem.outbox, bench.queue, bench.payments, bench.keys, idem.keys"
	su_sql -c "$(su_sql -c "SELECT bench.backlog_sql('$tab', $backlog)")"
	su_sql -c "VACUUM ANALYZE $tab"
	su_sql -c "CHECKPOINT"
	su_sql -c "SELECT pg_stat_reset()" >/dev/null
	size_before=$(sizes "$tab")

	# the purge: every second, delivered events older than 10 s
	(
		while :; do
			n=$(su_sql -c "$(purge_sql "$d")" 2>/dev/null | tail -n1)
			echo "${n:-0}" >>"$out/purge-$d.log"
			sleep 1
		done
	) &
	purger=$!
	# the producer, at a fixed rate
	run env PGOPTIONS="-c idem.outbox_topic=payments" \
		pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -R "$rate" \
		-T "$seconds" -f "$here/p_${d%_batch}.sql" $db >"$out/producer-$d.log" 2>&1 &
	producer=$!
	run pgbench -n -M prepared -h "$dir" -p $port -U bench -c "$consumers" -j "$consumers" \
		-T "$seconds" -P "$interval" -f "$here/c_$d.sql" $db >"$out/consumer-$d.log" 2>&1 || true
	wait $producer || true
	kill $purger 2>/dev/null || true
	wait $purger 2>/dev/null || true

	# pgbench prints no progress line for the interval that ends the run:
	# that one is the total less the intervals reported
	awk -v d="$d" -v b="$batch" -v secs="$seconds" -v iv="$interval" '
		/^progress: / { gsub(/,/, ""); printf "%s,%d,%.0f\n", d, $2, $4 * b; done += $4 * iv; t = $2 }
		/^number of transactions actually processed: / { n = $6 }
		END { if (secs - t > 0 && n > done) printf "%s,%d,%.0f\n", d, secs, (n - done) / (secs - t) * b }' \
		"$out/consumer-$d.log" >>"$csv"
	first=$(awk -F, -v d="$d" '$1 == d { print $3; exit }' "$csv")
	last=$(awk -F, -v d="$d" '$1 == d { v = $3 } END { print v }' "$csv")
	txs=$(awk '/^number of transactions actually processed: / { print $6 }' "$out/consumer-$d.log")
	mean=$(awk '/^tps = / { printf "%.0f", $3 * '"$batch"' }' "$out/consumer-$d.log")
	purged=$(awk '{ s += $1 } END { print s + 0 }' "$out/purge-$d.log")
	delivered=$(su_sql -c "SELECT count(*) FROM $tab WHERE state = 'delivered'")
	pending=$(su_sql -c "SELECT count(*) FROM $tab WHERE state = 'pending'")
	produced=$(awk '/^number of transactions actually processed: / { print $6 }' "$out/producer-$d.log")
	hot=$(su_sql -c "SELECT n_tup_upd || ' updates, ' || round(100.0 * n_tup_hot_upd / greatest(n_tup_upd, 1), 1) || '% HOT, ' || n_dead_tup || ' dead tuples' FROM pg_stat_user_tables WHERE relid = '$tab'::regclass")
	size_after=$(sizes "$tab")
	ratio=$(awk -v a="$last" -v b="$first" 'BEGIN { if (b > 0) printf "%.2f", a / b }')
	{
		echo "$d ($tab)"
		echo "  events/s: mean $mean, first ${interval}s $first, last ${interval}s $last (last/first $ratio)"
		echo "  consumer transactions (claim+ack pairs): ${txs:-?}; events delivered $((delivered + purged)) (still in table $delivered, purged $purged); pending left $pending"
		echo "  producer calls: ${produced:-?} at $rate/s"
		echo "  size before: $size_before; after: $size_after"
		echo "  $hot"
	} | tee -a "$summary" >&2
	echo "$d,$mean" >>"$out/means.txt"
done

{
	echo "Outbox delivery benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), idem at $rev"
	echo "$machine"
	echo "$consumers consumers, batches of $batch, claim and ack in separate transactions, lease 30 s,"
	echo "synchronous_commit off, 1 producer at $rate calls/s, purge every second (retention 10 s), ${seconds}s per design"
	echo
	cat "$summary"
	awk -F, '{ m[$1] = $2 } END {
		if (m["sql"] > 0 && m["idem"] > 0) printf "idem (ack per event) / hand-written (mean events/s): %.2f\n", m["idem"] / m["sql"]
		if (m["sql"] > 0 && m["idem_batch"] > 0) printf "idem (batch ack) / hand-written (mean events/s): %.2f\n", m["idem_batch"] / m["sql"]
	}' "$out/means.txt" 2>/dev/null || true
} >"$out/latest.txt"
cp "$out/latest.txt" "$out/latest.csv" "$res/"
cat "$res/latest.txt"
