#!/usr/bin/env bash
# idem's benchmark on every PostgreSQL major it supports, side by side, each
# in a fresh root of the Debian release that ships it, from this
# repository's HEAD (uncommitted changes are not measured):
#
#   bookworm  PostgreSQL 15      trixie  PostgreSQL 17      forky  PostgreSQL 18
#
# Run once per release of idem, by hand: not part of CI (.ci/run does not
# call it).  For each release a root with postgresql-<major>,
# postgresql-server-dev-<major>, build-essential, valgrind and git (and
# what scripts/deps.sh --bench adds) gets a clone of HEAD in /srv/idem,
# builds and installs idem with that major's pg_config, and runs
#
#   bench/run.sh --no-install --workloads none --no-memory --profile \
#                --profile-workloads "<workloads>"
#
# in an empty environment (no LANG, no HOME; only PATH and PG_CONFIG), the
# cluster running as postgres: instructions per transaction in the server
# backend under callgrind, which do not move with the load of the machine,
# so majors measured one after the other on a busy machine compare.  The
# figures of all majors, their differences and idem's ratios to the
# hand-written baselines go to bench/results/versions.txt.
#
#   bench/versions.sh [--release bookworm|trixie|forky]...
#                     [--profile-workloads "L"] [--repeat N] [--tps]
#                     [--out FILE] [--no-cache] [--keep]
#
# --profile-workloads  the workloads counted (default "0 1 2 3 4 5 6 8": the
#                      round trip, bare, floor, plpgsql, idem new key, idem
#                      replay, plpgsql replay and the replay call shape)
# --repeat N           count each major N times (default 2: the second
#                      count shows how stable the first is) and report the
#                      median and the spread of the N counts
# --tps                also a short TPS pass of the same workloads (1 round
#                      x 5 s, synchronous_commit off, 4 clients) before the
#                      first count: secondary, since the majors run at
#                      different times and TPS moves with the machine's load
# --out FILE           the report (default bench/results/versions.txt)
#
# The roots are made at the same time (mostly waiting for the archive), the
# benchmarks run one at a time.  Base roots come from the tarballs
# scripts/test-versions.sh caches as /var/cache/idem-roots/<release>-<UTC
# date>.tar (made when missing; --no-cache makes them from nothing) and
# the .debs from /var/cache/idem-roots/apt-<release>, hard-linked into and
# back out of each root rather than bind-mounted, so that apt here never
# waits on the archive lock of a test-versions run using the same cache.
# Everything else is made in a mktemp -d directory under /tmp, removed at
# the end unless --keep (logs are kept when something failed).  Needs root.
# The summary lists each part's time.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/scripts/roots.sh"

all_releases="bookworm trixie forky"
releases=""
workloads="0 1 2 3 4 5 6 8"
repeat=2
tps=0
out="$top/bench/results/versions.txt"
use_cache=1
keep=0
cache_dir=/var/cache/idem-roots

usage() {
	sed -n '/^#   bench\/versions.sh/,/^#  *\[--out FILE\]/p' "$0" | sed 's/^# *//' >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case "$1" in
		--release)
			[ $# -ge 2 ] || usage
			case " $all_releases " in *" $2 "*) releases="$releases $2" ;; *) usage ;; esac
			shift ;;
		--profile-workloads)
			[ $# -ge 2 ] && [[ $2 =~ ^[0-9]+( [0-9]+)*$ ]] || usage
			workloads=$2
			shift ;;
		--repeat)
			[ $# -ge 2 ] && [[ $2 =~ ^[1-9][0-9]*$ ]] || usage
			repeat=$2
			shift ;;
		--tps) tps=1 ;;
		--out)
			[ $# -ge 2 ] || usage
			out=$(realpath -m "$2")
			shift ;;
		--no-cache) use_cache=0 ;;
		--keep) keep=1 ;;
		*) usage ;;
	esac
	shift
done
releases=${releases:-$all_releases}
# the majors in the order of $all_releases, whatever the order asked
releases=$(for r in $all_releases; do case " $releases " in *" $r "*) printf '%s ' "$r" ;; esac; done)

say() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "versions: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mounts)"
head=$(git -C "$top" rev-parse HEAD)
if ! command -v debootstrap >/dev/null; then
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

work=$(mktemp -d /tmp/idem-bench-versions.XXXXXX)
logs=$work/logs
mkdir -p "$logs"
bg_pid=""
pids=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	stop_parts "${pids[@]}"
	remove_work versions "$work" "$keep" "$rc" results
	exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- one release, in a subshell ------------------------------------------------
# Its parts' "name<TAB>seconds<TAB>result" go to $logs/<rel>.summary, its
# figures to $work/results/<rel>/ (run.sh's results directory of each run,
# and versions.env: the root's PostgreSQL, gcc and valgrind).
bench_release() {	# release
	local rel=$1 major sum tarball root res srcs
	major=$(major_of "$rel")
	sum=$logs/$rel.summary
	: >"$sum"
	root=$work/$rel
	res=$work/results/$rel
	mkdir -p "$res"
	bg_pid=""
	trap 'kill -TERM -- -"$bg_pid" 2>/dev/null; exit 143' TERM

	# a command in the root from /srv/idem, in an empty environment but
	# for PATH and PG_CONFIG; output to log $1
	in_env() {	# log command
		local log=$1
		shift
		in_bg "$log" chroot "$root" /usr/bin/env -i \
			PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			PG_CONFIG="/usr/lib/postgresql/$major/bin/pg_config" \
			/bin/bash -c "cd /srv/idem && $*" ||
			{ echo "=== $rel: '$*' failed; last 60 lines of $log:" >&2; tail -n 60 "$log" >&2; return 1; }
	}
	# .debs between the cache and the root: hard links where they can be
	# (same file system), copies otherwise; never overwriting
	debs() {	# from-dir to-dir
		local d
		for d in "$1"/*.deb; do
			[ -f "$d" ] || continue
			[ -e "$2/${d##*/}" ] && continue
			ln "$d" "$2/" 2>/dev/null || cp "$d" "$2/"
		done
	}
	make_bench_root() {
		local cache=$cache_dir/apt-$rel
		mkdir "$root" && tar -C "$root" -xf "$tarball" && mount_root "$root" || return 1
		# a throwaway root: dpkg need not sync each file
		echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/idem-unsafe-io"
		mkdir -p "$root/var/cache/apt/archives/partial"
		[ $use_cache -eq 1 ] && mkdir -p "$cache" && debs "$cache" "$root/var/cache/apt/archives"
		# procps: bench/run.sh's profile waits for backends with pgrep, which
		# deps.sh does not check for (a minbase root has none); gnuplot-nox,
		# libipc-run-perl and python3-psycopg: what deps.sh --bench would
		# install otherwise, one apt run fewer
		in_root "$root" "$logs/$rel-root.log" apt-get install -y -qq --no-install-recommends \
			"postgresql-$major" "postgresql-server-dev-$major" build-essential valgrind git \
			procps gnuplot-nox libipc-run-perl python3-psycopg || return 1
		# not under /root (mode 700): bench/run.sh, run as root, runs psql
		# and pgbench as postgres, which read the tree's SQL files
		git clone -q --no-hardlinks "$top" "$root/srv/idem" &&
			git -C "$root/srv/idem" checkout -q --detach "$head"
	}
	# what bench/run.sh needs besides (deps.sh --bench: gnuplot, IPC::Run,
	# psycopg...), then idem built and installed with this major's pg_config
	build() {
		in_env "$logs/$rel-build.log" './scripts/deps.sh --bench && . scripts/env.sh && idem_build_install .' || return 1
		[ $use_cache -eq 1 ] && debs "$root/var/cache/apt/archives" "$cache_dir/apt-$rel"
		chroot "$root" /bin/sh -c "/usr/lib/postgresql/$major/bin/postgres --version;
			gcc --version | head -n1; valgrind --version; . /etc/os-release; echo \"\$PRETTY_NAME\"" \
			>"$res/versions.env"
	}
	wait_turn() {	# one benchmark at a time: the others wait here
		exec 9>"$work/bench.lock"
		flock 9
	}
	bench() {
		local i opts
		for i in $(seq 1 "$repeat"); do
			opts="--no-install --workloads none --no-memory"
			[ $tps -eq 1 ] && [ "$i" -eq 1 ] &&
				opts="--no-install --workloads '$workloads' --rounds 1 --seconds 5 --sync off --no-memory"
			say "$rel: bench/run.sh, run $i of $repeat"
			in_env "$logs/$rel-bench.log" "cut -d' ' -f1 /proc/loadavg >/tmp/load-at-start &&
				bench/run.sh $opts --profile --profile-workloads '$workloads' &&
				d=\$(ls -d bench/out/*/ | tail -n1) && cp /tmp/load-at-start \$d/results/" || return 1
		done
		# run.sh's results directory of each run (oldest first)
		i=0
		for d in "$root"/srv/idem/bench/out/*/; do
			i=$((i + 1))
			cp -r "$d/results" "$res/run$i"
			cp "$d/run.log" "$res/run$i/"
			[ -f "$d/profile-functions.txt" ] && cp "$d/profile-functions.txt" "$res/run$i/"
		done
		[ "$i" -eq "$repeat" ] || { echo "versions: $rel: $i runs' results for $repeat runs" >&2; return 1; }
		flock -u 9
	}

	release_part "base root ($rel minbase)" release_base || return 1
	release_part "root: postgresql-$major, -dev, gcc, valgrind" make_bench_root || return 1
	release_part "idem built and installed" build || return 1
	release_part "waiting for the other benchmarks" wait_turn || return 1
	release_part "bench/run.sh --profile ($repeat run(s))" bench || return 1
	release_part "root removed" remove_root "$root" || return 1
}

say "benchmarking $head on:$(for r in $releases; do printf ' %s/%s' "$r" "$(major_of "$r")"; done); work directory $work"
t0=$(date +%s)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load0=$(cut -d' ' -f1-3 /proc/loadavg)
declare -A pid_of=()
for rel in $releases; do
	(bench_release "$rel") >"$logs/$rel.log" 2>&1 &
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
total=$(( $(date +%s) - t0 ))

times() {
	for rel in $releases; do
		echo "$rel / PostgreSQL $(major_of "$rel"): $([ "${rc_of[$rel]}" -eq 0 ] && echo "done" || echo FAILED)"
		awk -F'\t' '{ printf "  %-46s %5ds  %s\n", $1, $2, $3 }' "$logs/$rel.summary" 2>/dev/null || true
	done
	echo "in all: ${total}s"
}

if [ $failed -ne 0 ]; then
	echo
	echo "versions: $head"
	times
	for rel in $releases; do
		[ "${rc_of[$rel]}" -eq 0 ] && continue
		echo "$rel: log $logs/$rel.log (and $logs/$rel-*.log); its end:"
		tail -n 40 "$logs/$rel.log" | sed 's/^/  | /'
	done
	die "FAILED; $out not written"
fi

# --- the report ------------------------------------------------------------------
# the profile table of a run's results directory
profile_of() { ls "$1"/latest-profile*.txt | head -n1; }
# One line per count: "major run workload_id instr name..." from each run's
# profile table (latest-profile.txt, or latest-profile-subset.txt for a
# subset of the workloads).
counts=$work/counts
tpsf=$work/tps
: >"$counts"
: >"$tpsf"
for rel in $releases; do
	major=$(major_of "$rel")
	for d in "$work/results/$rel"/run*; do
		run=${d##*/run}
		f=$(profile_of "$d")
		awk -v m="$major" -v r="$run" '
			/^workload +instr\/tx/ { t = 1; next }
			t && NF == 0 { exit }
			t { n = $2; for (i = 3; i <= NF - 2; i++) n = n " " $i
				print m, r, $1, $(NF - 1), n }' "$f" >>"$counts"
		# TPS (--tps): "major run workload_id tps"
		[ -f "$d/latest.csv" ] &&
			awk -F, -v m="$major" -v r="$run" 'NR > 1 && $3 == "off" { print m, r, $1, $6 }' "$d/latest.csv" >>"$tpsf"
	done
done
majors=$(for rel in $releases; do printf '%s ' "$(major_of "$rel")"; done)

{
	echo "idem benchmark per PostgreSQL major (bench/versions.sh; run by hand once per release of idem, not part of CI)"
	echo "run: $started, ${total}s in all; 1-minute, 5-minute and 15-minute load at the start: $load0"
	echo "idem: $head (a clone of it built in each root), $(git -C "$top" log -1 --format='%cd' --date=format:'%Y-%m-%d' "$head"):"
	git -C "$top" log -1 --format='%s' "$head" | fold -s -w 108 | sed 's/ *$//; s/^/  /'
	echo "machine: $(sed -n 's/^machine: \([^,]*, [^,]*, [^,]*\), .*/\1/p' "$(profile_of "$work/results/${releases%% *}/run1")")"
	for rel in $releases; do
		f=$(profile_of "$work/results/$rel/run1")
		printf '  %-9s %s; %s, %s; fdatasync %s ops/s\n' "$rel" \
			"$(sed -n '4p' "$work/results/$rel/versions.env")" \
			"$(sed -n '2p' "$work/results/$rel/versions.env" | sed 's/ (Debian [^)]*)//')" \
			"$(sed -n '3p' "$work/results/$rel/versions.env")" \
			"$(sed -n 's/.*fdatasync \([0-9?]*\) ops.*/\1/p' "$f")"
		printf '  %-9s %s; load at the start of its benchmark: %s\n' "" \
			"$(sed -n 's/^machine: .*, \(PostgreSQL [^,]*\), fdatasync.*/\1/p' "$f")" \
			"$(cat "$work/results/$rel"/run*/load-at-start | tr '\n' ' ' | sed 's/ $//')"
	done
	echo
	echo "Instructions per transaction in the server backend (callgrind; bench/run.sh --profile: pgbench -M prepared,"
	echo "1 client, synchronous_commit off, the difference of a 1500- and a 300-transaction session, so connection"
	echo "start-up is excluded).  Each major's PostgreSQL is Debian's build, and idem is compiled by that release's gcc."
	[ "$repeat" -gt 1 ] && echo "Median of $repeat runs per major; spread: (max - min) / median over a major's runs."
	echo
	awk -v majors="$majors" -v repeat="$repeat" '
		function median(list,    n, a, i, j, t) {
			n = split(list, a, " ")
			for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
			return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
		}
		function spread(list,    n, a, i, lo, hi) {
			n = split(list, a, " "); lo = hi = a[1] + 0
			for (i = 2; i <= n; i++) { if (a[i] + 0 < lo) lo = a[i] + 0; if (a[i] + 0 > hi) hi = a[i] + 0 }
			return (hi - lo) / median(list)
		}
		function r(x, y) { return (y > 0 && x > 0) ? sprintf("%.2f", x / y) : "-" }
		{ m = $1; w = $3; v[m, w] = v[m, w] " " $4; n = $5; for (i = 6; i <= NF; i++) n = n " " $i; name[w] = n
		  if (!(w in seen)) { seen[w] = 1; order[++nw] = w } }
		END {
			nm = split(majors, M, " ")
			for (i = 1; i <= nw; i++) for (j = 1; j <= nm; j++)
				if ((M[j], order[i]) in v) { med[M[j], order[i]] = median(v[M[j], order[i]])
					sp = spread(v[M[j], order[i]]); if (sp > maxsp[M[j]]) maxsp[M[j]] = sp }
			printf "%-22s", "workload"
			for (j = 1; j <= nm; j++) printf " %10s", "PG " M[j]
			for (j = 2; j <= nm; j++) printf " %9s", "PG " M[j] "/" M[1]
			printf "\n"
			for (i = 1; i <= nw; i++) {
				w = order[i]
				printf "%-22s", w " " name[w]
				for (j = 1; j <= nm; j++) printf " %10s", ((M[j], w) in med) ? sprintf("%d", med[M[j], w]) : "-"
				flag = ""
				for (j = 2; j <= nm; j++) {
					x = med[M[j], w]; y = med[M[1], w]
					if (x > 0 && y > 0) { d = 100 * (x / y - 1); printf " %+8.1f%%", d; if (d > 5 || d < -5) flag = "  *" }
					else printf " %9s", "-"
				}
				printf "%s\n", flag
			}
			if (nm > 1) printf "(* differs from PostgreSQL %s by more than 5%%)\n", M[1]
			if (repeat > 1) {
				printf "spread of the %d runs, largest over the workloads:", repeat
				for (j = 1; j <= nm; j++) printf " PG %s %.1f%%", M[j], 100 * maxsp[M[j]]
				printf "\n"
			}
			printf "\nidem against the hand-written baselines, instructions per transaction (lower is cheaper for idem)\n"
			printf "%-40s", "ratio"
			for (j = 1; j <= nm; j++) printf " %7s", "PG " M[j]
			printf "\n"
			nr = split("4 2 idem new key / floor;4 3 idem new key / plpgsql;4 1 idem new key / bare;5 0 idem replay / round trip;5 6 idem replay / plpgsql replay;5 8 idem replay / replay call shape;9 4 idem step new key / idem new key", R, ";")
			for (k = 1; k <= nr; k++) {
				split(R[k], f, " "); a = f[1]; b = f[2]; label = R[k]; sub(/^[0-9]+ [0-9]+ /, "", label)
				if (!((M[1], a) in med) || !((M[1], b) in med)) continue
				printf "%-40s", a " / " b "  " label
				for (j = 1; j <= nm; j++) printf " %7s", r(med[M[j], a], med[M[j], b])
				printf "\n"
			}
		}' "$counts"
	if [ -s "$tpsf" ]; then
		echo
		echo "TPS (secondary: --tps, pgbench -M prepared, 4 clients, synchronous_commit off, 1 run of 5 s per workload and"
		echo "major before its first count, the majors one after the other on a shared machine: the columns do not compare well)"
		awk -v majors="$majors" '
			function median(list,    n, a, i, j, t) {
				n = split(list, a, " ")
				for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
				return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
			}
			FNR == NR { name[$3] = $5; for (i = 6; i <= NF; i++) name[$3] = name[$3] " " $i; next }
			{ v[$1, $3] = v[$1, $3] " " $4; if (!($3 in seen)) { seen[$3] = 1; order[++nw] = $3 } }
			END {
				nm = split(majors, M, " ")
				printf "%-22s", "workload"
				for (j = 1; j <= nm; j++) printf " %10s", "PG " M[j]
				printf "\n"
				for (i = 1; i <= nw; i++) {
					printf "%-22s", order[i] " " name[order[i]]
					for (j = 1; j <= nm; j++) printf " %10s", ((M[j], order[i]) in v) ? sprintf("%.0f", median(v[M[j], order[i]])) : "-"
					printf "\n"
				}
			}' "$counts" "$tpsf"
	fi
	echo
	echo "time of each part (the roots are made at the same time, the benchmarks run one at a time)"
	times
	for rel in $releases; do
		echo
		echo "=== $rel / PostgreSQL $(major_of "$rel"): bench/run.sh's profile (run 1), with the costliest functions of idem's calls"
		# (not run.sh's ratios: the ones above are the same, and run.sh
		# prints 0.00 for a ratio whose workload was not counted)
		sed -n '/^workload  *instr\/tx/,$p' "$(profile_of "$work/results/$rel/run1")" |
			sed '/^instruction ratios/,/^$/d'
	done
} >"$out.new"
mv "$out.new" "$out"
sed -n '1,/^time of each part/p' "$out" | sed '$d'
times
echo "versions: report in $out"
