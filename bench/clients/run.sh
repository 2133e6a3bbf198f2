#!/usr/bin/env bash
# Client-side benchmark (bench.py): builds and installs idem into
# $PG_CONFIG, then runs bench.py as the cluster user in a copy of the tree
# it owns.  Arguments go to bench.py (--seconds, --rounds, --procs, --sync).
set -euo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$top/scripts/env.sh"
idem_install_and_copy "$top" clientbench
run env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/bench/clients/bench.py" "$@"
