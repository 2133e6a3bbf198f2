#!/usr/bin/env bash
# The returns agent (clients/python/demo/returns_agent.py): a workflow run
# written with the Python helper, crashed at random points and restarted
# until it completes, then proved from the database and the carrier's log.
# Builds and installs idem, then runs the demo as the cluster user in a copy
# of the tree it owns.  Arguments go to the demo: --seed N, --crashes N.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/env.sh"
idem_install_and_copy "$top" agent
run env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/clients/python/demo/returns_agent.py" "$@"
