
# Copyright (c) 2026, idem authors

# Crash in the middle of a workload.
#
# Four clients stream idem_execute_ex() calls (each key printed by the
# client before it is sent; half of the keys private to a client, half sent
# by every client, so they also race on the same key).  Two more clients
# make sure the crash finds both in-between cases: late-1 has committed but
# its commit still waits (for a synchronous standby that does not exist), so
# its acknowledgement is lost; open-1 has executed inside a transaction that
# is still open.  The whole server (postmaster and every child) is killed
# with SIGKILL while they run and restarted, which runs crash recovery.
# Then every client retries every key it ever sent, concurrently.
#
# Checked: after recovery, and again after the retries, each key has exactly
# one business row, one key record and one outbox event, and never one
# without the others; every acknowledged call survived; a retry of a key
# whose transaction committed replays its stored response (even when the
# acknowledgement was lost in the crash); a key whose transaction never
# committed executes exactly once, whichever client retries it first.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nclients = 4;
my $ncalls = 50000;	  # per client, so no client can finish before the crash
my $crash_after = 400;	  # committed keys before the crash

my $node = idem_node('crash', allows_streaming => 1);
# No synchronous standby exists, and the clients commit with
# synchronous_commit = local.  One extra client commits with
# synchronous_commit = on instead: its commit is flushed locally and then
# waits forever for the missing standby, so the crash is sure to hit a key
# that committed but whose acknowledgement never reached the client.
$node->append_conf(
	'postgresql.conf', q(
synchronous_standby_names = 'ghost'
synchronous_commit = local
));
$node->start;
idem_setup_db($node, 'postgres');

my @scripts = map { client_script($_, $ncalls) } 1 .. $nclients;
# It sends no NOTIFY: PostgreSQL holds its notify lock from the commit
# until the wait for the standby ends (never), which would stop every other
# client's commit (README, Outbox: Wakeups).
push @scripts,
  "SET synchronous_commit = on;\nSET idem.outbox_notify = off;\nSET idem.outbox_topic = 'orders';\n"
  . call_sql('late-1', 99, 1);
# And one whose transaction is still open when the crash comes: the call
# executed, but the transaction never committed.
push @scripts,
  "SET idem.outbox_topic = 'orders';\nBEGIN;\n"
  . call_sql('open-1', 98, 1, 'pending')
  . "SELECT pg_sleep(600);\nCOMMIT;\n";
my @clients = start_clients($node, 'postgres', 'crash', \@scripts);

ok( $node->poll_query_until(
		'postgres', "SELECT count(*) >= $crash_after FROM idem.keys"),
	"workload committed $crash_after keys");
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'SyncRep'"),
	'one client waits after its local commit');
ok( $node->poll_query_until(
		'postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND backend_xid IS NOT NULL"),
	'one client has executed a call in a transaction still open');

my $logstart = -s $node->logfile;
crash_node($node);
my @before = wait_clients(@clients);

# What the clients know: the keys they sent and the answers they got.
my (%sent, %acked, @disagree);
for my $c (@before)
{
	isnt($c->{status}, 0, "client $c->{id} was interrupted by the crash");
	cmp_ok(scalar(@{ $c->{sent} }), '<', $ncalls,
		"client $c->{id} stopped mid-stream")
	  if $c->{id} <= $nclients;
	$sent{$_} = 1 for @{ $c->{sent} };
	for my $key (keys %{ $c->{acks} })
	{
		my $response = $c->{acks}{$key}[1];
		push @disagree, $key
		  if defined $acked{$key} && $acked{$key} ne $response;
		$acked{$key} = $response;
	}
}
is(join(',', @disagree), '',
	'clients acknowledged for the same key got the same response');
note scalar(keys %sent) . " keys sent, " . scalar(keys %acked) . " acknowledged";
ok(!defined $acked{'late-1'} && !defined $acked{'open-1'},
	'late-1 and open-1 were never acknowledged');

$node->start;
ok( $node->log_contains(
		qr/database system was not properly shut down; automatic recovery in progress/,
		$logstart),
	'restart ran crash recovery');

# State right after recovery, before any retry.
my %committed = check_pairing($node, 'postgres', 'after crash recovery');
is(scalar(grep { !$sent{$_} } keys %committed),
	0, 'every key record belongs to a key some client sent');
is(join(',', grep { !defined $committed{$_} } sort keys %acked),
	'', 'every acknowledged key survived the crash');
is(join(',', grep { $committed{$_} ne $acked{$_} } sort keys %acked),
	'', 'every acknowledged response is the stored one');
my @lost_acks = grep { !defined $acked{$_} } keys %committed;
note scalar(@lost_acks)
  . ' keys committed but their acknowledgement was lost in the crash: '
  . join(' ', sort @lost_acks);
ok(defined $committed{'late-1'},
	'late-1 committed before the crash although its client never heard back');
ok(!defined $committed{'open-1'}, 'open-1, never committed, is gone');

# Every client retries every key it sent, all clients at once.
my @retry_scripts;
for my $c (@before)
{
	my $sql = "SET idem.outbox_topic = 'orders';\n";
	for my $key (@{ $c->{sent} })
	{
		my ($client, $n) =
		  $key =~ /^c(\d+)-(\d+)$/ ? ($1, $2 + 0)
		  : $key =~ /^s-(\d+)$/ ? (0, $1 + 0)
		  : $key eq 'late-1' ? (99, 1)
		  : $key eq 'open-1' ? (98, 1)
		  : die "bad key $key";
		$sql .= call_sql($key, $client, $n, 'retry');
	}
	push @retry_scripts, $sql;
}
my @retries =
  wait_clients(start_clients($node, 'postgres', 'crash_retry', \@retry_scripts));

my (%fresh, $replays_ok, $fresh_ok);
$replays_ok = $fresh_ok = 1;
for my $c (@retries)
{
	is($c->{status}, 0, "retry client $c->{id} succeeded")
	  or diag $c->{stderr};
	is($c->{nack}, scalar(@{ $c->{sent} }),
		"retry client $c->{id} got an answer for every key");
	for my $key (@{ $c->{sent} })
	{
		my ($replayed, $response) = @{ $c->{acks}{$key} };
		if (defined $committed{$key})
		{
			unless ($replayed eq 't' && $response eq $committed{$key})
			{
				diag "$key committed before the crash but retry gave replayed=$replayed $response";
				$replays_ok = 0;
			}
		}
		elsif ($replayed eq 'f')
		{
			$fresh{$key}++;
		}
	}
}
ok($replays_ok,
	'every retry of a key committed before the crash replayed the stored response'
);
for my $key (sort keys %sent)
{
	next if defined $committed{$key};
	if (($fresh{$key} // 0) != 1)
	{
		diag "$key never committed before the crash; retries executed it "
		  . ($fresh{$key} // 0) . " times";
		$fresh_ok = 0;
	}
}
ok($fresh_ok,
	'every key that had not committed was executed exactly once by the retries'
);
note scalar(grep { !defined $committed{$_} } keys %sent)
  . ' keys sent had not committed: '
  . join(' ', sort grep { !defined $committed{$_} } keys %sent);
is($fresh{'open-1'}, 1, 'open-1 was executed by its retry');

my %final = check_pairing($node, 'postgres', 'after the retries');
is_deeply([ sort keys %final ], [ sort keys %sent ],
	'the keys recorded are exactly the keys sent');
is( $node->safe_psql(
		'postgres',
		'SELECT (SELECT count(*) FROM biz) = (SELECT count(*) FROM idem.keys)'),
	't',
	'one business row per key');

# A second full round of retries changes nothing.
my $rows_before = $node->safe_psql('postgres',
	'SELECT count(*), sum(id) FROM biz');
my @again =
  wait_clients(start_clients($node, 'postgres', 'crash_again', \@retry_scripts));
my $all_replayed = 1;
for my $c (@again)
{
	$all_replayed = 0 if $c->{status} != 0;
	for my $key (@{ $c->{sent} })
	{
		my ($replayed, $response) = @{ $c->{acks}{$key} // [ 'x', '' ] };
		$all_replayed = 0
		  unless $replayed eq 't' && $response eq $final{$key};
	}
}
ok($all_replayed, 'a second round of retries replays every key');
is($node->safe_psql('postgres', 'SELECT count(*), sum(id) FROM biz'),
	$rows_before, 'and writes no business row');

$node->stop;
done_testing();
