# Sourced by scripts/fresh-machine.sh and scripts/test-versions.sh: fresh
# Debian roots made with debootstrap, the commands run in them, and their
# removal.  Needs root.  The sourcing script sets bg_pid="" (the command
# in_bg waits for, which its cleanup kills) and defines say and die.

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

# "URI suite components" of Debian's own suites for release $1 (its
# -updates and -security too): the host's, or, for a release the host does
# not use, the same archives under that release's name.  Nothing
# third-party: a fresh machine has none.
release_sources() {
	local rel=$1 all
	all=$(apt_sources)
	if awk -v s="$rel" '$2 == s { f = 1 } END { exit !f }' <<<"$all"; then
		awk -v s="$rel" '$2 == s || $2 == s "-updates" || $2 == s "-security"' <<<"$all"
	else
		# the URIs of the host's Debian release, under $rel's name
		awk -v r="$rel" '$2 ~ /^[a-z]+(-updates|-security)?$/ && $1 ~ /debian/ {
				s = $2; sub(/^[a-z]+/, r, s); $2 = s; print }' <<<"$all"
	fi | awk '!seen[$0]++'
}

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
	echo "${0##*/}: still mounted under $d:" >&2
	mounts_under "$d" >&2
	return 1
}

# remove a root only when nothing is mounted in it any more
remove_root() {
	local r=$1
	kill_in_root "$r"
	unmount_under "$r" || { echo "${0##*/}: not removing $r" >&2; return 1; }
	rm -rf --one-file-system "$r"
}

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
		{ echo "${0##*/}: failed in $r: $*" >&2; tail -n 30 "$log" >&2; return 1; }
}

# A minimal root of release $2 in directory $1 (debootstrap's minbase, from
# the first of the "URI suite components" lines $4...), configured as a
# fresh machine of this network would be, with apt's lists fetched and the
# packages of $5 installed (a space-separated list).  Logs to $3.
make_root() {	# dir release log packages source-line...
	local base=$1 rel=$2 log=$3 pkgs=$4 script="" f
	shift 4
	local mirror=${1%% *}
	[ -e "/usr/share/debootstrap/scripts/$rel" ] || script=/usr/share/debootstrap/scripts/sid
	in_bg "$log" debootstrap --variant=minbase "$rel" "$base" "$mirror" $script ||
		{ tail -n 30 "$log" >&2; echo "${0##*/}: debootstrap $rel failed (log: $log)" >&2; return 1; }
	printf '#!/bin/sh\n# no service starts in this root\nexit 101\n' >"$base/usr/sbin/policy-rc.d"
	chmod 755 "$base/usr/sbin/policy-rc.d"
	# the Debian sources the host uses, as a fresh machine would have them
	rm -f "$base"/etc/apt/sources.list.d/*
	printf '%s\n' "$@" | sed 's/^/deb /' >"$base/etc/apt/sources.list"
	# the host's Acquire settings (proxy, validity checks) are how this network
	# reaches that archive; a fresh machine here would need them too
	# (the local ones only: a package's conffile, such as appstream's, would
	# stop that package's installation in the root at a conffile prompt)
	for f in /etc/apt/apt.conf /etc/apt/apt.conf.d/*; do
		[ -f "$f" ] && grep -qi '^[[:space:]]*Acquire' "$f" && ! dpkg -S "$f" >/dev/null 2>&1 &&
			cp "$f" "$base/etc/apt/apt.conf.d/"
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
	# and npm's own trust store, which is not the system's: point npm's
	# global configuration at the bundle that has them
	compgen -G "$base/usr/local/share/ca-certificates/*.crt" >/dev/null &&
		echo "cafile=/etc/ssl/certs/ca-certificates.crt" >"$base/etc/npmrc"
	mount_root "$base"
	in_root "$base" "$log" apt-get update -qq || return 1
	# shellcheck disable=SC2086
	in_root "$base" "$log" apt-get install -y -qq $pkgs || return 1
	kill_in_root "$base"
	unmount_under "$base"
}

# --- the end of a script's work directory -------------------------------------
# stop_parts PID...: end background parts (subshells of their own) and wait.
stop_parts() {
	local p
	for p in "$@"; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in "$@"; do
		wait "$p" 2>/dev/null || true
	done
}

# remove_work NAME DIR KEEP FAILED [KEPT...]: end the processes in DIR's
# roots and their mounts, then remove DIR: all of it after a success, all
# but its logs and the folders KEPT after a failure (FAILED non-zero),
# nothing with KEEP 1 or while a mount remains.  NAME begins the messages.
remove_work() {
	local name=$1 dir=$2 keep=$3 failed=$4 f
	local spare=(! -name logs)
	shift 4
	for f in "$@"; do
		spare+=(! -name "$f")
	done
	kill_in_root "$dir"
	if ! unmount_under "$dir"; then
		echo "$name: left $dir in place (mounts remain)" >&2
	elif [ "$keep" -eq 1 ]; then
		echo "$name: kept $dir" >&2
	elif [ "$failed" -ne 0 ]; then
		find "$dir" -mindepth 1 -maxdepth 1 "${spare[@]}" -exec rm -rf --one-file-system {} +
		echo "$name: logs kept in $dir/logs" >&2
	else
		rm -rf --one-file-system "$dir"
	fi
}

# --- the releases and their PostgreSQL majors ----------------------------------
# major_of RELEASE: the PostgreSQL major of Debian RELEASE's archive
major_of() {
	case $1 in bookworm) echo 15 ;; trixie) echo 17 ;; forky) echo 18 ;; esac
}

# --- one release's parts, in a script's per-release subshell -------------------
# Both read the caller's rel and sum (its summary file), release_base also
# work, logs, cache_dir and use_cache, and set the caller's tarball and
# srcs (bash's dynamic scope: the caller declares them local).

# release_part NAME COMMAND...: run, time and record one part, a line
# "name<TAB>seconds<TAB>result" in $sum.
release_part() {
	local name=$1 rc=0 t
	shift
	t=$(date +%s)
	say "$rel: $name"
	"$@" || rc=$?
	printf '%s\t%d\t%s\n' "$name" $(( $(date +%s) - t )) \
		"$([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)")" >>"$sum"
	return $rc
}

# release_base: the release's minimal base root (debootstrap minbase, the
# archive's sources, ca-certificates) as $tarball: the day's under
# $cache_dir, made there when it is missing; without the cache, made anew
# under $work.
release_base() {
	mapfile -t srcs < <(release_sources "$rel")
	[ ${#srcs[@]} -gt 0 ] || { echo "${0##*/}: no Debian source for $rel" >&2; return 1; }
	tarball=$cache_dir/$rel-$(date -u +%Y%m%d).tar
	if [ "$use_cache" -eq 1 ] && [ -f "$tarball" ]; then
		say "$rel: base root from $tarball"
		return 0
	fi
	[ "$use_cache" -eq 1 ] || tarball=$work/$rel-base.tar
	make_root "$work/$rel-base" "$rel" "$logs/$rel-base.log" ca-certificates "${srcs[@]}" || return 1
	if [ "$use_cache" -eq 1 ]; then
		mkdir -p "$cache_dir"
		rm -f "$cache_dir/$rel"-*.tar
	fi
	tar -C "$work/$rel-base" -cf "$tarball.$$" . && mv "$tarball.$$" "$tarball"
	rm -rf --one-file-system "$work/$rel-base"
}
