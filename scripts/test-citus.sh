#!/usr/bin/env bash
# idem on Citus: build Citus from the vendored release, build and install idem
# against the same PostgreSQL, and run the Citus TAP suite (test/citus/*.pl:
# a coordinator and two workers on loopback).
#
#   scripts/test-citus.sh [--build-only] [--no-cache] [--keep]
#                         [--upgrade-from <older Citus version>]
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
# run as postgres.
#
# --upgrade-from 13.2.2 runs test/citus/020_citus_upgrade.pl alone instead
# of the suite: the older release is built (cached) and installed as the
# release above is, the test makes its cluster and records under it, then
# asks for the newer release, which this script (as root) installs in its
# place while the nodes run, as a package upgrade would; the test restarts
# the nodes and updates the extension.  The newer release is installed when
# the script ends.  PG_CONFIG defaults to the one on PATH.  What idem's build
# and the TAP modules need comes from scripts/deps.sh, so a bare Debian root
# with postgresql-N and postgresql-server-dev-N is enough.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
cache_root=${IDEM_CITUS_CACHE:-/var/cache/idem-citus}
build_only=0
use_cache=1
keep=0
upgrade_from=""

usage() {
	sed -n '/^#   scripts\/test-citus.sh/,/^# *\[--upgrade-from/p' "$0" | sed 's/^# *//' >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
		--build-only) build_only=1 ;;
		--no-cache) use_cache=0 ;;
		--keep) keep=1 ;;
		--upgrade-from)
			[ $# -ge 2 ] || usage
			upgrade_from=$2
			shift ;;
		*) usage ;;
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

[ -z "$upgrade_from" ] || [ "$upgrade_from" != "$citus_version" ] ||
	die "--upgrade-from $upgrade_from: that is the release this PostgreSQL gets"

vendor=${CITUS_VENDOR:-}
if [ -z "$vendor" ]; then
	for d in "$top/../shared/vendor" "$top/../../shared/vendor" /work/shared/vendor; do
		if [ -f "$d/citus-$citus_version.tar.gz" ]; then vendor=$(cd "$d" && pwd); break; fi
	done
fi
for v in $citus_version $upgrade_from; do
	[ -f "$vendor/citus-$v.tar.gz" ] ||
		die "no citus-$v.tar.gz (set CITUS_VENDOR to the vendored sources' folder)"
done

# The patch for release $1 against this major, if one is vendored
patch_of() {
	local f p=""
	for f in "$vendor/citus-$1-pg$pg_major-"*.patch; do
		[ -f "$f" ] && p=$f
	done
	echo "$p"
}
# without its patch 13.2.2 fails to build against 15.20 and later
patches=""
for v in $citus_version $upgrade_from; do
	patches="$patches$(patch_of "$v")"
	[ "$v-$pg_major" != 13.2.2-15 ] || [ -n "$(patch_of "$v")" ] ||
		die "missing $vendor/citus-13.2.2-pg15-have_createdb_privilege.patch"
done

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
	$([ -z "$patches" ] || echo patch) $([ $libcurl = --without-libcurl ] || echo libcurl4-openssl-dev); do
	# dpkg -s also succeeds for a package removed but not purged
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || need="$need $p"
done
if [ -n "$need" ]; then
	say "installing$need"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $need >/dev/null ||
		{ apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $need >/dev/null; }
fi

# The staged build of release $1 for this PostgreSQL (built unless cached):
# its directory, in $stage ($build is global: the EXIT trap removes it if the
# build fails).
stage_citus() {
	local version=$1 tarball=$vendor/citus-$1.tar.gz patch key src t
	patch=$(patch_of "$version")
	key=$( {
		sha256sum "$tarball" | cut -d' ' -f1
		[ -z "$patch" ] || sha256sum "$patch" | cut -d' ' -f1
		echo "$pg_version"
		"$PG_CONFIG" --pkglibdir --sharedir --includedir-server
	} | sha256sum | cut -c1-16)
	stage=$cache_root/citus-$version-pg$pg_major-$key
	if [ $use_cache = 1 ] && [ -f "$stage/.complete" ]; then
		say "Citus $version from the cache ($stage)"
		return
	fi
	t=$(date +%s)
	say "building Citus $version against $pg_version (-j2)"
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
	say "Citus $version built in $(( $(date +%s) - t ))s"
}

# The staged tree holds absolute paths below PG_CONFIG's directories; copy
# files only, so that no existing directory takes the staging tree's modes.
# Each file replaces the installed one rather than being written over it: a
# server of this PostgreSQL that has citus.so mapped would crash on a
# library truncated under it.  The files of the release it replaces ($2)
# are removed first, as a package's are, so that none of them stays beside
# it (another release's update scripts, say).
install_stage() {	# stage [replaced stage]
	[ -z "${2:-}" ] ||
		(cd "$2" && find . ! -type d ! -name .complete -print0 | sed -z 's|^\.||' | xargs -0 rm -f)
	(cd "$1" && find . ! -type d ! -name .complete -print0 | xargs -0 cp -P --parents --remove-destination -t /)
}

t0=$(date +%s)
[ -z "$upgrade_from" ] || [ $build_only = 0 ] || stage_citus "$upgrade_from"
stage_citus "$citus_version"
new_stage=$stage
if [ -n "$upgrade_from" ]; then
	stage_citus "$upgrade_from"
	old_stage=$stage
	install_stage "$old_stage" "$new_stage"
	say "Citus $upgrade_from installed, to be replaced by $citus_version during the test"
else
	install_stage "$new_stage"
	say "Citus $citus_version installed"
fi
t1=$(date +%s)
say "Citus ready ($(( t1 - t0 ))s)"
[ $build_only = 0 ] || exit 0

PG_CONFIG="$PG_CONFIG" "$top/scripts/deps.sh"
say "building idem"
make -s -C "$top" -j2 PG_CONFIG="$PG_CONFIG" >/dev/null
make -s -C "$top" install PG_CONFIG="$PG_CONFIG" >/dev/null

work=$(mktemp -d /tmp/idem-citus.XXXXXX)
tar -C "$top" --exclude=.git -cf - . | tar -C "$work" -xf -
chown -R postgres: "$work"
rc=0
env=(PG_CONFIG="$PG_CONFIG")
if [ -n "$upgrade_from" ]; then
	tests=test/citus/020_citus_upgrade.pl
	# The test asks, through a FIFO, for the newer release (it runs as
	# postgres, which cannot write PostgreSQL's directories); this loop,
	# as root, installs that release and nothing else, and answers.
	mkfifo -m 600 "$work/.upgrade-ask" "$work/.upgrade-done"
	chown postgres: "$work/.upgrade-ask" "$work/.upgrade-done"
	(
		while read -r what <"$work/.upgrade-ask"; do
			[ "$what" = install ] || break
			if install_stage "$new_stage" "$old_stage"; then
				say "Citus $citus_version installed, as the test asked"
				echo installed >"$work/.upgrade-done"
			else
				echo failed >"$work/.upgrade-done"
			fi
		done
	) &
	helper=$!
	env+=(IDEM_CITUS_UPGRADE="$work/.upgrade" IDEM_CITUS_FROM="$upgrade_from" IDEM_CITUS_TO="$citus_version")
else
	tests=$(cd "$work" && ls test/citus/*.pl)
fi
say "running $(echo $tests)"
runuser -u postgres -- env "${env[@]}" \
	make -C "$work" -s PG_CONFIG="$PG_CONFIG" installcheck REGRESS= ISOLATION= \
	PROVE_TESTS="$(echo $tests)" || rc=$?
if [ -n "$upgrade_from" ]; then
	# the helper waits for a question, unless the test asked already
	kill "$helper" 2>/dev/null || true
	wait "$helper" 2>/dev/null || true
	install_stage "$new_stage" "$old_stage"
fi
t2=$(date +%s)
if [ $rc = 0 ] && [ $keep = 0 ]; then rm -rf "$work"; else say "kept $work"; fi
say "Citus $(( t1 - t0 ))s, idem and tests $(( t2 - t1 ))s, in all $(( t2 - t0 ))s: $([ $rc = 0 ] && echo passed || echo FAILED)"
exit $rc
