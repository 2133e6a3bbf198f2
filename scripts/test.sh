#!/usr/bin/env bash
# Build and install idem, then run the whole suite: pg_regress, the
# isolation specs and the TAP tests (make installcheck).  Each part starts
# its own throwaway cluster on a Unix socket; then the client helpers'
# tests (scripts/test-clients.sh), then every example of the documentation
# (test/doc/run.py: README.md, doc/*.md, clients/README.md, the output each
# shows compared), then the driver matrix (scripts/test-drivers.sh).  Works
# as root: the tests run as the unprivileged postgres user, in a copy of the
# tree it owns.
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

status=0 parts=()
part() {	# name command...: run one part, remember its result
	local name=$1 t=$SECONDS rc=0
	shift
	"$@" || rc=$?
	parts+=("$(printf '%-14s %5ds  %s' "$name" $((SECONDS - t)) \
		"$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")")")
	[ $rc -eq 0 ] || status=1
}
part installcheck "${IDEM_RUNAS[@]}" make -C "$work" PG_CONFIG="$PG_CONFIG" installcheck
# the Python and Node helpers, directly and through PgBouncer
part clients "${IDEM_RUNAS[@]}" env PG_CONFIG="$PG_CONFIG" HOME="$work" "$work/scripts/test-clients.sh"
# the docs' examples, after the clients' tests: those install node_modules
part docs "${IDEM_RUNAS[@]}" env PG_CONFIG="$PG_CONFIG" /usr/bin/python3 "$work/test/doc/run.py"
# the driver matrix: thirteen drivers and psql retry each other's requests,
# directly and through PgBouncer (it installs the drivers: root, or sudo);
# IDEM_TEST_DRIVERS=0 leaves it out
[ "${IDEM_TEST_DRIVERS:-1}" = 0 ] || part drivers "$top/scripts/test-drivers.sh"
if [ $status -ne 0 ]; then
	for f in "$work/regression.diffs" "$work/output_iso/regression.diffs"; do
		[ -f "$f" ] && { echo "=== $f"; cat "$f"; }
	done
	# the log of each TAP test that did not pass (prove names them)
	for f in "$work"/tmp_check/log/regress_log_*; do
		[ -f "$f" ] && grep -q '^\(\[[0-9:.]*\]([0-9.]*s) \)\?not ok\|^# Looks like' "$f" &&
			{ echo "=== $f"; tail -n 80 "$f"; }
	done
fi
# last, so that a log's tail shows it
echo "test.sh:"
printf '  %s\n' "${parts[@]}"
exit $status
