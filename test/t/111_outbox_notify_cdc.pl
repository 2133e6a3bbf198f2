
# Copyright (c) 2026, idem authors

# Outbox wakeups and change data capture (issue 10).
#
# 1. NOTIFY: nobody is notified at idem.outbox_notify's default (off).
#    With it on, a session that LISTENs on a topic's channel (from
#    idem_outbox_channel()) is notified, with an empty payload and nothing
#    on idem_outbox, only once the producing transaction commits: not
#    while it is open, never for a rolled-back transaction or savepoint,
#    once per topic and transaction however many events it wrote.  A
#    prepared transaction that wrote events can be prepared and committed
#    (it notifies nobody).
# 2. Logical decoding: with idem.outbox_logical_message = on each event is
#    also a transactional message (prefix idem.outbox, the event as JSON)
#    on a test_decoding slot: committed events only, in commit order, and
#    the JSON is the row.  With the setting off there is none.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = idem_node('cdc');
$node->append_conf(
	'postgresql.conf', qq(
wal_level = logical
max_replication_slots = 4
max_prepared_transactions = 4
));
$node->start;
idem_setup_db($node, 'postgres');
$node->safe_psql('postgres', "SELECT idem_outbox_create_topic('mail')");

sub call
{
	my ($key) = @_;
	return
	    "SELECT idem_execute('$key', '$IdemTAP::biz_sql', '$key'::text, 0, 1) ->> 'command'";
}

########################################################################
# 1. NOTIFY on commit
########################################################################

my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN idem_outbox');
my %topic_of;
foreach my $topic ('orders', 'mail')
{
	my $channel = $listener->query_safe("SELECT idem_outbox_channel('$topic')");
	$listener->query_safe(qq{LISTEN "$channel"});
	$topic_of{$channel} = $topic;
}

# What the listener has been told so far, as topics: psql prints
# notifications that arrived while it ran a command.  A notification on
# another channel, or with a payload, shows as itself.
sub heard
{
	my $out = $listener->query_safe('SELECT 1');
	my @heard =
	  $out =~ /Asynchronous notification ("[^"]*"(?: with payload "[^"]*")?) received/g;
	return join(',',
		map { /^"([^"]*)"$/ && $topic_of{$1} ? $topic_of{$1} : $_ } @heard);
}

my $producer = $node->background_psql('postgres');
$producer->query_safe("SET idem.outbox_topic = 'orders'");
# the default: a producer's commit sends no NOTIFY (notifying commits are
# serialized), so a LISTENing consumer hears nothing
$producer->query_safe(call('n-0'));
is($producer->query_safe('SHOW idem.outbox_notify'), 'off',
	'idem.outbox_notify is off by default');
usleep(300_000);
is(heard(), '', 'no notification for a commit at the default');
$producer->query_safe('SET idem.outbox_notify = on');
$producer->query_safe('BEGIN');
$producer->query_safe(call('n-1'));
$producer->query_safe(call('n-2'));
usleep(200_000);
is(heard(), '', 'no notification while the producing transaction is open');
$producer->query_safe('COMMIT');

my $got = '';
foreach (1 .. 50)
{
	$got .= heard();
	last if $got ne '';
	usleep(100_000);
}
is($got, 'orders', 'one notification with the topic after the commit of two events');

$producer->query_safe('BEGIN');
$producer->query_safe(call('n-3'));
$producer->query_safe('ROLLBACK');
$producer->query_safe('BEGIN');
$producer->query_safe('SAVEPOINT s');
$producer->query_safe("SET LOCAL idem.outbox_topic = 'mail'");
$producer->query_safe(call('n-4'));
$producer->query_safe('ROLLBACK TO SAVEPOINT s');
$producer->query_safe('COMMIT');
# a later committed transaction is the marker that everything before it
# has been delivered
$producer->query_safe(call('n-5'));
$got = '';
foreach (1 .. 50)
{
	$got .= heard();
	last if $got ne '';
	usleep(100_000);
}
is($got, 'orders',
	'nothing for a rolled-back transaction or savepoint, then the next commit');

$producer->query_safe('BEGIN');
$producer->query_safe(call('n-6'));
$producer->query_safe("PREPARE TRANSACTION 'p1'");
$producer->query_safe("COMMIT PREPARED 'p1'");
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem.outbox WHERE key = 'n-6' AND state = 'pending'"),
	'1',
	'a prepared transaction writes its event and commits');
$producer->quit;
$listener->quit;

is( $node->safe_psql('postgres',
		"SELECT string_agg(key, ',' ORDER BY key) FROM idem.outbox WHERE key LIKE 'n-%'"),
	'n-0,n-1,n-2,n-5,n-6',
	'events: only the committed calls');

########################################################################
# 2. Logical decoding messages
########################################################################

$node->safe_psql('postgres',
	"SELECT 'init' FROM pg_create_logical_replication_slot('cdc', 'test_decoding')");

my $a = $node->background_psql('postgres');
my $b = $node->background_psql('postgres');
for my $s ($a, $b)
{
	$s->query_safe("SET idem.outbox_topic = 'orders'");
	$s->query_safe('SET idem.outbox_logical_message = on');
}
# a begins first and commits last; c rolls back; d has the setting off
$a->query_safe('BEGIN');
$a->query_safe(call('cdc-a1'));
$b->query_safe('BEGIN');
$b->query_safe(call('cdc-b1'));
$b->query_safe('COMMIT');
$a->query_safe(call('cdc-a2'));
$a->query_safe('COMMIT');
$b->query_safe('BEGIN');
$b->query_safe(call('cdc-c1'));
$b->query_safe('ROLLBACK');
$b->query_safe("SET idem.outbox_logical_message = off");
$b->query_safe(call('cdc-d1'));
$a->quit;
$b->quit;

my @messages = split /\n/,
  $node->safe_psql('postgres',
	"SELECT data FROM pg_logical_slot_get_changes('cdc', NULL, NULL) WHERE data LIKE 'message:%'"
  );
my @keys;
my $shape_ok = 1;
foreach my $m (@messages)
{
	if ($m =~ /^message: transactional: 1 prefix: idem\.outbox, sz: \d+ content:(.*)$/)
	{
		my $json = $1;
		push @keys, $json =~ /"key": "([^"]*)"/;
		# the message is the row: compare it with the table through SQL
		my $same = $node->safe_psql(
			'postgres', qq{
SELECT j->>'event_id' = o.event_id::text AND j->>'owner' = o.owner::text
   AND j->>'topic' = o.topic AND (j->'payload') = o.payload
   AND (j->>'created_at')::timestamptz = o.created_at
   AND j->'run_id' = 'null'::jsonb AND j->'step' = 'null'::jsonb
  FROM (SELECT \$j\$$json\$j\$::jsonb AS j) m
  JOIN idem.outbox o ON o.key = j->>'key'});
		$shape_ok = 0 unless $same eq 't';
	}
	else
	{
		$shape_ok = 0;
		diag("unexpected message: $m");
	}
}
is(join(',', @keys), 'cdc-b1,cdc-a1,cdc-a2',
	'messages of committed events only, in commit order, none with the setting off');
ok($shape_ok, 'each message is transactional, prefixed idem.outbox, and carries the row as JSON');

$node->safe_psql('postgres', "SELECT pg_drop_replication_slot('cdc')");
$node->stop;
done_testing();
