#!/usr/bin/env bash
# The client helpers' tests (clients/python with pytest, clients/node with
# node --test), each against its own throwaway cluster and a PgBouncer in
# transaction mode that the tests start on loopback.  Run as the cluster
# user, in a tree it owns, after idem is installed into $PG_CONFIG
# (scripts/test.sh does all that).  node-postgres and postgres.js come from
# the committed package-lock.json (npm ci) when clients/node/node_modules
# lacks them.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}

status=0
echo "# clients/python (pytest)"
(cd "$top/clients/python" && /usr/bin/python3 -m pytest -q -p no:cacheprovider tests) || status=1

echo "# the main job (scripts/agent-demo.sh): 20 orders, 3 workers SIGKILLed at random, PostgreSQL crashed once (exits 1 unless proved)"
/usr/bin/python3 "$top/clients/python/demo/returns_chaos.py" --seed 3 --chart >"${TMPDIR:-/tmp}/idem-chaos-demo.$$.log" 2>&1 ||
	{ cat "${TMPDIR:-/tmp}/idem-chaos-demo.$$.log"; status=1; }
grep "^PROVED" "${TMPDIR:-/tmp}/idem-chaos-demo.$$.log" || status=1
rm -f "${TMPDIR:-/tmp}/idem-chaos-demo.$$.log"

echo "# the returns agent walkthrough (agent-demo.sh --walkthrough), seed 3: every kind of crash, a 503 from each service (exits 1 unless proved)"
/usr/bin/python3 "$top/clients/python/demo/returns_agent.py" --seed 3 --crashes 6 >"${TMPDIR:-/tmp}/idem-agent-demo.$$.log" 2>&1 ||
	{ cat "${TMPDIR:-/tmp}/idem-agent-demo.$$.log"; status=1; }
grep -q "PROVED" "${TMPDIR:-/tmp}/idem-agent-demo.$$.log" && grep "PROVED\|^done" "${TMPDIR:-/tmp}/idem-agent-demo.$$.log"
rm -f "${TMPDIR:-/tmp}/idem-agent-demo.$$.log"

echo "# clients/node (node --test)"
# npm ci also when node_modules predates a dependency of the lock file
if ! (cd "$top/clients/node" && node -e 'for (const m of ["pg", "postgres", "typescript", "@types/pg/package.json"]) require.resolve(m)' 2>/dev/null); then
	(cd "$top/clients/node" && npm ci --no-audit --no-fund --loglevel=error) || status=1
fi
# the files named: Node 22 (Debian forky) takes a directory argument for a
# test file and fails on it, where Node 20 searched it
# spec, not dot: a failure shows its test and its error
(cd "$top/clients/node" && node --test --test-reporter=spec test/*.test.js) || status=1
exit $status
