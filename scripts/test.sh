#!/usr/bin/env bash
# Build and install idem, then run the whole suite: pg_regress, the
# isolation specs and the TAP tests (make installcheck).  Each part starts
# its own throwaway cluster on a Unix socket; then the client helpers'
# tests (scripts/test-clients.sh), then every example of the documentation
# (test/doc/run.py: README.md, doc/*.md, clients/README.md, the output each
# shows compared).  Works as root: the tests run
# as the unprivileged postgres user, in a copy of the tree it owns.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/check-meta.sh"
"$top/scripts/deps.sh" --test
. "$top/scripts/env.sh"

idem_build_install "$top"
# no import cycle between the C files, no layer calling up
"$top/scripts/check-layers.sh"

work=$(mktemp -d /tmp/idem-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -C "$top" --exclude=.git -cf - . | tar -C "$work" -xf -
[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work"

status=0
"${IDEM_RUNAS[@]}" make -C "$work" PG_CONFIG="$PG_CONFIG" installcheck || status=$?
# the Python and Node helpers, directly and through PgBouncer
"${IDEM_RUNAS[@]}" env PG_CONFIG="$PG_CONFIG" HOME="$work" "$work/scripts/test-clients.sh" || {
	[ $status -ne 0 ] || status=1
}
# the docs' examples, after the clients' tests: those install node_modules
"${IDEM_RUNAS[@]}" env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/test/doc/run.py" || {
	[ $status -ne 0 ] || status=1
}
if [ $status -ne 0 ]; then
	for f in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
		[ -f "$f" ] && { echo "=== $f"; cat "$f"; }
	done
	for f in "$work"/tmp_check/log/regress_log_*; do
		[ -f "$f" ] && { echo "=== $f"; tail -n 60 "$f"; }
	done
fi
exit $status
