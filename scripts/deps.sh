#!/usr/bin/env bash
# Install what building and testing idem needs, from Debian's archive:
# PostgreSQL 15 with its PGXS build kit (server headers, pg_regress,
# isolationtester, the TAP modules), a C compiler, make and IPC::Run, and
# for the client helpers' tests psycopg 3, pytest, PgBouncer, Node and npm.
# Does nothing when all is there.
#
# Each check looks for the file the build or the tests use, not for a
# package: on Debian pg_config, PGXS, pg_regress, isolationtester and the
# PostgreSQL::Test modules all ship in postgresql-client-15, which
# postgresql-15 pulls in, but the server headers (postgres.h) ship only in
# postgresql-server-dev-15.  So a machine with postgresql-15 and no -dev
# package has every tool and cannot compile.  pg_config itself may be
# missing, and the other paths come from it, so it is checked first.
# With --test it also makes sure of what only the suite needs: Debian's
# prometheus-postgres-exporter and curl (test/t/120_exporter.pl scrapes the
# exporter), pytest, psycopg2 (the drivers' tests), PgBouncer, Node and
# npm.  With --bench it also makes sure of gnuplot, which only
# bench/run.sh needs (its chart).  The quick start needs neither.
set -euo pipefail

bench=0
tests=0
for arg in "$@"; do
	case $arg in
		--bench) bench=1 ;;
		--test) tests=1 ;;
	esac
done

# the major of PG_CONFIG's installation (Debian's layout), 15 by default:
# Debian 12 has 15, Debian 13 17, forky 18 (scripts/test-versions.sh)
major=15
[[ ${PG_CONFIG:-} =~ /postgresql/([0-9]+)/bin/pg_config$ ]] && major=${BASH_REMATCH[1]}
pgbin=/usr/lib/postgresql/$major/bin
pg_config=$pgbin/pg_config

# One line "package what" for each missing item.
missing() {
	[ -x "$pgbin/postgres" ] || echo "postgresql-$major $pgbin/postgres"
	if [ -x "$pg_config" ]; then
		local pgxs src inc clang llvm
		pgxs=$("$pg_config" --pgxs)	# .../lib/pgxs/src/makefiles/pgxs.mk
		src=$(dirname "$(dirname "$pgxs")")
		inc=$("$pg_config" --includedir-server)
		[ -f "$inc/postgres.h" ] || echo "postgresql-server-dev-$major $inc/postgres.h"
		# idem hashes with OpenSSL's SHA-256 where the server uses OpenSSL
		if grep -q '^#define USE_OPENSSL 1' "$inc/pg_config.h" 2>/dev/null; then
			[ -f /usr/include/openssl/sha.h ] || echo "libssl-dev /usr/include/openssl/sha.h"
		fi
		# utils/pg_locale.h includes ICU's headers where the server uses ICU
		if grep -q '^#define USE_ICU 1' "$inc/pg_config.h" 2>/dev/null; then
			[ -f /usr/include/unicode/ucol.h ] || echo "libicu-dev /usr/include/unicode/ucol.h"
		fi
		[ -f "$pgxs" ] || echo "postgresql-client-$major $pgxs"
		[ -f "$src/Makefile.global" ] || echo "postgresql-client-$major $src/Makefile.global"
		[ -x "$src/test/regress/pg_regress" ] ||
			echo "postgresql-client-$major $src/test/regress/pg_regress"
		[ -x "$src/test/isolation/isolationtester" ] ||
			echo "postgresql-client-$major $src/test/isolation/isolationtester"
		[ -x "$src/test/isolation/pg_isolation_regress" ] ||
			echo "postgresql-client-$major $src/test/isolation/pg_isolation_regress"
		[ -f "$src/test/perl/PostgreSQL/Test/Utils.pm" ] ||
			echo "postgresql-client-$major $src/test/perl/PostgreSQL/Test/Utils.pm"
		# Debian builds PostgreSQL with LLVM: PGXS also compiles the module
		# to bitcode with clang and indexes it with llvm-lto on install.
		mk() { sed -n "s/^$1[[:space:]]*=[[:space:]]*//p" "$src/Makefile.global" 2>/dev/null | head -n1; }
		if [ "$(mk with_llvm)" = yes ]; then
			clang=$(mk CLANG)
			[ -x "$clang" ] || echo "$(basename "$clang") $clang"
			llvm=$(mk LLVM_BINPATH)
			[ -x "$llvm/llvm-lto" ] || echo "$(basename "$(dirname "$llvm")") $llvm/llvm-lto"
		fi
		# the TAP modules load (they need IPC::Run and perl's Test::More);
		# their INIT block makes $TESTDIR/tmp_check, so give it a scratch dir
		if [ -f "$src/test/perl/PostgreSQL/Test/Utils.pm" ] && command -v prove >/dev/null &&
			perl -MIPC::Run -e1 2>/dev/null; then
			local t
			t=$(mktemp -d)
			TESTDIR=$t perl -I"$src/test/perl" -MPostgreSQL::Test::Utils -e1 >/dev/null 2>&1 ||
				echo "perl PostgreSQL::Test::Utils (perl -I$src/test/perl -MPostgreSQL::Test::Utils does not load)"
			rm -rf "$t"
		fi
	else
		echo "postgresql-client-$major $pg_config"
		# postgresql-server-dev-15 depends on postgresql-client-15, so
		# without pg_config there are no server headers either
		echo "postgresql-server-dev-$major server headers (postgres.h)"
	fi
	command -v gcc >/dev/null || echo "gcc gcc"
	command -v make >/dev/null || echo "make make"
	[ -f /usr/include/stdio.h ] || echo "libc6-dev /usr/include/stdio.h"
	command -v prove >/dev/null || echo "perl prove"
	perl -MIPC::Run -e1 2>/dev/null || echo "libipc-run-perl perl module IPC::Run"
	command -v runuser >/dev/null || echo "util-linux runuser"
	# the agent demo (scripts/agent-demo.sh) uses the Python helper
	/usr/bin/python3 -c 'import psycopg' 2>/dev/null || echo "python3-psycopg python3 module psycopg"
	if [ $tests -eq 1 ]; then
		[ -x /usr/bin/prometheus-postgres-exporter ] ||
			echo "prometheus-postgres-exporter /usr/bin/prometheus-postgres-exporter (test/t/120_exporter.pl)"
		command -v curl >/dev/null || echo "curl curl (test/t/120_exporter.pl)"
		# the client helpers' tests (scripts/test-clients.sh)
		/usr/bin/python3 -c 'import pytest' 2>/dev/null || echo "python3-pytest python3 module pytest"
		# the drivers table's psycopg2 row (clients/python/tests/test_drivers.py)
		/usr/bin/python3 -c 'import psycopg2' 2>/dev/null || echo "python3-psycopg2 python3 module psycopg2"
		# the Python package's offline install into a venv (test_package.py):
		# Debian ships ensurepip apart, in python3-venv
		/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || echo "python3-venv python3 module ensurepip"
		[ -x /usr/sbin/pgbouncer ] || echo "pgbouncer /usr/sbin/pgbouncer"
		command -v node >/dev/null || echo "nodejs node"
		command -v npm >/dev/null || echo "npm npm"
	fi
	if [ $bench -eq 1 ]; then
		command -v gnuplot >/dev/null || echo "gnuplot-nox gnuplot (bench)"
	fi
}

show() { echo "$report" | sed 's/^\([^ ]*\) \(.*\)/  \2 (package \1)/' >&2; }

report=$(missing)
[ -z "$report" ] && exit 0
mapfile -t need < <(echo "$report" | cut -d" " -f1 | sort -u)
if [ "$(id -u)" -ne 0 ]; then
	echo "idem: missing:" >&2
	show
	echo "idem: run this as root to install: ${need[*]}" >&2
	exit 1
fi
echo "idem: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=600 update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >/dev/null

report=$(missing)
if [ -n "$report" ]; then
	echo "idem: still missing after installing ${need[*]}:" >&2
	show
	exit 1
fi
