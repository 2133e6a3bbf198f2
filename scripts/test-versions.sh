#!/usr/bin/env bash
# Prove idem on every PostgreSQL major it supports, each in a fresh root of
# the Debian release that ships it, from this repository's HEAD (uncommitted
# changes are not tested):
#
#   bookworm  PostgreSQL 15      trixie  PostgreSQL 17      forky  PostgreSQL 18
#
# For each release:
#   suite    a root with postgresql-<major> and postgresql-server-dev-<major>
#            and a clone of HEAD runs scripts/test.sh against that major
#            (pg_regress, isolation, TAP, the Python and Node helpers' tests,
#            PgBouncer included; deps.sh installs the rest), in an empty
#            environment: no LANG, no HOME, only PATH and PG_CONFIG
#   package  in the same root, scripts/package.sh builds
#            postgresql-<major>-idem with pg_buildext (lintian included)
#   citus    with --citus <release>, in the same root after its suite,
#            scripts/test-citus.sh: Citus built from the vendored source
#            for that major (14.0.1 for 16 and later), a coordinator and two
#            workers, test/citus/*.pl; the vendored folder is bind-mounted
#            read-only where the clone looks for it (../shared/vendor), and
#            the Citus build cache (/var/cache/idem-citus) too unless
#            --no-cache
#   citus upgrade
#            with --citus-upgrade <release> (trixie: PostgreSQL 17, which
#            both 13.2.2 and 14.0.1 support), in the same root after the
#            citus part, scripts/test-citus.sh --upgrade-from 13.2.2:
#            test/citus/020_citus_upgrade.pl makes idem's tenant records
#            under Citus 13.2.2, upgrades the cluster to 14.0.1 and checks
#            them (the same mounts)
#   pg_upgrade
#            with --pg-upgrade <release> (trixie or forky), in the same root
#            after the package part: postgresql-15 and its -dev from
#            bookworm's archive (pinned below the release's own, so only
#            those and what they need come from it; for forky bookworm's
#            15.18, not bookworm-security's 15.20, whose pg_upgrade to 18
#            fails on any table), idem built and
#            installed for 15 and for the release's major, then
#            scripts/test-pg-upgrade.sh: pg_upgrade of a cluster with idem's
#            records, runs and events from 15 to that major
#   use      a second root with postgresql-<major> and no compiler, make,
#            headers or source tree installs that .deb alone and
#            scripts/check-package.sh exercises it (create, execute, replay,
#            ID422, update from 1.0 and from 1.1), then purges it
#
#   scripts/test-versions.sh [--release bookworm|trixie|forky]... [--no-cache]
#                            [--no-suite bookworm|trixie|forky]...
#                            [--citus bookworm|trixie|forky]...
#                            [--citus-upgrade trixie]
#                            [--pg-upgrade trixie|forky]...
#                            [--parallel-suites] [--keep]
#
# --no-suite skips a release's suite and keeps its package parts: .ci/run
# runs the suite for bookworm on the host itself (scripts/test.sh).
#
# The releases' roots are made at the same time (mostly waiting for the
# archive); their suites run one at a time unless --parallel-suites (two
# cores cannot run three suites at once without their timeouts).  Each
# release's minimal base root (debootstrap minbase, the archive's sources,
# ca-certificates) is cached as /var/cache/idem-roots/<release>-<UTC
# date>.tar and reused that day; --no-cache makes them from nothing (the
# result must be the same).  Everything else is made anew in a mktemp -d
# directory under /tmp, removed at the end unless --keep (logs are kept
# when something failed).  Needs root.  Exits non-zero if any part failed.
# The summary lists each part's time and result.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/roots.sh"

all_releases="bookworm trixie forky"
releases=""
no_suite=""
citus=""
citus_upgrade=""
pg_upgrade=""
use_cache=1
parallel_suites=0
keep=0
cache_dir=/var/cache/idem-roots

usage() {
	sed -n '/^#   scripts\/test-versions.sh/,/^#  *\[--parallel-suites\]/p' "$0" | sed 's/^# *//' >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
		--release)
			[ $# -ge 2 ] || usage
			case " $all_releases " in *" $2 "*) releases="$releases $2" ;; *) usage ;; esac
			shift ;;
		--no-suite)
			[ $# -ge 2 ] || usage
			case " $all_releases " in *" $2 "*) no_suite="$no_suite $2" ;; *) usage ;; esac
			shift ;;
		--citus)
			[ $# -ge 2 ] || usage
			case " $all_releases " in *" $2 "*) citus="$citus $2" ;; *) usage ;; esac
			shift ;;
		--citus-upgrade)
			# the older release must build against the major too: 13.2.2
			# supports 15 to 17, 14.0.1 16 to 18
			[ $# -ge 2 ] && [ "$2" = trixie ] || usage
			citus_upgrade="$citus_upgrade $2"
			shift ;;
		--pg-upgrade)
			# 15's binaries run on a newer release, not the other way
			[ $# -ge 2 ] && { [ "$2" = trixie ] || [ "$2" = forky ]; } || usage
			pg_upgrade="$pg_upgrade $2"
			shift ;;
		--no-cache) use_cache=0 ;;
		--parallel-suites) parallel_suites=1 ;;
		--keep) keep=1 ;;
		*) usage ;;
	esac
	shift
done
releases=${releases:-$all_releases}

say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "test-versions: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mounts)"
head=$(git -C "$top" rev-parse HEAD)
citus_cache=/var/cache/idem-citus
vendor=""
if [ -n "$citus$citus_upgrade" ]; then
	for d in ${CITUS_VENDOR:-} "$top/../shared/vendor" "$top/../../shared/vendor" /work/shared/vendor; do
		if compgen -G "$d/citus-*.tar.gz" >/dev/null; then vendor=$(cd "$d" && pwd); break; fi
	done
	[ -n "$vendor" ] || die "--citus, --citus-upgrade: no vendored Citus sources (set CITUS_VENDOR)"
fi
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
fi

work=$(mktemp -d /tmp/idem-versions.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
bg_pid=""
pids=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_parts "${pids[@]}"
	remove_work test-versions "$work" "$keep" "$rc" debs
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Node (npm) trusts only its own CA list: where the host added authorities
# of its own (make_root copies them into the roots), point Node at the
# root's bundle, which has them.
tls_env=()
compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null &&
	tls_env+=("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt")

# --- one release, in a subshell: its summary lines go to $logs/<rel>.summary --
# "part<TAB>seconds<TAB>result" per part; the subshell exits non-zero when a
# part failed.
prove_release() {	# release
	local rel=$1 major sum t rc tarball dev pkg deb srcs
	major=$(major_of "$rel")
	sum=$logs/$rel.summary
	: >"$sum"
	bg_pid=""
	trap 'kill -TERM -- -"$bg_pid" 2>/dev/null; exit 143' TERM

	# a command in root $1 from /root/idem, in an empty environment but for
	# PATH, PG_CONFIG and Node's CA bundle; output to log $2
	in_env() {	# root log command
		local r=$1 log=$2
		shift 2
		in_bg "$log" chroot "$r" /usr/bin/env -i \
			PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			PG_CONFIG="/usr/lib/postgresql/$major/bin/pg_config" "${tls_env[@]}" \
			/bin/bash -c "cd /root/idem && $*" ||
			{ echo "=== $rel: '$*' failed; last 60 lines of $log:" >&2; tail -n 60 "$log" >&2; return 1; }
	}
	# a throwaway root: dpkg need not sync each file (the installs are most
	# of a root's time); with the cache, the .debs of earlier runs are kept
	# in $cache_dir/apt-<release> and only what changed is downloaded
	unpack() {	# dir
		mkdir "$1" && tar -C "$1" -xf "$tarball" && mount_root "$1" || return 1
		echo force-unsafe-io >"$1/etc/dpkg/dpkg.cfg.d/idem-unsafe-io"
		if [ $use_cache -eq 1 ]; then
			mkdir -p "$cache_dir/apt-$rel/partial" "$1/var/cache/apt/archives"
			mount --bind "$cache_dir/apt-$rel" "$1/var/cache/apt/archives"
		fi
	}
	dev_root() {
		unpack "$dev" &&
			in_root "$dev" "$logs/$rel-dev.log" apt-get install -y -qq \
				"postgresql-$major" "postgresql-server-dev-$major" git &&
			git clone -q --no-hardlinks "$top" "$dev/root/idem" &&
			git -C "$dev/root/idem" checkout -q --detach "$head"
	}
	# in_env, as one suite at a time unless --parallel-suites: wait here
	# for the others
	in_turn() {	# root log command
		[ $parallel_suites -eq 0 ] || { in_env "$@"; return; }
		exec 9>"$work/suite.lock"
		flock 9
		local rc=0
		in_env "$@" || rc=$?
		flock -u 9
		return $rc
	}
	suite() {
		in_turn "$dev" "$logs/$rel-suite.log" IDEM_TEST_DRIVERS=0 ./scripts/test.sh
	}
	# the vendored sources live outside the repository, and the clone has
	# none: lend them to the root for this part only
	citus_suite() {	# [test-citus.sh option]...
		local rc=0 log=$logs/$rel-citus.log
		[ $# -eq 0 ] || log=$logs/$rel-citus-upgrade.log
		mkdir -p "$dev/root/shared/vendor"
		mount --bind -o ro "$vendor" "$dev/root/shared/vendor" || return 1
		if [ $use_cache -eq 1 ]; then
			mkdir -p "$citus_cache" "$dev$citus_cache"
			mount --bind "$citus_cache" "$dev$citus_cache" || return 1
		fi
		in_turn "$dev" "$log" ./scripts/test-citus.sh "$@" || rc=1
		# the servers it started must not hold the mounts
		kill_in_root "$dev"
		umount "$dev/root/shared/vendor" || rc=1
		[ $use_cache -eq 0 ] || umount "$dev$citus_cache" || rc=1
		return $rc
	}
	# PostgreSQL 15 beside the release's major, from bookworm's archive at
	# a priority below the release's, and idem built for both from HEAD
	# (not the suite's tree, which holds the release's build)
	pg_upgrade_suite() {
		local log=$logs/$rel-pg-upgrade.log old=/usr/lib/postgresql/15/bin/pg_config b
		release_sources bookworm | sed 's/^/deb /' >"$dev/etc/apt/sources.list.d/idem-bookworm.list"
		for b in bookworm bookworm-updates bookworm-security; do
			printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n\n' "$b"
		done >"$dev/etc/apt/preferences.d/idem-bookworm"
		# 15.20 (bookworm-security) writes a column option pg_attver on
		# every column, which forky's 18.6 does not know: its pg_upgrade
		# fails restoring any table, with or without idem.  forky's root
		# takes 15 from bookworm itself (15.18); trixie's 17.12 takes 15.20.
		local from=""
		[ "$rel" != forky ] || from=/bookworm
		in_root "$dev" "$log" apt-get update -qq &&
			in_root "$dev" "$log" apt-get install -y -qq "postgresql-15$from" \
				"postgresql-client-15$from" "postgresql-server-dev-15$from" &&
			in_env "$dev" "$log" "PG_CONFIG=$old ./scripts/deps.sh && ./scripts/deps.sh &&
				rm -rf /root/idem-up && mkdir /root/idem-up &&
				git archive HEAD | tar -C /root/idem-up -xf - &&
				make -s -j2 -C /root/idem-up PG_CONFIG=$old install >/dev/null &&
				make -s -C /root/idem-up clean &&
				make -s -j2 -C /root/idem-up PG_CONFIG=\$PG_CONFIG install >/dev/null &&
				./scripts/test-pg-upgrade.sh $old \$PG_CONFIG"
	}
	package() {
		in_env "$dev" "$logs/$rel-package.log" ./scripts/package.sh --out /root/debs || return 1
		mkdir -p "$work/debs/$rel"
		cp "$dev"/root/debs/*.deb "$work/debs/$rel/"
		deb=$(cd "$work/debs/$rel" && ls "postgresql-$major-idem_"*.deb 2>/dev/null | head -n1)
		[ -n "$deb" ] || { echo "test-versions: $rel made no postgresql-$major-idem .deb" >&2; return 1; }
		sed -n 's/^  \([EWIPXCO]: .*\)/lintian \1/p' "$logs/$rel-package.log" >>"$logs/$rel.lintian"
	}
	pkg_root() {
		unpack "$pkg" &&
			in_root "$pkg" "$logs/$rel-use.log" apt-get install -y -qq "postgresql-$major" &&
			mkdir -p "$pkg/root/idem" &&
			cp "$work/debs/$rel/$deb" "$pkg/root/idem/" &&
			git -C "$top" show "$head:scripts/check-package.sh" >"$pkg/root/idem/check-package.sh" &&
			chmod 755 "$pkg/root/idem/check-package.sh"
	}
	use() {
		local c
		for c in "./check-package.sh bare $major" \
			"DEBIAN_FRONTEND=noninteractive apt-get install -y -q ./$deb" \
			"./check-package.sh bare $major" "./check-package.sh installed $major" \
			"./check-package.sh use $major" \
			"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q postgresql-$major-idem" \
			"./check-package.sh purged $major"; do
			in_env "$pkg" "$logs/$rel-use.log" "$c" || return 1
		done
	}

	dev=$work/$rel-dev
	pkg=$work/$rel-pkg
	rc=0
	release_part "base root ($rel minbase)" release_base || return 1
	release_part "root: postgresql-$major, -dev, git" dev_root || return 1
	case " $no_suite " in
		*" $rel "*) say "$rel: suite skipped (--no-suite)" ;;
		*) release_part "suite (scripts/test.sh)" suite || rc=1 ;;
	esac
	case " $citus " in
		*" $rel "*) release_part "citus (scripts/test-citus.sh)" citus_suite || rc=1 ;;
	esac
	case " $citus_upgrade " in
		*" $rel "*) release_part "citus upgrade (--upgrade-from 13.2.2)" \
			citus_suite --upgrade-from 13.2.2 || rc=1 ;;
	esac
	release_part "package (pg_buildext, lintian)" package || return 1
	case " $pg_upgrade " in
		*" $rel "*) release_part "pg_upgrade from 15 (test-pg-upgrade.sh)" pg_upgrade_suite || rc=1 ;;
	esac
	remove_root "$dev" || true
	release_part "root: postgresql-$major, no compiler" pkg_root || return 1
	release_part "the .deb alone (check-package.sh)" use || rc=1
	remove_root "$pkg" || true
	return $rc
}

say "testing $head on:$(for r in $releases; do printf ' %s/%s' "$r" "$(major_of "$r")"; done); work directory $work"
t0=$(date +%s)
declare -A pid_of=()
for rel in $releases; do
	(prove_release "$rel") >"$logs/$rel.log" 2>&1 &
	pid_of[$rel]=$!
	pids+=($!)
done
failed=0
declare -A rc_of=()
for rel in $releases; do
	rc=0
	wait "${pid_of[$rel]}" || rc=$?
	rc_of[$rel]=$rc
	[ $rc -eq 0 ] || failed=1
done
pids=()

echo
echo "test-versions: $head"
for rel in $releases; do
	echo "$rel / PostgreSQL $(major_of "$rel"): $([ "${rc_of[$rel]}" -eq 0 ] && echo passed || echo FAILED)"
	awk -F'\t' '{ printf "  %-42s %5ds  %s\n", $1, $2, $3 }' "$logs/$rel.summary" 2>/dev/null || true
	[ -f "$logs/$rel.lintian" ] && sed 's/^/    /' "$logs/$rel.lintian"
	if [ "${rc_of[$rel]}" -ne 0 ]; then
		echo "  log: $logs/$rel.log (and $logs/$rel-*.log)"
		# what failed, wherever in the logs it was said, then the end
		grep -h -E '(^|\) )not ok |^# Looks like|Dubious|\.\.\. FAILED|^ *(installcheck|clients|docs) .*FAILED|failed:|FAILED \(' \
			"$logs/$rel"-*.log 2>/dev/null | head -n 30 | sed 's/^/  ! /'
		tail -n 40 "$logs/$rel.log" | sed 's/^/  | /'
	fi
done
echo "  in all: $(( $(date +%s) - t0 ))s"
ls "$work"/debs/*/*.deb 2>/dev/null | sed 's/^/  built: /'
[ $failed -eq 0 ] || { echo "test-versions: FAILED"; exit 1; }
echo "test-versions: all releases passed"
