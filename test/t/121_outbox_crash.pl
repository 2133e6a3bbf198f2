
# Copyright (c) 2026, idem authors

# Outbox delivery through crashes (issue 10).
#
# 1. A consumer killed with events leased: nobody else gets them while the
#    lease runs; once it expires they are claimed again (attempt 2) and the
#    dead consumer's tokens are fenced off.
# 2. A server crash (SIGKILL of every process) with events pending, leased,
#    acknowledged, an ack and a producer call in open transactions: after
#    recovery every committed event is there exactly once, the committed
#    acks are delivered, the open ack and the open call left nothing, the
#    leases survive with their tokens until they expire, and then every
#    event is delivered exactly once.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = idem_node('obcrash');
# delivered events stay (the default deletes them), so that each one's
# delivery can be counted
$node->append_conf('postgresql.conf',
	"restart_after_crash = on\nidem.outbox_keep_delivered = on");
$node->start;
idem_setup_db($node, 'postgres');
# deliveries: one row per successful ack, in the ack's transaction, so a
# second delivery of an event would show as a second row
$node->safe_psql(
	'postgres', q{
CREATE TABLE deliveries (event_id uuid NOT NULL, key text NOT NULL, attempt int NOT NULL);
CREATE TABLE held (who text, event_id uuid, key text, token uuid, attempt int);
});

sub produce
{
	my ($from, $to) = @_;
	my $sql = "SET idem.outbox_topic = 'orders';\n";
	$sql .=
	    "SELECT idem_execute('ob-$_', '$IdemTAP::biz_sql', 'ob-$_'::text, 0, 1) ->> 'command';\n"
	  for $from .. $to;
	$node->safe_psql('postgres', $sql);
	return;
}

# claim into "held" as who
sub claim_sql
{
	my ($who, $n, $lease) = @_;
	return "INSERT INTO held SELECT '$who', event_id, key, lease_token, attempt "
	  . "FROM idem_outbox_claim('orders', $n, '$lease')";
}

sub ack_sql
{
	my ($where) = @_;
	return "WITH a AS (SELECT event_id, key, attempt, idem_outbox_ack(event_id, token) FROM held "
	  . "WHERE $where) INSERT INTO deliveries SELECT event_id, key, attempt FROM a";
}

sub sq { return $node->safe_psql('postgres', $_[0]); }

########################################################################
# 1. A consumer killed with events leased
########################################################################

produce(1, 20);
my $victim = $node->background_psql('postgres', on_error_stop => 0);
my $victim_pid = $victim->query_safe('SELECT pg_backend_pid()');
$victim->query_safe(claim_sql('victim', 5, '3 s'));
is(sq("SELECT count(*) FROM held WHERE who = 'victim'"), '5', 'the consumer leased 5 events');
$victim->{run}->kill_kill;
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $victim_pid")
  or die "the killed consumer's backend did not exit";

sq(claim_sql('other', 100, '30 s'));
is( sq(  "SELECT count(*) FROM held o JOIN held v USING (event_id) "
	  . "WHERE o.who = 'other' AND v.who = 'victim'"),
	'0',
	'while the lease runs, nobody else gets the killed consumer\'s events');
is(sq("SELECT count(*) FROM held WHERE who = 'other'"), '15', 'the others are claimed');

# wait for the 3 s lease to run out, then the events are due again
$node->poll_query_until('postgres',
	"SELECT count(*) = 5 FROM idem_outbox_events WHERE state = 'pending' AND key LIKE 'ob-%'")
  or die "the lease did not expire";
sq(claim_sql('heir', 100, '30 s'));
is( sq(  "SELECT count(*) || ' ' || min(h.attempt) || ' ' || max(h.attempt) FROM held h "
	  . "JOIN held v USING (event_id) WHERE h.who = 'heir' AND v.who = 'victim'"),
	'5 2 2',
	'after the lease the same 5 events are claimed again, attempt 2');
my ($rc, $out, $err) = $node->psql('postgres',
	"SELECT idem_outbox_ack(event_id, token) FROM held WHERE who = 'victim' LIMIT 1");
like($err, qr/lease token does not hold/, 'the dead consumer\'s token is fenced off');

sq(ack_sql("who IN ('other', 'heir')"));
is(sq("SELECT count(*) FROM idem.outbox WHERE state = 'delivered'"), '20', 'all 20 delivered');
sq("TRUNCATE held");

########################################################################
# 2. A server crash
########################################################################

produce(21, 60);
sq(claim_sql('acked', 10, '30 s'));
sq(ack_sql("who = 'acked'"));
sq(claim_sql('leased', 10, '4 s'));
sq(claim_sql('open', 2, '30 s'));
my %before = (
	events => sq("SELECT count(*) FROM idem.outbox"),
	leases => sq(
		"SELECT string_agg(event_id || ':' || lease_token, ',' ORDER BY event_id) FROM idem.outbox WHERE state = 'leased'"
	));

# an ack and a producer call, both in transactions that never commit
my $open_ack = $node->background_psql('postgres', on_error_stop => 0);
$open_ack->query_safe('BEGIN');
$open_ack->query_safe(ack_sql("who = 'open'"));
my $open_call = $node->background_psql('postgres', on_error_stop => 0);
$open_call->query_safe("SET idem.outbox_topic = 'orders'");
$open_call->query_safe('BEGIN');
$open_call->query_safe(
	"SELECT idem_execute('ob-open', '$IdemTAP::biz_sql', 'ob-open'::text, 0, 1)");

crash_node($node);
bg_finish($open_ack);
bg_finish($open_call);
$node->start;

is(sq("SELECT count(*) FROM idem.outbox"), $before{events},
	'every committed event survived the crash');
is(sq("SELECT count(*) - count(DISTINCT key) FROM idem.outbox"), '0', '... exactly once per key');
is(sq("SELECT count(*) FROM idem.outbox WHERE key = 'ob-open'"), '0',
	'the uncommitted call left no event');
is( sq(  "SELECT count(*) FROM idem.outbox o JOIN deliveries d USING (event_id) "
	  . "WHERE o.state = 'delivered'"),
	'30',
	'committed acks are durable (20 before, 10 now)');
is( sq(  "SELECT string_agg(event_id || ':' || lease_token, ',' ORDER BY event_id) "
	  . "FROM idem.outbox WHERE state = 'leased'"),
	$before{leases},
	'leases survived with their tokens (the open ack\'s included)');
is( sq(  "SELECT count(*) FROM held h JOIN idem.outbox o USING (event_id) "
	  . "WHERE h.who = 'open' AND o.state = 'leased'"),
	'2',
	'the uncommitted ack delivered nothing');

# the open ack's consumer retries with its token: the lease still holds
sq(ack_sql("who = 'open'"));
# the 4 s leases expire; everything left is claimed and delivered
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.outbox WHERE state = 'leased' AND next_attempt_at > clock_timestamp()")
  or die "the leases did not expire";
sq("TRUNCATE held");
sq(claim_sql('last', 1000, '30 s'));
sq(ack_sql("who = 'last'"));
is( sq(  "SELECT count(*) || ' ' || count(DISTINCT event_id) FROM deliveries"),
	'60 60',
	'in the end each of the 60 events was delivered exactly once');
is( sq("SELECT count(*) FROM idem.outbox WHERE state <> 'delivered'"), '0',
	'nothing left undelivered');

$node->stop;
done_testing();
