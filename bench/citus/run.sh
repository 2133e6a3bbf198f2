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
#   bench/citus/run.sh --claims [--events N] [--rounds N] [--keep]
#   bench/citus/run.sh --profile [--keep]
#
# --keep leaves the cluster running (its folder and ports are printed).
#
# --claims measures an outbox consumer on a node instead: 64 shards (32 on
# each worker), N tenant events (default 20000) written to the shards of
# idem.citus_outbox on worker 1, and as many to idem.outbox of a fourth
# server without Citus (port PORT+3); one session on each claims and
# acknowledges them all (half in claims of 1 event, a quarter in claims of
# 10 acknowledged one by one, a quarter in claims of 10 acknowledged with
# idem_outbox_ack_batch(); each claim and its acks one transaction), then
# makes 5000 claims that find nothing (a consumer polling an empty topic).  Each figure is the consuming
# backend's CPU time (utime + stime, from /proc) per claim, in
# microseconds, with the load average; rounds alternate the two servers.
# Results go to bench/citus/results/latest-claims.txt.
#
# --profile counts instructions per call instead (needs valgrind): the
# three nodes are restarted under valgrind --tool=callgrind, and each
# workload below, and citus_tl (the same call in the target list, SELECT
# idem_citus_call(...)), runs in two fresh sessions (pgbench -M prepared, 1 client,
# a tenant whose shard is on worker 1, 50 and 350 calls); the difference of
# the two sessions' backends, divided by 300, is a call's cost on the
# coordinator (the client's backend) and on worker 1 (the backend of the
# coordinator's connection), start-up excluded.  The same difference per
# function (inclusive) shows where a call goes.  Results go to
# bench/citus/results/latest-profile.txt, with the functions of the
# delegated function and of idem_citus_call() on both nodes; the callgrind
# files of the longer sessions and all the per-function lists to the
# cluster's folder (kept with --keep).
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
claims=0
profile=0
events=20000
while [ $# -gt 0 ]; do
	case "$1" in
		--seconds) seconds=$2; shift ;;
		--rounds) rounds=$2; shift ;;
		--clients) clients=$2; shift ;;
		--claims) claims=1 ;;
		--profile) profile=1 ;;
		--events) events=$2; shift ;;
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
	if [ $keep = 1 ]; then echo "kept: $work (ports $port-$((port + 3)))" >&2; return; fi
	for i in 0 1 2 3; do
		[ -d "$work/n$i" ] && as_pg "$bindir/pg_ctl" -D "$work/n$i" -m immediate stop >/dev/null 2>&1 || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

shard_count=8
[ $claims = 0 ] || shard_count=64
# node 3, for --claims only, is a server without Citus
for i in 0 1 2 $([ $claims = 0 ] || echo 3); do
	as_pg "$bindir/initdb" -D "$work/n$i" -A trust --encoding=UTF8 --no-locale >/dev/null
	cat >>"$work/n$i/postgresql.conf" <<EOF
port = $((port + i))
listen_addresses = '127.0.0.1'
unix_socket_directories = '$work'
$([ $i = 3 ] || echo "shared_preload_libraries = 'citus'")
max_connections = 100
max_prepared_transactions = 100
shared_buffers = 128MB
synchronous_commit = off
citus.shard_count = $shard_count
EOF
	as_pg "$bindir/pg_ctl" -D "$work/n$i" -l "$work/n$i.log" -w start >/dev/null
	[ $i = 3 ] || as_pg "$bindir/psql" -X -q -h 127.0.0.1 -p $((port + i)) -d postgres -c 'CREATE EXTENSION citus'
done
psql_c() { as_pg "$bindir/psql" -X -q -At -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 "$@"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# the first line of a summary: what ran, when, on what
title() { echo "$1, $(date -u +%FT%TZ), $("$PG_CONFIG" --version), Citus $(psql_c -c "SELECT extversion FROM pg_extension WHERE extname='citus'")"; }
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

if [ $claims = 1 ]; then
	# one consumer session per measurement: the backend's CPU ticks (from
	# /proc, utime + stime) around n claims of batch events, each claim
	# and its acks one transaction
	psql_n() { local n=$1; shift; as_pg "$bindir/psql" -X -q -At -h 127.0.0.1 -p $((port + n)) -d postgres -v ON_ERROR_STOP=1 "$@"; }
	consumer_sql=$(cat <<'EOF'
CREATE PROCEDURE bench_consume(n int, batch int, batched boolean) LANGUAGE plpgsql AS $$
DECLARE
	e record;
	ids uuid[];
	tokens uuid[];
BEGIN
	FOR i IN 1 .. n LOOP
		IF batched THEN
			SELECT array_agg(event_id), array_agg(lease_token) INTO ids, tokens
			  FROM idem_outbox_claim('bench', batch, '10 min');
			IF ids IS NOT NULL THEN
				PERFORM idem_outbox_ack_batch(ids, tokens);
			END IF;
		ELSE
			FOR e IN SELECT event_id, lease_token FROM idem_outbox_claim('bench', batch, '10 min') LOOP
				PERFORM idem_outbox_ack(e.event_id, e.lease_token);
			END LOOP;
		END IF;
		COMMIT;
	END LOOP;
END $$;
CREATE FUNCTION bench_cpu() RETURNS bigint LANGUAGE sql AS $$
	SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint
	  FROM pg_read_file('/proc/self/stat') s $$;
EOF
)
	psql_c -c "SELECT run_command_on_all_nodes(\$\$SELECT idem_outbox_create_topic('bench')\$\$)" >/dev/null
	psql_c -c "$consumer_sql"
	psql_n 3 -c "CREATE EXTENSION idem" -c "SELECT idem_outbox_create_topic('bench')" -c "$consumer_sql" >/dev/null
	# tenants whose shards are on worker 1: its 32 shards, each with events
	tenants=$(psql_c -c "SELECT array_agg(t) FROM generate_series(1, 2000) t
		WHERE (SELECT nodeport FROM citus_shards WHERE shardid =
			get_shard_id_for_distribution_column('idem.citus_outbox', t::bigint)) = $((port + 1))")
	[ "$(psql_n 1 -c "SELECT count(DISTINCT get_shard_id_for_distribution_column('idem.citus_outbox', t)) FROM unnest('$tenants'::bigint[]) t")" = 32 ] ||
		{ echo "worker 1 does not hold 32 shards' tenants" >&2; exit 1; }
	fill() {
		if [ "$1" = citus ]; then
			psql_c -c "INSERT INTO idem.citus_outbox (event_id, key, owner, topic, payload, created_at,
					state, attempts, next_attempt_at, tenant, owner_name)
				SELECT gen_random_uuid(), 'e' || i, 'postgres'::regrole, 'bench', '{}', now(),
					'pending', 0, now(), ('$tenants'::bigint[])[1 + i % cardinality('$tenants'::bigint[])], 'postgres'
				  FROM generate_series(1, $events) i"
			psql_n 1 -c VACUUM
		else
			psql_n 3 -c "INSERT INTO idem.outbox (event_id, key, owner, topic, payload, created_at,
					state, attempts, next_attempt_at)
				SELECT gen_random_uuid(), 'e' || i, 'postgres'::regrole, 'bench', '{}', now(),
					'pending', 0, now()
				  FROM generate_series(1, $events) i" -c VACUUM
		fi
	}
	# CPU microseconds per claim of n claims of batch events on node, each
	# event acknowledged by itself, or with the batch ack if batched
	measure() {
		local node=$1 n=$2 batch=$3 batched=${4:-false} ticks
		ticks=$(psql_n "$node" -v n="$n" -v batch="$batch" -v batched="$batched" <<'EOF'
SELECT bench_cpu() AS c0 \gset
CALL bench_consume(:n, :batch, :batched);
SELECT bench_cpu() - :c0;
EOF
)
		echo "$ticks * 1000000 / $(getconf CLK_TCK) / $n" | bc
	}
	declare -A us
	for r in $(seq 1 "$rounds"); do
		for s in citus plain; do
			node=$([ $s = citus ] && echo 1 || echo 3)
			fill $s
			for b in 1 10 10b; do
				[ $b = 1 ] && n=$((events / 2)) || n=$((events / 40))
				u=$(measure $node $n ${b%b} $([ $b = 10b ] && echo true))
				echo "round $r $s claim $b + ack: $u us CPU per claim"
				us[$s-$b]="${us[$s-$b]:-} $u"
			done
			if [ $s = citus ]; then
				left=$(psql_c -c "SELECT count(*) FROM idem.citus_outbox WHERE topic = 'bench'")
			else
				left=$(psql_n 3 -c "SELECT count(*) FROM idem.outbox WHERE topic = 'bench'")
			fi
			[ "$left" = 0 ] || { echo "$s: $left events left undelivered" >&2; exit 1; }
			psql_n $node -c VACUUM
			u=$(measure $node 5000 10)
			echo "round $r $s empty claim: $u us CPU per claim"
			us[$s-empty]="${us[$s-empty]:-} $u"
		done
		loads="${loads:-} $(cut -d' ' -f1 /proc/loadavg)"
	done
	mkdir -p "$top/bench/citus/results"
	{
		title "idem outbox consumer on a Citus node"
		echo "worker 1 of coordinator + 2 workers, 64 shards (32 on worker 1), against a server without Citus; $events events per round, $rounds rounds, $(nproc) cores (shared), load after each round:$loads"
		echo "backend CPU (utime + stime) per claim, microseconds, median (rounds)"
		for k in 1 10 10b empty; do
			c=$(echo "${us[citus-$k]}" | median)
			p=$(echo "${us[plain-$k]}" | median)
			printf '%-22s citus %6s (%s)  plain %6s (%s)  ratio %.2f\n' \
				"$(case $k in empty) echo 'empty claim (10)' ;; 10b) echo 'claim 10 + ack_batch' ;; *) echo "claim $k + ack" ;; esac)" \
				"$c" "$(echo ${us[citus-$k]})" "$p" "$(echo ${us[plain-$k]})" "$(echo "$c / $p" | bc -l)"
		done
	} | tee "$top/bench/citus/results/latest-claims.txt"
	exit 0
fi

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

if [ $profile = 1 ]; then
	command -v callgrind_annotate >/dev/null || { echo "--profile needs valgrind" >&2; exit 1; }
	profiled="plain delegated wrapper citus citus_tl"
	# a tenant whose shard is on worker 1: every call reaches that node
	tenant=$(psql_c -c "SELECT t FROM generate_series(1, 1000) t
		WHERE (SELECT nodeport FROM citus_shards WHERE shardid =
			get_shard_id_for_distribution_column('payments', t::bigint)) = $((port + 1)) LIMIT 1")
	# the call in the target list too, which Citus delegates as well
	sed 's/^SELECT \* FROM idem_citus_call(\(.*\));$/SELECT idem_citus_call(\1);/' "$work/citus.sql" >"$work/citus_tl.sql"
	for w in $profiled; do
		sed "s/^\\\\set t .*/\\\\set t $tenant/" "$work/$w.sql" >"$work/p-$w.sql"
	done
	chown postgres: "$work"/p-*.sql 2>/dev/null || true
	mkdir -p "$work/cg"
	chown postgres: "$work/cg" 2>/dev/null || true
	declare -a vpid pm aux
	for i in 0 1 2; do
		as_pg "$bindir/pg_ctl" -D "$work/n$i" -w -m fast stop >/dev/null
		as_pg bash -c "cd '$work/cg' && exec valgrind --tool=callgrind \
			--callgrind-out-file='$work/cg/n$i.%p' '$bindir/postgres' -D '$work/n$i' \
			-c autovacuum=off -c citus.distributed_deadlock_detection_factor=-1 \
			-c citus.recover_2pc_interval=-1" >"$work/valgrind-n$i.log" 2>&1 &
		vpid[$i]=$!
	done
	for i in 0 1 2; do
		for s in $(seq 1 180); do
			as_pg "$bindir/pg_isready" -q -h 127.0.0.1 -p $((port + i)) && break
			sleep 1
		done
	done
	# Citus starts its maintenance daemon at a database's first connection
	for i in 0 1 2; do
		as_pg "$bindir/psql" -X -q -At -h 127.0.0.1 -p $((port + i)) -d postgres -c 'SELECT 1' >/dev/null
	done
	sleep 20
	for i in 0 1 2; do
		pm[$i]=$(head -n1 "$work/n$i/postmaster.pid")
		aux[$i]=$(pgrep -c -P "${pm[$i]}" || true)
	done
	# until no node has a backend left (callgrind writes a profile as its
	# process exits)
	quiesce() {
		local i s busy
		for s in $(seq 1 240); do
			busy=0
			for i in 0 1 2; do
				[ "$(pgrep -c -P "${pm[$i]}" || true)" -le "${aux[$i]}" ] || busy=1
			done
			[ $busy = 1 ] || return 0
			sleep 0.5
		done
		echo "profile: backends still running after 120 s" >&2
	}
	# the new profile of node $1 with the most instructions since $2 (a
	# listing), and its count
	largest() {
		local f best=0 v file=""
		for f in $(comm -13 <(echo "$2") <(ls "$work/cg" | sort) | grep "^n$1\\."); do
			v=$(sed -n 's/^summary: //p' "$work/cg/$f")
			if [ "${v:-0}" -gt "$best" ]; then best=$v; file=$f; fi
		done
		echo "$file $best"
	}
	. "$top/bench/callgrind.sh"
	short=50
	long=350
	declare -A ir files
	for w in $profiled; do
		for n in $short $long; do
			quiesce
			before=$(ls "$work/cg" | sort)
			as_pg "$bindir/pgbench" -n -M prepared -c 1 -t $n -f "$work/p-$w.sql" \
				-h 127.0.0.1 -p "$port" postgres >"$work/p-$w-$n.log" 2>&1
			quiesce
			for i in 0 1; do
				read -r f v < <(largest $i "$before")
				ir[$w-$n-$i]=$v
				files[$w-$n-$i]=$f
			done
		done
		for i in 0 1; do
			ir[$w-$i]=$(( (ir[$w-$long-$i] - ir[$w-$short-$i]) / (long - short) ))
			join -t "$(printf '\t')" -1 2 -2 2 -o 0,1.1,2.1 \
				<(callgrind_inclusive "$work/cg/${files[$w-$short-$i]}") <(callgrind_inclusive "$work/cg/${files[$w-$long-$i]}") |
			awk -F'\t' -v n=$((long - short)) -v tot="${ir[$w-$i]}" '
				$1 !~ /^(\?\?\?:0x|=>|\.\/|PROGRAM|\?\?\?:\(below|\?\?\?:main|\?\?\?:PostmasterMain)/ {
					d = ($3 - $2) / n; if (d >= tot / 200) printf "%8.0f %5.1f%%  %s\n", d, 100 * d / tot, $1 }' |
			sort -rn >"$work/functions-$w-n$i.txt"
			cp "$work/cg/${files[$w-$long-$i]}" "$work/callgrind-$w-n$i.out"
		done
		echo "profile $w: coordinator ${ir[$w-0]}, worker ${ir[$w-1]} instructions per call" >&2
	done
	mkdir -p "$top/bench/citus/results"
	{
		title "idem on Citus, instructions per call"
		echo "coordinator + 2 workers on loopback under callgrind, pgbench -M prepared, 1 client, tenant $tenant (on worker 1);"
		echo "difference of sessions of $long and $short calls, per call; worker: the backend of the coordinator's connection"
		printf '%-10s %12s %12s %12s %9s %9s\n' workload coordinator worker both "/ plain" "/ deleg."
		for w in $profiled; do
			b=$(( ir[$w-0] + ir[$w-1] ))
			printf '%-10s %12d %12d %12d %9.2f %9.2f\n' "$w" "${ir[$w-0]}" "${ir[$w-1]}" "$b" \
				"$(echo "$b / (${ir[plain-0]} + ${ir[plain-1]})" | bc -l)" \
				"$(echo "$b / (${ir[delegated-0]} + ${ir[delegated-1]})" | bc -l)"
		done
		for w in delegated citus; do
			for i in 1 0; do
				echo
				echo "--- $w, $([ $i = 0 ] && echo coordinator || echo worker): inclusive instructions per call, by function"
				sed -n '1,45p' "$work/functions-$w-n$i.txt"
			done
		done
	} | tee "$top/bench/citus/results/latest-profile.txt"
	for i in 0 1 2; do
		as_pg "$bindir/pg_ctl" -D "$work/n$i" -w -m fast stop >/dev/null || true
	done
	wait "${vpid[@]}" 2>/dev/null || true
	exit 0
fi

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

mkdir -p "$top/bench/citus/results"
{
	title "idem on Citus"
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
