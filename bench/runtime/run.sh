#!/usr/bin/env bash
#
# Runs on queues benchmark (issue 21), on a throwaway cluster (Unix socket
# only, synchronous_commit off so that the CPU, not the disk, sets the
# pace):
#
# 1. runs/s with 4 workers: claim a run under a lease, then its 4 fenced
#    steps (idem_call with the lease token, one transaction each), against
#    the baseline of 4 plain idem_step() calls of a run on no queue, one
#    transaction each (and the same with idem_call, the leased script's
#    shape).  Target: leased within 15% of the baseline.
# 2. the latency of one claim of one due run, 1 client, with idem.runs
#    holding 100k due runs only ("empty") and with 1M finished runs besides.
#    Target: within 10%.
#
# Designs alternate, each measured --rounds times; the report gives every
# round and the medians.  Results go to bench/runtime/results/latest.txt.
#
#   bench/runtime/run.sh [--seconds 20] [--rounds 2] [--no-install]
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
seconds=20
rounds=2
install=1
while [ $# -gt 0 ]; do
	case "$1" in
		--seconds) seconds=$2; shift ;;
		--rounds) rounds=$2; shift ;;
		--no-install) install=0 ;;
		*) echo "usage: $0 [--seconds S] [--rounds N] [--no-install]" >&2; exit 2 ;;
	esac
	shift
done

. "$top/scripts/env.sh"
[ $install -eq 1 ] && idem_build_install "$top"

port=5474
db=idem_runtime_bench
idem_throwaway_cluster runtime-bench
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
shared_preload_libraries = 'idem'
shared_buffers = 512MB
max_wal_size = 8GB
checkpoint_timeout = 30min
synchronous_commit = off
max_locks_per_transaction = 256
CONF
run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
sql() { run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U postgres -d $db "$@"; }
run psql -X -q -h "$dir" -p $port -U postgres -d postgres -c "CREATE DATABASE $db"
sql -f "$here/schema.sql" >/dev/null
cp "$here"/*.sql "$dir/" && chown -R postgres: "$dir" 2>/dev/null || true

res="$here/results"
mkdir -p "$res"
report="$res/latest.txt"
machine="$(nproc) vCPU ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), PostgreSQL $(sql -c 'SHOW server_version'), idem at $(git -c safe.directory="$top" -C "$top" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# runs on queues, $(date -u +%FT%TZ); $machine; ${seconds}s per round, $rounds rounds; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$report"

pgb() { run pgbench -n -M prepared -h "$dir" -p $port -U postgres "$@" $db 2>&1; }
tps() { sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -n1; }
lat() { sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' | head -n1; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
# The backend's CPU time in ms per unit of work for CALL $1 of $2 units.
cpu_per() {
	sql <<SQL
SET synchronous_commit = off;
CREATE TEMP TABLE t AS SELECT split_part(s, ' ', 14)::int + split_part(s, ' ', 15)::int AS ticks FROM pg_read_file('/proc/' || pg_backend_pid() || '/stat') s;
CALL $1;
SELECT round(((split_part(s, ' ', 14)::int + split_part(s, ' ', 15)::int - (SELECT ticks FROM t)) * 1000.0 / $(getconf CLK_TCK) / $2)::numeric, 4) FROM pg_read_file('/proc/' || pg_backend_pid() || '/stat') s;
SQL
}
# idem.runs for the claim measurements: 100k due runs, and for "full" 1M
# finished ones besides.
fill_lat_table() {
	sql -c "TRUNCATE idem.runs, idem.run_attempts, idem.run_signals" >/dev/null
	if [ "$1" = empty ]; then
		sql -c "CALL fill_lat(100000, 0)"
	else
		sql -c "CALL fill_lat(100000, 1000000)"
	fi
	sql -c "VACUUM ANALYZE idem.runs" -c "CHECKPOINT" >/dev/null
}

# 1. throughput: enough runs that the workers never run dry
# (a quiet 2-core machine does up to 10,000 plain runs/s; a round that runs
# dry fails the claim's \gset and stops the benchmark, saying so)
per_round=$((seconds * 12000))
declare -A got
for r in $(seq 1 "$rounds"); do
	for d in leased plain_step plain_call hand_queue; do
		sql -c "TRUNCATE effects, hand_runs, idem.runs, idem.run_attempts, idem.run_signals, idem.keys; SELECT setval('bseq', 1, false)" >/dev/null
		if [ $d = leased ]; then
			sql -c "CALL begin_runs('q', $per_round, 'bench')"
		elif [ $d = hand_queue ]; then
			sql -c "CALL begin_hand_runs($per_round)"
		else
			sql -c "CALL begin_runs('b', $per_round, NULL)"
		fi
		sql -c "VACUUM ANALYZE" -c "CHECKPOINT" >/dev/null
		t=$(pgb -c 4 -j 4 -T "$seconds" -f "$dir/$d.sql" | tee "$dir/$d-$r.log" | tps) || {
			echo "round $r: $d: pgbench failed (did the $per_round runs run out?):" >&2
			tail -n 5 "$dir/$d-$r.log" >&2
			exit 1
		}
		done_runs=$(sql -c "SELECT count(*) / 4 FROM effects")
		got[$d]="${got[$d]:-} $t"
		echo "round $r: $d: $t runs/s ($done_runs runs)" | tee -a "$report"
	done
done
for d in leased plain_step plain_call hand_queue; do
	m=$(echo "${got[$d]}" | tr ' ' '\n' | grep . | median)
	eval "med_$d=$m"
	echo "median $d: $m runs/s" | tee -a "$report"
done
echo "leased / plain_step: $(echo "$med_leased / $med_plain_step" | bc -l | cut -c1-5)" | tee -a "$report"
echo "leased / plain_call: $(echo "$med_leased / $med_plain_call" | bc -l | cut -c1-5)" | tee -a "$report"
echo "leased / hand_queue: $(echo "$med_leased / $med_hand_queue" | bc -l | cut -c1-5)" | tee -a "$report"

# CPU time per run of one backend (the same work by procedure, 1000 runs):
# a loaded machine moves throughput far more than it moves CPU time
for r in $(seq 1 "$rounds"); do
	for d in leased plain_step plain_call hand_queue; do
		sql -c "TRUNCATE effects, hand_runs, idem.runs, idem.run_attempts, idem.run_signals, idem.keys; SELECT setval('bseq', 1, false)" >/dev/null
		if [ $d = leased ]; then
			sql -c "CALL begin_runs('q', 1000, 'bench')"
		elif [ $d = hand_queue ]; then
			sql -c "CALL begin_hand_runs(1000)"
		else
			sql -c "CALL begin_runs('b', 1000, NULL)"
		fi
		sql -c "VACUUM ANALYZE" >/dev/null
		c=$(cpu_per "cpu_$d(1000)" 1000)
		echo "round $r: $d: $c ms CPU per run" | tee -a "$report"
	done
done

# 2. claim latency: 100k due runs, without and with 1M finished runs
declare -A lat_got
for r in $(seq 1 "$rounds"); do
	for d in empty full; do
		fill_lat_table $d
		rows=$(sql -c "SELECT count(*) FROM idem.runs")
		l=$(pgb -c 1 -T "$seconds" -f "$dir/claim.sql" | tee "$dir/claim-$d-$r.log" | lat)
		lat_got[$d]="${lat_got[$d]:-} $l"
		echo "round $r: claim, $d ($rows runs in idem.runs): $l ms" | tee -a "$report"
	done
done
for d in empty full; do
	m=$(echo "${lat_got[$d]}" | tr ' ' '\n' | grep . | median)
	eval "lat_$d=$m"
	echo "median claim latency $d: $m ms" | tee -a "$report"
done
echo "claim latency full / empty: $(echo "$lat_full / $lat_empty" | bc -l | cut -c1-5)" | tee -a "$report"

# CPU time per claim of one backend, 5000 claims a transaction each
for r in $(seq 1 "$rounds"); do
	for d in empty full; do
		fill_lat_table $d
		c=$(cpu_per "cpu_claim(5000)" 5000)
		echo "round $r: claim, $d: $c ms CPU per claim" | tee -a "$report"
	done
done
