
# Copyright (c) 2026, idem authors

# idem_outbox_wait(): consumers woken through shared memory, with the
# producers' NOTIFY turned off (issues 10 and 12).  Preloaded.
#
# 1. With nothing committed the wait times out (false).
# 2. A commit between an empty claim and the wait ends the wait at once:
#    the claim noted where it stood.
# 3. A sleeping waiter (wait event Extension) is not woken while the
#    producing transaction is open, and is woken by its commit.  Every
#    waiter on the topic is woken.  No NOTIFY was sent.
# 4. A rolled-back transaction or savepoint wakes nobody.
# 5. An event in another database, or of a topic in another slot, does not
#    wake a waiter.
# 6. A cancel ends the wait with 57014 and the session carries on.
# 7. After a claim in REPEATABLE READ the wait is for later commits only.
# 8. idem_outbox_claim(..., wait => t): nothing committed, it returns nothing
#    after t; a commit during its wait, it returns the event at once; with
#    events due it does not wait; in REPEATABLE READ it is refused.
# 9. A consumer whose grant is revoked while its claim waits leases nothing
#    committed after: the claim ends with 42501 and the event stays pending.
# 10. What becomes due with no commit to announce it is claimed during the
#    wait, not after it: an event whose retry time comes, and a run's event
#    whose predecessor is acknowledged.  A waiting claim does not keep the
#    held-back event locked from other consumers meanwhile.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = idem_node('wait');
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'idem'
idem.outbox_notify = off
));
$node->start;
idem_setup_db($node, 'postgres');
idem_setup_db($node, 'other');

sub call
{
	my ($key, $topic) = @_;
	$topic //= 'orders';
	return "SET idem.outbox_topic = '$topic';\n"
	  . "SELECT idem_execute('$key', '$IdemTAP::biz_sql', '$key'::text, 0, 1) ->> 'command'";
}

# "t|seconds" of a wait run by a session
sub waited
{
	my ($session, $topic, $timeout) = @_;
	return $session->query_safe(
		"SELECT w, round(extract(epoch FROM clock_timestamp() - t0)::numeric, 1)\n"
		  . "  FROM (SELECT clock_timestamp() AS t0) s,\n"
		  . "       LATERAL (SELECT idem_outbox_wait('$topic', '$timeout') AS w) x");
}

sub claim
{
	my ($session, $topic) = @_;
	$topic //= 'orders';
	return $session->query_safe(
		"SELECT count(idem_outbox_ack(event_id, lease_token)) FROM idem_outbox_claim('$topic', 100)");
}

my $consumer = $node->background_psql('postgres');
my $consumer_pid = $consumer->query_safe('SELECT pg_backend_pid()');
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN idem_outbox');
my $orders_channel = $listener->query_safe("SELECT idem_outbox_channel('orders')");
$listener->query_safe(qq{LISTEN "$orders_channel"});
my $producer = $node->background_psql('postgres');

# 1. timeout
is(claim($consumer), '0', 'nothing to claim at first');
my ($w, $secs) = split /\|/, waited($consumer, 'orders', '700 ms');
is($w, 'f', 'a wait with nothing committed times out: false');
cmp_ok($secs, '>=', 0.7, "and it lasted its timeout ($secs s)");

# 2. commit between an empty claim and the wait
is(claim($consumer), '0', 'an empty claim');
$producer->query_safe(call('w-race'));
($w, $secs) = split /\|/, waited($consumer, 'orders', '60 s');
is($w, 't', 'an event committed after the empty claim ends the wait');
cmp_ok($secs, '<', 1, "at once ($secs s)");
is(claim($consumer), '1', 'and the claim that follows gets it');

# 3. a sleeping waiter, woken by the commit only
my $second = $node->background_psql('postgres');
my $second_pid = $second->query_safe('SELECT pg_backend_pid()');
is(claim($second), '0', 'a second consumer finds nothing');
$consumer->query_until(qr/waiting/,
	"\\echo waiting\nSELECT idem_outbox_wait('orders', '60 s');\n");
$second->query_until(qr/waiting/,
	"\\echo waiting\nSELECT idem_outbox_wait('orders', '60 s');\n");
wait_for_backend($node, $_, "wait_event_type = 'Extension'")
  for ($consumer_pid, $second_pid);
pass('both consumers sleep in idem_outbox_wait (wait event Extension)');
$producer->query_safe('BEGIN');
$producer->query_safe(call('w-open'));
usleep(500_000);
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE pid IN ($consumer_pid, $second_pid) AND wait_event_type = 'Extension'"),
	'2',
	'an open producing transaction wakes nobody');
my $t0 = [ Time::HiRes::gettimeofday() ];
$producer->query_safe('COMMIT');
my $out = $consumer->query_until(qr/^[tf]$/m, '');
like($out, qr/^t$/m, 'its commit wakes the first consumer');
$out = $second->query_until(qr/^[tf]$/m, '');
like($out, qr/^t$/m, 'and the second');
my $latency = Time::HiRes::tv_interval($t0);
cmp_ok($latency, '<', 5, sprintf('well before the timeout (%.3f s)', $latency));
is(claim($consumer) + claim($second), 1, 'one of them gets the event');
is($listener->query_safe('SELECT 1'), '1',
	'no NOTIFY was sent (idem.outbox_notify = off)');

# 4. rollback, savepoint
is(claim($consumer), '0', 'empty claim before the rollbacks');
$producer->query_safe("BEGIN;\n" . call('w-rollback') . ";\nROLLBACK");
$producer->query_safe("BEGIN;\nSAVEPOINT s;\n" . call('w-savepoint')
	  . ";\nROLLBACK TO s;\nCOMMIT");
($w, $secs) = split /\|/, waited($consumer, 'orders', '700 ms');
is($w, 'f', 'a rolled-back transaction and savepoint wake nobody');
$producer->query_safe("BEGIN;\nSAVEPOINT s;\n" . call('w-released')
	  . ";\nRELEASE s;\nCOMMIT");
($w, $secs) = split /\|/, waited($consumer, 'orders', '60 s');
is($w, 't', 'a released savepoint\'s event wakes at commit');
is(claim($consumer), '1', 'and is claimed');

# 5. another database, another slot
my $elsewhere = $node->background_psql('other');
$elsewhere->query_safe(call('w-other-db'));
$producer->query_safe(call('w-workflow', 'workflow'));
($w, $secs) = split /\|/, waited($consumer, 'orders', '700 ms');
is($w, 'f',
	'events in another database, or of a topic in another slot, do not wake');
is($elsewhere->query_safe(
		"SELECT count(*) FROM idem.outbox WHERE key = 'w-other-db'"),
	'1', 'the other database has its event');

# 6. cancel
$consumer->query_until(qr/waiting/,
	"\\echo waiting\n\\set ON_ERROR_STOP 0\nSELECT idem_outbox_wait('orders', '60 s');\n");
wait_for_backend($node, $consumer_pid, "wait_event_type = 'Extension'");
$node->safe_psql('postgres', "SELECT pg_cancel_backend($consumer_pid)");
$consumer->query_until(qr/^ok$/m, "\\echo ok\n");
like($consumer->{stderr}, qr/canceling statement due to user request/,
	'a cancel ends the wait');
$consumer->{stderr} = '';
is($consumer->query_safe('SELECT 1'), '1', 'and the session carries on');

# 7. a claim in REPEATABLE READ notes nothing
$consumer->query_safe("\\set ON_ERROR_STOP 1");
$consumer->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$consumer->query_safe('SELECT 1');
$producer->query_safe(call('w-rr'));
is($consumer->query_safe("SELECT count(*) FROM idem_outbox_claim('orders', 100)"),
	'0', 'a claim in REPEATABLE READ does not see an event committed after its snapshot');
$consumer->query_safe('COMMIT');
($w, $secs) = split /\|/, waited($consumer, 'orders', '700 ms');
is($w, 'f',
	'after a claim in REPEATABLE READ the wait is for later commits only');
is(claim($consumer), '1', 'that event is claimed by the next claim');

# 8. a claim with a wait: one statement, so one server session
my $claimed = q{SELECT count(*), round(extract(epoch FROM clock_timestamp() - statement_timestamp())::numeric, 1)
  FROM idem_outbox_claim('orders', 10, '30 s', wait => };
($w, $secs) = split /\|/, $consumer->query_safe("$claimed '700 ms')");
is($w, '0', 'a claim with a wait and nothing committed returns nothing');
cmp_ok($secs, '>=', 0.7, "after its wait ($secs s)");
$consumer->query_until(qr/waiting/, "\\echo waiting\n$claimed '60 s');\n");
wait_for_backend($node, $consumer_pid, "wait_event_type = 'Extension'");
$producer->query_safe(call('w-claim-wait'));
$out = $consumer->query_until(qr/^\d+\|/m, '');
($w, $secs) = split /\|/, $out;
is($w, '1', 'a commit during the wait: the claim returns its event');
cmp_ok($secs, '<', 5, "at once ($secs s)");
is( $node->safe_psql('postgres',
		"SELECT state FROM idem.outbox WHERE key = 'w-claim-wait'"),
	'leased', 'leased by that claim');
$producer->query_safe(call('w-claim-now'));
is($consumer->query_safe("SELECT count(*) FROM idem_outbox_claim('orders', 10, '30 s', wait => '60 s')"),
	'1', 'a claim with a wait that finds events returns them without waiting');
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	"\\set VERBOSITY sqlstate\nBEGIN ISOLATION LEVEL REPEATABLE READ;\n"
	  . "SELECT * FROM idem_outbox_claim('orders', wait => '1 s');");
like($stderr, qr/ERROR:  0A000/, 'a claim with a wait in REPEATABLE READ is refused (0A000)');

# 9. the grant revoked during a claim's wait
$node->safe_psql('postgres',
	"CREATE ROLE cons;\n"
	  . "GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval) TO cons;\n"
	  . "SELECT idem_outbox_grant('orders', 'cons', 'consume')");
my $revoked = $node->background_psql('postgres', on_error_stop => 0);
my $revoked_pid = $revoked->query_safe('SELECT pg_backend_pid()');
$revoked->query_safe("SELECT count(*) FROM idem_outbox_claim('orders', 100, '30 s')");
$revoked->query_until(qr/started/,
	    "SET ROLE cons;\n\\echo started\n"
	  . "SELECT key FROM idem_outbox_claim('orders', 10, '30 s', wait => '60 s');\n"
	  . "\\echo done :LAST_ERROR_SQLSTATE\n");
wait_for_backend($node, $revoked_pid, "wait_event_type = 'Extension'");
$node->safe_psql('postgres', "SELECT idem_outbox_revoke('orders', 'cons', 'consume')");
$producer->query_safe(call('w-revoked'));
$out = $revoked->query_until(qr/done \w+/, '');
like($out, qr/done 42501/, 'a revoke during the wait ends the claim with 42501');
unlike($out, qr/w-revoked/, '... which leases nothing');
is( $node->safe_psql('postgres',
		"SELECT state FROM idem.outbox WHERE key = 'w-revoked'"),
	'pending', 'the event stays pending for the consumers the topic has');
$revoked->quit;

# 10. due by time, or by an ack, during a claim's wait
$node->safe_psql('postgres', "SELECT idem_outbox_create_topic('later')");
$producer->query_safe(call('w-later', 'later'));
my ($ev, $tok) = split /\|/,
  $consumer->query_safe("SELECT event_id, lease_token FROM idem_outbox_claim('later', 1, '30 s')");
$consumer->query_safe("SELECT idem_outbox_fail('$ev', '$tok', 'busy', retry_after => '2 s')");
my $later = q{SELECT string_agg(key, ','), round(extract(epoch FROM clock_timestamp() - statement_timestamp())::numeric, 1)
  FROM idem_outbox_claim('later', 10, '30 s', wait => '60 s')};
($w, $secs) = split /\|/, $consumer->query_safe($later);
is($w, 'w-later', 'an event whose retry time comes during the wait is claimed');
cmp_ok($secs, '<', 10, "when it is due, not when the wait ends ($secs s)");

$node->safe_psql('postgres',
	"SELECT idem_outbox_create_topic('ordered');\n"
	  . "SELECT status FROM idem_run_begin('ord', steps => ARRAY['a', 'b']);\n"
	  . "SET idem.outbox_topic = 'ordered';\n"
	  . "SELECT idem_step('ord', 'a', 'SELECT 1 AS n');\n"
	  . "SELECT idem_step('ord', 'b', 'SELECT 2 AS n');");
($ev, $tok) = split /\|/,
  $second->query_safe("SELECT event_id, lease_token FROM idem_outbox_claim('ordered', 10, '30 s')");
my $ordered = q{SELECT string_agg(run_id || '/' || step, ','), round(extract(epoch FROM clock_timestamp() - statement_timestamp())::numeric, 1)
  FROM idem_outbox_claim('ordered', 10, '30 s', wait => '60 s')};
$consumer->query_until(qr/waiting/, "\\echo waiting\n$ordered;\n");
wait_for_backend($node, $consumer_pid, "wait_event_type = 'Extension'");
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem.outbox WHERE step = 'b' AND run_id = 'ord'"
		  . " AND ctid IN (SELECT ctid FROM idem.outbox FOR UPDATE SKIP LOCKED)"),
	'1', 'the waiting claim does not keep the held-back event locked');
$second->query_safe("SELECT idem_outbox_ack('$ev', '$tok')");
$out = $consumer->query_until(qr/^\S+\|[\d.]+$/m, '');
($w, $secs) = split /\|/, $out;
is($w, 'ord/b', 'once its predecessor is acknowledged, the waiting claim gets the next event');
cmp_ok($secs, '<', 10, "during its wait ($secs s)");

$_->quit for ($consumer, $second, $listener, $producer, $elsewhere);
$node->stop;
done_testing();
