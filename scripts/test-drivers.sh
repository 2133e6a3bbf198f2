#!/usr/bin/env bash
# The driver matrix (issue 23): a retry from any client replays.  Installs
# thirteen drivers from Debian's archive and npm (psycopg 3 and 2, asyncpg,
# SQLAlchemy, node-postgres, postgres.js, PgJDBC, DBD::Pg, PDO, PHP's
# pgsql, ruby-pg, pgx v4 and lib/pq, the Go ones built offline from
# Debian's sources in GOPATH mode), starts a throwaway cluster with idem and
# a PgBouncer in transaction mode on loopback, and then:
#   1. each driver, and psql with explicit types, makes the same request
#      (scripts/drivers/README) under a key of its own: it executes;
#   2. each one retries every key, its own and every other's: each must
#      replay with the very response, and a different request under each
#      key must be ID422 in the driver's own error object;
#   3. each one retries every key again through PgBouncer with its
#      documented setting, after a client left SET extra_float_digits = 3
#      on the pooled server connection (PgJDBC's setting, leaked);
#   4. each one, directly and through PgBouncer, makes an idem_call with
#      every option (outbox_topic, ttl, wait, as the language's own values)
#      twice under a new key: it must execute, then replay the very
#      response, write one event to the topic and keep the record for the
#      ttl; and it calls with wait => false under a key that a prepared
#      transaction holds: the driver's error object must carry ID409.
# Prints the pass counts and the time, and the driver table of
# doc/drivers.md, which it checks against the doc (--write-doc rewrites
# it).  A driver that cannot be installed or built counts as failed.
#
#   scripts/test-drivers.sh [--write-doc]
# Builds and installs idem into PG_CONFIG's installation first (Debian's
# PostgreSQL 15 by default, which scripts/deps.sh installs), so it runs on
# a machine with nothing.  IDEM_DRIVERS_PORT: the first port to try (5491);
# the first free pair from there on is used, PgBouncer on its second.
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
"$top/scripts/deps.sh" --test || exit 1
. "$top/scripts/env.sh"
idem_build_install "$top" || exit 1
bindir=$("$PG_CONFIG" --bindir)
port=${IDEM_DRIVERS_PORT:-5491}
write_doc=0
[ "${1:-}" = "--write-doc" ] && write_doc=1
started=$(date +%s)
drv="$top/scripts/drivers"

# PostgreSQL and PgBouncer refuse to run as root
as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# --- dependencies ---------------------------------------------------------
apt_pkgs="python3-psycopg python3-psycopg2 python3-asyncpg python3-sqlalchemy
	nodejs libpostgresql-jdbc-java default-jdk-headless libdbd-pg-perl
	php-cli php-pgsql ruby-pg golang-go golang-github-jackc-pgx-v4-dev
	golang-github-lib-pq-dev pgbouncer"
missing=$(for p in $apt_pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
done)
if [ -n "$missing" ]; then
	echo "# installing from Debian: $(echo $missing)"
	if [ "$(id -u)" = 0 ]; then
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
			--no-install-recommends $missing >/dev/null ||
			{ apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
				-o DPkg::Lock::Timeout=600 --no-install-recommends $missing >/dev/null; } ||
			echo "# apt-get install failed: the drivers it lacks are reported below"
	else
		echo "# not root: cannot install $(echo $missing)"
	fi
fi
if ! (cd "$top/clients/node" && node -e 'require.resolve("pg"); require.resolve("postgres")' 2>/dev/null); then
	echo "# installing node-postgres and postgres.js from npm (clients/node's lock file)"
	(cd "$top/clients/node" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
		echo "# npm ci failed: the node drivers are reported below"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/idem-drivers.XXXXXX")
chmod 755 "$work"
cleanup() {
	[ -f "$work/bouncer.pid" ] && kill "$(cat "$work/bouncer.pid")" 2>/dev/null
	[ -d "$work/data" ] && as_pg "$bindir/pg_ctl" -D "$work/data" -m immediate stop >/dev/null 2>&1
	rm -rf "$work"
}
trap cleanup EXIT

# Java and Go programs are built once, offline
build_log="$work/build.log"
if command -v javac >/dev/null && [ -f /usr/share/java/postgresql.jar ]; then
	javac -cp /usr/share/java/postgresql.jar -d "$work/java" "$drv/Matrix.java" >>"$build_log" 2>&1
fi
if command -v go >/dev/null; then
	for prog in pgx pq; do
		(cd "$drv/$prog" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="${XDG_CACHE_HOME:-${HOME:-$work}/.cache}/idem-drivers-go" \
			GOFLAGS= go build -o "$work/$prog" . >>"$build_log" 2>&1)
	done
fi
chmod -R a+rX "$work"
echo "# dependencies and builds: $(($(date +%s) - started))s"

# --- the cluster and PgBouncer ------------------------------------------
mkdir -p "$work/data" && chown postgres: "$work" "$work/data" 2>/dev/null
as_pg "$bindir/initdb" -D "$work/data" -A trust -U postgres --encoding=UTF8 --no-locale >/dev/null ||
	{ echo "initdb failed"; exit 1; }
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
# mixed typed and untyped parameters need the library at parse time
session_preload_libraries = 'idem'
# the transaction that holds the keys of the ID409 check
max_prepared_transactions = 1
EOF
# The server on the first pair of free loopback ports from $port on (the
# suite may run here and in a fresh root at once, which share the network);
# PgBouncer gets the second port of the pair.
in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
started_pg=0
for _ in $(seq 20); do
	if ! in_use "$port" && ! in_use $((port + 1)) &&
		as_pg "$bindir/pg_ctl" -D "$work/data" -l "$work/server.log" -o "-p $port" -w start >/dev/null; then
		started_pg=1
		break
	fi
	port=$((port + 2))
done
[ $started_pg = 1 ] || { cat "$work/server.log"; exit 1; }
bport=$((port + 1))
export PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres PGDATABASE=matrix
psql_q() { "$bindir/psql" -X -q -v ON_ERROR_STOP=1 -At "$@"; }
psql_q -d postgres -c "CREATE DATABASE matrix" &&
	psql_q -c "CREATE EXTENSION idem" &&
	psql_q -c "CREATE TABLE matrix_pay (id serial PRIMARY KEY, ref text NOT NULL, amount numeric(12,2) NOT NULL)" &&
	psql_q -c "SELECT idem_outbox_create_topic('matrix')" >/dev/null &&
	# a call that waits for a held key where wait => false should refuse
	# fails with 55P03 instead of hanging (before PgBouncer connects)
	psql_q -c "ALTER DATABASE matrix SET lock_timeout = '30s'" ||
	exit 1

cat >"$work/bouncer.ini" <<EOF
[databases]
matrix = host=127.0.0.1 port=$port dbname=matrix
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $work/users.txt
pool_mode = transaction
default_pool_size = 1
max_client_conn = 50
ignore_startup_parameters = extra_float_digits
logfile = $work/bouncer.log
pidfile = $work/bouncer.pid
EOF
echo '"postgres" ""' >"$work/users.txt"
chown postgres: "$work/bouncer.ini" "$work/users.txt" 2>/dev/null
as_pg pgbouncer -d "$work/bouncer.ini" || { echo "pgbouncer failed to start"; exit 1; }
for _ in $(seq 50); do psql_q -p "$bport" -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.1; done

# --- the drivers ------------------------------------------------------------
SQL='INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount'
# idem_call with every option (scripts/drivers/README), in SQL
idem_call_sql() {	# key wait
	echo "SELECT replayed, response::text FROM idem_call('$1', '$SQL', ARRAY['$1', '25.00'], outbox_topic => 'matrix', ttl => interval '2 days 3 hours', wait => $2)"
}
# psql: the request with explicit types, the way an operator types it
run_psql() {
	local mode=$1 key
	shift
	for key in "$@"; do
		if [ "$mode" = call ]; then
			psql_q -F $'\t' -c "$(idem_call_sql "$key" true)" -c "$(idem_call_sql "$key" true)" |
				sed "s/^t\t/call\t$key\ttrue\t/; s/^f\t/call\t$key\tfalse\t/"
			continue
		fi
		if [ "$mode" = busy ]; then
			if psql_q -v VERBOSITY=verbose -c "$(idem_call_sql "$key" false)" >/dev/null 2>"$work/psql.$key.err"; then
				printf 'busy\t%s\tnone\n' "$key"
			else
				printf 'busy\t%s\t%s\n' "$key" "$(sed -n 's/^ERROR:  \([A-Z0-9]\{5\}\):.*/\1/p' "$work/psql.$key.err" | head -1)"
			fi
			continue
		fi
		psql_q -F $'\t' -c "SELECT 'result', '$key', replayed, response::text FROM idem_execute_ex('$key', '$SQL', '$key'::text, 25.00::numeric)" |
			sed 's/\tt\t/\ttrue\t/; s/\tf\t/\tfalse\t/'
		if [ "$mode" = retry ]; then
			if psql_q -v VERBOSITY=verbose -c "SELECT idem_execute('$key', '$SQL', '$key'::text, 26.00::numeric)" >/dev/null 2>"$work/psql.err"; then
				printf 'mismatch\t%s\tnone\n' "$key"
			else
				printf 'mismatch\t%s\t%s\n' "$key" "$(sed -n 's/^ERROR:  \([A-Z0-9]\{5\}\):.*/\1/p' "$work/psql.err" | head -1)"
			fi
		fi
	done
}
NODE_PATH="$top/clients/node/node_modules"
export NODE_PATH
# name|how to run it|what proves it can run|how it sends the amount|its PgBouncer setting
drivers=(
	"psql|run_psql|true|25.00::numeric (typed)|none needed"
	"psycopg 3|/usr/bin/python3 $drv/psycopg3_driver.py|/usr/bin/python3 -c 'import psycopg'|Decimal: numeric, next to untyped str|prepare_threshold=None"
	"psycopg2|/usr/bin/python3 $drv/psycopg2_driver.py|/usr/bin/python3 -c 'import psycopg2'|Decimal: a numeric literal quoted in|none needed"
	"asyncpg|/usr/bin/python3 $drv/asyncpg_driver.py|/usr/bin/python3 -c 'import asyncpg'|Decimal to \$4::numeric|statement_cache_size=0, calls in a transaction"
	"SQLAlchemy|/usr/bin/python3 $drv/sqlalchemy_driver.py|/usr/bin/python3 -c 'import sqlalchemy, psycopg2'|Decimal (psycopg2 underneath)|none needed"
	"node-postgres|node $drv/node_pg.js|node -e 'require(\"pg\")'|JS number 25: untyped \"25\"|none needed"
	"postgres.js|node $drv/postgresjs.js|node -e 'require(\"postgres\")'|JS number 25: untyped \"25\"|prepare: false"
	"PgJDBC|java -cp $work/java:/usr/share/java/postgresql.jar Matrix|test -f $work/java/Matrix.class|setBigDecimal: numeric, next to setString varchar|prepareThreshold=0"
	"DBD::Pg|perl $drv/dbd_pg.pl|perl -MDBD::Pg -e 1|Perl number 25.00: untyped \"25\"|pg_server_prepare => 0"
	"PDO|php $drv/pdo.php|php -r 'exit(extension_loaded(\"pdo_pgsql\") ? 0 : 1);'|PHP float 25.00: untyped \"25\"|PDO::ATTR_EMULATE_PREPARES => true"
	"PHP pgsql|php $drv/php_pgsql.php|php -r 'exit(function_exists(\"pg_query_params\") ? 0 : 1);'|PHP float 25.00: untyped \"25\"|none needed"
	"ruby-pg|ruby $drv/ruby_pg.rb|ruby -e 'require \"pg\"'|BigDecimal: untyped \"0.25e2\"|none needed"
	"pgx v4|$work/pgx|test -x $work/pgx|Go string \"25\"|PreferSimpleProtocol"
	"lib/pq|$work/pq|test -x $work/pq|Go float64 25: untyped \"25\"|binary_parameters=yes"
)
slug_of() { echo "$1" | tr -c 'a-zA-Z0-9\n' '-'; }
key_of() { echo "m-$(slug_of "$1")"; }

declare -A ok begun resp direct mism bounced calls
usable=()
for d in "${drivers[@]}"; do
	IFS='|' read -r name cmd probe _ _ <<<"$d"
	if eval "$probe" >/dev/null 2>&1; then
		ok[$name]=1
		usable+=("$name")
	else
		ok[$name]=0
		echo "# $name: cannot run (not installed, or did not build; see below)"
	fi
done
echo "# cluster, PgBouncer and the drivers probed: $(($(date +%s) - started))s"
[ -s "$build_log" ] && { echo "# build output:"; sed 's/^/#   /' "$build_log"; }

cmd_of() {
	local d name cmd
	for d in "${drivers[@]}"; do
		IFS='|' read -r name cmd _ _ _ <<<"$d"
		[ "$name" = "$1" ] && { echo "$cmd"; return; }
	done
}

# 1. each begins its own key, all at once
i=0
for name in "${usable[@]}"; do
	i=$((i + 1))
	eval "$(cmd_of "$name") begin $(key_of "$name")" >"$work/begin.$i" 2>"$work/begin.$i.err" &
done
wait
i=0
for name in "${usable[@]}"; do
	i=$((i + 1))
	key=$(key_of "$name")
	line=$(grep -P "^result\t$key\tfalse\t" "$work/begin.$i")
	if [ -n "$line" ]; then
		begun[$name]=1
		resp[$key]=$(cut -f4 <<<"$line")
	else
		begun[$name]=0
		echo "# $name: begin failed:"; sed 's/^/#   /' "$work/begin.$i"; sed 's/^/#   /' "$work/begin.$i.err" | tail -5
	fi
done
keys=()
for name in "${usable[@]}"; do [ "${begun[$name]}" = 1 ] && keys+=("$(key_of "$name")"); done

echo "# each driver began its key: $(($(date +%s) - started))s"

# 2. and 3. each retries every key, directly and through PgBouncer
check_retry() {	# name output -> "replays mismatches"
	local out=$2 k r=0 m=0
	for k in "${keys[@]}"; do
		grep -qxF "$(printf 'result\t%s\ttrue\t%s' "$k" "${resp[$k]}")" <<<"$out" && r=$((r + 1))
		grep -qxF "$(printf 'mismatch\t%s\tID422' "$k")" <<<"$out" && m=$((m + 1))
	done
	echo "$r $m"
}
# directly, all drivers at once (each key's lock orders the calls)
run_all() {	# prefix, then env assignments for the drivers
	local prefix=$1 i=0 name cmd
	shift
	for name in "${usable[@]}"; do
		i=$((i + 1))
		cmd=$(cmd_of "$name")
		(export "$@"; eval "$cmd retry ${keys[*]}") >"$work/$prefix.$i" 2>"$work/$prefix.$i.err" &
	done
	wait
}
run_all direct PGPORT=$port
echo "# each driver retried every key directly: $(($(date +%s) - started))s"
# through PgBouncer's one pooled server connection, on which a client left
# PgJDBC's setting
psql_q -p "$bport" -c "SET extra_float_digits = 3" || echo "# could not SET through PgBouncer"
run_all bouncer PGPORT=$bport VIA_BOUNCER=1
i=0
for name in "${usable[@]}"; do
	i=$((i + 1))
	for via in direct bouncer; do
		read -r r m <<<"$(check_retry "$name" "$(cat "$work/$via.$i")")"
		if [ $via = direct ]; then direct[$name]=$r mism[$name]=$m; else bounced[$name]=$((r < m ? r : m)); fi
		if [ "$r" != "${#keys[@]}" ] || [ "$m" != "${#keys[@]}" ]; then
			echo "# $name $via: $r/${#keys[@]} replays, $m/${#keys[@]} ID422:"
			sed 's/^/#   /' "$work/$via.$i" | head -40; sed 's/^/#   /' "$work/$via.$i.err" | tail -5
		fi
	done
done
leaked=$(psql_q -p "$bport" -c "SHOW extra_float_digits")
echo "# each driver retried every key through PgBouncer: $(($(date +%s) - started))s"

# 4. idem_call with every option under c-/cb- keys (directly / through
# PgBouncer), and with wait => false under b-/bb- keys, which a prepared
# transaction holds with the very same request
hold=(-c BEGIN)
for name in "${usable[@]}"; do
	for k in b-$(slug_of "$name") bb-$(slug_of "$name"); do hold+=(-c "$(idem_call_sql "$k" true)"); done
done
psql_q "${hold[@]}" -c "PREPARE TRANSACTION 'matrix-hold'" >/dev/null ||
	echo "# could not hold the keys of the ID409 check"
i=0
for name in "${usable[@]}"; do
	i=$((i + 1))
	cmd=$(cmd_of "$name") s=$(slug_of "$name")
	(export PGPORT=$port; eval "$cmd call c-$s"; eval "$cmd busy b-$s") >"$work/call.$i" 2>"$work/call.$i.err" &
	(export PGPORT=$bport VIA_BOUNCER=1; eval "$cmd call cb-$s"; eval "$cmd busy bb-$s") \
		>"$work/bcall.$i" 2>"$work/bcall.$i.err" &
done
wait
psql_q -c "ROLLBACK PREPARED 'matrix-hold'" >/dev/null
echo "# each driver made its idem_calls, directly and through PgBouncer: $(($(date +%s) - started))s"
# what the database holds for each idem_call key: the response, whether
# the topic has exactly one event for it, with that payload, and whether
# the record lives for the ttl
declare -A stored
while IFS=$'\t' read -r k r e t; do stored[$k]="$r"$'\t'"$e"$'\t'"$t"; done < <(psql_q -F $'\t' -c "
	SELECT k.key, k.response::text,
	       (SELECT count(*) = 1 AND bool_and(o.payload = k.response) FROM idem.outbox o
	         WHERE o.key = k.key AND o.topic = 'matrix'),
	       k.expires_at - k.created_at BETWEEN interval '2 days 3 hours' AND interval '2 days 3 hours 5 minutes'
	  FROM idem.keys k WHERE k.key LIKE 'c%'")
check_call() {	# output call-key busy-key -> "checks-passed sqlstate"
	local out=$1 r e t p=0 state lines
	IFS=$'\t' read -r r e t <<<"${stored[$2]:-}"
	mapfile -t lines < <(grep -P "^call\t$2\t" <<<"$out")
	if [ -n "$r" ] && [ "${#lines[@]}" = 2 ]; then
		# the first executed, the second replayed, both with the stored response
		[ "${lines[0]}" = "$(printf 'call\t%s\tfalse\t%s' "$2" "$r")" ] && p=$((p + 1))
		[ "${lines[1]}" = "$(printf 'call\t%s\ttrue\t%s' "$2" "$r")" ] && p=$((p + 1))
		[ "$e" = t ] && p=$((p + 1))
		[ "$t" = t ] && p=$((p + 1))
	fi
	state=$(grep -P "^busy\t$3\t" <<<"$out" | cut -f3 | head -1)
	echo "$p ${state:-nothing}"
}
i=0
for name in "${usable[@]}"; do
	i=$((i + 1))
	s=$(slug_of "$name") cell=
	for via in call bcall; do
		if [ $via = call ]; then ck=c-$s bk=b-$s; else ck=cb-$s bk=bb-$s; fi
		read -r p st <<<"$(check_call "$(cat "$work/$via.$i")" "$ck" "$bk")"
		cell+="${cell:+; }$p/4, $st"
		if [ "$p" != 4 ] || [ "$st" != ID409 ]; then
			echo "# $name $([ $via = call ] && echo directly || echo through PgBouncer): idem_call $p/4 checks, wait => false on a held key: $st:"
			IFS=$'\t' read -r _ e t <<<"${stored[$ck]:-}"
			echo "#   $ck: one event with the response: ${e:-no record}, kept for the ttl: ${t:-no record}"
			sed 's/^/#   /' "$work/$via.$i" | head -20; sed 's/^/#   /' "$work/$via.$i.err" | tail -5
		fi
	done
	calls[$name]=$cell
done
rows=$(psql_q -c "SELECT count(*) FROM matrix_pay")

# --- the result -------------------------------------------------------------
n=${#drivers[@]}
passed=0 failed=0
table="| driver | sends the amount as | direct: replays of the $n keys, ID422 | through PgBouncer (transaction mode) | idem_call, every option: checks, wait => false on a held key (direct; PgBouncer) | its PgBouncer setting |
|---|---|---|---|---|---|"
for d in "${drivers[@]}"; do
	IFS='|' read -r name _ _ how setting <<<"$d"
	if [ "${ok[$name]}" != 1 ] || [ "${begun[$name]:-0}" != 1 ]; then
		failed=$((failed + 1))
		table+=$'\n'"| $name | $how | not run: cannot install or begin | not run | not run | $setting |"
		continue
	fi
	if [ "${direct[$name]}" = "$n" ] && [ "${mism[$name]}" = "$n" ] && [ "${bounced[$name]}" = "$n" ] &&
		[ "${calls[$name]}" = "4/4, ID409; 4/4, ID409" ]; then
		passed=$((passed + 1))
	else
		failed=$((failed + 1))
	fi
	table+=$'\n'"| $name | $how | ${direct[$name]}/$n, ${mism[$name]}/$n | ${bounced[$name]}/$n | ${calls[$name]} | $setting |"
done
elapsed=$(($(date +%s) - started))
echo "$table"
echo "# $rows business rows for $((3 * n)) requests; extra_float_digits left on the pooled connection: $leaked"

doc="$top/doc/drivers.md"
if [ "$write_doc" = 1 ]; then
	python3 - "$doc" "$table" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
new = re.sub(r"(<!-- matrix:begin -->\n)(?:.*?\n)?(<!-- matrix:end -->)", lambda m: m.group(1) + table + "\n" + m.group(2), text, flags=re.S)
open(path, "w").write(new)
PY
	echo "# wrote the table into doc/drivers.md"
elif ! diff <(sed -n '/<!-- matrix:begin -->/,/<!-- matrix:end -->/p' "$doc" | sed '1d;$d') <(echo "$table") >/dev/null; then
	echo "# doc/drivers.md's table differs from this run (scripts/test-drivers.sh --write-doc updates it)"
	failed=$((failed + 1))
fi
[ "$rows" = "$((3 * n))" ] || { echo "# expected $((3 * n)) business rows, found $rows"; failed=$((failed + 1)); }
echo "drivers: $passed passed, $failed failed"
echo "# matrix time: ${elapsed}s"
[ "$failed" = 0 ]
