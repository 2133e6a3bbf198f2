#!/usr/bin/env bash
#
# Outbox delivery benchmark (issues 10 and 24): idem's outbox against the
# two designs a user would pick instead, the lean hand-written queue
# (bench.q, schema.sql) and pgmq 1.5.1 (built from the vendored source if
# it is not installed), on one throwaway cluster on a Unix socket.
#
#   bench/outbox/run.sh                      # paired rounds (~6 minutes)
#   bench/outbox/run.sh --profile            # + callgrind instructions per event
#   bench/outbox/run.sh --sustained 600      # + a 10-minute run, idem and lean side by side
#   bench/outbox/run.sh --help
#
# Paired rounds: each round runs every design for --seconds with
# --consumers clients (pgbench -M prepared), claim in one transaction and
# ack in the next, in an order that rotates from round to round, each from
# the same state (its queue topped up to --backlog pending events,
# vacuumed, analyzed, checkpointed); the ratios are medians over rounds of
# the per-round ratios.  Workloads: batches of --batch (claim, then one
# batch ack / DELETE ... USING unnest / pgmq.delete(array)) and single
# events (claim one, ack it / DELETE it / pgmq.delete(id)).  idem runs with
# its defaults and, as "idem_keep", with idem.outbox_keep_delivered = on.
#
# --profile restarts the cluster under valgrind --tool=callgrind and counts
# the server backend's instructions per event for each consumer script
# (the difference of a long and a short session, so start-up cancels out).
#
# --sustained S: idem and the lean queue at the same time, --consumers
# each, a producer each at --rate calls/s (idem_execute() with
# idem.outbox_topic; the lean producer's INSERT ... RETURNING into an
# INSERT), idem_outbox_purge() every second, autovacuum on; events/s per
# minute, the first and the last minute, table and index sizes at the end.
#
# Results: bench/outbox/results/latest.txt (and latest-profile.txt,
# latest-sustained.txt); pgbench logs in bench/outbox/out/ (not in git).
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

rounds=3
seconds=15
consumers=4
batch=10
backlog=300000
workloads="batch single"
designs="idem lean pgmq idem_keep"
profile=0
sustained=0
rate=200
naptime=""
port=5496
install=1

usage() {
	cat <<USAGE
usage: $0 [options]
  --rounds N       paired rounds (default $rounds; 0: none)
  --seconds S      seconds per design and round (default $seconds)
  --consumers N    consumer clients (default $consumers)
  --backlog N      pending events each queue is topped up to before a run (default $backlog)
  --workloads "L"  any of batch single (default "$workloads")
  --designs "L"    any of idem lean pgmq idem_keep (default "$designs")
  --profile        also count instructions per event under callgrind
  --sustained S    also run idem and the lean queue side by side for S seconds
  --rate R         producer calls per second in the sustained run (default $rate)
  --naptime T      the cluster's autovacuum_naptime (default PostgreSQL's, 1min)
  --sustained-backlog N  pending events each design starts the sustained run with
                   (default 12000 per second of the run: more than its consumers deliver;
                   a quiet 2-core machine delivers about 6,500 events/s per design)
  --port P         the throwaway cluster's port (default $port)
  --no-install     do not build and install idem first
USAGE
}

while [ $# -gt 0 ]; do
	case "$1" in
		--rounds) rounds=$2; shift ;;
		--seconds) seconds=$2; shift ;;
		--consumers) consumers=$2; shift ;;
		--backlog) backlog=$2; shift ;;
		--workloads) workloads=$2; shift ;;
		--designs) designs=$2; shift ;;
		--profile) profile=1 ;;
		--sustained) sustained=$2; shift ;;
		--rate) rate=$2; shift ;;
		--naptime) naptime=$2; shift ;;
		--sustained-backlog) sustained_backlog=$2; shift ;;
		--port) port=$2; shift ;;
		--no-install) install=0 ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

"$top/scripts/deps.sh"
. "$top/scripts/env.sh"
[ $install -eq 1 ] && idem_build_install "$top"

# pgmq, from the vendored release, unless this installation has it
if [ ! -f "$(pg_config --sharedir)/extension/pgmq--1.5.1.sql" ]; then
	tarball="$top/../shared/vendor/pgmq-1.5.1.tar.gz"
	[ -f "$tarball" ] || tarball=/work/shared/vendor/pgmq-1.5.1.tar.gz
	src=$(mktemp -d /tmp/pgmq-build.XXXXXX)
	tar -C "$src" -xzf "$tarball"
	make -s -C "$src/pgmq-1.5.1/pgmq-extension" PG_CONFIG="$PG_CONFIG" >/dev/null
	if [ "$(id -u)" -eq 0 ]; then
		make -s -C "$src/pgmq-1.5.1/pgmq-extension" PG_CONFIG="$PG_CONFIG" install >/dev/null
	else
		sudo -n make -s -C "$src/pgmq-1.5.1/pgmq-extension" PG_CONFIG="$PG_CONFIG" install >/dev/null
	fi
	rm -rf "$src"
fi

stamp=$(date -u +%Y%m%dT%H%M%SZ)
out="$here/out/$stamp"
res="$here/results"
mkdir -p "$out" "$res"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/run.log" >&2; }

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
shared_preload_libraries = 'idem'
CONF
[ -z "$naptime" ] || echo "autovacuum_naptime = '$naptime'" >>"$dir/data/postgresql.conf"
start_server() { run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null; }
start_server
su_sql() { run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U postgres -d $db "$@"; }
run psql -X -q -h "$dir" -p $port -U postgres -d postgres -c "CREATE DATABASE $db"
su_sql -f "$here/schema.sql" >/dev/null

machine="$(nproc) vCPU ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), PostgreSQL $(su_sql -c 'SHOW server_version')"
rev=$(git -c safe.directory="$top" -C "$top" rev-parse --short HEAD 2>/dev/null || echo "?")
dirty=$(git -c safe.directory="$top" -C "$top" status --porcelain -- src '*.sql' 2>/dev/null | grep -q . && echo "+changes" || true)
log "$machine; idem at $rev$dirty; load average $(cut -d' ' -f1-3 /proc/loadavg)"

queue_of() { case $1 in idem*) echo idem ;; *) echo "$1" ;; esac; }
table_of() {
	case $1 in idem*) echo idem.outbox ;; lean) echo bench.q ;; pgmq) echo pgmq.q_payments ;; esac
}
events_of() { [ "$1" = batch ] && echo "$batch" || echo 1; }
script_of() { echo "$here/c_$(queue_of "$1")_$2.sql"; }

# Every design starts from the same state: delivered rows gone, its queue
# topped up to the backlog, vacuumed, analyzed, checkpointed.
prepare() {
	local q t
	q=$(queue_of "$1")
	t=$(table_of "$1")
	[ "$q" = idem ] && su_sql -c "DELETE FROM idem.outbox WHERE state = 'delivered'"
	su_sql -c "SELECT bench.top_up('$q', $backlog)" >/dev/null
	su_sql -c "VACUUM ANALYZE $t"
	su_sql -c "CHECKPOINT"
}

# idem_keep: idem with delivered events kept (a superuser's setting)
design_setting() {
	if [ "$1" = idem_keep ]; then
		su_sql -c "ALTER ROLE bench SET idem.outbox_keep_delivered = on"
	else
		su_sql -c "ALTER ROLE bench RESET idem.outbox_keep_delivered"
	fi
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > 0 ? sprintf("%.3f", a / b) : "-") }'; }

txt="$res/latest.txt"
csv="$res/latest.csv"
ndesigns=$(echo $designs | wc -w)
if [ "$rounds" -gt 0 ]; then
	echo "workload,round,design,tps,events_per_s" >"$csv"
	declare -A eps=()
	for r in $(seq 1 "$rounds"); do
		for w in $workloads; do
			# rotate the order: each design runs first in some round
			darr=($designs)
			k=$(( (r - 1) % ndesigns ))
			order="${darr[*]:k} ${darr[*]:0:k}"
			for d in $order; do
				prepare "$d"
				design_setting "$d"
				run pgbench -n -M prepared -h "$dir" -p $port -U bench -c "$consumers" -j "$consumers" \
					-T "$seconds" -f "$(script_of "$d" "$w")" $db >"$out/$w-$d-$r.log" 2>&1 ||
					{ cat "$out/$w-$d-$r.log" >&2; exit 1; }
				tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$out/$w-$d-$r.log")
				e=$(awk -v t="$tps" -v n="$(events_of "$w")" 'BEGIN { printf "%.0f", t * n }')
				eps[$w,$d,$r]=$e
				echo "$w,$r,$d,$tps,$e" >>"$csv"
				log "round $r $w $d: $tps tx/s, $e events/s"
			done
			design_setting none
		done
	done
	{
		echo "Outbox delivery benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), idem at $rev$dirty"
		echo "$machine"
		echo "$consumers consumers, pgbench -M prepared, claim (lease 30 s) and ack in separate transactions,"
		echo "synchronous_commit off, each queue topped up to $backlog pending events before each run,"
		echo "$rounds paired rounds of ${seconds}s per design in rotating order; load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
		echo
		for w in $workloads; do
			echo "$w ($(events_of "$w") per claim): events/s per round"
			printf "  %-10s" design
			for r in $(seq 1 "$rounds"); do printf " %9s" "round $r"; done
			printf " %9s\n" median
			for d in $designs; do
				printf "  %-10s" "$d"
				for r in $(seq 1 "$rounds"); do printf " %9s" "${eps[$w,$d,$r]}"; done
				printf " %9s\n" "$(for r in $(seq 1 "$rounds"); do echo "${eps[$w,$d,$r]}"; done | median)"
			done
			for pair in idem/lean idem/pgmq idem_keep/lean idem_keep/idem; do
				a=${pair%/*}
				b=${pair#*/}
				case " $designs " in *" $a "*) ;; *) continue ;; esac
				case " $designs " in *" $b "*) ;; *) continue ;; esac
				per=$(for r in $(seq 1 "$rounds"); do ratio "${eps[$w,$a,$r]}" "${eps[$w,$b,$r]}"; done)
				printf "  %-16s per round %s; median %s\n" "$a / $b" "$(echo $per | tr ' ' ',')" \
					"$(echo "$per" | median)"
			done
			echo
		done
	} | tee "$txt"
fi

# --- instructions per event under callgrind ---------------------------------
if [ $profile -eq 1 ]; then
	if ! command -v valgrind >/dev/null; then
		log "--profile needs valgrind (apt-get install valgrind); skipped"
	else
		# a smaller queue, filled at full speed: under valgrind each refill
		# and VACUUM costs minutes
		backlog=20000
		su_sql -c "TRUNCATE idem.outbox, bench.q, pgmq.q_payments"
		for q in idem lean pgmq; do
			su_sql -c "SELECT bench.top_up('$q', $backlog)" >/dev/null
		done
		su_sql -c "VACUUM ANALYZE idem.outbox, bench.q, pgmq.q_payments"
		log "profile: restarting the cluster under callgrind"
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
		pm=$(head -n1 "$dir/data/postmaster.pid")
		sleep 5
		aux=$(pgrep -c -P "$pm" || true)
		quiesce() {
			for i in $(seq 1 120); do
				[ "$(pgrep -c -P "$pm" || true)" -le "$aux" ] && return 0
				sleep 0.5
			done
		}
		short=50
		long=250
		prof="$res/latest-profile.txt"
		{
			echo "Outbox delivery, instructions per event in the server backend, $(date -u '+%Y-%m-%d %H:%M UTC'), idem at $rev$dirty"
			echo "callgrind; pgbench -M prepared, 1 client; difference of a ${long}- and a ${short}-transaction"
			echo "session divided by the events they delivered (claim and ack: one transaction pair)"
			echo
			printf "%-8s %-10s %14s %14s\n" workload design "instr/event" "x lean"
		} >"$prof"
		declare -A ir=()
		for w in $workloads; do
			for d in $designs; do
				declare -A pf=()
				for n in $short $long; do
					prepare "$d"
					design_setting "$d"
					quiesce
					before=$(ls "$dir/cg" | sort)
					run pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -t $n \
						-f "$(script_of "$d" "$w")" $db >"$out/profile-$w-$d-$n.log" 2>&1
					quiesce
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
				design_setting none
				a=$(sed -n 's/^summary: //p' "${pf[$short]}")
				b=$(sed -n 's/^summary: //p' "${pf[$long]}")
				ir[$w,$d]=$(( (b - a) / (long - short) / $(events_of "$w") ))
				cp "${pf[$long]}" "$out/callgrind-$w-$d.out"
				log "profile $w $d: ${ir[$w,$d]} instructions per event"
			done
			for d in $designs; do
				printf "%-8s %-10s %14d %14s\n" "$w" "$d" "${ir[$w,$d]}" \
					"$(ratio "${ir[$w,$d]}" "${ir[$w,lean]:-0}")" >>"$prof"
			done
		done
		cat "$prof"
		run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null || true
		wait "$valgrind_pid" || true
		start_server
	fi
fi

# --- sustained: idem and the lean queue side by side --------------------------
if [ "$sustained" -gt 0 ]; then
	sus="$res/latest-sustained.txt"
	sbacklog=${sustained_backlog:-$(( sustained * 12000 ))}
	log "sustained: ${sustained}s, backlog $sbacklog events each"
	su_sql -c "TRUNCATE idem.outbox, bench.q, bench.payments, idem.keys"
	su_sql -c "SELECT bench.top_up('idem', $sbacklog), bench.top_up('lean', $sbacklog)" >/dev/null
	su_sql -c "VACUUM ANALYZE idem.outbox, bench.q"
	su_sql -c "CHECKPOINT"
	su_sql -c "SELECT pg_stat_reset()" >/dev/null
	sizes() {
		su_sql -c "SELECT pg_size_pretty(pg_table_size('$1')) || ' table, ' || pg_size_pretty(pg_indexes_size('$1')) || ' indexes'"
	}
	before_idem=$(sizes idem.outbox)
	before_lean=$(sizes bench.q)
	(
		while :; do
			run psql -X -q -At -h "$dir" -p $port -U bench -d $db \
				-c "SELECT idem_outbox_purge(10000)" >>"$out/sustained-purge.log" 2>&1 || true
			sleep 1
		done
	) &
	purger=$!
	pids=()
	run env PGOPTIONS="-c idem.outbox_topic=payments" \
		pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -R "$rate" -T "$sustained" \
		-f "$here/p_idem.sql" $db >"$out/sustained-p-idem.log" 2>&1 &
	pids+=($!)
	run pgbench -n -M prepared -h "$dir" -p $port -U bench -c 1 -j 1 -R "$rate" -T "$sustained" \
		-f "$here/p_lean.sql" $db >"$out/sustained-p-lean.log" 2>&1 &
	pids+=($!)
	for d in idem lean; do
		run pgbench -n -M prepared -h "$dir" -p $port -U bench -c "$consumers" -j "$consumers" \
			-T "$sustained" --progress=60 -f "$(script_of "$d" batch)" $db \
			>"$out/sustained-$d.log" 2>&1 &
		pids+=($!)
	done
	wait "${pids[@]}"
	kill "$purger" 2>/dev/null || true
	wait "$purger" 2>/dev/null || true
	{
		echo "Outbox delivery, sustained, $(date -u '+%Y-%m-%d %H:%M UTC'), idem at $rev$dirty"
		echo "$machine"
		echo "idem and the lean queue at the same time for ${sustained}s: $consumers consumers each (batches of $batch),"
		echo "a producer each at $rate calls/s, idem_outbox_purge() every second, autovacuum on (naptime ${naptime:-1min}); backlog $sbacklog each"
		echo
		declare -A first=() last=()
		for d in idem lean; do
			per=$(sed -n 's/^progress: \([0-9.]*\) s, \([0-9.]*\) tps.*/\2/p' "$out/sustained-$d.log" |
				awk -v n="$batch" '{ printf "%.0f ", $1 * n }')
			first[$d]=$(echo $per | awk '{ print $1 }')
			last[$d]=$(echo $per | awk '{ print $NF }')
			echo "$d: events/s per minute: $per"
			echo "  first minute ${first[$d]}, last minute ${last[$d]}, last / first $(ratio "${last[$d]}" "${first[$d]}")"
		done
		echo "idem last minute / lean last minute: $(ratio "${last[idem]}" "${last[lean]}")"
		echo "pending left: idem $(su_sql -c "SELECT count(*) FROM idem.outbox WHERE state IN ('pending', 'leased')"), lean $(su_sql -c "SELECT count(*) FROM bench.q")"
		echo "delivered rows kept: idem $(su_sql -c "SELECT count(*) FROM idem.outbox WHERE state = 'delivered'")"
		echo "sizes before: idem.outbox $before_idem; bench.q $before_lean"
		echo "sizes after:  idem.outbox $(sizes idem.outbox); bench.q $(sizes bench.q)"
		su_sql -c "SELECT relname || ': ' || n_tup_upd || ' updates (' || n_tup_hot_upd || ' HOT), ' || n_tup_del || ' deletes, ' || n_dead_tup || ' dead, ' || autovacuum_count || ' autovacuums' FROM pg_stat_user_tables WHERE relid IN ('idem.outbox'::regclass, 'bench.q'::regclass) ORDER BY relname"
	} | tee "$sus"
fi
log "done; logs in $out"
