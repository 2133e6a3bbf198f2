#!/usr/bin/env bash
# Client-side benchmarks: builds and installs idem into $PG_CONFIG, then
# runs, as the cluster user in a copy of the tree it owns, bench.py (the
# helpers' calls against hand-written SQL; arguments --seconds, --rounds,
# --procs, --sync) or, with --workflow first, workflow_bench.py (the 4-step
# workflow with workers against the same steps by hand; --runs, --rounds,
# --procs, --prefetch) or, with --workflow-node first, workflow_bench.js
# (the same from Node; --runs, --rounds, --procs, --concurrency,
# --prefetch, --cpu, --compare-client DIR) or, with --worker-wakeups first,
# worker_wakeups.js (a Node worker's timers and CPU, busy and idle, against
# those of DIR/clients/node; DIR, --runs, --rounds).
#
#   bench/clients/run.sh [--workflow | --workflow-node | --worker-wakeups] [arguments...]
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
prog=(/usr/bin/python3 bench.py)
case "${1:-}" in
--workflow) prog=(/usr/bin/python3 workflow_bench.py); shift ;;
--workflow-node) prog=(node workflow_bench.js); shift ;;
--worker-wakeups) prog=(node worker_wakeups.js); shift ;;
esac
. "$top/scripts/env.sh"
idem_install_and_copy "$top" clientbench
if [ "${prog[0]}" = node ] && ! (cd "$work/clients/node" && node -e 'require.resolve("pg")' 2>/dev/null); then
	# node-postgres from the committed package-lock.json; npm's cache in
	# the copy, which the cluster user owns and the exit removes
	(cd "$work/clients/node" && run env HOME="$work" npm ci --omit=dev --no-audit --no-fund --loglevel=error)
fi
run env PG_CONFIG="$PG_CONFIG" "${prog[0]}" "$work/bench/clients/${prog[1]}" "$@"
