#!/usr/bin/env bash
# Prove the README's quick start and the Debian package on fresh Debian 12
# machines.  Builds a minimal bookworm root with debootstrap, and in a copy
# of it for each variant tests this repository's HEAD (uncommitted changes
# are not tested).  Variants a and b clone HEAD and run the commands of
# the ```sh block under "## Quick start" in README.md verbatim, in order,
# as root, from the clone's top directory, in a clean environment:
#
#   a  postgresql-15 preinstalled (server and client, no -dev package), git
#   b  bare: only git
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
# "URI suite components" for each deb source in sources.list, *.list
# (one-line format) and *.sources (deb822).
apt_sources() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -f "$f" ] || continue
		sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" |
			awk '$1 == "deb" && NF >= 3 { c = ""; for (i = 4; i <= NF; i++) c = c " " $i
				print $2, $3, (c == "" ? " main" : c) }'
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] || continue
		awk 'function flush(   i, j, nu, ns, u, s) {
				if (types ~ /(^| )deb( |$)/ && enabled !~ /^(no|false)$/) {
					nu = split(uris, u, " "); ns = split(suites, s, " ")
					for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++)
						print u[i], s[j], (comps == "" ? "main" : comps)
				}
				types = uris = suites = comps = enabled = ""
			}
			/^[ \t]*#/ { next }
			/^[ \t]*$/ { flush(); next }
			/^[ \t]/ {					# continuation of a multi-line field
				if (k == "uris:") uris = uris " " $0
				else if (k == "suites:") suites = suites " " $0
				else if (k == "components:") comps = comps " " $0
				next
			}
			{ v = $0; sub(/^[^:]*:[ \t]*/, "", v); k = tolower($1) }
			k == "types:" { types = v } k == "uris:" { uris = v }
			k == "suites:" { suites = v } k == "components:" { comps = v }
			k == "enabled:" { enabled = tolower(v) }
			END { flush() }' "$f"
	done
}
# only Debian's own bookworm suites: a fresh machine has no third-party ones
mapfile -t sources < <(apt_sources |
	awk -v s="$suite" '$2 == s || $2 == s "-updates" || $2 == s "-security"' | awk '!seen[$0]++')
mirror=$(printf '%s\n' "${sources[@]}" | awk -v s="$suite" '$2 == s { print $1; exit }')
[ -n "$mirror" ] || die "no '$suite' source in the host's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/)"

# --- the work directory and its cleanup ----------------------------------------
work=$(mktemp -d /tmp/idem-fresh.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
failed=0
bg_pid=""		# the command in_bg waits for

# mount points at or under $1, most recent first
mounts_under() {
	awk -v d="$1" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | tac
}

alive() {
	local p
	for p; do
		kill -0 "$p" 2>/dev/null && return 0
	done
	return 1
}

# is a process of group $1 still running (zombies do not count)?
group_alive() {
	ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { f = 1 } END { exit !f }'
}

# kill every process whose root directory is at or under $1 (the servers
# and clients a command may have left behind)
kill_in_root() {
	local r=$1 p root pids sig i
	for sig in TERM KILL; do
		pids=()
		for p in /proc/[0-9]*; do
			root=$(readlink "$p/root" 2>/dev/null) || continue
			[ "$root" = "$r" ] || [ "${root#"$r"/}" != "$root" ] || continue
			pids+=("${p#/proc/}")
		done
		[ ${#pids[@]} -eq 0 ] && return 0
		say "killing (SIG$sig) processes left in $r: ${pids[*]}"
		kill -"$sig" "${pids[@]}" 2>/dev/null || true
		for i in $(seq 1 20); do
			alive "${pids[@]}" || break
			sleep 0.5
		done
	done
}

unmount_under() {
	local d=$1 m
	for _ in 1 2 3; do
		for m in $(mounts_under "$d"); do
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
		done
		[ -z "$(mounts_under "$d")" ] && return 0
		sleep 1
	done
	echo "fresh-machine: still mounted under $d:" >&2
	mounts_under "$d" >&2
	return 1
}

# remove a root only when nothing is mounted in it any more
remove_root() {
	local r=$1
	kill_in_root "$r"
	unmount_under "$r" || { echo "fresh-machine: not removing $r" >&2; return 1; }
	rm -rf --one-file-system "$r"
}

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
	kill_in_root "$work"
	if ! unmount_under "$work"; then
		echo "fresh-machine: left $work in place (mounts remain)" >&2
	elif [ $keep -eq 1 ]; then
		echo "fresh-machine: kept $work" >&2
	elif [ $failed -ne 0 ] || [ $rc -ne 0 ]; then
		find "$work" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
		echo "fresh-machine: logs kept in $logs" >&2
	else
		rm -rf --one-file-system "$work"
	fi
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Run "$@" in the background, in a process group of its own, and wait for
# it: a signal then interrupts the wait and the cleanup runs at once,
# killing that group (debootstrap runs outside the roots) and what runs in
# the roots, instead of after the command.  The command gets SIGINT and
# SIGQUIT back, which a background command of a script would otherwise
# ignore.  Its output is appended to LOG here, not by redirecting this
# function: the cleanup trap would run with that redirection in effect.
in_bg() {	# LOG command...
	local log=$1 rc=0
	shift
	(trap - INT QUIT; exec setsid "$@") </dev/null >>"$log" 2>&1 &
	bg_pid=$!
	wait $bg_pid || rc=$?
	bg_pid=""
	return $rc
}

mount_root() {
	local r=$1
	mount -t proc proc "$r/proc"
	mount --bind /dev "$r/dev"
	mount --bind /dev/pts "$r/dev/pts"
	mount -t tmpfs -o mode=1777,nosuid,nodev shm "$r/dev/shm"
}

# run a set-up command in root $1, in a clean environment, logging to $2
in_root() {
	local r=$1 log=$2
	shift 2
	in_bg "$log" chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		"$@" ||
		{ echo "fresh-machine: failed in $r: $*" >&2; tail -n 30 "$log" >&2; return 1; }
}

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
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
base=$work/base
phase_start "debootstrap --variant=minbase $suite"
in_bg "$logs/debootstrap.log" debootstrap --variant=minbase "$suite" "$base" "$mirror" ||
	{ tail -n 30 "$logs/debootstrap.log" >&2; die "debootstrap failed (log: $logs/debootstrap.log)"; }
phase_end "debootstrap --variant=minbase $suite"

phase_start "base root: apt sources, policy-rc.d, git"
printf '#!/bin/sh\n# no service starts in this root\nexit 101\n' >"$base/usr/sbin/policy-rc.d"
chmod 755 "$base/usr/sbin/policy-rc.d"
# the Debian sources the host uses, as a fresh machine would have them
rm -f "$base"/etc/apt/sources.list.d/*
printf '%s\n' "${sources[@]}" | sed 's/^/deb /' >"$base/etc/apt/sources.list"
# the host's Acquire settings (proxy, validity checks) are how this network
# reaches that archive; a fresh machine here would need them too
for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
	[ -f "$f" ] && grep -qi '^[[:space:]]*Acquire' "$f" && cp "$f" "$base/etc/apt/apt.conf.d/"
done
cp /etc/resolv.conf "$base/etc/resolv.conf"
cp /etc/hosts "$base/etc/hosts"
# likewise the certificate authorities the host adds to Debian's (this
# network's TLS egress proxy signs with one), which npm needs to reach its
# registry; ca-certificates puts them in the root's bundle
mkdir -p "$base/usr/local/share/ca-certificates"
for f in /usr/local/share/ca-certificates/*.crt; do
	[ -f "$f" ] && cp "$f" "$base/usr/local/share/ca-certificates/"
done
mount_root "$base"
in_root "$base" "$logs/base.log" apt-get update -qq
in_root "$base" "$logs/base.log" apt-get install -y -qq git ca-certificates
kill_in_root "$base"
unmount_under "$base"
phase_end "base root: apt sources, policy-rc.d, git"

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
	in_bg "$log" chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		"${tls_env[@]}" "$@" \
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
