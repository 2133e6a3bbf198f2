#!/usr/bin/env bash
# idem_citus_call() next to what a Citus user would write instead, in one
# run on a throwaway cluster: a coordinator and two workers on loopback
# (ports PORT, PORT+1, PORT+2; default 5510), payments distributed by
# tenant_id in 8 shards, idem.citus_keys co-located with it.  Needs Citus
# installed into PG_CONFIG's PostgreSQL (scripts/test-citus.sh --build-only)
# and idem too (make install).  Run as root (the cluster runs as postgres)
# or as postgres.
#
#   bench/citus/run.sh [--seconds N] [--rounds N] [--clients N] [--keep]
#
# --keep leaves the cluster running (its folder and ports are printed).
#
# Workloads, all from the coordinator, pgbench -n -M prepared, a random
# tenant of 1000 per transaction, fresh keys:
#   plain    INSERT INTO payments ... RETURNING: Citus routes it to the
#            shard's node (the baseline)
#   delegated SELECT ins(tenant, key, amount): a PL/pgSQL function that
#            only runs the INSERT, delegated as the wrapper is (what Citus's
#            delegation of a function costs, idem or not)
#   wrapper  SELECT pay(tenant, key, amount): a PL/pgSQL function calling
#            idem_execute(), delegated by create_distributed_function(...,
#            force_delegation => true) (the hand-written shape, keyed per
#            node, not per tenant, and lost on a shard move)
#   citus    SELECT * FROM idem_citus_call(tenant, key, sql, args...)
# Rounds interleave the workloads; the summary gives each one's median TPS
# and its ratios to plain's and to the wrapper's, then each round's ratios
# and the load average after it.  Results go to
# bench/citus/results/latest.txt.
set -euo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
seconds=15
rounds=3
clients=4
port=${PORT:-5510}
keep=0
while [ $# -gt 0 ]; do
	case "$1" in
		--seconds) seconds=$2; shift ;;
		--rounds) rounds=$2; shift ;;
		--clients) clients=$2; shift ;;
		--keep) keep=1 ;;
		*) sed -n '/^#   bench\/citus\/run.sh/p' "$0" | sed 's/^# *//' >&2; exit 2 ;;
	esac
	shift
done

bindir=$("$PG_CONFIG" --bindir)
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
work=$(mktemp -d /tmp/idem-citus-bench.XXXXXX)
chown postgres: "$work" 2>/dev/null || true
cleanup() {
	if [ $keep = 1 ]; then echo "kept: $work (ports $port-$((port + 2)))" >&2; return; fi
	for i in 0 1 2; do
		[ -d "$work/n$i" ] && as_pg "$bindir/pg_ctl" -D "$work/n$i" -m immediate stop >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

for i in 0 1 2; do
	as_pg "$bindir/initdb" -D "$work/n$i" -A trust --encoding=UTF8 --no-locale >/dev/null
	cat >>"$work/n$i/postgresql.conf" <<EOF
port = $((port + i))
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
shared_preload_libraries = 'citus'
max_connections = 100
max_prepared_transactions = 100
shared_buffers = 128MB
synchronous_commit = off
citus.shard_count = 8
EOF
	as_pg "$bindir/pg_ctl" -D "$work/n$i" -l "$work/n$i.log" -w start >/dev/null
	as_pg "$bindir/psql" -X -q -h 127.0.0.1 -p $((port + i)) -d postgres -c 'CREATE EXTENSION citus'
done
psql_c() { as_pg "$bindir/psql" -X -q -At -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
psql_c -c "SELECT citus_set_coordinator_host('127.0.0.1', $port)" >/dev/null
psql_c -c "SELECT citus_add_node('127.0.0.1', $((port + 1)))" >/dev/null
psql_c -c "SELECT citus_add_node('127.0.0.1', $((port + 2)))" >/dev/null
psql_c <<'EOF' >/dev/null
CREATE EXTENSION idem;
CREATE TABLE payments (tenant_id bigint NOT NULL, note text NOT NULL, amount int NOT NULL);
SELECT create_distributed_table('payments', 'tenant_id');
SELECT idem_citus_colocate('payments');
CREATE FUNCTION pay(tenant bigint, key text, amount int) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
	RETURN idem_execute(key,
		'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount',
		tenant, key, amount);
END
$$;
SELECT create_distributed_function('pay(bigint, text, int)', 'tenant',
	colocate_with => 'payments', force_delegation => true);
CREATE FUNCTION ins(tenant bigint, key text, amount int) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
	INSERT INTO payments AS p VALUES (tenant, key, amount)
		RETURNING p.tenant_id, p.note, p.amount INTO r;
	RETURN to_jsonb(r);
END
$$;
SELECT create_distributed_function('ins(bigint, text, int)', 'tenant',
	colocate_with => 'payments', force_delegation => true);
EOF

cat >"$work/plain.sql" <<'EOF'
\set t random(1, 1000)
\set k random(1, 1000000000000)
INSERT INTO payments VALUES (:t, 'p' || :k, 1) RETURNING tenant_id, note, amount;
EOF
cat >"$work/delegated.sql" <<'EOF'
\set t random(1, 1000)
\set k random(1, 1000000000000)
SELECT ins(:t, 'd' || :k, 1);
EOF
cat >"$work/wrapper.sql" <<'EOF'
\set t random(1, 1000)
\set k random(1, 1000000000000)
SELECT pay(:t, 'w' || :k, 1);
EOF
cat >"$work/citus.sql" <<'EOF'
\set t random(1, 1000)
\set k random(1, 1000000000000)
SELECT * FROM idem_citus_call(:t, 'c' || :k, 'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount', :t::bigint, 'c' || :k, 1);
EOF
chown postgres: "$work"/*.sql 2>/dev/null || true

# each workload once, to check it really runs its shape (and to warm up)
for w in plain delegated wrapper citus; do
	as_pg "$bindir/pgbench" -n -M prepared -c 1 -t 20 -f "$work/$w.sql" -h 127.0.0.1 -p "$port" postgres >/dev/null
done
[ "$(psql_c -c "SELECT count(*) FROM idem.citus_keys")" = 20 ] || { echo "citus workload recorded no keys" >&2; exit 1; }

declare -A tps
for r in $(seq 1 "$rounds"); do
	for w in plain delegated wrapper citus; do
		out=$(as_pg "$bindir/pgbench" -n -M prepared -c "$clients" -j 2 -T "$seconds" \
			-f "$work/$w.sql" -h 127.0.0.1 -p "$port" postgres)
		t=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
		echo "round $r $w: $t tps"
		tps[$w]="${tps[$w]:-} $t"
	done
	loads="${loads:-} $(cut -d' ' -f1 /proc/loadavg)"
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
mkdir -p "$top/bench/citus/results"
{
	echo "idem on Citus, $(date -u +%FT%TZ), $("$PG_CONFIG" --version), Citus $(psql_c -c "SELECT extversion FROM pg_extension WHERE extname='citus'")"
	echo "coordinator + 2 workers on loopback, $clients clients, $rounds rounds x ${seconds}s, synchronous_commit=off, $(nproc) cores (shared)"
	p=$(echo "${tps[plain]}" | median)
	wr=$(echo "${tps[wrapper]}" | median)
	for w in plain delegated wrapper citus; do
		m=$(echo "${tps[$w]}" | median)
		printf '%-9s median %8.1f tps  (%s)  ratio to plain %.2f, to wrapper %.2f\n' "$w" "$m" \
			"$(echo ${tps[$w]})" "$(echo "$m / $p" | bc -l)" "$(echo "$m / $wr" | bc -l)"
	done
	nth() { echo "${tps[$1]}" | awk -v n="$2" '{print $n}'; }
	for r in $(seq 1 "$rounds"); do
		printf 'round %d: citus/plain %.2f, citus/wrapper %.2f, delegated/plain %.2f, load %s\n' "$r" \
			"$(echo "$(nth citus $r) / $(nth plain $r)" | bc -l)" \
			"$(echo "$(nth citus $r) / $(nth wrapper $r)" | bc -l)" \
			"$(echo "$(nth delegated $r) / $(nth plain $r)" | bc -l)" \
			"$(echo $loads | awk -v n="$r" '{print $n}')"
	done
} | tee "$top/bench/citus/results/latest.txt"
