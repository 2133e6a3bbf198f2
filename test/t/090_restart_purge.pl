
# Copyright (c) 2026, idem authors

# Restart and purge.
#
# 1. A clean restart keeps every key record, business row and outbox event,
#    and every key replays.
# 2. A purge interrupted by a crash leaves no half-state.  20,000 expired
#    key records in 20 batches (one transaction each, so each batch has its
#    own expires_at and the purge, which walks expires_at in order, takes
#    them batch by batch) plus 100 live ones.  idem_purge(5000) is called
#    in three transactions; the third is made to stop in the middle (it
#    reaches a row that another session holds FOR UPDATE, after deleting
#    thousands of rows), and the server is killed.  After recovery the
#    first two purge transactions are entirely gone and the third entirely
#    undone: exactly the 10,000 newest expired records remain.
# 3. Same with a purge transaction that finished its statement but never
#    committed.  Then the purge runs to completion, live keys stay, and a
#    purged key executes afresh.
# 4. A prepared transaction that executed a key survives a crash with the
#    key's lock: a caller that will not wait gets ID409; after COMMIT
#    PREPARED the key replays.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $timeout = $PostgreSQL::Test::Utils::timeout_default;

my $node = idem_node('purge');
$node->append_conf('postgresql.conf', 'max_prepared_transactions = 5');
$node->start;
idem_setup_db($node, 'postgres');

########################################################################
# 1. Clean restart.
########################################################################

my $sql_live = "SET idem.outbox_topic = 'orders';\n";
$sql_live .= call_sql("live-$_", 0, $_) for 1 .. 100;
$node->safe_psql('postgres', $sql_live);

my $state_sql = q{
SELECT key, owner, fingerprint, response, created_at, expires_at FROM idem.keys ORDER BY key;
SELECT * FROM idem.outbox ORDER BY event_id;
SELECT * FROM biz ORDER BY id;
};
my $state = $node->safe_psql('postgres', $state_sql);

my $logstart = -s $node->logfile;
$node->restart;
ok(!$node->log_contains(qr/automatic recovery in progress/, $logstart),
	'clean restart, no recovery');
is($node->safe_psql('postgres', $state_sql),
	$state, 'a clean restart keeps key records, outbox and business rows');

my $out = $node->safe_psql('postgres', $sql_live);
is(scalar(grep { /^ack\|[^|]+\|t\|/ } split /\n/, $out),
	100, 'every key replays after the restart');
is($node->safe_psql('postgres', $state_sql),
	$state, 'and the replays changed nothing');

########################################################################
# 2. Crash in the middle of a purge.
########################################################################

my $sql = "SET idem.ttl = 1;\n";
for my $b (1 .. 20)
{
	$sql .= sprintf(
		"SELECT count(idem_execute('p-%02d-' || lpad(g::text, 4, '0'), 'SELECT \$1::int AS n', g)) FROM generate_series(1, 1000) g;\n",
		$b);
}
$node->safe_psql('postgres', $sql, timeout => $timeout);
is( $node->safe_psql(
		'postgres',
		q{SELECT count(*), count(DISTINCT created_at) FROM idem.keys WHERE key LIKE 'p-%'}),
	'20000|20',
	'20,000 short-lived key records in 20 batches');
ok( $node->poll_query_until(
		'postgres',
		q{SELECT max(expires_at) <= now() FROM idem.keys WHERE key LIKE 'p-%'}),
	'all of them have expired');

# What must remain if purge transactions are atomic: batches 11..20.
my $survivors_sql =
  q{SELECT count(*), min(key), max(key) FROM idem.keys WHERE key LIKE 'p-%'};

my $blocker = $node->background_psql('postgres');
$blocker->query_safe('BEGIN');
$blocker->query_safe(
	q{SELECT key FROM idem.keys WHERE key = 'p-15-0500' FOR UPDATE});

my $purger = $node->background_psql('postgres', on_error_stop => 0);
my $purger_pid = $purger->query_safe('SELECT pg_backend_pid()');
is($purger->query_safe('SELECT idem_purge(5000)'), '5000', 'first purge transaction: 5000');
is($purger->query_safe('SELECT idem_purge(5000)'), '5000', 'second purge transaction: 5000');
$purger->query_until(qr/purging/, "\\echo purging\nSELECT idem_purge(5000);\n");
wait_for_backend($node, $purger_pid,
	"wait_event_type = 'Lock' AND wait_event = 'transactionid' AND backend_xid IS NOT NULL"
);
pass('third purge transaction has deleted rows and waits in the middle of batch 15');
is($node->safe_psql('postgres', $survivors_sql),
	'10000|p-11-0001|p-20-1000',
	'others see the first two purges, not the third');

$logstart = -s $node->logfile;
crash_node($node);
bg_finish($purger);
bg_finish($blocker);
$node->start;
ok($node->log_contains(qr/automatic recovery in progress/, $logstart),
	'crash recovery ran');

is($node->safe_psql('postgres', $survivors_sql),
	'10000|p-11-0001|p-20-1000',
	'after the crash: committed purges are complete, the interrupted one left nothing behind'
);
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM idem.keys WHERE key LIKE 'live-%'}),
	'100', 'live keys untouched');

########################################################################
# 3. Crash with a purge transaction open.
########################################################################

$purger = $node->background_psql('postgres', on_error_stop => 0);
$purger->query_safe('BEGIN');
is($purger->query_safe('SELECT idem_purge(100000)'),
	'10000', 'an open transaction purged every expired record');
$logstart = -s $node->logfile;
crash_node($node);
bg_finish($purger);
$node->start;
ok($node->log_contains(qr/automatic recovery in progress/, $logstart),
	'crash recovery ran');
is($node->safe_psql('postgres', $survivors_sql),
	'10000|p-11-0001|p-20-1000',
	'the uncommitted purge left every record in place');

my $total = 0;
for (1 .. 10)
{
	my $n = $node->safe_psql('postgres', 'SELECT idem_purge(3000)');
	$total += $n;
	last if $n == 0;
}
is($total, 10000, 'purging to completion deletes the 10,000 expired records');
is( $node->safe_psql(
		'postgres',
		q{SELECT (SELECT count(*) FROM idem.keys WHERE key LIKE 'p-%'),
		         (SELECT count(*) FROM idem.keys WHERE key LIKE 'live-%')}),
	'0|100',
	'only live keys remain');

$out = $node->safe_psql('postgres',
	q{SELECT replayed, response FROM idem_execute_ex('p-12-0007', 'SELECT $1::int AS n', 7)});
is($out, 'f|{"rows": [{"n": 7}], "command": "SELECT", "rowcount": 1}',
	'a purged key executes afresh');
$out = $node->safe_psql('postgres', $sql_live);
is(scalar(grep { /^ack\|[^|]+\|t\|/ } split /\n/, $out),
	100, 'every live key still replays');

########################################################################
# 4. A prepared transaction keeps its key across a crash.
########################################################################

$node->safe_psql('postgres',
	"BEGIN;\nSET LOCAL idem.outbox_topic = 'orders';\n"
	  . call_sql('prep-1', 0, 1)
	  . "PREPARE TRANSACTION 'idem_prep';");
$logstart = -s $node->logfile;
crash_node($node);
$node->start;
ok($node->log_contains(qr/recovering prepared transaction/, $logstart),
	'the prepared transaction was recovered');

my ($ret, $stdout, $stderr) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSET idem.wait = off;\n" . call_sql('prep-1', 0, 1));
like($stderr, qr/ERROR:  ID409:/,
	'after the crash the prepared transaction still holds prep-1');
$node->safe_psql('postgres', "COMMIT PREPARED 'idem_prep'");
$out = $node->safe_psql('postgres', call_sql('prep-1', 0, 1));
like($out, qr/^ack\|prep-1\|t\|/m, 'after COMMIT PREPARED, prep-1 replays');
is( $node->safe_psql(
		'postgres',
		q{SELECT (SELECT count(*) FROM biz WHERE key = 'prep-1'),
		         (SELECT count(*) FROM idem.outbox WHERE key = 'prep-1')}),
	'1|1',
	'prep-1: one business row, one outbox event');

$node->stop;
done_testing();
