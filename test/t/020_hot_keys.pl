
# Copyright (c) 2026, idem authors

# Hot keys under every isolation level.
#
# pgbench runs 16 clients for a few seconds on 50 hot keys, once at READ
# COMMITTED, once at REPEATABLE READ and once at SERIALIZABLE, retrying
# transactions that fail with 40001 or 40P01 (--max-tries).  Each
# transaction calls idem_execute_ex() on one of the 50 keys and logs the
# response it got, in the same transaction, into "seen".  The business
# statement inserts one row into "orders"; its response carries the row's id
# and the pid of the backend that executed it, so two executions can never
# produce the same response.  The set of 50 keys changes every half second
# (the key carries a round number), so that first executions, and the races
# around them, happen all through the run rather than only at its start.
# Meanwhile idem.keys is analyzed ten times a second, as autovacuum does on
# a busy catalog, so calls keep receiving relcache invalidations of idem's
# tables.
#
# Checked for each level: every key has exactly one business row and one key
# record (and neither exists without the other); every client that
# committed a call on a key saw the same response, the one stored with the
# key, which describes that key's business row; exactly one logged call per
# key executed, all others replayed; pgbench counted no failed transaction
# and no client aborted on an error it cannot retry; the server never raised
# a unique violation; every retry was caused by idem's 40001 for a key
# recorded after the transaction's snapshot, never by anything else.  At
# READ COMMITTED nothing needs a retry.
#
# A larger version of this workload is bench/hotkeys/run.sh.

use strict;
use warnings FATAL => 'all';

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $clients = 16;
my $keys = 50;
# Transactions per client and level: a few seconds here.  A fixed count
# rather than --time: when the time is up pgbench does not retry, so a 40001
# in the last moment would count as a failed transaction.
my $transactions = 1000;

my $node = PostgreSQL::Test::Cluster->new('hot_keys');
$node->init(extra => [ '--encoding=UTF8', '--no-locale' ]);
# test nodes get max_connections = 10
$node->append_conf('postgresql.conf',
	'max_connections = ' . ($clients + 10) . "\n");
$node->start;

$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
CREATE TABLE orders (
	id			bigserial PRIMARY KEY,
	key			text NOT NULL,
	amount		int NOT NULL,
	executed_by	int NOT NULL
);
CREATE TABLE seen (
	key			text NOT NULL,
	client		int NOT NULL,
	replayed	boolean NOT NULL,
	response	jsonb NOT NULL
);
CREATE TABLE maintenance_done (level text NOT NULL);
});

my %levels = (
	rc => 'READ COMMITTED',
	rr => 'REPEATABLE READ',
	ser => 'SERIALIZABLE');

for my $prefix (qw(rc rr ser))
{
	my $level = $levels{$prefix};
	my $script = $node->basedir . "/hot_keys_$prefix.sql";
	append_to_file(
		$script, qq{
\\set n random(1, $keys)
SELECT (extract(epoch FROM clock_timestamp()) * 2)::bigint AS round \\gset
BEGIN ISOLATION LEVEL $level;
WITH k AS (SELECT '$prefix-' || :round || '-' || :n AS key)
INSERT INTO seen (key, client, replayed, response)
SELECT k.key, :client_id, e.replayed, e.response
  FROM k, idem_execute_ex(k.key,
	'INSERT INTO orders (key, amount, executed_by) VALUES (\$1, \$2, pg_backend_pid()) RETURNING id, key, amount, executed_by',
	k.key, :n) AS e;
END;
});

	my $log_offset = -s $node->logfile;

	# Meanwhile, ANALYZE idem.keys ten times a second, as autovacuum does
	# on a busy catalog: each one sends a relcache invalidation of idem's
	# table to every backend, in the middle of its calls.
	my ($maint_out, $maint_err) = ('', '');
	my $maint = IPC::Run::start(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr('postgres'),
			'-c', qq{
DO \$\$
DECLARE
	deadline timestamptz := clock_timestamp() + interval '$PostgreSQL::Test::Utils::timeout_default s';
BEGIN
	WHILE NOT EXISTS (SELECT FROM maintenance_done WHERE level = '$prefix')
		AND clock_timestamp() < deadline
	LOOP
		ANALYZE idem.keys;
		COMMIT;
		PERFORM pg_sleep(0.1);
	END LOOP;
END
\$\$;}
		],
		'>', \$maint_out, '2>', \$maint_err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));

	my ($stdout, $stderr);
	my @cmd = (
		'pgbench', '--no-vacuum', '--client' => $clients,
		'--jobs' => 2, '--transactions' => $transactions,
		'--max-tries' => 1000, '--file' => $script,
		$node->connstr('postgres'));
	my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	ok($ok, "$level: pgbench completed")
	  or diag("pgbench stdout:\n$stdout\nstderr:\n$stderr");
	unlike($stderr, qr/aborted/, "$level: no client aborted");
	$node->safe_psql('postgres',
		"INSERT INTO maintenance_done VALUES ('$prefix')");
	ok($maint->finish, "$level: ANALYZE of idem.keys ran alongside")
	  or diag("psql stderr:\n$maint_err");

	my ($processed) =
	  $stdout =~ /number of transactions actually processed: (\d+)/;
	my ($failed) = $stdout =~ /number of failed transactions: (\d+)/;
	my ($retries) = $stdout =~ /total number of retries: (\d+)/;
	is($failed, 0, "$level: no failed transactions");
	is($processed, $clients * $transactions,
		"$level: every transaction completed");
	note("$level: $processed transactions, $retries retries");
	is($retries, 0, "$level: no retries needed") if $prefix eq 'rc';

	my $log = slurp_file($node->logfile, $log_offset);
	unlike($log, qr/duplicate key value/,
		"$level: no unique violation in the server log");
	my $conflicts =
	  () = $log =~ /could not serialize access due to concurrent use of idempotency key/g;
	note("$level: $conflicts calls ended with idem's 40001");
	is($conflicts, $retries,
		"$level: every retry was a call that met a newer record of its key");

	my $like = "'$prefix-%'";

	# one business row and one key record per key, never one without the other
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM (SELECT key FROM orders WHERE key LIKE $like
					  GROUP BY key HAVING count(*) <> 1) d}),
		'0',
		"$level: no key has more than one business row");
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM (SELECT * FROM orders WHERE key LIKE $like) o
	 FULL JOIN (SELECT * FROM idem.keys WHERE key LIKE $like) k USING (key)
 WHERE o.id IS NULL OR k.response IS NULL}),
		'0',
		"$level: business rows and key records match one to one");

	# the stored response describes the key's business row
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM orders o JOIN idem.keys k USING (key)
 WHERE o.key LIKE $like
   AND k.response <> jsonb_build_object(
		'rows', jsonb_build_array(to_jsonb(o)),
		'command', 'INSERT', 'rowcount', 1)}),
		'0',
		"$level: each stored response is its business row");

	# every client saw the stored response; exactly one call per key executed
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM seen s LEFT JOIN idem.keys k USING (key)
 WHERE s.key LIKE $like AND k.response IS DISTINCT FROM s.response}),
		'0',
		"$level: every committed call got the stored response");
	is( $node->safe_psql(
			'postgres', qq{
SELECT count(*) FROM (SELECT key FROM seen WHERE key LIKE $like GROUP BY key
					  HAVING count(*) FILTER (WHERE NOT replayed) <> 1) d}),
		'0',
		"$level: exactly one call per key executed, the others replayed");

	my ($nseen, $nkeys, $nhot) = split /\|/,
	  $node->safe_psql(
		'postgres', qq{
SELECT (SELECT count(*) FROM seen WHERE key LIKE $like),
	   (SELECT count(*) FROM idem.keys WHERE key LIKE $like),
	   (SELECT count(*) FROM (SELECT key FROM seen WHERE key LIKE $like
							  GROUP BY key HAVING count(*) > 1) h)});
	is($nseen, $processed,
		"$level: every transaction pgbench counted logged its call");
	cmp_ok($nhot, '>', 0, "$level: keys were called more than once");
	note("$level: $nkeys keys, $nseen calls");
}

$node->stop;
done_testing();
