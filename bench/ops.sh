#!/usr/bin/env bash
#
# idem operations benchmark (issue 11): what stats, the audit trail and the
# purge worker cost, on one throwaway PostgreSQL 15 cluster (Unix socket).
#
#   bench/ops.sh                 # ~12 minutes
#   bench/ops.sh --help
#
# Configurations, compared within the same run:
#   plain      idem not preloaded: no shared memory, no stats, no worker
#   stats      shared_preload_libraries = 'idem': stats on, idem.audit = off
#   executions preloaded, idem.audit = executions
#   all        preloaded, idem.audit = all
# Workloads: 4 (idem new key) and 5 (idem replay) of run.sh, 4 clients,
# pgbench -M prepared, synchronous_commit off and on, interleaved rounds,
# median TPS and the ratio to "plain" (stats) or to "stats" (audit levels).
# --profile (default on) also counts the server's instructions per
# transaction under callgrind for plain, stats and executions.
# The purge dip: 1M expired keys purged by the worker (idem.purge_batch_size
# 10000) while workload 4 runs with --progress=1: TPS before, during, after.
#
# Results: bench/results/latest-ops.txt and latest-ops.csv; raw logs in
# bench/out/ (not in git).
#
set -euo pipefail

bench=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$bench/.." && pwd)

rounds=3
seconds=8
clients=4
seeds=10000
syncs="off on"
profile=1
purge_keys=1000000
purge_seconds=60
install=1

usage() {
	cat <<EOF
usage: $0 [options]
  --rounds N        interleaved rounds (default $rounds)
  --seconds S       pgbench duration of each run (default $seconds)
  --sync "L"        synchronous_commit settings (default "$syncs")
  --no-profile      skip the callgrind instruction counts
  --purge-keys N    expired keys for the purge dip (default $purge_keys; 0 skips it)
  --purge-seconds S length of the purge-dip run (default $purge_seconds)
  --no-install      do not build and install idem first
EOF
}

while [ $# -gt 0 ]; do
	case "$1" in
		--rounds) rounds=$2; shift ;;
		--seconds) seconds=$2; shift ;;
		--sync) syncs=$2; shift ;;
		--no-profile) profile=0 ;;
		--purge-keys) purge_keys=$2; shift ;;
		--purge-seconds) purge_seconds=$2; shift ;;
		--no-install) install=0 ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

"$top/scripts/deps.sh"
. "$top/scripts/env.sh"
[ $install -eq 1 ] && idem_build_install "$top"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$bench/out/ops-$stamp"
res="$bench/results"
mkdir -p "$out" "$res"
[ "$(id -u)" -eq 0 ] && chown postgres: "$out"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/run.log" >&2; }

port=5496
db=idem_bench
idem_throwaway_cluster bench-ops
cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
max_connections = 50
shared_buffers = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
idem.purge_interval = 3600
idem.purge_batch_size = 10000
EOF

preloaded=""
# start (or restart) the server with or without idem preloaded
server() {
	local want=$1
	[ "$preloaded" = "$want" ] && return 0
	run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null 2>&1 || true
	if [ "$want" = yes ]; then
		run pg_ctl -D "$dir/data" -l "$dir/server.log" -w \
			-o "-c shared_preload_libraries=idem" start >/dev/null
	else
		run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
	fi
	preloaded=$want
}

psql_as() {
	local user=$1; shift
	run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U "$user" "$@"
}
su_sql() { psql_as postgres -d $db "$@"; }
bench_sql() { psql_as bench -d $db "$@"; }

server no
psql_as postgres -d postgres -c "CREATE DATABASE $db"
su_sql -f "$bench/schema.sql" >/dev/null
owner=$(su_sql -c "SELECT 'bench'::regrole::oid")
biz_sql='INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount'

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
machine="$(nproc) vCPU ($cpu), Linux $(uname -r), PostgreSQL $(su_sql -c 'SHOW server_version')"
rev=$(git -c safe.directory="$top" -C "$top" rev-parse --short HEAD 2>/dev/null || echo "?")
git -C "$top" diff --quiet HEAD -- src 2>/dev/null || rev="$rev+uncommitted src changes"
log "$machine; idem at $rev"

log "seeding $seeds keys"
bench_sql <<EOF
DO \$\$
BEGIN
	FOR i IN 1 .. $seeds LOOP
		PERFORM idem_execute('seed-' || i, '$biz_sql', 'inv-' || i, i::numeric);
		IF i % 1000 = 0 THEN
			COMMIT;
		END IF;
	END LOOP;
END
\$\$;
EOF
su_sql -c "INSERT INTO bench.idem_seed SELECT * FROM idem.keys"

reset_state() {
	su_sql -c "SELECT bench.reset()" >/dev/null
	su_sql -c "TRUNCATE idem.audit"
	su_sql -c "VACUUM ANALYZE bench.payments, idem.keys, idem.outbox, idem.audit"
	su_sql -c "CHECKPOINT"
}

# set the configuration: server restart only between plain and the others
configure() {
	case $1 in
		plain) server no; su_sql -c "ALTER ROLE bench RESET idem.audit" ;;
		stats) server yes; su_sql -c "ALTER ROLE bench SET idem.audit = off" ;;
		executions) server yes; su_sql -c "ALTER ROLE bench SET idem.audit = executions" ;;
		all) server yes; su_sql -c "ALTER ROLE bench SET idem.audit = 'all'" ;;
	esac
}

wname() { [ "$1" = w4_idem_new_key ] && echo "new key" || echo "replay"; }

configs="plain stats executions all"
csv="$out/latest-ops.csv"
echo "round,synchronous_commit,config,workload,tps" >"$csv"
log "TPS: $rounds round(s) x ${seconds}s, configurations: $configs"
for r in $(seq 1 "$rounds"); do
	for c in $configs; do
		configure "$c"
		for sync in $syncs; do
			for w in w4_idem_new_key w5_idem_replay; do
				reset_state
				logf="$out/r$r-$c-$sync-$w.log"
				run env PGOPTIONS="-c synchronous_commit=$sync" \
					pgbench -n -M prepared -h "$dir" -p $port -U bench \
					-c $clients -j $clients -T "$seconds" -D owner="$owner" -D seeds="$seeds" \
					-f "$bench/$w.sql" $db >"$logf" 2>&1 || true
				tps=$(awk '/^tps = / { printf "%.1f", $3 }' "$logf")
				echo "$r,$sync,$c,$(wname $w),${tps:-0}" >>"$csv"
				log "round $r $c sync=$sync $(wname $w): $tps TPS"
			done
		done
	done
done
# the audit levels really wrote: one entry per call of the last run
entries=$(su_sql -c "SELECT count(*) FROM idem.audit")
log "audit entries after the last run (audit = all, replay): $entries"

report="$out/latest-ops.txt"
{
	echo "idem operations benchmark, $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "machine: $machine; idem at $rev"
	echo "pgbench -M prepared, $clients clients, ${seconds}s runs, $rounds interleaved rounds; median TPS"
	echo "ratio: stats / plain; executions and all / stats (the audit's own cost)"
	echo
	for sync in $syncs; do
		for wl in "new key" "replay"; do
			awk -F, -v s="$sync" -v w="$wl" '
				function med(list,   a, n, i, j, t) {
					n = split(substr(list, 2), a, " ")
					for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
						if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
					return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
				NR > 1 && $2 == s && $4 == w { v[$3] = v[$3] " " $5 }
				END {
					p = med(v["plain"]); st = med(v["stats"]); e = med(v["executions"]); a = med(v["all"])
					printf "sync=%-3s %-8s plain %8.0f | stats %8.0f (%.3f) | executions %8.0f (%.3f) | all %8.0f (%.3f)\n",
						s, w, p, st, st / p, e, e / st, a, a / st
					printf "         runs: plain%s; stats%s; executions%s; all%s\n", v["plain"], v["stats"], v["executions"], v["all"] }' "$csv"
		done
	done
	echo
} >"$report"
cat "$report"

# --- instructions per transaction under callgrind ---------------------------
if [ $profile -eq 1 ]; then
	if ! command -v valgrind >/dev/null; then
		log "--profile needs valgrind (apt-get install valgrind); skipped"
	else
		run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null
		preloaded=""
		mkdir -p "$dir/cg"
		[ "$(id -u)" -eq 0 ] && chown postgres: "$dir/cg"
		echo "instructions per transaction in the server backend (callgrind; 1 client; difference of a 1500- and a 300-transaction session)" >>"$report"
		for c in plain stats executions; do
			extra=""
			[ "$c" != plain ] && extra="-c shared_preload_libraries=idem"
			run bash -c "cd '$dir/cg' && exec valgrind --tool=callgrind --trace-children=yes \
				--callgrind-out-file='$dir/cg/cg.%p' postgres -D '$dir/data' -c autovacuum=off $extra" \
				>"$dir/valgrind-$c.log" 2>&1 &
			vpid=$!
			for i in $(seq 1 120); do
				run pg_isready -q -h "$dir" -p $port && break
				sleep 1
			done
			sleep 5
			# callgrind writes a backend's profile as it exits: wait until
			# only the server's own processes are left
			pm=$(head -n1 "$dir/data/postmaster.pid")
			aux=$(pgrep -c -P "$pm" || true)
			quiesce() {
				for i in $(seq 1 120); do
					[ "$(pgrep -c -P "$pm" || true)" -le "$aux" ] && return 0
					sleep 0.5
				done
				log "profile: backends still running after 60 s"
			}
			case $c in
				plain) su_sql -c "ALTER ROLE bench RESET idem.audit" ;;
				stats) su_sql -c "ALTER ROLE bench SET idem.audit = off" ;;
				executions) su_sql -c "ALTER ROLE bench SET idem.audit = executions" ;;
			esac
			for w in w4_idem_new_key w5_idem_replay; do
				declare -A cnt=()
				for n in 300 1500; do
					su_sql -c "SELECT bench.reset()" >/dev/null
					quiesce
					before=$(ls "$dir/cg" | sort)
					run env PGOPTIONS="-c synchronous_commit=off" \
						pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -t $n \
						-D owner="$owner" -D seeds="$seeds" -f "$bench/$w.sql" $db \
						>"$out/profile-$c-$w-$n.log" 2>&1
					quiesce
					best=0
					for f in $(comm -13 <(echo "$before") <(ls "$dir/cg" | sort) | grep '^cg\.'); do
						v=$(sed -n 's/^summary: //p' "$dir/cg/$f")
						[ "${v:-0}" -gt "$best" ] && best=$v
					done
					cnt[$n]=$best
				done
				ir=$(( (cnt[1500] - cnt[300]) / 1200 ))
				echo "profile,$c,$(wname $w),$ir" >>"$csv"
				log "profile $c $(wname $w): $ir instructions per transaction"
			done
			run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null || true
			wait "$vpid" || true
		done
		awk -F, '$1 == "profile" { ir[$2 "," $3] = $4 }
			END {
				for (i = 1; i <= 2; i++) {
					w = i == 1 ? "new key" : "replay"
					p = ir["plain," w]; s = ir["stats," w]; e = ir["executions," w]
					printf "  %-8s plain %7d | stats %7d (%+.2f%%) | executions %7d (%+.2f%% over stats)\n",
						w, p, s, 100 * (s - p) / p, e, 100 * (e - s) / s }
			}' "$csv" >>"$report"
		echo >>"$report"
	fi
fi

# --- the purge dip: the worker purges 1M expired keys under load -------------
if [ "$purge_keys" -gt 0 ]; then
	server yes
	su_sql -c "ALTER ROLE bench RESET idem.audit"
	reset_state
	log "purge dip: loading $purge_keys expired keys"
	su_sql -c "INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
		SELECT 'exp-' || g, 'bench', '\\x00', '{}', now() - interval '2 days', now() - interval '1 day', 2
		  FROM generate_series(1, $purge_keys) g"
	su_sql -c "VACUUM ANALYZE idem.keys"
	su_sql -c "CHECKPOINT"
	plog="$out/purge-pgbench.log"
	run env PGOPTIONS="-c synchronous_commit=off" \
		pgbench -n -M prepared -h "$dir" -p $port -U bench -c $clients -j $clients \
		-T "$purge_seconds" --progress=1 -D owner="$owner" -D seeds="$seeds" \
		-f "$bench/w4_idem_new_key.sql" $db >"$plog" 2>&1 &
	pg=$!
	sleep 10
	t0=$(date +%s.%N)
	# the launcher wakes on the reload and starts a cycle at once
	sed -i 's/^idem.purge_interval = 3600$/idem.purge_interval = 1/' "$dir/data/postgresql.conf"
	su_sql -c "SELECT pg_reload_conf()" >/dev/null
	while [ "$(su_sql -c "SELECT count(*) FROM idem.keys WHERE key LIKE 'exp-%'")" -gt 0 ]; do
		sleep 0.5
	done
	t1=$(date +%s.%N)
	wait $pg || true
	sed -i 's/^idem.purge_interval = 1$/idem.purge_interval = 3600/' "$dir/data/postgresql.conf"
	dur=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
	purged=$(su_sql -c "SELECT purged_keys FROM idem_stats WHERE datname = current_database()")
	# progress lines: "progress: 12.0 s, 1234.5 tps, ..." (stderr)
	awk -v s=10 -v d="$dur" -v k="$purge_keys" -v p="$purged" '
		/^progress: / { t = $2 + 0; v = $4 + 0
			if (t <= s) { b += v; nb++ }
			else if (t <= s + d) { du += v; nd++; if (min == "" || v < min) min = v }
			else { a += v; na++ } }
		END {
			printf "purge dip: the worker purged %d expired keys (idem_stats.purged_keys %s) in %.1f s (%.0f keys/s), batches of 10000,\n", k, p, d, k / d
			if (!nd) { du = 0; nd = 1; min = 0 }
			printf "  while workload 4 (new key, 4 clients, synchronous_commit=off) ran: TPS before %.0f, during %.0f (worst second %.0f, %.2f of before), after %.0f\n",
				b / nb, du / nd, min, min / (b / nb), (na ? a / na : 0) }' "$plog" | tee -a "$report"
fi

cp "$report" "$csv" "$res"/
log "results in $res/latest-ops.txt and latest-ops.csv (raw logs in $out)"
