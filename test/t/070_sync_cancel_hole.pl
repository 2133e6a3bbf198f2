
# Copyright (c) 2026, idem authors

# The synchronous-replication cancel hole, and idem.durable_replay.
#
# PostgreSQL writes and flushes a commit locally before it waits for the
# synchronous standby.  If that wait is cancelled, the client gets a
# WARNING ("canceling wait for synchronous replication ... The transaction
# has already committed locally, but might not have been replicated to the
# standby") and the row is visible on the primary, yet it is not on the
# standby and a failover loses it.
#
# A replay writes nothing, so by default it waits for nobody: a retry
# arriving after such a cancel is told "success" at once, for a result a
# failover can still lose.  With idem.durable_replay = on the replay writes
# one transactional WAL record, so its commit waits for the synchronous
# standby like any write and is acknowledged only once the original result
# is on the standby.
#
# Phase 1 (standby down, then back): the cancelled commit is visible
# locally; a replay with durable_replay = off returns replayed = true at
# once; with durable_replay = on it waits in SyncRep and completes when the
# standby comes back, which then has the key.
#
# Phase 2 (standby down, then failover): same cancelled commit; the
# durable_replay = off replay again says "success"; a call committed with
# synchronous_commit = local (what asynchronous replication gives every
# call) is acknowledged too; the durable_replay = on replay is still
# waiting when the primary dies, so it never says "success" (one whose
# wait is cancelled answers with the cancel warning, like any write).  After
# promoting the standby, both acknowledged results are gone (business row,
# key record and outbox event together) and the retries execute afresh.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $timeout = $PostgreSQL::Test::Utils::timeout_default;

my ($primary, $standby) = idem_sync_pair('on');

sub wait_sync
{
	$primary->poll_query_until('postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'"
	) or die 'standby did not become synchronous';
}
wait_sync();
idem_setup_db($primary, 'postgres');
$primary->wait_for_catchup($standby);

sub call
{
	my ($key) = @_;
	return
	    "SELECT 'result:' || left(replayed::text, 1) || '|' || response FROM idem_execute_ex('$key', "
	  . "'$IdemTAP::biz_sql', '$key'::text, 0, 1);\n";
}

sub counts
{
	my ($node, $key) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT (SELECT count(*) FROM biz WHERE key = '$key') || ' ' ||
       (SELECT count(*) FROM idem.keys WHERE key = '$key') || ' ' ||
       (SELECT count(*) FROM idem.outbox WHERE key = '$key')});
}

# Start a call in a background session; return (session, pid).
sub start_call
{
	my ($key, $setup) = @_;
	my $bg = $primary->background_psql('postgres', on_error_stop => 0);
	my $pid = $bg->query_safe('SELECT pg_backend_pid()');
	$bg->query_safe("SET idem.outbox_topic = 'orders'");
	$bg->query_safe($setup) if defined $setup;
	$bg->query_until(qr/go/, "\\echo go\n" . call($key));
	return ($bg, $pid);
}

# Execute key with the standby down and cancel the commit's sync wait.
sub cancelled_commit
{
	my ($key) = @_;
	my ($bg, $pid) = start_call($key);

	wait_for_backend($primary, $pid, "wait_event = 'SyncRep'");
	pass("$key: commit is flushed locally and waits for the standby");
	$primary->safe_psql('postgres', "SELECT pg_cancel_backend($pid)");
	my $out = $bg->query_until(qr/result:.*\n/, '');
	like($out, qr/result:f\|/, "$key: the client still gets its result");
	like(
		$bg->{stderr},
		qr/WARNING:  canceling wait for synchronous replication due to user request\nDETAIL:  The transaction has already committed locally, but might not have been replicated to the standby/,
		"$key: with the cancel warning");
	$bg->quit;
	is(counts($primary, $key), '1 1 1', "$key: committed and visible on the primary");
	my ($response) = $out =~ /result:f\|(.*)/;
	return $response;
}

# A replay with durable_replay = off: must come back at once.
sub plain_replay
{
	my ($key, $response) = @_;
	my $timed_out = 0;
	my ($ret, $out, $err) = $primary->psql(
		'postgres', call($key),
		timeout => $timeout,
		timed_out => \$timed_out);
	ok(!$timed_out && $ret == 0,
		"$key: durable_replay = off: the replay returns although the standby is down"
	);
	is($out, "result:t|$response", "$key: and reports success (replayed = true)");
	is($err, '', "$key: without any warning");
}

########################################################################
# Phase 1: the standby comes back.
########################################################################

$standby->stop;
my $r1 = cancelled_commit('hole-1');
plain_replay('hole-1', $r1);

my ($durable, $durable_pid) =
  start_call('hole-1', 'SET idem.durable_replay = on');
wait_for_backend($primary, $durable_pid, "wait_event = 'SyncRep'");
$durable->{run}->pump_nb();
unlike($durable->{stdout}, qr/result:/,
	'hole-1: durable_replay = on: the replay waits for the standby instead of answering'
);

$standby->start;
my $out = $durable->query_until(qr/result:.*\n/, '');
is($out, "result:t|$r1\n",
	'hole-1: once the standby is back, the durable replay completes');
unlike($durable->{stderr}, qr/WARNING/, 'hole-1: without a warning');
$durable->quit;
ok( $standby->poll_query_until(
		'postgres', "SELECT count(*) = 1 FROM idem.keys WHERE key = 'hole-1'"),
	'hole-1 is on the standby now');
is(counts($standby, 'hole-1'), '1 1 1', 'with its business row and outbox event');

# With the standby up, a durable replay just works.
wait_sync();
is( $primary->safe_psql(
		'postgres', "SET idem.durable_replay = on;\n" . call('hole-1'),
		timeout => $timeout),
	"result:t|$r1",
	'durable replay with the standby up');

########################################################################
# Phase 2: failover while the standby lacks the commit.
########################################################################

$standby->stop;
my $r2 = cancelled_commit('hole-2');
plain_replay('hole-2', $r2);

# Asynchronous replication, for one transaction.
$out = $primary->safe_psql('postgres',
	"SET synchronous_commit = local;\nSET idem.outbox_topic = 'orders';\n"
	  . call('async-1'),
	timeout => $timeout);
like($out, qr/^result:f\|/,
	'async-1: with synchronous_commit = local the call is acknowledged at once');

# A durable replay whose wait is cancelled in turn answers, but like any
# write whose synchronous wait is cancelled: with the warning, which is
# the client's only sign that the result may not survive a failover.
my ($cancelled, $cancelled_pid) =
  start_call('hole-2', 'SET idem.durable_replay = on');
wait_for_backend($primary, $cancelled_pid, "wait_event = 'SyncRep'");
$primary->safe_psql('postgres', "SELECT pg_cancel_backend($cancelled_pid)");
$out = $cancelled->query_until(qr/result:.*\n/, '');
is($out, "result:t|$r2\n",
	'hole-2: a durable replay whose wait is cancelled returns the response');
like($cancelled->{stderr},
	qr/WARNING:  canceling wait for synchronous replication/,
	'hole-2: but only with the cancel warning');
$cancelled->quit;

($durable, $durable_pid) =
  start_call('hole-2', 'SET idem.durable_replay = on');
wait_for_backend($primary, $durable_pid, "wait_event = 'SyncRep'");
pass('hole-2: durable_replay = on: the replay waits for the standby');

$primary->stop('immediate');
my ($stdout, $stderr) = bg_finish($durable);
unlike($stdout, qr/result:/,
	'hole-2: the durable replay never reported success before the primary died');

$standby->start;
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
	'standby promoted');

is(counts($standby, 'hole-1'), '1 1 1', 'hole-1 survived the failover');
is(counts($standby, 'hole-2'), '0 0 0',
	'hole-2, replayed as a success with durable_replay = off, is lost with its business row'
);
is(counts($standby, 'async-1'), '0 0 0',
	'async-1, acknowledged without the standby, is lost with its business row');
check_pairing($standby, 'postgres', 'new primary');

for my $key ('hole-2', 'async-1')
{
	$out = $standby->safe_psql('postgres',
		"SET idem.outbox_topic = 'orders';\n" . call($key));
	like($out, qr/^result:f\|/, "$key: the retry on the new primary executes afresh");
	$out = $standby->safe_psql('postgres', call($key));
	like($out, qr/^result:t\|/, "$key: and the next one replays");
	is(counts($standby, $key), '1 1 1', "$key: exactly once on the new primary");
}
$out = $standby->safe_psql('postgres', call('hole-1'));
is($out, "result:t|$r1", 'hole-1 replays its original response on the new primary');

$standby->stop;
done_testing();
