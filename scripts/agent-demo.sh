#!/usr/bin/env bash
# The main job: 20 orders through a 4-step returns workflow written with the
# Python helper's Workflow and Worker (clients/python/demo/returns_chaos.py),
# 3 worker processes, a chaos loop that SIGKILLs workers at random from
# outside and crashes PostgreSQL once (pg_ctl -m immediate); it ends with
# one order's audit trail, idem_stats and the proof (exit 1 unless proved).
#   ./scripts/agent-demo.sh [--seed N] [--crashes N] [--chart [FILE.svg]] [--orders N] [--workers N]
#   ./scripts/agent-demo.sh --walkthrough [--seed N] [--crashes N]
# --walkthrough is the single-order scripted demo: one run written step by
# step with the helper's calls, crashed at planned points and restarted
# (clients/python/demo/returns_agent.py).
# Builds and installs idem, then runs the demo as the cluster user in a
# copy of the tree it owns.  Works from an empty environment (env -i).
set -euo pipefail
export PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/env.sh"
demo=returns_chaos.py
if [ "${1:-}" = "--walkthrough" ]; then
	demo=returns_agent.py
	shift
fi
# a chart file named relative to the caller's directory, written by the
# cluster user: written in the copy, then moved here
chart=
args=()
while [ $# -gt 0 ]; do
	case $1 in
		--chart=*) chart=${1#--chart=}; args+=(--chart "__CHART__") ;;
		--chart)
			if [ $# -gt 1 ] && [ "${2#-}" = "$2" ]; then
				chart=$2; args+=(--chart "__CHART__"); shift
			else
				args+=(--chart)
			fi ;;
		*) args+=("$1") ;;
	esac
	shift
done
idem_install_and_copy "$top" agent
for i in "${!args[@]}"; do
	[ "${args[$i]}" = "__CHART__" ] && args[$i]="$work/chart.svg"
done
cd /
status=0
run env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/clients/python/demo/$demo" ${args[@]+"${args[@]}"} || status=$?
if [ -n "$chart" ] && [ -f "$work/chart.svg" ]; then
	case $chart in /*) ;; *) chart="$OLDPWD/$chart" ;; esac
	cp "$work/chart.svg" "$chart"
	echo "chart: $chart"
fi
exit $status
