#!/usr/bin/env bash
# pg_upgrade of a cluster with idem from one PostgreSQL major to another,
# with idem built and installed for both (make PG_CONFIG=... install):
#
#   scripts/test-pg-upgrade.sh OLD_PG_CONFIG NEW_PG_CONFIG
#
# Twice, without shared_preload_libraries and with 'idem' preloaded on both
# clusters: initdb an old cluster (UTF8, C.UTF-8), create idem and write
# what an application leaves behind (idem_execute and idem_call records of
# typed and untyped numeric, timestamptz, jsonb, array, enum and domain
# arguments, a cached error, a queue and a topic granted to roles, a run
# with a completed step under a lease, a claimed run whose lease runs out,
# outbox events pending and leased); initdb the new cluster alike,
# pg_upgrade --check, pg_upgrade, start it and check from new sessions: the
# same calls replay (replayed, the same response), a different request under
# a key is ID422, the leased run goes on with its token (its next step runs
# once), the other run is claimed again (attempt 2) and its old token is
# ID412, the events are claimed and acknowledged (the leased one with its
# token), the extension's objects and privileges are those of the old
# cluster and ALTER EXTENSION idem UPDATE changes nothing.  Prints each
# check ("ok N - ..." or "not ok N - ..."); exits non-zero on any mismatch.
# Needs root (the clusters run as postgres, in a mktemp -d directory,
# on a Unix socket there).
set -euo pipefail

[ $# -eq 2 ] || { sed -n '/^#   scripts/p' "$0" | sed 's/^# *//' >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "test-pg-upgrade: must run as root" >&2; exit 2; }
old_bin=$("$1" --bindir)
new_bin=$("$2" --bindir)
old_major=$("$1" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
new_major=$("$2" --version | sed 's/^PostgreSQL \([0-9]*\).*/\1/')
for b in "$old_bin" "$new_bin"; do
	[ -f "$("$b/pg_config" --pkglibdir)/idem.so" ] ||
		{ echo "test-pg-upgrade: idem is not installed for $b" >&2; exit 2; }
done

dir=$(mktemp -d /tmp/idem-pg-upgrade.XXXXXX)
chown postgres: "$dir"
port=54399
bin=""
cleanup() {
	local rc=$? d
	for d in "$dir"/*/old "$dir"/*/new; do
		[ -f "$d/postmaster.pid" ] || continue
		for b in "$old_bin" "$new_bin"; do
			runuser -u postgres -- "$b/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 && break
		done
	done
	if [ $rc -eq 0 ]; then rm -rf "$dir"; else echo "test-pg-upgrade: kept $dir" >&2; fi
	exit $rc
}
trap cleanup EXIT

run() { (cd "$dir" && runuser -u postgres -- "$@"); }
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

checks=0
failed=0
check() {	# description expected actual
	checks=$((checks + 1))
	if [ "$2" == "$3" ]; then
		echo "ok $checks - $1"
	else
		echo "not ok $checks - $1"
		if [[ "$2$3" == *$'\n'* ]]; then
			diff <(echo "$2") <(echo "$3") | sed 's/^/#   /' || true
		else
			printf '#   expected: %s\n#   got:      %s\n' "$2" "$3"
		fi
		failed=1
	fi
}

# psql on the current cluster ($bin, $port), database shop, one -c per
# argument, unaligned and quiet; stops at the first error
sql() {
	local a=()
	for s; do a+=(-c "$s"); done
	run "$bin/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$dir" -p $port -d shop "${a[@]}"
}
# the SQLSTATE of the error the last statement raises (empty if none)
sqlstate() {
	local a=()
	for s; do a+=(-c "$s"); done
	run "$bin/psql" -X -qAt -v VERBOSITY=sqlstate -h "$dir" -p $port -d shop "${a[@]}" 2>&1 >/dev/null |
		sed -n 's/^\(psql:.*\)\{0,1\}ERROR: *//p' | tail -n 1
}

start() {	# bin datadir
	run "$1/pg_ctl" -D "$2" -w -l "$2.log" -o "-p $port" start >/dev/null
}
stop() {	# bin datadir
	run "$1/pg_ctl" -D "$2" -w -m fast stop >/dev/null
}
cluster() {	# bin datadir preload
	local sums=()
	# 18's initdb enables data checksums, which pg_upgrade needs both or
	# neither cluster to have: the old one has none, as 15's default
	case $("$1/initdb" --help) in *--no-data-checksums*) sums=(--no-data-checksums) ;; esac
	run "$1/initdb" -D "$2" -A trust -U postgres --encoding=UTF8 --locale=C.UTF-8 "${sums[@]}" >/dev/null
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$dir'"
		[ "$3" = none ] || echo "shared_preload_libraries = '$3'"
	} >>"$2/postgresql.conf"
}

# the calls whose records must replay after the upgrade: each a query of
# "response|replayed", as role shop
names=(typed untyped call event error noargs)
declare -A call=(
	[typed]="SELECT response, replayed FROM idem_execute_ex('order:1',
		'INSERT INTO orders VALUES (\$1, \$2, \$3, \$4, \$5, \$6, \$7) RETURNING *',
		1, 12.50::numeric, '2026-01-01 12:00:00.123456+00'::timestamptz,
		'{\"a\": [1, 2.50, null], \"b\": {\"c\": \"é\"}}'::jsonb, ARRAY['x', 'y z'],
		'large'::size, 125::cents)"
	[untyped]="SELECT response, replayed FROM idem_execute_ex('order:2',
		'INSERT INTO orders VALUES (\$1, \$2, \$3, \$4, \$5, \$6, \$7) RETURNING *',
		'2', '7.25', '2026-02-01 08:30:00+01', '{\"b\": true}', '{p,q}', 'small', '3')"
	[call]="SELECT response, replayed FROM idem_call('order:3',
		'INSERT INTO orders (id, amount, at, doc, tags) VALUES (\$1, \$2, \$3, \$4, \$5)
		 RETURNING id, amount * 2 AS twice, at',
		ARRAY['3', '0.10', '2026-03-01 00:00:00+00', '[1, {\"c\": null}]', '{1,2}'],
		outbox_topic => 'orders')"
	[event]="SET idem.outbox_topic = 'orders';
		SELECT response, replayed FROM idem_execute_ex('order:4',
		'INSERT INTO orders (id, amount, tags) VALUES (\$1, \$2, \$3) RETURNING id',
		4, 1e-20::numeric, ARRAY[1.5, NULL]::numeric[])"
	[error]="SET idem.cache_errors = '23';
		SELECT response, replayed FROM idem_execute_ex('order:dup',
		'INSERT INTO orders (id, amount) VALUES (\$1, \$2)', 1, 5::numeric)"
	[noargs]="SELECT response, replayed FROM idem_execute_ex('report:1',
		'SELECT count(*) AS n, sum(amount) AS total FROM orders')"
)
# a word that is an identifier on 15 and a keyword from 17 on makes another
# token stream there: its record is refused, never replayed (doc/semantics.md)
keyword="SELECT response, replayed FROM idem_execute_ex('report:2', 'SELECT \$1::int AS target', 7)"
# the extension's objects and who may use them.  pg_upgrade's restore makes
# a member table's row type and a member type's array type members too, and
# 17 grants a relation's owner MAINTAIN (m): neither is idem's, so neither
# counts; nor does an ACL that pg_dump found equal to the default (NULL)
objects="SELECT string_agg(o, E'\\n' ORDER BY o) FROM (
	SELECT pg_describe_object(classid, objid, 0) || ' ' || replace(coalesce(
		(SELECT coalesce(proacl, acldefault('f', proowner))::text
		   FROM pg_proc WHERE classid = 'pg_proc'::regclass AND oid = objid),
		(SELECT coalesce(relacl, acldefault('r', relowner))::text
		   FROM pg_class WHERE classid = 'pg_class'::regclass AND oid = objid),
		''), 'arwdDxtm', 'arwdDxt') AS o
	FROM pg_depend WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	 AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
	 AND NOT (classid = 'pg_type'::regclass AND objid IN
		(SELECT oid FROM pg_type WHERE typrelid <> 0 OR typcategory = 'A'))) AS m"
step() {	# run token step sql args: the step's call as agent, "response|replayed"
	sql "SET ROLE agent" "SELECT response, replayed FROM idem_call(NULL, '$4', ARRAY[$5],
		run_id => '$1', step => '$3', lease_token => '$2')"
}

# --- one upgrade ---------------------------------------------------------------
upgrade() {	# preload: none or idem
	local preload=$1 d=$dir/$1 t0 t n old_objects
	local -A first=()
	local t1 t2 e1 l1 pending r1check
	mkdir "$d"
	chown postgres: "$d"
	t0=$(date +%s)
	say "$old_major -> $new_major, shared_preload_libraries: $preload"

	# the old cluster and its state
	bin=$old_bin
	cluster "$old_bin" "$d/old" "$preload"
	start "$old_bin" "$d/old"
	run "$bin/createdb" -h "$dir" -p $port shop
	sql "CREATE EXTENSION idem" \
		"CREATE ROLE shop" "CREATE ROLE agent" \
		"CREATE TYPE size AS ENUM ('small', 'large')" \
		"CREATE DOMAIN cents AS integer CHECK (VALUE >= 0)" \
		"CREATE TABLE orders (id int PRIMARY KEY, amount numeric, at timestamptz,
			doc jsonb, tags text[], s size, c cents)" \
		"CREATE TABLE refunds (run text PRIMARY KEY, amount numeric)" \
		"GRANT SELECT, INSERT ON orders TO shop" \
		"GRANT SELECT, INSERT ON refunds TO agent" \
		"SELECT idem_outbox_create_topic('orders', publishers => '{shop,agent}', consumers => '{agent}')" \
		"GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
			idem_outbox_ack(uuid, uuid), idem_outbox_ack_batch(uuid[], uuid[]) TO agent" \
		"SELECT idem_queue_create('returns', producers => '{shop}', workers => '{agent}',
			max_attempts => 5, backoff_base => '1 s', backoff_cap => '1 s', jitter => 'none')" >/dev/null
	for n in "${names[@]}"; do
		first[$n]=$(sql "SET ROLE shop" "${call[$n]}")
		check "$n: executed on $old_major" f "${first[$n]##*|}"
	done
	check "keyword: executed on $old_major" f "$(sql "SET ROLE shop" "$keyword" | sed 's/.*|//')"
	check "error: the cached error is a unique violation" 23505 \
		"$(sql "SELECT \$j\$${first[error]%|*}\$j\$::jsonb->'error'->>'sqlstate'")"
	for n in r1 r2; do
		sql "SET ROLE shop" "SELECT created FROM idem_run_begin('$n', steps => ARRAY['check', 'refund', 'notify'],
			input => '{\"amount\": 25.00}', queue => 'returns')" >/dev/null
	done
	# r1: claimed for an hour, its first step done
	t1=$(sql "SET ROLE agent" "SELECT run_id || ' ' || lease_token FROM idem_run_claim('returns', lease => '1 h')")
	check "r1 claimed first" r1 "${t1%% *}"
	t1=${t1#* }
	r1check=$(step r1 "$t1" check 'SELECT $1::numeric <= 100 AS ok' "'25.00'")
	check "r1: step check executed" f "${r1check##*|}"
	# r2: claimed for a second, nothing done
	t2=$(sql "SET ROLE agent" "SELECT run_id || ' ' || lease_token FROM idem_run_claim('returns', lease => '1 s')")
	check "r2 claimed second" r2 "${t2%% *}"
	t2=${t2#* }
	# one event leased for an hour, the others pending
	e1=$(sql "SET ROLE agent" "SELECT event_id || ' ' || lease_token FROM idem_outbox_claim('orders', 1, '1 h')")
	l1=${e1#* }
	e1=${e1%% *}
	pending=$(sql "SELECT count(*) FROM idem.outbox WHERE topic = 'orders' AND state = 'pending'")
	check "outbox: one event leased, one pending" "1 1" \
		"$(sql "SELECT count(*) FILTER (WHERE state = 'leased') FROM idem.outbox") $pending"
	old_objects=$(sql "$objects")
	stop "$old_bin" "$d/old"

	# the upgrade
	cluster "$new_bin" "$d/new" "$preload"
	t=$(date +%s)
	if ! run "$new_bin/pg_upgrade" --check -b "$old_bin" -B "$new_bin" -d "$d/old" -D "$d/new" \
			-p $port -P $port >"$d/check.log" 2>&1; then
		cat "$d/check.log"
		check "pg_upgrade --check" 0 1
		return
	fi
	check "pg_upgrade --check passes" 0 0
	if ! run "$new_bin/pg_upgrade" -b "$old_bin" -B "$new_bin" -d "$d/old" -D "$d/new" \
			-p $port -P $port >"$d/upgrade.log" 2>&1; then
		cat "$d/upgrade.log"
		# pg_upgrade keeps its logs in the new cluster on failure
		for f in "$d"/new/pg_upgrade_output.d/*/log/*.log; do
			[ -s "$f" ] || continue
			echo "=== the end of $f:"
			tail -n 40 "$f"
		done
		check "pg_upgrade" 0 1
		return
	fi
	check "pg_upgrade passes ($(($(date +%s) - t)) s with its check)" 0 0

	# the new cluster, from new sessions
	bin=$new_bin
	start "$new_bin" "$d/new"
	check "server is $new_major" "$new_major" "$(sql "SHOW server_version_num" | cut -c1-2)"
	check "extension objects and their privileges are the old cluster's" "$old_objects" "$(sql "$objects")"
	for n in "${names[@]}"; do
		check "$n: replays on $new_major" "${first[$n]%|*}|t" "$(sql "RESET ROLE" "SET ROLE shop" "${call[$n]}")"
	done
	check "typed: another request under order:1 is ID422" ID422 \
		"$(sqlstate "SET ROLE shop" "${call[typed]/12.50::numeric/12.51::numeric}")"
	check "untyped: another request under order:2 is ID422" ID422 \
		"$(sqlstate "SET ROLE shop" "${call[untyped]/7.25/7.26}")"
	check "keyword: target, a keyword on $new_major, is ID422" ID422 "$(sqlstate "SET ROLE shop" "$keyword")"
	check "a new key executes" "f" \
		"$(sql "SET ROLE shop" "SELECT replayed FROM idem_execute_ex('order:5',
			'INSERT INTO orders (id, amount) VALUES (\$1, \$2) RETURNING id', 5, 2.5)")"
	check "orders: each write once" "1 2 3 4 5" "$(sql "SELECT string_agg(id::text, ' ' ORDER BY id) FROM orders")"

	# r1 goes on under its token
	check "r1: step check replays" "${r1check%|*}|t" \
		"$(step r1 "$t1" check 'SELECT $1::numeric <= 100 AS ok' "'25.00'")"
	check "r1: step refund executes" f \
		"$(step r1 "$t1" refund 'INSERT INTO refunds VALUES ($1, $2) RETURNING amount' "'r1', '25.00'" | sed 's/.*|//')"
	check "r1: step refund replays" t \
		"$(step r1 "$t1" refund 'INSERT INTO refunds VALUES ($1, $2) RETURNING amount' "'r1', '25.00'" | sed 's/.*|//')"
	check "r1: refund written once" 1 "$(sql "SELECT count(*) FROM refunds WHERE run = 'r1'")"
	# r2's lease ran out: claimed again, its old token fenced
	sleep 1
	t=$(sql "SET ROLE agent" "SELECT run_id || ' ' || attempt || ' ' || next_step || ' ' || lease_token
		FROM idem_run_claim('returns', max_runs => 5, lease => '30 s')")
	check "r2 claimed again (attempt 2, step check), r1 still leased" "r2 2 check" "${t% *}"
	check "r2: its old token is ID412" ID412 \
		"$(sqlstate "SET ROLE agent" "SELECT idem_call(NULL, 'SELECT 1', run_id => 'r2', step => 'check',
			lease_token => '$t2')")"
	check "r2: step check executes under the new token" f \
		"$(step r2 "${t##* }" check 'SELECT $1::numeric <= 100 AS ok' "'25.00'" | sed 's/.*|//')"
	sql "SET ROLE agent" "SELECT idem_step_complete('r1', 'notify', '{\"sent\": true}', lease_token => '$t1')" >/dev/null
	check "runs: r1 completed, r2 at refund" "r1 completed -|r2 running refund" \
		"$(sql "SELECT string_agg(run_id || ' ' || status || ' ' || coalesce(next_step, '-'), '|' ORDER BY run_id)
			FROM idem_runs")"

	# the outbox: the pending event is claimed, not the leased one, which
	# its token acknowledges
	check "outbox: the pending events claimed (not the leased one) and acknowledged" "$pending" \
		"$(sql "SET ROLE agent" "SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(lease_token))
			FROM idem_outbox_claim('orders', 10, '30 s')")"
	sql "SET ROLE agent" "SELECT idem_outbox_ack('$e1', '$l1')" >/dev/null
	check "outbox: the leased event acknowledged with its token" 0 \
		"$(sql "SELECT count(*) FROM idem.outbox WHERE event_id = '$e1' AND state <> 'delivered'")"
	check "outbox: nothing left" 0 "$(sql "SET ROLE agent" "SELECT count(*) FROM idem_outbox_claim('orders', 10, '30 s')")"

	check "ALTER EXTENSION idem UPDATE: already 1.2" \
		'NOTICE:  version "1.2" of extension "idem" is already installed' \
		"$(run "$bin/psql" -X -qAt -h "$dir" -p $port -d shop -c "ALTER EXTENSION idem UPDATE" 2>&1)"
	check "ALTER EXTENSION idem UPDATE: the objects unchanged" "$old_objects" "$(sql "$objects")"
	stop "$new_bin" "$d/new"
	say "$old_major -> $new_major, shared_preload_libraries: $preload: $(($(date +%s) - t0)) s"
}

upgrade none
upgrade idem
echo "test-pg-upgrade: $checks checks, $([ $failed -eq 0 ] && echo passed || echo FAILED)"
exit $failed
