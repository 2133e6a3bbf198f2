#!/usr/bin/env bash
# Prove the README's quick start and the Debian package on fresh Debian 12
# machines.  Builds a minimal bookworm root with debootstrap, and in a copy
# of it for each variant tests this repository's HEAD (uncommitted changes
# are not tested).  Variants a and b clone HEAD and run the commands of
# the ```sh block under "## Quick start" in README.md verbatim, in order,
# as root, from the clone's top directory, in a clean environment:
#
#   a  postgresql-15 preinstalled (server and client, no -dev package), git
#   b  bare: only git, and an empty environment (env -i: no LANG, HOME or
#      PATH, as a container's default), where the test clusters must still
#      come up UTF-8
#
# Variant c tests the package route instead:
#
#   c  postgresql-15 and no compiler, make or source tree: installs only
#      the .deb that scripts/package.sh built from HEAD on this machine
#      (before any root is made), checks its files, uses it in a throwaway
#      cluster (1.0 then ALTER EXTENSION UPDATE, a fresh 1.1, execute,
#      replay, ID422: scripts/check-package.sh, copied into the root), then
#      purges it and checks that its files are gone.  Then, in the same
#      root, HEAD's tree (git archive) and the package's autopkgtest
#      (debian/tests: the whole suite against the installed .deb), run by
#      autopkgtest's null runner
#
#   scripts/fresh-machine.sh [--variant a|b|c] [--keep]
#
# The Debian archive is the one the host's own apt sources name.  Needs
# root (debootstrap, chroot, mounts).  Everything lives in a mktemp -d
# directory under /tmp, removed at the end unless --keep; when a command
# failed, its logs are kept there.  Exits non-zero if any command failed.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/roots.sh"
suite=bookworm
variants="a b c"
keep=0

usage() {
	cat <<EOF
usage: $0 [--variant a|b|c] [--keep]
  --variant a   quick start, postgresql-15 preinstalled (no -dev package)
  --variant b   quick start, bare Debian 12 with git only
  --variant c   the Debian package alone, postgresql-15, no build tools;
                then its autopkgtest in the same root
                (default: all three)
  --keep        keep the work directory with the roots, for debugging
EOF
}

while [ $# -gt 0 ]; do
	case "$1" in
		--variant)
			[ $# -ge 2 ] || { usage >&2; exit 2; }
			case "$2" in a|b|c) variants=$2 ;; *) usage >&2; exit 2 ;; esac
			shift ;;
		--keep) keep=1 ;;
		-h|--help) usage; exit 0 ;;
		*) usage >&2; exit 2 ;;
	esac
	shift
done

say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "fresh-machine: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mounts)"

# --- what to test: HEAD and its README's quick start --------------------------
head=$(git -C "$top" rev-parse HEAD)
# (README.md read whole first: awk stops reading at the block, and git
# writing into a pipe nobody reads any more dies of SIGPIPE under pipefail)
readme=$(git -C "$top" show "$head:README.md")
quick=$(awk '
	/^## Quick start[ \t]*$/ { h = 1; next }
	h && !inb && /^##? / { exit }			# next heading: no block
	h && !inb && /^```sh[ \t]*$/ { inb = 1; next }
	inb && /^```/ { closed = 1; exit }
	inb {
		if ($0 ~ /^[ \t]*#/) next
		sub(/[ \t]+#.*$/, ""); sub(/[ \t]+$/, "")
		if ($0 != "") print
	}
	END { if (!closed) exit 1 }' <<<"$readme") ||
	die "README.md at $head has no closed \`\`\`sh block after '## Quick start'"
[ -n "$quick" ] || die "the quick-start block of README.md at $head is empty"
mapfile -t cmds <<<"$quick"

# --- the Debian archive, from the host's apt sources --------------------------
# only Debian's own bookworm suites: a fresh machine has no third-party ones
mapfile -t sources < <(release_sources "$suite")
mirror=$(printf '%s\n' "${sources[@]}" | awk -v s="$suite" '$2 == s { print $1; exit }')
[ -n "$mirror" ] || die "no '$suite' source in the host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/)"

# --- the work directory and its cleanup ----------------------------------------
work=$(mktemp -d /tmp/idem-fresh.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
failed=0
bg_pid=""		# the command in_bg waits for

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -n "$bg_pid" ]; then
		kill -TERM -- -"$bg_pid" 2>/dev/null || true
		for _ in $(seq 1 20); do
			group_alive "$bg_pid" || break
			sleep 0.5
		done
		kill -KILL -- -"$bg_pid" 2>/dev/null || true
		wait "$bg_pid" 2>/dev/null || true
	fi
	remove_work fresh-machine "$work" "$keep" "$((failed || rc))"
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# phase timings, printed in the summary
declare -a summary=()
t_phase=0
phase_start() { t_phase=$(date +%s); say "$*"; }
phase_end() { summary+=("$(printf '  %-44s %4ds' "$1" $(( $(date +%s) - t_phase )))"); }

say "testing $head; quick start: $(printf '%s; ' "${cmds[@]}")"
say "archive: $mirror (from the host's apt sources); work directory $work"

# --- variant c's package, built here from HEAD before any root ------------------
case " $variants " in
	*" c "*)
		phase_start "scripts/package.sh --commit $head"
		in_bg "$logs/package.log" "$top/scripts/package.sh" --commit "$head" --out "$work/debs" ||
			{ tail -n 40 "$logs/package.log" >&2; die "scripts/package.sh failed (log: $logs/package.log)"; }
		phase_end "package: scripts/package.sh (build, lintian)"
		# the lintian tags package.sh printed (it fails on errors)
		while IFS= read -r l; do
			summary+=("    lintian $l")
		done < <(sed -n 's/^  \([EWIPXCO]: .*\)/\1/p' "$logs/package.log")
		compgen -G "$work/debs/postgresql-15-idem_*.deb" >/dev/null ||
			die "scripts/package.sh made no postgresql-15-idem .deb (log: $logs/package.log)"
		;;
esac

# --- the base root: debootstrap minbase, apt sources, no services, git --------
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq debootstrap >/dev/null
fi
base=$work/base
phase_start "base root: debootstrap --variant=minbase $suite, apt sources, git"
make_root "$base" "$suite" "$logs/base.log" "git ca-certificates" "${sources[@]}" ||
	die "the base root failed (log: $logs/base.log)"
phase_end "base root: debootstrap minbase $suite, git"

# Node (npm) trusts only its own CA list unless told: where the host added
# authorities of its own, point Node at the root's bundle, which has them.
tls_env=()
compgen -G "$base/usr/local/share/ca-certificates/*.crt" >/dev/null &&
	tls_env+=("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt")

# --- the variants ------------------------------------------------------------
# Run one command of variant $1 in its root $2, as root, from directory $4
# of the root, in a clean environment (plus the VAR=value assignments after
# the command); log it to $logs/$1-$3.log and record its exit status and
# time in the summary.  Returns the command's status.
run_step() {	# variant root number dir command [VAR=value...]
	local v=$1 root=$2 i=$3 dir=$4 cmd=$5 log rc=0 t
	shift 5
	log=$logs/$v-$i.log
	say "variant $v: $cmd"
	t=$(date +%s)
	# variant b: an empty environment, as a container starts (no LANG,
	# no HOME, bash's default PATH); the others a login's
	local envv=(HOME=/root LANG=C.UTF-8
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${tls_env[@]}" "$@")
	[ "$v" = b ] && envv=()
	in_bg "$log" chroot "$root" /usr/bin/env -i "${envv[@]}" \
		/bin/bash -c "cd $dir && $cmd" || rc=$?
	t=$(( $(date +%s) - t ))
	summary+=("$(printf '  %-44s exit %-3d %4ds' "$cmd" "$rc" "$t")")
	if [ $rc -ne 0 ]; then
		failed=1
		summary+=("    log: $log")
		{
			echo "=== variant $v: '$cmd' exited $rc; last 40 lines of $log:"
			tail -n 40 "$log"
			echo "==="
		} >&2
	fi
	return $rc
}

# Run commands $3... of variant c in its root $1 from directory $2 of it,
# with DEBIAN_FRONTEND=noninteractive; stop at the first that fails.
c_steps() {	# root dir command...
	local root=$1 dir=$2 cmd
	shift 2
	for cmd; do
		c_step=$((c_step + 1))
		run_step c "$root" "$c_step" "$dir" "$cmd" DEBIAN_FRONTEND=noninteractive || return 1
	done
}

# Variant c, in root $1 with postgresql-15 installed: the package alone, no
# build tools, no source tree; then, in the same root, the package's
# autopkgtest (debian/tests) with autopkgtest's null runner, for which
# HEAD's tree (git archive) comes into the root only after the purge.
package_steps() {
	local root=$1 dir=/var/tmp/idem-package
	c_step=0
	mkdir -p "$root$dir"
	cp "$work"/debs/postgresql-15-idem_*.deb "$root$dir/"
	git -C "$top" show "$head:scripts/check-package.sh" >"$root$dir/check-package.sh"
	chmod -R a+rX "$root$dir"
	chmod a+x "$root$dir/check-package.sh"
	c_steps "$root" "$dir" \
		"./check-package.sh bare" \
		"apt-get install -y -q ./postgresql-15-idem_*.deb" \
		"./check-package.sh bare" \
		"./check-package.sh installed" \
		"./check-package.sh use" \
		"apt-get purge -y -q postgresql-15-idem" \
		"./check-package.sh purged" || return 1
	mkdir "$root/root/idem-src"
	git -C "$top" archive "$head" | tar -C "$root/root/idem-src" -xf -
	c_steps "$root" "$dir" \
		"apt-get install -y -q --no-install-recommends autopkgtest" \
		"autopkgtest ./postgresql-15-idem_*.deb /root/idem-src/ -- null"
}

run_variant() {
	local v=$1 name root cmd t0 i=0
	case $v in
		a) name="a: postgresql-15 preinstalled, no -dev" ;;
		b) name="b: bare, git only" ;;
		c) name="c: the .deb alone, postgresql-15, no build tools" ;;
	esac
	root=$work/root-$v
	summary+=("variant $name")
	t0=$(date +%s)

	phase_start "variant $v: copy the base root"
	cp -a "$base" "$root"
	mount_root "$root"
	if [ "$v" = a ] || [ "$v" = c ]; then
		in_root "$root" "$logs/$v-setup.log" apt-get install -y -qq postgresql-15
		in_root "$root" "$logs/$v-setup.log" \
			sh -c '! dpkg -l "postgresql-server-dev-*" 2>/dev/null | grep -q "^ii"' ||
			die "variant $v: a -dev package got installed"
	fi
	if [ "$v" = c ]; then
		phase_end "set-up (copy, postgresql-15)"
		package_steps "$root" || true
	else
		git clone -q --no-hardlinks "$top" "$root/root/idem" >>"$logs/$v-setup.log" 2>&1
		git -C "$root/root/idem" checkout -q --detach "$head"
		phase_end "set-up (copy, packages, clone)"
		for cmd in "${cmds[@]}"; do
			i=$((i + 1))
			run_step "$v" "$root" "$i" /root/idem "$cmd" || true
		done
	fi

	summary+=("$(printf '  %-44s %4ds' "variant $v in all" $(( $(date +%s) - t0 )))")
	kill_in_root "$root"
	if [ $keep -eq 1 ]; then
		unmount_under "$root"
	else
		remove_root "$root"
	fi
}

for v in $variants; do
	run_variant "$v"
done

echo
echo "fresh-machine: $head on fresh Debian 12 roots (variants: $variants)"
printf '%s\n' "${summary[@]}"
if [ $failed -ne 0 ]; then
	echo "fresh-machine: FAILED"
	exit 1
fi
echo "fresh-machine: all commands passed"
