#!/usr/bin/env bash
# Client-side benchmarks: builds and installs idem into $PG_CONFIG, then
# runs, as the cluster user in a copy of the tree it owns, bench.py (the
# helpers' calls against hand-written SQL; arguments --seconds, --rounds,
# --procs, --sync) or, with --workflow first, workflow_bench.py (the 4-step
# workflow with workers against the same steps by hand; --runs, --rounds,
# --procs, --prefetch).
#
#   bench/clients/run.sh [--workflow] [arguments...]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
prog=bench.py
if [ "${1:-}" = "--workflow" ]; then
	prog=workflow_bench.py
	shift
fi
. "$top/scripts/env.sh"
idem_install_and_copy "$top" clientbench
run env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/bench/clients/$prog" "$@"
