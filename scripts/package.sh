#!/usr/bin/env bash
# Build the Debian package postgresql-15-idem from a clean clone of the
# committed HEAD (uncommitted changes are not packaged), with Debian's
# PostgreSQL extension tooling (debian/: pg_buildext, one
# postgresql-<major>-idem per version of debian/pgversions that this
# machine supports), then run lintian on it and fail on any lintian error.
#
#   scripts/package.sh [--out DIR] [--commit REV]
#     --out DIR     where the .deb files go (default: dist/ at the top of
#                   this repository)
#     --commit REV  package REV instead of HEAD
#
# As root it first installs, from Debian's archive, what the build needs:
# dpkg-dev, lintian and the Build-Depends of the clone's debian/control
# (apt-get build-dep).  Otherwise it names what is missing and stops.  The
# build happens in a mktemp -d directory under /tmp (removed at the end)
# and installs only into the clone's debian/ staging directories: this
# machine's PostgreSQL installation is not touched.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/dist
rev=HEAD

usage() { echo "usage: $0 [--out DIR] [--commit REV]" >&2; exit 2; }
while [ $# -gt 0 ]; do
	case "$1" in
		--out) [ $# -ge 2 ] || usage; out=$2; shift ;;
		--commit) [ $# -ge 2 ] || usage; rev=$2; shift ;;
		-h|--help) usage ;;
		*) usage ;;
	esac
	shift
done

say() { echo "[$(date -u +%H:%M:%S)] package: $*" >&2; }
die() { echo "package: $*" >&2; exit 1; }

commit=$(git -C "$top" rev-parse --verify "$rev^{commit}") || die "no commit '$rev'"
mkdir -p "$out"
out=$(cd "$out" && pwd)
t0=$(date +%s)

work=$(mktemp -d /tmp/idem-package.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$work/idem
git clone -q --no-hardlinks "$top" "$src"
git -C "$src" checkout -q --detach "$commit"
say "packaging $commit in $src"

# --- build dependencies ----------------------------------------------------
deps_ok() {
	command -v dpkg-buildpackage >/dev/null && command -v lintian >/dev/null &&
		(cd "$src" && dpkg-checkbuilddeps) 2>/dev/null
}
if ! deps_ok; then
	if [ "$(id -u)" -ne 0 ]; then
		(cd "$src" && dpkg-checkbuilddeps) || true
		die "missing build tools (dpkg-dev, lintian, or the Build-Depends above); run as root to install them"
	fi
	say "installing dpkg-dev, lintian and the Build-Depends of debian/control"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -o DPkg::Lock::Timeout=600 update -qq
	apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends dpkg-dev lintian >/dev/null
	apt-get -o DPkg::Lock::Timeout=600 build-dep -y -qq --no-install-recommends "$src" >/dev/null
	deps_ok || { (cd "$src" && dpkg-checkbuilddeps) || true; die "build dependencies still missing"; }
fi

# --- debian/control for the PostgreSQL versions this machine supports --------
# debian/control is generated from debian/control.in by pg_buildext
# updatecontrol; it is committed for Debian 12 (PostgreSQL 15).  A machine
# that supports other versions of debian/pgversions (apt.postgresql.org's)
# gets one package per version.
if ! (cd "$src" && pg_buildext checkcontrol) >/dev/null 2>&1; then
	say "debian/control does not match this machine's PostgreSQL versions: pg_buildext updatecontrol"
	(cd "$src" && pg_buildext updatecontrol)
fi

# --- build ------------------------------------------------------------------
say "dpkg-buildpackage -us -uc -b (log: build.log)"
(cd "$src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1 || {
	tail -n 60 "$work/build.log" >&2
	cp "$work/build.log" "$out/build-failed.log"
	die "dpkg-buildpackage failed (whole log: $out/build-failed.log)"
}
mapfile -t debs < <(find "$work" -maxdepth 1 -name '*.deb' | sort)
[ ${#debs[@]} -gt 0 ] || die "dpkg-buildpackage made no .deb"

# --- lintian ----------------------------------------------------------------
say "lintian ${debs[*]##*/}"
rc=0
lintian --fail-on error --display-info --tag-display-limit 0 "${debs[@]}" >"$work/lintian.log" 2>&1 || rc=$?
sed 's/^/  /' "$work/lintian.log" >&2
[ $rc -eq 0 ] || die "lintian reports errors (exit $rc)"
[ -s "$work/lintian.log" ] || say "lintian: no tags"

cp "${debs[@]}" "$out/"
for d in "${debs[@]}"; do
	echo "$out/${d##*/}"
done
say "done in $(( $(date +%s) - t0 ))s"
