#!/usr/bin/env bash
# idem on Citus: build Citus from the vendored release, build and install idem
# against the same PostgreSQL, and run the Citus TAP suite (test/citus/*.pl:
# a coordinator and two workers on loopback).
#
#   scripts/test-citus.sh [--build-only] [--no-cache] [--keep]
#
# Citus is not in Debian's archive: the source is the vendored release tree
# (CITUS_VENDOR, default ../shared/vendor beside the repository, or
# /work/shared/vendor).  The release follows the target PostgreSQL major:
# 13.2.2 for 15 (14 supports 16 to 18 only), with the have_createdb_privilege
# patch that 15's recent minors need; 14.0.1 for 16 and later (13.2.2
# supports 15 to 17).  CITUS_VERSION names another vendored release; a
# patch citus-<version>-pg<major>-*.patch beside it is applied when one
# exists.  The build is installed into a staging
# directory kept as /var/cache/idem-citus/<key>, where the key is the sha256
# of the tarball, the patch and the target PostgreSQL (pg_config's version
# and directories); a later run with the same key only copies the staged
# files into PostgreSQL's directories.  --no-cache ignores (and replaces) a
# cached build, so the script must and does pass from nothing.  Needs root
# (apt build dependencies, make install into PG_CONFIG's tree); the tests
# run as postgres.  PG_CONFIG defaults to the one on PATH.  What idem's build
# and the TAP modules need comes from scripts/deps.sh, so a bare Debian root
# with postgresql-N and postgresql-server-dev-N is enough.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
cache_root=${IDEM_CITUS_CACHE:-/var/cache/idem-citus}
build_only=0
use_cache=1
keep=0

while [ $# -gt 0 ]; do
	case "$1" in
		--build-only) build_only=1 ;;
		--no-cache) use_cache=0 ;;
		--keep) keep=1 ;;
		*) sed -n '/^#   scripts\/test-citus.sh/p' "$0" | sed 's/^# *//' >&2; exit 2 ;;
	esac
	shift
done

say() { echo "[$(date -u +%H:%M:%S)] test-citus: $*" >&2; }
die() { echo "test-citus: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (build dependencies, make install)"
command -v "$PG_CONFIG" >/dev/null || die "no pg_config (set PG_CONFIG)"

pg_version=$("$PG_CONFIG" --version)
pg_major=$(echo "$pg_version" | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
if [ -n "${CITUS_VERSION:-}" ]; then
	citus_version=$CITUS_VERSION
elif [ "$pg_major" -le 15 ]; then
	citus_version=13.2.2
else
	citus_version=14.0.1
fi

vendor=${CITUS_VENDOR:-}
if [ -z "$vendor" ]; then
	for d in "$top/../shared/vendor" "$top/../../shared/vendor" /work/shared/vendor; do
		if [ -f "$d/citus-$citus_version.tar.gz" ]; then vendor=$(cd "$d" && pwd); break; fi
	done
fi
tarball=$vendor/citus-$citus_version.tar.gz
[ -f "$tarball" ] || die "no citus-$citus_version.tar.gz (set CITUS_VENDOR to the vendored sources' folder)"

patch=""
for f in "$vendor/citus-$citus_version-pg$pg_major-"*.patch; do
	[ -f "$f" ] && patch=$f
done
# without its patch 13.2.2 fails to build against 15.20 and later
[ -n "$patch" ] || [ "$citus_version-$pg_major" != 13.2.2-15 ] ||
	die "missing $vendor/citus-13.2.2-pg15-have_createdb_privilege.patch"

# Citus's statistics reporter is compiled where HAVE_LIBCURL is defined, and
# PostgreSQL 18 (built with libcurl for OAuth) defines it in its own
# pg_config.h, whatever Citus's configure was told: there Citus must be
# configured with libcurl to link.  The reporter stays off (its setting
# defaults to on only in Citus's own packages).
libcurl=--without-libcurl
grep -q '^#define HAVE_LIBCURL 1' "$("$PG_CONFIG" --includedir-server)/pg_config.h" &&
	libcurl=--with-libcurl

# Build dependencies from Debian's archive (what configure asks), and
# psycopg for the suite's driver retries.
need=""
for p in liblz4-dev libzstd-dev libkrb5-dev libssl-dev zlib1g-dev libreadline-dev libicu-dev make gcc python3-psycopg \
	$([ -z "$patch" ] || echo patch) $([ $libcurl = --without-libcurl ] || echo libcurl4-openssl-dev); do
	# dpkg -s also succeeds for a package removed but not purged
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || need="$need $p"
done
if [ -n "$need" ]; then
	say "installing$need"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null; }
fi

key=$( {
	sha256sum "$tarball" | cut -d' ' -f1
	[ -z "$patch" ] || sha256sum "$patch" | cut -d' ' -f1
	echo "$pg_version"
	"$PG_CONFIG" --pkglibdir --sharedir --includedir-server
} | sha256sum | cut -c1-16)
stage=$cache_root/citus-$citus_version-pg$pg_major-$key

t0=$(date +%s)
if [ $use_cache = 1 ] && [ -f "$stage/.complete" ]; then
	say "Citus $citus_version from the cache ($stage)"
else
	say "building Citus $citus_version against $pg_version (-j2)"
	mkdir -p "$cache_root"
	rm -rf "$stage"
	build=$(mktemp -d "$cache_root/build.XXXXXX")
	trap 'rm -rf "$build"' EXIT
	tar -C "$build" -xzf "$tarball"
	src=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -1)
	[ -z "$patch" ] || patch -s -d "$src" -p1 <"$patch"
	(
		cd "$src"
		./configure $libcurl PG_CONFIG="$PG_CONFIG" >"$build/configure.log" 2>&1 ||
			{ tail -30 "$build/configure.log" >&2; exit 1; }
		# no LLVM bitcode for JIT inlining: it doubles the build, and
		# nothing here JIT-compiles Citus's functions
		make -s -j2 with_llvm=no >"$build/make.log" 2>&1 || { tail -40 "$build/make.log" >&2; exit 1; }
		make -s install with_llvm=no DESTDIR="$build/stage" >"$build/install.log" 2>&1 ||
			{ tail -40 "$build/install.log" >&2; exit 1; }
	)
	touch "$build/stage/.complete"
	mv "$build/stage" "$stage"
	rm -rf "$build"
	trap - EXIT
	say "Citus built in $(( $(date +%s) - t0 ))s"
fi
# The staged tree holds absolute paths below PG_CONFIG's directories; copy
# files only, so that no existing directory takes the staging tree's modes.
# Each file replaces the installed one rather than being written over it: a
# server of this PostgreSQL that has citus.so mapped would crash on a
# library truncated under it.
(cd "$stage" && find . ! -type d ! -name .complete -print0 | xargs -0 cp -P --parents --remove-destination -t /)
t1=$(date +%s)
say "Citus installed ($(( t1 - t0 ))s)"
[ $build_only = 0 ] || exit 0

PG_CONFIG="$PG_CONFIG" "$top/scripts/deps.sh"
say "building idem"
make -s -C "$top" -j2 PG_CONFIG="$PG_CONFIG" >/dev/null
make -s -C "$top" install PG_CONFIG="$PG_CONFIG" >/dev/null

work=$(mktemp -d /tmp/idem-citus.XXXXXX)
tar -C "$top" --exclude=.git -cf - . | tar -C "$work" -xf -
chown -R postgres: "$work"
rc=0
tests=$(cd "$work" && ls test/citus/*.pl)
say "running $(echo $tests)"
runuser -u postgres -- env PG_CONFIG="$PG_CONFIG" \
	make -C "$work" -s PG_CONFIG="$PG_CONFIG" installcheck REGRESS= ISOLATION= \
	PROVE_TESTS="$(echo $tests)" || rc=$?
t2=$(date +%s)
if [ $rc = 0 ] && [ $keep = 0 ]; then rm -rf "$work"; else say "kept $work"; fi
say "Citus $(( t1 - t0 ))s, idem and tests $(( t2 - t1 ))s, in all $(( t2 - t0 ))s: $([ $rc = 0 ] && echo passed || echo FAILED)"
exit $rc
