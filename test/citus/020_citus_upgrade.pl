
# Copyright (c) 2026, idem authors

# idem's tenant records across a Citus upgrade.  Runs only when
# scripts/test-citus.sh --upgrade-from <release> installed that older
# release: it names it in IDEM_CITUS_FROM, the release to upgrade to in
# IDEM_CITUS_TO, and in IDEM_CITUS_UPGRADE the FIFOs (.upgrade-ask,
# .upgrade-done) through which the script, as root, installs the newer
# release when asked.
#
# Under the older release (a coordinator and two workers, payments
# distributed by tenant_id, idem's colocation declared as in doc/citus.md):
#  - 24 tenants' calls through the three entry nodes, each writing an event
#    (idem_citus_call_outbox()) and retried through another node (replayed);
#    a run of two steps per tenant, its first step done; a third of the
#    events delivered; a call Citus distributes (idem_execute()) is IDC02, a
#    tenant call writing another tenant IDC03, both writing nothing
# The upgrade, in Citus's documented order: the newer release installed on
# every node while they run (a call then writes nothing), every node
# restarted (a call before the extension's update writes nothing), ALTER
# EXTENSION citus UPDATE on every node, citus_finish_citus_upgrade() on the
# coordinator; sessions opened before the update are used after it.  Then:
#  - every call's retry, through every entry node, replays its first
#    response; one row each
#  - idem's tables are still in payments' colocation group
#  - the runs resume: their second steps run once, the first steps replay
#  - the pending events are delivered once each by the nodes' consumers
#  - new tenant calls execute once and replay
#  - a shard group moved after the upgrade carries its tenants' records:
#    retries replay through every entry node, a new call and a run's step
#    run on the new node, its event is delivered there
#  - a database whose tenant is text of collation "C" (Citus 13 registers
#    its group under the default collation, and Citus 14's
#    citus_finish_citus_upgrade() moves the tables to a new group, leaving
#    idem's functions delegated by the old one): a call through another
#    node than the tenant's is IDC01, writing nothing; once the colocation
#    is declared again, every tenant function is delegated by the tables'
#    group and the retries replay through every entry node

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $fifos = $ENV{IDEM_CITUS_UPGRADE};
plan skip_all =>
  'no older Citus to upgrade from (scripts/test-citus.sh --upgrade-from <release>)'
  unless $fifos;
my ($from, $to) = ($ENV{IDEM_CITUS_FROM}, $ENV{IDEM_CITUS_TO});

my @nodes = citus_cluster('max_connections = 100');
my ($coord, $w1, $w2) = @nodes;

sub citus_versions
{
	return join ',', map {
		$_->safe_psql('postgres', 'SELECT citus_version()') =~ /^Citus (\S+)/
		  ? $1 : '?'
	} @nodes;
}
is(citus_versions(), join(',', ($from) x 3), "every node runs Citus $from");

$coord->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
CREATE TABLE payments (tenant_id bigint NOT NULL, note text NOT NULL, amount int NOT NULL);
SELECT create_distributed_table('payments', 'tenant_id');
SELECT idem_citus_colocate('payments');
SELECT run_command_on_all_nodes($$SELECT idem_outbox_create_topic('refunds')$$);
});

my $insert =
  q{'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount'};
my @tenants = (1 .. 24);

# How many colocation groups table and idem's tables of database db are in.
sub groups
{
	my ($db, $table) = @_;
	return $coord->safe_psql($db, qq{
SELECT count(DISTINCT colocationid) FROM pg_dist_partition
 WHERE logicalrelid IN ('$table'::regclass, 'idem.citus_keys'::regclass,
	'idem.citus_runs'::regclass, 'idem.citus_outbox'::regclass)});
}

sub call
{
	my ($node, $sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($out, $err);
}

sub sqlstate_of
{
	my ($err) = @_;
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'none';
}

sub count_of
{
	my ($sql) = @_;
	return $coord->safe_psql('postgres', "SELECT count(*) FROM $sql");
}

sub pay
{
	my ($t, $key, $amount) = @_;
	return "SELECT replayed, response FROM idem_citus_call_outbox(${t}::bigint, 'refunds', '$key', "
	  . "$insert, ${t}::bigint, '$key', $amount)";
}

sub step
{
	my ($t, $step) = @_;
	return "SELECT replayed, response FROM idem_citus_step(${t}::bigint, 'run-$t', '$step', "
	  . "$insert, ${t}::bigint, 'run-$t:$step', $t)";
}

# The node holding tenant ${t}'s shard group, and its shard of payments.
sub placement
{
	my ($t) = @_;
	my ($shard, $port) = split /\|/, $coord->safe_psql(
		'postgres', qq{
SELECT shardid, nodeport FROM citus_shards
 WHERE shardid = get_shard_id_for_distribution_column('payments', ${t}::bigint)});
	my ($node) = grep { $_->port == $port } @nodes;
	return ($node, $shard);
}

# Claim and acknowledge every event of 'refunds' a node's consumer gets, at
# most $limit; the events' keys.
sub consume
{
	my ($node, $limit) = @_;
	my @keys;
	while (@keys < $limit)
	{
		my $n = $limit - @keys;
		$n = 10 if $n > 10;
		my $claimed = $node->safe_psql('postgres',
			"SELECT event_id, lease_token, key FROM idem_outbox_claim('refunds', $n, '30 s')");
		last if $claimed eq '';
		for my $line (split /\n/, $claimed)
		{
			my ($id, $token, $key) = split /\|/, $line;
			$node->safe_psql('postgres', "SELECT idem_outbox_ack('$id', '$token')");
			push @keys, $key;
		}
	}
	return @keys;
}

# --- under the older release
my %first;
for my $t (@tenants)
{
	my $entry = $nodes[ $t % 3 ];
	my ($out, $err) = call($entry, pay($t, "pay-$t", $t));
	like($out, qr/^f\|/, "Citus $from: tenant ${t}'s call executes") or diag($err);
	$first{$t} = (split /\|/, $out, 2)[1];
	($out, $err) = call($nodes[ ($t + 1) % 3 ], pay($t, "pay-$t", $t));
	is($out, "t|$first{$t}", "... and its retry through another node replays")
	  or diag($err);
	$entry->safe_psql('postgres',
		"SELECT idem_citus_run_begin(${t}::bigint, 'run-$t', ARRAY['charge', 'ship'])");
	($out, $err) = call($entry, step($t, 'charge'));
	like($out, qr/^f\|/, "... its run's first step executes") or diag($err);
}
is(count_of('payments'), 48, "Citus $from: one row per call and step");
{
	my ($out, $err) = call($coord,
		"SELECT idem_execute('distributed', $insert, 1::bigint, 'distributed', 1)");
	is(sqlstate_of($err), 'IDC02',
		"Citus $from: idem_execute() of a statement Citus runs on a worker is IDC02");
	($out, $err) = call($coord,
		"SELECT * FROM idem_citus_call(1::bigint, 'stray', "
		  . "'INSERT INTO payments VALUES (2, ''stray'', 1)')");
	is(sqlstate_of($err), 'IDC03',
		"Citus $from: a tenant call writing another tenant is IDC03");
	is(count_of("payments WHERE note IN ('distributed', 'stray')"), 0,
		'... neither wrote a row');
}

# a text tenant of collation "C", in a database of its own: Citus 14's
# citus_finish_citus_upgrade() takes a table whose distribution column's
# collation is not its colocation group's out of the group
citus_database('tc', @nodes);
$coord->safe_psql(
	'tc', q{
CREATE EXTENSION idem;
CREATE TABLE accounts (tenant text COLLATE "C" NOT NULL, note text NOT NULL);
SELECT create_distributed_table('accounts', 'tenant');
SELECT idem_citus_colocate('accounts');
});
note('Citus ' . $from . "'s colocation groups in tc (id, collation): "
	  . $coord->safe_psql('tc',
		'SELECT string_agg(colocationid || \':\' || distributioncolumncollation, \',\') FROM pg_dist_colocation'));
my $tc_insert = q{'INSERT INTO accounts VALUES ($1, $2) RETURNING tenant, note'};
my @tc_tenants = ('acme', 'acme:k', 'Zeta');
my %tc_first;

sub tc_call
{
	my ($node, $t) = @_;
	my ($ret, $out, $err) = $node->psql('tc',
		"SELECT replayed, response FROM idem_citus_call('$t'::text, 'c-1', $tc_insert, '$t'::text, 'c-1')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	diag($err) if $err =~ /ERROR/;
	return $out;
}
for my $t (@tc_tenants)
{
	my $out = tc_call($w2, $t);
	like($out, qr/^f\|/, "Citus $from: text tenant '$t' of collation \"C\" executes");
	$tc_first{$t} = (split /\|/, $out, 2)[1];
}

my @delivered = map { consume($_, 4) } ($w1, $w2);
is(scalar(@delivered), 8, "Citus $from: 8 events delivered before the upgrade");
is(count_of("idem.citus_outbox WHERE state = 'pending'"), 16,
	'... 16 pending');

# --- the upgrade: the newer release installed while the nodes run
{
	open my $ask, '>', "$fifos-ask" or die "$fifos-ask: $!";
	print $ask "install\n";
	close $ask;
	open my $done, '<', "$fifos-done" or die "$fifos-done: $!";
	my $answer = <$done>;
	close $done;
	chomp $answer;
	is($answer, 'installed', "Citus $to installed on every node");
}
{
	my ($out, $err) = call($coord, pay(1, 'pay-window', 1));
	like($err, qr/loaded Citus library version differs from latest available/,
		'a call between the install and the restart: Citus refuses it')
	  or diag($out);
}
$_->restart for @nodes;
{
	my ($out, $err) = call($coord, pay(1, 'pay-window', 1));
	like($err, qr/loaded Citus library version differs from installed/,
		'a call between the restart and ALTER EXTENSION citus UPDATE: Citus refuses it')
	  or diag($out);
}

# sessions opened before the extension's update, used after it
my %session = map {
	$_->name => $_->background_psql('postgres', on_error_stop => 0)
} ($coord, $w1);
$session{ $_->name }->query('SELECT 1') for ($coord, $w1);

# in every database where Citus is installed
for my $db ('postgres', 'tc')
{
	$_->safe_psql($db, 'ALTER EXTENSION citus UPDATE') for @nodes;
	$coord->safe_psql($db, 'CALL citus_finish_citus_upgrade()');
}
is(citus_versions(), join(',', ($to) x 3), "every node runs Citus $to");
is(count_of("payments WHERE note = 'pay-window'")
	  . count_of("idem.citus_keys WHERE key = 'pay-window'"),
	'00', 'the calls Citus refused during the upgrade wrote nothing');
is(groups('postgres', 'payments'), '1',
	"Citus $to: idem's tables still in payments' colocation group");
is(groups('tc', 'accounts'), '1',
	"Citus $to: and in the group of a text column of collation \"C\"");
# Citus 13 registered that group under the database's default collation:
# citus_finish_citus_upgrade() moved its tables to a new group, and left
# idem's functions delegated by the old one
{
	my ($ret, $out, $err) = $coord->psql('tc',
		"SELECT replayed FROM idem_citus_call('acme'::text, 'c-1', $tc_insert, 'acme'::text, 'c-1')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	is(sqlstate_of($err), 'IDC01',
		"Citus $to: a call whose function Citus no longer delegates is IDC01");
	like($err, qr/declared again/, '... asking for the colocation to be declared again');
	is($coord->safe_psql('tc', 'SELECT count(*) FROM accounts'), '3', '... writing nothing');
}
$coord->safe_psql('tc', "SELECT idem_citus_colocate('accounts')");
is( $coord->safe_psql(
		'tc', q{
SELECT count(*) FROM pg_dist_object o JOIN pg_proc f ON f.oid = o.objid
  JOIN pg_dist_partition p
    ON p.logicalrelid = 'idem.citus_keys'::regclass AND o.colocationid = p.colocationid
 WHERE o.classid = 'pg_proc'::regclass AND f.proname LIKE 'idem\_citus\_%'
   AND o.distribution_argument_index = 0 AND o.force_delegation}),
	$coord->safe_psql('tc', q{SELECT count(*) FROM pg_proc WHERE proname LIKE 'idem\_citus\_%'
		AND proargnames[1] = 'tenant'}),
	"... declared again: every tenant function delegated by idem.citus_keys' group");
for my $t (@tc_tenants)
{
	is(join(',', map { tc_call($_, $t) } @nodes),
		join(',', ("t|$tc_first{$t}") x 3),
		"Citus $to: text tenant '$t''s retries replay through every entry node");
}
is($coord->safe_psql('tc', 'SELECT count(*) FROM accounts'), '3', '... one row each');

# --- after the upgrade: retries replay through every entry node
for my $t (@tenants)
{
	my @got = map {
		my ($out, $err) = call($_, pay($t, "pay-$t", $t));
		diag($err) if $err =~ /ERROR/;
		$out
	} @nodes;
	is(join(',', @got), join(',', ("t|$first{$t}") x 3),
		"Citus $to: tenant ${t}'s retries through every entry node replay");
}
for my $name (sort keys %session)
{
	my $out = $session{$name}->query(pay(3, 'pay-3', 3));
	is($out, "t|$first{3}",
		"Citus $to: a session of $name opened before the update replays a retry");
}
is(count_of("payments WHERE note LIKE 'pay-%'"), 24, '... one row per call');

# --- the runs resume
for my $t (@tenants)
{
	my $entry = $nodes[ ($t + 2) % 3 ];
	my ($out, $err) = call($entry, step($t, 'charge'));
	like($out, qr/^t\|/, "Citus $to: run ${t}'s first step replays") or diag($err);
	($out, $err) = call($entry, step($t, 'ship'));
	like($out, qr/^f\|/, "... its second step executes") or diag($err);
	is( $coord->safe_psql('postgres',
			"SELECT status FROM idem_citus_run_status(${t}::bigint, 'run-$t')"),
		'completed',
		'... completing the run');
}
is(count_of("payments WHERE note LIKE 'run-%'"), 48,
	"Citus $to: one row per run's step");

# --- the pending events: delivered once each
{
	my @after = map { consume($_, 100) } ($w1, $w2);
	is(join(',', sort @after),
		join(',', sort grep { my $k = $_; !grep { $_ eq $k } @delivered }
			  map { "pay-$_" } @tenants),
		"Citus $to: the 16 pending events delivered, once each, none of the 8 again");
	is(count_of("idem.citus_outbox WHERE state <> 'delivered'"), 0,
		'... none left');
}

# --- new calls
for my $t (@tenants)
{
	my ($out, $err) = call($nodes[ $t % 3 ], pay($t, "new-$t", $t));
	like($out, qr/^f\|/, "Citus $to: tenant ${t}'s new call executes") or diag($err);
	my $resp = (split /\|/, $out, 2)[1];
	($out, $err) = call($nodes[ ($t + 1) % 3 ], pay($t, "new-$t", $t));
	is($out, "t|$resp", '... and its retry replays') or diag($err);
}
is(count_of("payments WHERE note LIKE 'new-%'"), 24, '... one row each');
is(scalar(map { consume($_, 100) } ($w1, $w2)), 24,
	'... their events delivered');

# --- a shard move after the upgrade carries the records
{
	my ($old, $shard) = placement(5);
	my ($new) = grep { $_ != $old && $_ != $coord } @nodes;
	$coord->safe_psql('postgres',
		"SELECT idem_citus_run_begin(5::bigint, 'run-5-later', ARRAY['one', 'two'])");
	my ($out, $err) = call($coord,
		"SELECT replayed FROM idem_citus_step(5::bigint, 'run-5-later', 'one', "
		  . "$insert, 5::bigint, 'later:one', 1)");
	is($out, 'f', "Citus $to: a run's first step before the move") or diag($err);
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', "
		  . $old->port
		  . ", '127.0.0.1', "
		  . $new->port
		  . ", shard_transfer_mode => 'block_writes')");
	my ($now) = placement(5);
	is($now->name, $new->name, "Citus $to: tenant 5's shard group moved to " . $new->name);
	my @moved = grep { (placement($_))[1] == $shard } @tenants;
	for my $t (@moved)
	{
		my @got = map {
			my ($o, $e) = call($_, pay($t, "pay-$t", $t));
			$o
		} @nodes;
		is(join(',', @got), join(',', ("t|$first{$t}") x 3),
			"... tenant ${t}'s first call replays through every entry node");
	}
	($out, $err) = call($w1,
		"SELECT replayed FROM idem_citus_step(5::bigint, 'run-5-later', 'one', "
		  . "$insert, 5::bigint, 'later:one', 1)");
	is($out, 't', '... the step before the move replays') or diag($err);
	($out, $err) = call($w2,
		"SELECT replayed FROM idem_citus_step(5::bigint, 'run-5-later', 'two', "
		  . "$insert, 5::bigint, 'later:two', 1)");
	is($out, 'f', '... the next step runs') or diag($err);
	($out, $err) = call($coord, pay(5, 'moved-5', 5));
	like($out, qr/^f\|/, '... a new call executes') or diag($err);
	my $owner = $new->safe_psql(
		'postgres', qq{
SET citus.override_table_visibility = off;
SELECT (SELECT count(*) FROM idem.citus_keys_}
		  . $new->safe_psql('postgres',
			"SELECT get_shard_id_for_distribution_column('idem.citus_keys', 5::bigint)")
		  . qq{ WHERE tenant = 5 AND key = 'moved-5')});
	is($owner, '1', "... its key recorded on " . $new->name);
	is(join(',', consume($old, 100)), '', '... the old node delivers no event');
	is(join(',', consume($new, 100)), 'moved-5', '... the new node delivers its event');
	is(count_of("payments WHERE note IN ('moved-5', 'later:one', 'later:two')"), 3,
		'... one row each');
}

$_->quit for values %session;
$_->stop for @nodes;
done_testing();
