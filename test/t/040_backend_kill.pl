
# Copyright (c) 2026, idem authors

# A backend dies between the business write and the commit.
#
# 1. pg_terminate_backend() of a session whose transaction has run
#    idem_execute() and is still open, while a second caller waits for the
#    key: the transaction vanishes as a whole and the waiter executes the
#    call itself, once.
# 2. pg_terminate_backend() while the business statement itself is still
#    running (the row is written, RETURNING is sleeping).
# 3. SIGKILL of a backend inside the business statement: the postmaster
#    treats it as a crash, resets every backend and runs crash recovery
#    (src/test/recovery/t/013_crash_restart.pl); keys committed before
#    survive and replay, the killed call is gone and its retry executes once.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('kill');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->start;
idem_setup_db($node, 'postgres');

# The business statement writes its row, then sleeps in RETURNING for
# test.sleep seconds (unset: not at all), so a backend can be caught between
# the write and the commit.  The sleep is a setting, not an argument, so the
# retry sends the very same request.
my $sleepy_sql =
  q{INSERT INTO biz (key, client, n) VALUES ($1, $2, $3) }
  . q{RETURNING id, key, client, n, }
  . q{(SELECT 0 FROM pg_sleep(current_setting('test.sleep', true)::float8)) AS slept};

sub call
{
	my ($key, $sql) = @_;
	$sql //= $IdemTAP::biz_sql;
	return
	    "SELECT replayed, response FROM idem_execute_ex('$key', "
	  . "\$q\$$sql\$q\$, '$key'::text, 0, 1)";
}

sub counts
{
	my ($key) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT (SELECT count(*) FROM biz WHERE key = '$key') || ' ' ||
       (SELECT count(*) FROM idem.keys WHERE key = '$key') || ' ' ||
       (SELECT count(*) FROM idem.outbox WHERE key = '$key')});
}

my ($out, $err);

########################################################################
# 1. Terminated with the transaction open after idem_execute(); a waiter.
########################################################################

my $holder = $node->background_psql('postgres', on_error_stop => 0);
my $holder_pid = $holder->query_safe('SELECT pg_backend_pid()');
$holder->query_safe("SET idem.outbox_topic = 'orders'");
$holder->query_safe('BEGIN');
$out = $holder->query_safe(call('k-open'));
like($out, qr/^f\|\{"rows": \[\{"n": 1, "id": \d+/,
	'holder executed k-open inside its open transaction');

is( $node->safe_psql(
		'postgres', qq{
SELECT count(*) FROM pg_locks
WHERE pid = $holder_pid AND locktype = 'advisory' AND objsubid = 18756 AND granted}),
	'1',
	'holder holds the key lock');
is(counts('k-open'), '0 0 0', 'nothing of k-open is visible to others yet');

my $waiter = $node->background_psql('postgres', on_error_stop => 0);
my $waiter_pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_safe("SET idem.outbox_topic = 'orders'");
$waiter->query_until(qr/waiting/,
	"\\echo waiting\n" . call('k-open') . ";\n");
wait_for_backend($node, $waiter_pid,
	"wait_event_type = 'Lock' AND wait_event = 'advisory'");
pass('a second caller waits for k-open');

is($node->safe_psql('postgres', "SELECT pg_terminate_backend($holder_pid)"),
	't', 'holder terminated');
# the idle client only notices when it sends its next statement (its COMMIT)
$holder->{stdin} .= "COMMIT;\n";
($out, $err) = bg_finish($holder);
like($err, qr/terminating connection due to administrator command/,
	'holder saw its connection terminated');

$out = $waiter->query_until(qr/\|/, '');
like($out, qr/^f\|/m,
	'the waiter executed k-open itself after the holder died');
is(counts('k-open'), '1 1 1',
	'k-open: one business row, one key record, one outbox event');

$out = $node->safe_psql('postgres', call('k-open'));
like($out, qr/^t\|/, 'retry of k-open replays');
is(counts('k-open'), '1 1 1', 'and adds nothing');
$waiter->quit;

########################################################################
# 2. Terminated inside the business statement.
########################################################################

my $sleeper = $node->background_psql('postgres', on_error_stop => 0);
my $sleeper_pid = $sleeper->query_safe('SELECT pg_backend_pid()');
$sleeper->query_safe("SET idem.outbox_topic = 'orders'");
$sleeper->query_safe("SET test.sleep = 600");
$sleeper->query_until(qr/running/,
	"\\echo running\n" . call('k-sleep', $sleepy_sql) . ";\n");
wait_for_backend($node, $sleeper_pid,
	"wait_event = 'PgSleep' AND backend_xid IS NOT NULL");
pass('k-sleep has written its business row and sleeps in RETURNING');

is($node->safe_psql('postgres', "SELECT pg_terminate_backend($sleeper_pid)"),
	't', 'sleeping backend terminated');
($out, $err) = bg_finish($sleeper);
like($err, qr/terminating connection due to administrator command/,
	'its client saw the connection terminated');
is(counts('k-sleep'), '0 0 0', 'nothing of k-sleep survived');

$out = $node->safe_psql('postgres',
	"SET idem.outbox_topic = 'orders';\n" . call('k-sleep', $sleepy_sql));
like($out, qr/^f\|/, 'retry of k-sleep executes');
$out = $node->safe_psql('postgres', call('k-sleep', $sleepy_sql));
like($out, qr/^t\|/, 'the next retry replays');
is(counts('k-sleep'), '1 1 1', 'k-sleep: executed exactly once');

########################################################################
# 3. SIGKILL inside the business statement: crash and reinitialisation.
########################################################################

my $before = $node->safe_psql('postgres',
	'SELECT key, response FROM idem.keys ORDER BY key');

my $victim = $node->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_safe("SET idem.outbox_topic = 'orders'");
$victim->query_safe("SET test.sleep = 600");
$victim->query_until(qr/running/,
	"\\echo running\n" . call('k-kill', $sleepy_sql) . ";\n");
wait_for_backend($node, $victim_pid,
	"wait_event = 'PgSleep' AND backend_xid IS NOT NULL");

# Another session waits for the same key when the crash comes.
my $waiter2 = $node->background_psql('postgres', on_error_stop => 0);
my $waiter2_pid = $waiter2->query_safe('SELECT pg_backend_pid()');
$waiter2->query_until(qr/waiting/,
	"\\echo waiting\n" . call('k-kill', $sleepy_sql) . ";\n");
wait_for_backend($node, $waiter2_pid,
	"wait_event_type = 'Lock' AND wait_event = 'advisory'");

my $logstart = -s $node->logfile;
ok(kill('KILL', $victim_pid), 'SIGKILL the backend running k-kill');
($out, $err) = bg_finish($victim);
($out, $err) = bg_finish($waiter2);
like($err, qr/server closed the connection unexpectedly|terminating connection/,
	'the waiting session was reset by the crash');
unlike($out, qr/\|/, 'and never got an answer');

$node->wait_for_log(qr/all server processes terminated; reinitializing/,
	$logstart);
ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
	'server accepts connections again');
ok( $node->log_contains(
		qr/database system was not properly shut down; automatic recovery in progress/,
		$logstart),
	'crash recovery ran');

is( $node->safe_psql(
		'postgres', 'SELECT key, response FROM idem.keys ORDER BY key'),
	$before,
	'key records committed before the crash are intact');
is(counts('k-kill'), '0 0 0', 'nothing of k-kill survived');
$out = $node->safe_psql('postgres', call('k-open'));
like($out, qr/^t\|/, 'k-open still replays after the crash');

$out = $node->safe_psql('postgres',
	"SET idem.outbox_topic = 'orders';\n" . call('k-kill', $sleepy_sql));
like($out, qr/^f\|/, 'retry of k-kill executes');
$out = $node->safe_psql('postgres', call('k-kill', $sleepy_sql));
like($out, qr/^t\|/, 'the next retry replays');
is(counts('k-kill'), '1 1 1', 'k-kill: executed exactly once');

check_pairing($node, 'postgres', 'end', loose => 1);

$node->stop;
done_testing();
