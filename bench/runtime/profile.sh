#!/usr/bin/env bash
#
# Instructions per run in one server backend (callgrind), for the runs on
# queues benchmark's procedures: the server runs under valgrind, one
# session calls PROC(50) and another PROC(550), and the difference of
# their totals divided by 500 is the cost of one run (start-up and the
# first calls' planning cancel out).  Prints both totals and the figure;
# keeps the larger session's callgrind file for callgrind_annotate.
#
#   bench/runtime/profile.sh [--no-install] [PROC ...]
#
# PROC: cpu_leased (default), cpu_leased4 (claims of four runs),
# cpu_folded (steps that carry their external neighbours' start and
# completion), cpu_plain_step, cpu_plain_call, cpu_hand_queue (what a user
# writes instead of queues: schema.sql).  Needs
# valgrind.
#
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
install=1
procs=()
while [ $# -gt 0 ]; do
	case "$1" in
		--no-install) install=0 ;;
		cpu_leased|cpu_leased4|cpu_folded|cpu_plain_step|cpu_plain_call|cpu_hand_queue) procs+=("$1") ;;
		*) echo "usage: $0 [--no-install] [cpu_leased|cpu_leased4|cpu_folded|cpu_plain_step|cpu_plain_call|cpu_hand_queue ...]" >&2; exit 2 ;;
	esac
	shift
done
[ ${#procs[@]} -gt 0 ] || procs=(cpu_leased)
command -v valgrind >/dev/null || { echo "$0 needs valgrind (apt-get install valgrind)" >&2; exit 1; }

. "$top/scripts/env.sh"
[ $install -eq 1 ] && idem_build_install "$top"

port=5475
idem_throwaway_cluster runtime-profile
cat >>"$dir/data/postgresql.conf" <<CONF
listen_addresses = ''
unix_socket_directories = '$dir'
port = $port
shared_preload_libraries = 'idem'
synchronous_commit = off
autovacuum = off
CONF
sql() { run psql -X -q -At -v ON_ERROR_STOP=1 -h "$dir" -p $port -U postgres "$@"; }
mkdir -p "$dir/cg" "$here/out"
chown postgres: "$dir/cg" 2>/dev/null || true
for p in "${procs[@]}"; do
	run pg_ctl -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
	sql -d postgres -c "DROP DATABASE IF EXISTS prof" -c "CREATE DATABASE prof"
	sql -d prof -f "$here/schema.sql" >/dev/null
	sql -d prof -c "CALL begin_runs('q', 1000, 'bench')" -c "CALL begin_runs('b', 1000, NULL)" -c "CALL begin_hand_runs(1000)" -c "VACUUM ANALYZE"
	run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null
	rm -f "$dir"/cg/*
	run bash -c "cd '$dir/cg' && exec valgrind --tool=callgrind --trace-children=yes \
		--callgrind-out-file='$dir/cg/cg.%p' postgres -D '$dir/data'" >"$dir/valgrind.log" 2>&1 &
	for _ in $(seq 1 120); do
		run pg_isready -q -h "$dir" -p $port && break
		sleep 1
	done
	sleep 3
	pids=()
	for n in 50 550; do
		pids+=("$(sql -d prof -c "SELECT pg_backend_pid()" -c "CALL $p($n)" | head -n1)")
		sleep 1
	done
	run pg_ctl -D "$dir/data" -w -m fast stop >/dev/null
	wait
	a=$(sed -n 's/^summary: //p' "$dir/cg/cg.${pids[0]}")
	b=$(sed -n 's/^summary: //p' "$dir/cg/cg.${pids[1]}")
	cp "$dir/cg/cg.${pids[1]}" "$here/out/callgrind-$p.out"
	echo "$p: $a instructions for 50 runs, $b for 550: $(( (b - a) / 500 )) per run (bench/runtime/out/callgrind-$p.out)"
done
