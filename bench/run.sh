#!/usr/bin/env bash
#
# idem benchmark: idem_execute() side by side with the hand-written
# alternatives, on one throwaway PostgreSQL 15 cluster (Unix socket only).
#
#   bench/run.sh                 # ~9 minutes: TPS table, CSV, chart, memory
#   bench/run.sh --scale         # + ~6 minutes: 10M-key catalog, purge dip
#   bench/run.sh --help
#
# Workloads (pgbench -M prepared, 4 clients, synchronous_commit off and on,
# interleaved rounds, median TPS):
#   0 round trip     SELECT 1
#   1 bare           the business INSERT alone
#   2 floor          business INSERT + key INSERT + outbox INSERT, one CTE, no checks
#   3 plpgsql        the classic hand-written PL/pgSQL idempotency function
#   4 idem new key   idem_execute() with a fresh key per call (+ outbox event)
#   5 idem replay    idem_execute() on seeded keys
#   6 plpgsql replay the PL/pgSQL function on seeded keys
#   7 hot keys       idem_execute(), 16 clients on 50 keys, executes and replays
#   8 replay call shape  (diagnostic) the same call as a replay, answered
#                    from a constant: what any replay through this call costs
#
# --profile adds instructions per transaction under callgrind, which unlike
# TPS does not move with the load of a shared machine.
#
# Results go to bench/results/ (latest.txt, latest.md, latest.csv,
# latest-runs.csv, latest-targets.csv, latest-memory.csv, latest.png; with
# --scale latest-scale.txt/.csv, with --profile latest-profile.txt); raw
# pgbench output and callgrind files go to bench/out/ (not in git).
#
set -euo pipefail

bench=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$bench/.." && pwd)

rounds=3
seconds=8
clients=4
hot_clients=16
seeds=10000
workloads="0 1 2 3 4 5 6 7 8 9"
syncs="off on"
memory=1
mem_statements=100000
scale=0
scale_keys=10000000
purge_keys=1000000
scale_seconds=20
scale_rounds=3
max_load=""
max_wait=1200
install=1
preload=0
profile=0
default_profile_workloads="0 8 5 6 1 2 4 3 9"
profile_workloads=$default_profile_workloads
purge_autovacuum="off on"

usage() {
	cat <<EOF
usage: $0 [options]
  --rounds N          interleaved rounds per workload and setting (default $rounds)
  --seconds S         pgbench duration of each run (default $seconds)
  --workloads "L"     workload numbers to run (default "$workloads"; none: only
                      the measurements asked for by other options)
  --sync "L"          synchronous_commit settings (default "$syncs")
  --no-memory         skip the bounded-memory measurement
  --statements N      distinct SQL texts for the memory measurement (default $mem_statements)
  --scale             also measure a ${scale_keys}-key catalog and a purge under load
  --scale-keys N      key records pre-loaded for --scale (default $scale_keys)
  --purge-keys N      expired records purged under load for --scale (default $purge_keys)
  --scale-seconds S   duration of each --scale TPS run (default $scale_seconds)
  --scale-rounds N    rounds of the --scale TPS comparison (default $scale_rounds)
  --purge-autovacuum "L"  purge runs with autovacuum of idem.keys off and/or on
                      (default "$purge_autovacuum")
  --max-load X        first wait until the 1-minute load average is below X
  --max-wait S        ... but at most S seconds (default $max_wait), then run anyway
  --profile           also count instructions per transaction under callgrind
                      (needs valgrind) and list what dominates idem's calls
  --profile-workloads "L"  the workloads --profile counts (default
                      "$profile_workloads"; the ratios need 0 2 3 4 5 6 8 9)
  --no-install        do not build and install idem first
  --preload           run the cluster with shared_preload_libraries = 'idem'
                      (stats counted, outbox wakeups signalled in shared memory)
EOF
}

while [ $# -gt 0 ]; do
	case "$1" in
		--rounds) rounds=$2; shift ;;
		--seconds) seconds=$2; shift ;;
		--workloads) workloads=$2; shift ;;
		--sync) syncs=$2; shift ;;
		--no-memory) memory=0 ;;
		--statements) mem_statements=$2; shift ;;
		--scale) scale=1 ;;
		--scale-keys) scale_keys=$2; shift ;;
		--purge-keys) purge_keys=$2; shift ;;
		--scale-seconds) scale_seconds=$2; shift ;;
		--scale-rounds) scale_rounds=$2; shift ;;
		--purge-autovacuum) purge_autovacuum=$2; shift ;;
		--max-load) max_load=$2; shift ;;
		--max-wait) max_wait=$2; shift ;;
		--no-install) install=0 ;;
		--preload) preload=1 ;;
		--profile) profile=1 ;;
		--profile-workloads) profile_workloads=$2; shift ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

[ "$workloads" = none ] && workloads=""

"$top/scripts/deps.sh" --bench
. "$top/scripts/env.sh"

[ $install -eq 1 ] && idem_build_install "$top"

names=("round trip" "bare" "floor" "plpgsql" "idem new key" "idem replay"
	   "plpgsql replay" "hot keys" "replay call shape" "idem step new key"
	   "idem new key, cache_errors" "idem_call new key" "idem_call replay"
	   "idem new key, no NOTIFY")
scripts=(w0_round_trip w1_bare w2_floor w3_plpgsql w4_idem_new_key
		 w5_idem_replay w6_plpgsql_replay w7_hot_keys w8_replay_call_shape
		 w9_idem_step_new_key w10_idem_new_key_cache_errors
		 w11_idem_call_new_key w12_idem_call_replay
		 w13_idem_new_key_no_notify)
declare -a ir=()

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$bench/out/$stamp"			# raw logs (not kept in git)
res="$bench/results"
mkdir -p "$out" "$res"
new="$out/results"				# moved to results/ at the end
mkdir -p "$new"

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/run.log" >&2; }

# --- wait for a quiet machine ----------------------------------------------
load_note="1-minute load at start: $(cut -d' ' -f1 /proc/loadavg)"
if [ -n "$max_load" ]; then
	waited=0
	while awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v m="$max_load" \
		'BEGIN { exit !(l >= m) }'; do
		if [ $waited -ge "$max_wait" ]; then
			load_note="load stayed >= $max_load for ${max_wait}s; ran anyway at load $(cut -d' ' -f1 /proc/loadavg)"
			break
		fi
		[ $((waited % 60)) -eq 0 ] && log "load $(cut -d' ' -f1 /proc/loadavg) >= $max_load, waiting"
		sleep 10
		waited=$((waited + 10))
	done
	case "$load_note" in
		load*) ;;
		*) load_note="1-minute load at start: $(cut -d' ' -f1 /proc/loadavg) (waited ${waited}s for < $max_load)" ;;
	esac
fi
log "$load_note"

# --- the throwaway cluster -------------------------------------------------
port=5497
db=idem_bench
idem_throwaway_cluster bench
cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
max_connections = 50
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
EOF
[ $preload -eq 1 ] && echo "shared_preload_libraries = 'idem'" >>"$dir/data/postgresql.conf"
run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null

psql_as() {
	local user=$1; shift
	run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U "$user" "$@"
}
su_sql() { psql_as postgres -d $db "$@"; }
bench_sql() { psql_as bench -d $db "$@"; }

psql_as postgres -d postgres -c "CREATE DATABASE $db"
su_sql -f "$bench/schema.sql" >/dev/null
owner=$(su_sql -c "SELECT 'bench'::regrole::oid")
biz_sql='INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount'

# --- the machine -----------------------------------------------------------
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
ncpu=$(nproc)
mem=$(awk '/^MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo)
pgver=$(su_sql -c "SHOW server_version")
fsync=$(cd "$dir" && run pg_test_fsync -s 1 -f "$dir/fsync.test" 2>/dev/null |
		awk '/^ *fdatasync/ { printf "%.0f", $2; exit }')
machine="$ncpu vCPU ($cpu), $mem RAM, Linux $(uname -r), PostgreSQL $pgver, fdatasync ${fsync:-?} ops/s (pg_test_fsync)"
log "$machine"
rev=$(git -c safe.directory="$top" -C "$top" rev-parse --short HEAD 2>/dev/null || echo "?")
git -C "$top" diff --quiet HEAD -- src 2>/dev/null || rev="$rev+uncommitted src changes"
sofile="$("$PG_CONFIG" --pkglibdir)/idem.so"
version="idem: tree at $rev, $sofile built $(date -u -r "$sofile" '+%Y-%m-%d %H:%M UTC')"
[ $preload -eq 1 ] && version="$version, preloaded (shared_preload_libraries = 'idem')"
log "$version"

# --- seed the replay keys (as the role the workloads run as) ----------------
log "seeding $seeds keys for idem and for the PL/pgSQL function"
bench_sql <<EOF
SET idem.outbox_topic = 'payments';
DO \$\$
BEGIN
	FOR i IN 1 .. $seeds LOOP
		PERFORM idem_execute('seed-' || i, '$biz_sql', 'inv-' || i, i::numeric);
		PERFORM bench.plpgsql_execute('seed-' || i, '$biz_sql', 'inv-' || i, i::numeric);
		IF i % 1000 = 0 THEN
			COMMIT;
		END IF;
	END LOOP;
END
\$\$;
EOF
su_sql <<'EOF'
INSERT INTO bench.idem_seed SELECT * FROM idem.keys;
INSERT INTO bench.plpgsql_seed SELECT * FROM bench.keys;
EOF

# Every run starts from the same state: no payments or outbox events, the
# seeded keys only, vacuumed and analyzed, and no dirty buffers.
reset_state() {
	su_sql -c "SELECT bench.reset()" >/dev/null
	su_sql -c "VACUUM ANALYZE bench.payments, bench.keys, bench.outbox, idem.keys, idem.outbox, idem.runs"
	su_sql -c "CHECKPOINT"
}

# Session settings a workload needs besides the common ones.
script_options() {
	case "$1" in
		w10_*) echo "-c idem.cache_errors=23" ;;
		w13_*) echo "-c idem.outbox_notify=off" ;;
	esac
}

# run_pgbench LOG CLIENTS SYNC SECONDS SCRIPT [pgbench options...]
run_pgbench() {
	local logf=$1 c=$2 sync=$3 secs=$4 script=$5
	shift 5
	local j=$c
	[ "$j" -gt 4 ] && j=4
	run env PGOPTIONS="-c synchronous_commit=$sync -c idem.outbox_topic=payments $(script_options "$script")" \
		pgbench -n -M prepared -h "$dir" -p $port -U bench \
		-c "$c" -j "$j" -T "$secs" -D owner="$owner" -D seeds="$seeds" -D i=0 \
		-f "$bench/$script.sql" "$@" $db >"$logf" 2>&1 || true
}

# tps, average latency, transactions, aborted clients of a pgbench log
parse_pgbench() {
	awk '/^tps = / { tps = $3 }
		 /^latency average = / { lat = $4 }
		 /^number of transactions actually processed: / { n = $6 }
		 /aborted in command/ { ab++ }
		 END { printf "%.1f,%s,%s,%d\n", tps, lat, n, ab }' "$1"
}

# --- the workloads ---------------------------------------------------------
if [ -n "$workloads" ]; then
runs="$new/latest-runs.csv"
echo "round,synchronous_commit,workload_id,workload,clients,seconds,tps,latency_ms,transactions,aborted_clients,executed" >"$runs"
nworkloads=$(echo $workloads | wc -w)
nsyncs=$(echo $syncs | wc -w)
log "running $rounds round(s) x $nsyncs setting(s) x $nworkloads workload(s) x ${seconds}s"
aborted_total=0
for r in $(seq 1 "$rounds"); do
	for sync in $syncs; do
		for w in $workloads; do
			c=$clients
			[ "$w" -eq 7 ] && c=$hot_clients
			reset_state
			logf="$out/r${r}-${sync}-${scripts[$w]}.log"
			run_pgbench "$logf" "$c" "$sync" "$seconds" "${scripts[$w]}"
			IFS=, read -r tps lat n ab <<<"$(parse_pgbench "$logf")"
			executed=""
			if [ "$w" -eq 7 ]; then
				executed=$(su_sql -c "SELECT count(*) FROM bench.payments")
			fi
			# no transaction count at all: pgbench failed as a whole
			[ -z "$n" ] && ab=$c
			if [ "$ab" -gt 0 ]; then
				log "WARNING: ${names[$w]} (round $r, sync $sync): $ab client(s) aborted, see $logf"
				grep -m1 -E 'ERROR|error' "$logf" >&2 || true
				aborted_total=$((aborted_total + ab))
			fi
			echo "$r,$sync,$w,${names[$w]},$c,$seconds,$tps,$lat,$n,$ab,$executed" >>"$runs"
			log "round $r sync=$sync ${names[$w]}: $tps TPS"
		done
	done
done

# --- summary: medians, ratios, targets --------------------------------------
summary="$new/latest.csv"
targets="$new/latest-targets.csv"
awk -F, -v summary="$summary" -v targets="$targets" '
function median(list,    n, a, i, j, t) {
	n = split(list, a, " ")
	for (i = 2; i <= n; i++) {
		t = a[i] + 0
		for (j = i - 1; j >= 1 && a[j] + 0 > t; j--)
			a[j + 1] = a[j]
		a[j + 1] = t
	}
	if (n == 0) return 0
	return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function minof(list,    n, a, i, m) {
	n = split(list, a, " "); m = a[1] + 0
	for (i = 2; i <= n; i++) if (a[i] + 0 < m) m = a[i] + 0
	return m
}
function maxof(list,    n, a, i, m) {
	n = split(list, a, " "); m = a[1] + 0
	for (i = 2; i <= n; i++) if (a[i] + 0 > m) m = a[i] + 0
	return m
}
NR == 1 { next }
# a run in which clients aborted measured fewer clients: leave it out
$10 + 0 > 0 || $7 + 0 == 0 { next }
{
	k = $2 SUBSEP $3
	tps[k] = tps[k] " " $7
	lat[k] = lat[k] " " $8
	name[$3] = $4; clients[$3] = $5
	round_tps[$1, $2, $3] = $7
	if ($1 > nrounds) nrounds = $1
	seen_sync[$2] = 1; seen_w[$3] = 1
	if ($11 != "") { execd[k] += $11; txs[k] += $9 }
}
END {
	print "workload_id,workload,synchronous_commit,clients,rounds,median_tps,min_tps,max_tps,ratio_to_bare,median_latency_ms,executed_share" > summary
	for (s = 0; s < 2; s++) {
		sync = s ? "on" : "off"
		if (!(sync in seen_sync)) continue
		bare = ((sync SUBSEP 1) in tps) ? median(tps[sync, 1]) : 0
		for (w = 0; w <= 10; w++) {
			k = sync SUBSEP w
			if (!(k in tps)) continue
			m = median(tps[k])
			med[k] = m
			share = (k in txs && txs[k] > 0) ? sprintf("%.3f", execd[k] / txs[k]) : ""
			rb = (bare > 0) ? sprintf("%.2f", m / bare) : ""
			nr = split(tps[k], junk, " ")
			printf("%d,%s,%s,%d,%d,%.0f,%.0f,%.0f,%s,%.3f,%s\n", w, name[w], sync, clients[w],
				nr, m, minof(tps[k]), maxof(tps[k]), rb, median(lat[k]), share) > summary
		}
	}
	# targets: a b threshold label
	nt = split("4 2 0.9 idem new key / floor;4 3 1.7 idem new key / plpgsql;5 0 0.85 idem replay / round trip;5 6 1.1 idem replay / plpgsql replay;9 4 0.9 idem step new key / idem new key;13 2 0.9 idem new key, no NOTIFY / floor", T, ";")
	print "target,synchronous_commit,ratio_of_medians,median_of_paired_ratios,threshold,met" > targets
	for (s = 0; s < 2; s++) {
		sync = s ? "on" : "off"
		for (t = 1; t <= nt; t++) {
			split(T[t], f, " ")
			a = f[1]; b = f[2]; thr = f[3]
			label = T[t]; sub(/^[0-9]+ [0-9]+ [0-9.]+ /, "", label)
			if (!((sync SUBSEP a) in med) || !((sync SUBSEP b) in med) || med[sync, b] == 0) continue
			ratio = med[sync, a] / med[sync, b]
			pl = ""
			for (r = 1; r <= nrounds; r++)
				if (((r, sync, a) in round_tps) && ((r, sync, b) in round_tps) && round_tps[r, sync, b] > 0)
					pl = pl " " round_tps[r, sync, a] / round_tps[r, sync, b]
			met = (ratio >= thr) ? "yes" : "no"
			printf("%s >= %s,%s,%.2f,%.2f,%s,%s\n", label, thr, sync, ratio, median(pl), thr, met) > targets
		}
	}
}' "$runs"

fi

# --- bounded memory ---------------------------------------------------------
memcsv="$new/latest-memory.csv"
if [ $memory -eq 1 ]; then
	log "bounded memory: $mem_statements distinct statements through one backend"
	reset_state
	echo "statement_cache_size,statements,backend_total_bytes,idem_cache_bytes,idem_cached_statements,kept_plans,rss_anon_kb" >"$memcsv"
	# the default cache size all the way; a larger one long enough to fill
	for size in 256 1024; do
		total=$mem_statements
		[ $size -ne 256 ] && [ "$total" -gt 10000 ] && total=10000
		steps=""
		for f in 0.01 0.1 0.2 0.5 1; do
			steps="$steps $(awk -v n="$total" -v f=$f 'BEGIN { printf "%d", n * f }')"
		done
		{
			echo "SET synchronous_commit = off;"
			echo "SET idem.statement_cache_size = $size;"
			prev=1
			for s in $steps; do
				echo "CALL bench.distinct_statements('mem$size-', $prev, $s);"
				echo "SELECT $size, $s, * FROM bench.memory_usage();"
				prev=$((s + 1))
			done
		} >"$dir/memory-$size.sql"
		# each line: size,statements,total,cache,count,plans,rss
		su_sql -F, -f "$dir/memory-$size.sql" >>"$memcsv"
	done
	# statements a megabyte long, the default cache (256 entries, 32 MB):
	# what bounds it is idem.statement_cache_memory
	{
		echo "SET synchronous_commit = off;"
		prev=1
		for s in 10 50 100 200; do
			echo "CALL bench.large_statements('memlarge-', $prev, $s, 1024);"
			echo "SELECT '256/1MB', $s, * FROM bench.memory_usage();"
			prev=$((s + 1))
		done
	} >"$dir/memory-large.sql"
	su_sql -F, -f "$dir/memory-large.sql" >>"$memcsv"
	{
		echo "bounded memory: one backend running distinct SQL texts through idem_execute() (256/1MB: texts of 1 MB each, the default cache)"
		awk -F, 'NR > 1 { printf "  cache size %7s  after %7d statements: backend %7.1f MB, idem cache %6.2f MB (%d statements), kept plans %d, RssAnon %6.1f MB\n", $1, $2, $3 / 1048576, $4 / 1048576, $5, $6, $7 / 1024 }' "$memcsv"
	} >"$new/latest-memory.txt"
	[ -n "$workloads" ] || cat "$new/latest-memory.txt"
fi

# --- the report -------------------------------------------------------------
if [ -n "$workloads" ]; then
report="$new/latest.txt"
md="$new/latest.md"
{
	echo "idem benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "machine: $machine"
	echo "$version"
	echo "$load_note"
	echo "pgbench -M prepared, $clients clients (hot keys: $hot_clients), $rounds interleaved round(s) x ${seconds}s per workload and setting; median TPS (min-max)"
	echo
	awk -F, '
	NR == 1 { next }
	{ k = $1; w[k] = $2; c[k] = $4
	  t[k, $3] = sprintf("%8d (%d-%d)", $6, $7, $8); r[k, $3] = $9
	  if ($11 != "") x[k] = $11 }
	END {
		printf "%-17s %-8s %-26s %-7s %-26s %-7s\n", "workload", "clients", "sync=off TPS", "x bare", "sync=on TPS", "x bare"
		for (i = 0; i <= 13; i++) if (i in w)
			printf "%-17s %-8s %-26s %-7s %-26s %-7s%s\n", i " " w[i], c[i], t[i, "off"], r[i, "off"], t[i, "on"], r[i, "on"],
				(i in x) ? "  (share executed " x[i] ")" : ""
	}' "$summary"
	echo
	echo "targets (ratio of median TPS; median of per-round paired ratios in brackets)"
	awk -F, 'NR > 1 { printf "  sync=%-3s %-40s %5s  [%s]  %s\n", $2, $1, $3, $4, ($6 == "yes") ? "met" : "NOT met" }' "$targets"
	if [ -s "$new/latest-memory.txt" ]; then
		echo
		cat "$new/latest-memory.txt"
	fi
	if [ $aborted_total -gt 0 ]; then
		echo
		echo "WARNING: runs in which pgbench clients aborted are left out of the medians above:"
		awk -F, 'NR > 1 && $10 > 0 { printf "  round %s sync=%s %s: %s of %s clients aborted\n", $1, $2, $4, $10, $5 }' "$runs"
		grep -h -m1 'aborted in command' "$out"/r*.log | sort | uniq -c | sed 's/^/  /' | head -n 3
	fi
	true
} | tee "$report"

{
	echo "| workload | clients | sync=off TPS (min-max) | x bare | sync=on TPS (min-max) | x bare |"
	echo "|---|---|---|---|---|---|"
	awk -F, 'NR > 1 { k = $1; w[k] = $2; c[k] = $4; t[k, $3] = sprintf("%d (%d-%d)", $6, $7, $8); r[k, $3] = $9 }
	END { for (i = 0; i <= 13; i++) if (i in w)
		printf "| %d %s | %s | %s | %s | %s | %s |\n", i, w[i], c[i], t[i, "off"], r[i, "off"], t[i, "on"], r[i, "on"] }' "$summary"
	echo
	echo "| target (synchronous_commit=off unless noted) | threshold | measured | paired | met |"
	echo "|---|---|---|---|---|"
	awk -F, 'NR > 1 { split($1, a, " >= "); printf "| %s%s | %s | %s | %s | %s |\n", a[1], ($2 == "on") ? " (sync on)" : "", $5, $3, $4, $6 }' "$targets"
} >"$md"

# --- the chart --------------------------------------------------------------
files="" settings=""
for sync in $syncs; do
	awk -F, -v s=$sync 'NR > 1 && $3 == s { printf "\"%s\" %s %s %s\n", $2, $6, $7, $8 }' \
		"$summary" >"$out/chart-$sync.dat"
	files="$files $out/chart-$sync.dat"
	settings="$settings $sync"
done
gnuplot -e "files='$files'; settings='$settings'; outfile='$new/latest.png'" \
	-e "sub1='$(echo "$machine" | sed "s/, fdatasync.*//" | tr -d "'")'" \
	-e "sub2='$(echo "$machine" | sed -n "s/.*, \(fdatasync.*\)/\1/p" | tr -d "'"); $clients clients (hot keys $hot_clients); $rounds round(s) x ${seconds}s; bars: median, whiskers: min-max'" \
	"$bench/chart.gp"

fi

# --- scale: a 10M-key catalog and a purge under load --------------------------
# Two databases in the same cluster, interleaved: one whose catalog starts
# empty for every run, one holding $scale_keys live key records.
if [ $scale -eq 1 ]; then
	scalecsv="$new/latest-scale.csv"
	scaletxt="$new/latest-scale.txt"
	for d in scale_empty scale_full; do
		psql_as postgres -d postgres -c "CREATE DATABASE $d"
		psql_as postgres -d $d -f "$bench/schema.sql" >/dev/null
	done
	# Pre-load the catalog directly, in key order (a sorted load keeps the
	# primary key build fast; the keys themselves are random UUIDs, so the
	# workload's new keys land all over the index, as in production).
	load_keys() {				# database count expires_at-expression label
		log "loading $2 $4 key records into $1"
		psql_as postgres -d "$1" <<EOF
SET work_mem = '1GB';
SET synchronous_commit = off;
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT k, $owner, sha256(convert_to(k, 'UTF8')),
	   jsonb_build_object('rows', jsonb_build_array(jsonb_build_object('id', 1, 'amount', 1.00, 'invoice', 'inv-1')),
						  'command', 'INSERT', 'rowcount', 1),
	   now() - interval '1 day', $3, 2
  FROM (SELECT gen_random_uuid()::text AS k FROM generate_series(1, $2)) s
 ORDER BY k;
VACUUM ANALYZE idem.keys;
CHECKPOINT;
EOF
	}
	t0=$(date +%s)
	load_keys scale_full "$scale_keys" "now() + interval '30 days'" live
	log "loaded in $(( $(date +%s) - t0 ))s"

	echo "round,catalog,keys_before,tps,latency_ms,aborted_clients" >"$scalecsv"
	for r in $(seq 1 "$scale_rounds"); do
		for d in scale_empty scale_full; do
			if [ $d = scale_empty ]; then
				psql_as postgres -d $d -c "TRUNCATE idem.keys, idem.outbox, bench.payments"
			else
				psql_as postgres -d $d -c "TRUNCATE idem.outbox, bench.payments"
			fi
			psql_as postgres -d $d -c "VACUUM ANALYZE idem.keys, idem.outbox, bench.payments"
			psql_as postgres -d $d -c "CHECKPOINT"
			nkeys=$(psql_as postgres -d $d -c "SELECT count(*) FROM idem.keys")
			logf="$out/scale-r$r-$d.log"
			db=$d run_pgbench "$logf" "$clients" off "$scale_seconds" w4_idem_new_key
			IFS=, read -r tps lat n ab <<<"$(parse_pgbench "$logf")"
			echo "$r,$d,$nkeys,$tps,$lat,$ab" >>"$scalecsv"
			log "scale round $r $d ($nkeys keys): $tps TPS"
		done
	done

	# Purge expired records while the new-key workload runs, once for each
	# autovacuum setting asked for: the purge's deletes make autovacuum
	# visit idem.keys, which is part of what a purge costs in production.
	for av in $purge_autovacuum; do
		t0=$(date +%s)
		load_keys scale_full "$purge_keys" "now() - interval '1 hour'" expired
		log "loaded in $(( $(date +%s) - t0 ))s"
		psql_as postgres -d scale_full -c "TRUNCATE idem.outbox, bench.payments"
		if [ "$av" = off ]; then
			psql_as postgres -d scale_full -c "ALTER TABLE idem.keys SET (autovacuum_enabled = off)"
		else
			psql_as postgres -d scale_full -c "ALTER TABLE idem.keys RESET (autovacuum_enabled)"
		fi
		psql_as postgres -d scale_full -c "VACUUM ANALYZE idem.keys"
		psql_as postgres -d scale_full -c "CHECKPOINT"
		av0=$(psql_as postgres -d scale_full -c "SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables WHERE relid = 'idem.keys'::regclass")
		logf="$out/scale-purge-autovacuum-$av.log"
		start=$(date +%s.%N)
		db=scale_full run_pgbench "$logf" "$clients" off 3600 w4_idem_new_key --progress=1 &
		pgbench_pid=$!
		sleep 15
		purge_start=$(date +%s.%N)
		psql_as postgres -d scale_full >"$out/scale-purge-batches-$av.log" 2>&1 <<'EOF'
DO $$
DECLARE
	n bigint;
	total bigint := 0;
	batches int := 0;
BEGIN
	LOOP
		n := idem_purge(10000);
		total := total + n;
		batches := batches + 1;
		RAISE NOTICE 'batch % at %: % deleted', batches, clock_timestamp(), n;
		COMMIT;
		EXIT WHEN n = 0;
	END LOOP;
	RAISE NOTICE 'purged % records in % batches', total, batches;
END
$$;
EOF
		purge_end=$(date +%s.%N)
		sleep 15
		# Stop the pgbench we started (under runuser when we are root, so
		# it is a child or grandchild of $pgbench_pid), by its own pid.
		pkid=$(pgrep -P "$pgbench_pid" -x pgbench || true)
		if [ -z "$pkid" ]; then
			for c in $(pgrep -P "$pgbench_pid" || true); do
				pkid=$(pgrep -P "$c" -x pgbench || true)
				[ -n "$pkid" ] && break
			done
		fi
		# (SIGTERM: a background job of a script ignores SIGINT)
		[ -n "$pkid" ] && kill -TERM $pkid
		wait $pgbench_pid || true
		left=$(psql_as postgres -d scale_full -c "SELECT count(*) FROM idem.keys WHERE expires_at <= now()")
		purged=$(sed -n 's/.*purged \([0-9]*\) records.*/\1/p' "$out/scale-purge-batches-$av.log")
		avruns=$(psql_as postgres -d scale_full -c "SELECT autovacuum_count + autoanalyze_count - $av0 FROM pg_stat_user_tables WHERE relid = 'idem.keys'::regclass")
		{
			echo "purge with autovacuum of idem.keys $av: $purged expired records deleted by idem_purge(10000) in a loop" \
				"($(awk -v n="${purged:-0}" -v a="$purge_start" -v b="$purge_end" 'BEGIN { printf "%.0f", n / (b - a) }') records/s)" \
				"while the new-key workload ran; $left expired left; $avruns autovacuum/autoanalyze run(s) of idem.keys meanwhile"
			awk -v s="$start" -v ps="$purge_start" -v pe="$purge_end" '
				/^progress: / { t = $2 + 0; v = $4 + 0; last = t
					# the line at t covers the second (t-1, t] after start
					if (t > 5 && s + t <= ps) { bn++; bs += v }
					else if (s + t > ps && s + t - 1 < pe) { dn++; ds += v; if (dn == 1 || v < dmin) { dmin = v; dmt = t } }
					else if (s + t - 1 >= pe && s + t - 1 < pe + 14) { an++; as += v } }
				END {
					printf "  purge from %.0f s after the workload started, for %.1f s; progress reported until %d s\n", ps - s, pe - ps, last
					if (bn) printf "  TPS before the purge: %.0f (mean of %d s)\n", bs / bn, bn
					if (dn) printf "  TPS during the purge: %.0f mean, %.0f worst second (at %d s): dip %.0f%% mean, %.0f%% worst second\n", ds / dn, dmin, dmt, 100 * (1 - ds / dn / (bs / bn)), 100 * (1 - dmin / (bs / bn))
					if (an) printf "  TPS after the purge: %.0f (mean of %d s)\n", as / an, an
				}' "$logf"
			if grep -q 'aborted in command' "$logf"; then
				echo "  WARNING: $(grep -c 'aborted in command' "$logf") of $clients clients aborted during this run:"
				grep -m1 'aborted in command' "$logf" | sed 's/^/    /'
			fi
		} >>"$out/purge-summary.txt"
	done
	psql_as postgres -d scale_full -c "ALTER TABLE idem.keys RESET (autovacuum_enabled)"
	{
		echo "idem benchmark --scale, $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "machine: $machine"
		echo "$version"
		echo "scale: idem new key ($clients clients, synchronous_commit=off, ${scale_seconds}s x $scale_rounds interleaved rounds)"
		awk -F, 'NR > 1 && $6 == 0 { tps[$2] = tps[$2] " " $4; k[$2] = k[$2] " " $3; r[$1, $2] = $4; if ($1 > nr) nr = $1 }
			function med(l,  n, a, i, j, t) { n = split(l, a, " ")
				for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
				return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
			END { e = med(tps["scale_empty"]); f = med(tps["scale_full"])
				for (i = 1; i <= nr; i++)
					if (((i, "scale_empty") in r) && ((i, "scale_full") in r))
						pl = pl sprintf(" %.2f", r[i, "scale_full"] / r[i, "scale_empty"])
				printf "  empty catalog:           median %.0f TPS (runs:%s)\n", e, tps["scale_empty"]
				n = split(k["scale_full"], kk, " ")
				printf "  catalog of %d-%d keys: median %.0f TPS (runs:%s)\n", kk[1], kk[n], f, tps["scale_full"]
				printf "  ratio full/empty: %.2f of medians, %.2f median of the paired rounds (%s); target >= 0.8: %s\n",
					f / e, med(pl), substr(pl, 2), (f / e >= 0.8 && med(pl) >= 0.8) ? "met" : "NOT met" }' "$scalecsv"
		cat "$out/purge-summary.txt"
	} | tee "$scaletxt"
fi

# --- profile: instructions per transaction under callgrind ----------------------
# Deterministic where TPS is noisy: the cluster is restarted under
# valgrind --tool=callgrind, each workload runs twice in a fresh session
# (1 client, prof_short and prof_long transactions), and the difference of
# the two backends' instruction counts divided by the difference of their
# transaction counts is the server's cost of one transaction, start-up
# excluded.  The same difference per function shows what dominates.
if [ $profile -eq 1 ]; then
	if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
		log "--profile needs valgrind (apt-get install valgrind); skipped"
	else
		log "profile: restarting the cluster under callgrind"
		prof="$new/latest-profile.txt"
		# a subset of the workloads does not replace the full profile
		[ "$profile_workloads" = "$default_profile_workloads" ] ||
			prof="$new/latest-profile-subset.txt"
		run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null
		mkdir -p "$dir/cg"
		[ "$(id -u)" -eq 0 ] && chown postgres: "$dir/cg"
		run bash -c "cd '$dir/cg' && exec valgrind --tool=callgrind --trace-children=yes \
			--callgrind-out-file='$dir/cg/cg.%p' postgres -D '$dir/data' -c autovacuum=off" \
			>"$dir/valgrind.log" 2>&1 &
		valgrind_pid=$!
		for i in $(seq 1 120); do
			run pg_isready -q -h "$dir" -p $port && break
			sleep 1
		done
		# wait until the postmaster has no children but its own auxiliary
		# processes (callgrind writes a backend's profile as it exits)
		pm=$(head -n1 "$dir/data/postmaster.pid")
		sleep 5
		aux=$(pgrep -c -P "$pm" || true)
		quiesce() {
			for i in $(seq 1 120); do
				[ "$(pgrep -c -P "$pm" || true)" -le "$aux" ] && return 0
				sleep 0.5
			done
			log "profile: backends still running after 60 s"
		}
		prof_short=300
		prof_long=1500
		. "$top/bench/callgrind.sh"
		{
			echo "idem benchmark --profile, $(date -u '+%Y-%m-%d %H:%M UTC')"
			echo "machine: $machine"
			echo "$version"
			echo "instructions per transaction in the server backend (callgrind; pgbench -M prepared, 1 client;"
			echo "difference of a ${prof_long}- and a ${prof_short}-transaction session, so connection start-up is excluded)"
			echo
		} >"$prof"
		for w in $profile_workloads; do
			declare -A pf=()
			for n in $prof_short $prof_long; do
				su_sql -c "SELECT bench.reset()" >/dev/null
				su_sql -c "VACUUM ANALYZE bench.payments, bench.keys, bench.outbox, idem.keys, idem.outbox, idem.runs"
				# with only the server's own processes left, the profiles
				# written after pgbench are those of its connections
				quiesce
				before=$(ls "$dir/cg" | sort)
				run env PGOPTIONS="-c synchronous_commit=off -c idem.outbox_topic=payments $(script_options "${scripts[$w]}")" \
					pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -t $n \
					-D owner="$owner" -D seeds="$seeds" -D i=0 -f "$bench/${scripts[$w]}.sql" $db \
					>"$out/profile-${scripts[$w]}-$n.log" 2>&1
				quiesce
				# pgbench's own short set-up connection leaves a profile too:
				# the client's backend is the one that did the most work
				f=""
				best=0
				for c in $(comm -13 <(echo "$before") <(ls "$dir/cg" | sort) | grep '^cg\.'); do
					v=$(sed -n 's/^summary: //p' "$dir/cg/$c")
					if [ "${v:-0}" -gt "$best" ]; then
						best=$v
						f="$dir/cg/$c"
					fi
				done
				pf[$n]=$f
			done
			a=$(sed -n 's/^summary: //p' "${pf[$prof_short]}")
			b=$(sed -n 's/^summary: //p' "${pf[$prof_long]}")
			ir[$w]=$(( (b - a) / (prof_long - prof_short) ))
			log "profile ${names[$w]}: ${ir[$w]} instructions per transaction"
			cp "${pf[$prof_long]}" "$out/callgrind-${scripts[$w]}.out"
			if [ "$w" -eq 4 ] || [ "$w" -eq 5 ] || [ "$w" -eq 9 ] || [ "$w" -eq 12 ]; then
				{
					echo "--- ${names[$w]}: inclusive instructions per transaction, by function"
					join -t "$(printf '\t')" -1 2 -2 2 -o 0,1.1,2.1 \
						<(callgrind_inclusive "${pf[$prof_short]}") <(callgrind_inclusive "${pf[$prof_long]}") |
					awk -F'\t' -v n=$((prof_long - prof_short)) -v tot="${ir[$w]}" '
						$1 !~ /^(\?\?\?:0x|=>|\.\/|PROGRAM|\?\?\?:\(below|\?\?\?:main|\?\?\?:PostmasterMain)/ {
							d = ($3 - $2) / n; if (d >= tot / 100) printf "%8.0f %5.1f%%  %s\n", d, 100 * d / tot, $1 }' |
					# sed, not head: reading to the end spares sort a SIGPIPE,
					# which pipefail turned into the end of the whole run
					sort -rn | sed -n '1,40p'
					echo
				} >>"$out/profile-functions.txt"
			fi
		done
		run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null || true
		wait "$valgrind_pid" || true
		{
			printf "%-22s %12s %10s\n" workload "instr/tx" "x round trip"
			for w in $profile_workloads; do
				printf "%-22s %12d %10s\n" "$w ${names[$w]}" "${ir[$w]}" "$(awk -v a="${ir[$w]}" -v b="${ir[0]:-0}" 'BEGIN { print (b > 0 ? sprintf("%.2f", a / b) : "-") }')"
			done
			echo
			awk -v a="${ir[4]:-0}" -v b="${ir[2]:-0}" -v c="${ir[3]:-0}" -v d="${ir[5]:-0}" -v e="${ir[0]:-0}" -v f="${ir[6]:-0}" -v g="${ir[8]:-0}" -v h="${ir[9]:-0}" '
			function r(x, y) { return y > 0 ? sprintf("%.2f", x / y) : "-" }
			BEGIN {
				printf "instruction ratios (lower is cheaper): idem new key / floor %s, / plpgsql %s;\n", r(a, b), r(a, c)
				printf "idem replay / round trip %s, / replay call shape %s, / plpgsql replay %s\n", r(d, e), r(d, g), r(d, f)
				printf "idem step new key / idem new key %s\n", r(h, a) }'
			echo
			cat "$out/profile-functions.txt"
		} >>"$prof"
		cat "$prof"
	fi
fi

cp "$new"/* "$res"/
log "results in $res (raw logs in $out)"
