#!/usr/bin/env bash
# Check the Debian package postgresql-<major>-idem on a machine where it is
# installed from its .deb, with nothing of idem's source tree and no build
# tools: only the package's own files and the PostgreSQL server.  Used by
# scripts/fresh-machine.sh (variant c) inside a fresh Debian 12 root; needs
# only bash, coreutils, util-linux (runuser) and PostgreSQL's own programs.
#
#   scripts/check-package.sh bare [MAJOR]
#       this machine cannot build idem: no C compiler, no make, no
#       PostgreSQL server headers, and no idem source tree (no idem.control
#       outside PostgreSQL's extension directory)
#   scripts/check-package.sh installed [MAJOR]
#       dpkg has the package installed, and it carries idem.so with its LLVM
#       bitcode, idem.control and the install chain idem--1.0.sql,
#       idem--1.0--1.1.sql, idem--1.1--1.2.sql where this PostgreSQL looks for them
#   scripts/check-package.sh use [MAJOR]
#       as the postgres user, in a throwaway cluster (initdb, pg_ctl, Unix
#       socket only, listen_addresses = ''): CREATE EXTENSION idem VERSION
#       '1.0' (which the 1.2 library refuses to run with 55000) then ALTER
#       EXTENSION idem UPDATE in one database, VERSION '1.1' then UPDATE in
#       a second, CREATE EXTENSION idem in a third; in each, a call
#       executes, its retry replays (replayed = t, the same response, one
#       business row) and a different request under the key is refused with
#       ID422; then the cluster is stopped
#   scripts/check-package.sh purged [MAJOR]
#       the package is gone from dpkg and none of its files is left
#
# MAJOR is the PostgreSQL major version, 15 by default.  Exits non-zero on
# the first check that fails.
set -euo pipefail

mode=${1:-}
major=${2:-15}
pkg=postgresql-$major-idem
pgbin=/usr/lib/postgresql/$major/bin
libdir=/usr/lib/postgresql/$major/lib
extdir=/usr/share/postgresql/$major/extension
files=("$libdir/idem.so" "$libdir/bitcode/idem.index.bc"
	"$extdir/idem.control" "$extdir/idem--1.0.sql"
	"$extdir/idem--1.0--1.1.sql" "$extdir/idem--1.1--1.2.sql")

say() { echo "check-package: $*"; }
die() { echo "check-package: FAILED: $*" >&2; exit 1; }

status() { dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true; }

bare() {
	local t found
	for t in cc gcc c99 clang make; do
		! command -v "$t" >/dev/null || die "$t is installed ($(command -v "$t"))"
	done
	[ ! -e "/usr/include/postgresql/$major/server/postgres.h" ] || die "the PostgreSQL $major server headers are installed"
	found=$(find / -xdev \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
		-name idem.control ! -path "$extdir/*" -print 2>/dev/null || true)
	[ -z "$found" ] || die "an idem source tree is here: $found"
	say "ok: no compiler, no make, no server headers, no idem source tree"
}

installed() {
	local f
	[ "$(status)" = installed ] || die "$pkg is not installed (dpkg status: '$(status)')"
	say "$pkg $(dpkg-query -W -f='${Version}' "$pkg") is installed; its files:"
	dpkg-query -L "$pkg" | sed 's/^/  /'
	for f in "${files[@]}"; do
		[ -f "$f" ] || die "$f is missing"
		dpkg-query -S "$f" >/dev/null 2>&1 || die "$f is not a file of any package"
	done
	ls "$libdir"/bitcode/idem/src/*.bc >/dev/null 2>&1 || die "no LLVM bitcode in $libdir/bitcode/idem/src"
	grep -q "^default_version = '1.2'" "$extdir/idem.control" ||
		die "idem.control's default_version is not '1.2'"
	say "ok: idem.so, its bitcode, idem.control, the install chain 1.0 -> 1.1 -> 1.2 is installed"
}

purged() {
	local left
	[ -z "$(status)" ] || [ "$(status)" = not-installed ] ||
		die "$pkg is still known to dpkg (status '$(status)')"
	left=$(find "$libdir" "$extdir" /usr/share/doc -maxdepth 3 \
		\( -name 'idem.*' -o -name 'idem--*' -o -name idem -o -name "$pkg" \) 2>/dev/null || true)
	[ -z "$left" ] || die "files left after the purge: $left"
	say "ok: $pkg is purged and none of its files is left"
}

use() {
	local dir port=5433
	[ -x "$pgbin/initdb" ] || die "no $pgbin/initdb (postgresql-$major is not installed)"
	# as root, the cluster runs as postgres (initdb refuses root); stay out
	# of directories postgres may not enter
	local runas=()
	[ "$(id -u)" -eq 0 ] && runas=(runuser -u postgres --)
	cd /
	dir=$(mktemp -d /tmp/idem-package.XXXXXX)
	[ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
	# shellcheck disable=SC2064
	trap "${runas[*]} $pgbin/pg_ctl -D '$dir/data' -m immediate stop >/dev/null 2>&1 || true; rm -rf '$dir'" EXIT
	"${runas[@]}" "$pgbin/initdb" -D "$dir/data" -A trust -U postgres \
		--encoding=UTF8 --no-locale >/dev/null
	"${runas[@]}" "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
		-o "-c listen_addresses='' -k $dir -p $port" start >/dev/null
	say "throwaway cluster in $dir/data, Unix socket $dir/.s.PGSQL.$port only"

	psql() {
		"${runas[@]}" "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres "$@"
	}
	psql -d postgres -c 'CREATE DATABASE upgraded' -c 'CREATE DATABASE upgraded11' \
		-c 'CREATE DATABASE fresh'

	# the version of idem that database $1 has must be $2
	expect_version() {
		local v
		v=$(psql -d "$1" -At -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'")
		[ "$v" = "$2" ] || die "database $1 has idem '$v', not '$2'"
		say "database $1: idem $v"
	}

	say "database upgraded: CREATE EXTENSION idem VERSION '1.0', then ALTER EXTENSION idem UPDATE"
	psql -d upgraded -c "CREATE EXTENSION idem VERSION '1.0'"
	expect_version upgraded 1.0
	psql -d upgraded <<'SQL'
DO $$
BEGIN
	-- the packaged 1.2 library refuses a database still at 1.0
	PERFORM idem_execute('k', 'SELECT 1');
	RAISE EXCEPTION 'idem_execute ran in a database still at 1.0';
EXCEPTION WHEN SQLSTATE '55000' THEN
	RAISE NOTICE 'at 1.0, refused as documented (55000): %', SQLERRM;
END $$;
SQL
	psql -d upgraded -c 'ALTER EXTENSION idem UPDATE'
	expect_version upgraded 1.2

	say "database upgraded11: CREATE EXTENSION idem VERSION '1.1', then ALTER EXTENSION idem UPDATE"
	psql -d upgraded11 -c "CREATE EXTENSION idem VERSION '1.1'"
	expect_version upgraded11 1.1
	psql -d upgraded11 -c 'ALTER EXTENSION idem UPDATE'
	expect_version upgraded11 1.2

	say "database fresh: CREATE EXTENSION idem"
	psql -d fresh -c 'CREATE EXTENSION idem'
	expect_version fresh 1.2

	# the call, as a retrying client sends it: each attempt its own session
	local db attempt call="idem_execute_ex('pay:invoice-4471',
       'INSERT INTO payments (invoice, amount) VALUES (\$1, \$2) RETURNING id, invoice, amount',
       'invoice-4471', 99.50::numeric)"
	for db in upgraded upgraded11 fresh; do
		say "database $db: a call executes, its retry replays, a different request is ID422"
		psql -d "$db" -c "CREATE TABLE payments (id bigserial PRIMARY KEY, invoice text NOT NULL,
			amount numeric(12,2) NOT NULL)" \
			-c 'CREATE TABLE calls (attempt int, replayed boolean, response jsonb)'
		for attempt in 1 2; do
			psql -d "$db" -P footer=off -c "INSERT INTO calls SELECT $attempt, replayed, response
				FROM $call RETURNING *"
		done
		psql -d "$db" <<'SQL'
\pset footer off
DO $$
BEGIN
	PERFORM idem_execute('pay:invoice-4471',
	        'INSERT INTO payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount',
	        'invoice-4471', 995.00::numeric);
	RAISE EXCEPTION 'a different request under the key was not refused';
EXCEPTION WHEN SQLSTATE 'ID422' THEN
	RAISE NOTICE 'different request refused (ID422): %', SQLERRM;
END $$;
DO $$
BEGIN
	IF (SELECT replayed FROM calls WHERE attempt = 1) IS DISTINCT FROM false THEN
		RAISE EXCEPTION 'the first call did not execute (replayed is not false)';
	END IF;
	IF (SELECT replayed FROM calls WHERE attempt = 2) IS DISTINCT FROM true THEN
		RAISE EXCEPTION 'the retry did not replay (replayed is not true)';
	END IF;
	IF (SELECT count(DISTINCT response) FROM calls) <> 1 THEN
		RAISE EXCEPTION 'the replay returned another response';
	END IF;
	IF (SELECT count(*) FROM payments) <> 1 THEN
		RAISE EXCEPTION 'not exactly one business row';
	END IF;
	IF (SELECT count(*) FROM idem.keys) <> 1 THEN
		RAISE EXCEPTION 'not exactly one key record';
	END IF;
END $$;
SELECT (SELECT count(*) FROM payments) AS payments,
       (SELECT count(*) FROM idem.keys) AS key_records;
SQL
	done

	"${runas[@]}" "$pgbin/pg_ctl" -D "$dir/data" -w -m fast stop >/dev/null
	say "ok: upgraded from 1.0 and from 1.1, created at 1.2; executed, replayed, ID422 in each; cluster stopped"
}

case $mode in
	bare|installed|use|purged) "$mode" ;;
	*) echo "usage: $0 bare|installed|use|purged [MAJOR]" >&2; exit 2 ;;
esac
