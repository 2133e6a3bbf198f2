
# Copyright (c) 2026, idem authors

# Failover with a synchronous standby (synchronous_standby_names,
# synchronous_commit = remote_apply).
#
# - Every acknowledged call is already visible on the standby.
# - On the hot standby idem_execute() (also a replay) and idem_purge() fail
#   with 25006 and change nothing.
# - Clients stream calls; the primary is stopped hard (immediate) in the
#   middle; the standby is promoted; every client retries every key it sent
#   against the new primary: every acknowledged key replays its response,
#   the others execute exactly once, no key has two business rows.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nclients = 3;
my $ncalls = 30000;	  # per client, so no client can finish before the failover
my $crash_after = 200;

my ($primary, $standby) = idem_sync_pair('remote_apply');
ok( $primary->poll_query_until(
		'postgres',
		"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'"
	),
	'standby is the synchronous standby');

idem_setup_db($primary, 'postgres');

# remote_apply: an acknowledged call is visible on the standby at once,
# no waiting for catch-up.
my $sql = "SET idem.outbox_topic = 'orders';\n";
$sql .= call_sql("pre-$_", 0, $_) for 1 .. 20;
$primary->safe_psql('postgres', $sql);
is( $standby->safe_psql(
		'postgres',
		"SELECT count(*) FROM idem.keys k JOIN biz USING (key) JOIN idem.outbox USING (key) WHERE key LIKE 'pre-%'"
	),
	'20',
	'every acknowledged call is already visible on the standby');

# Hot standby: refused, nothing changes anywhere.
my $state_sql = q{SELECT (SELECT string_agg(key || response::text, ',' ORDER BY key) FROM idem.keys),
	(SELECT count(*) FROM biz), (SELECT count(*) FROM idem.outbox)};
my $primary_state = $primary->safe_psql('postgres', $state_sql);
my $standby_state = $standby->safe_psql('postgres', $state_sql);
for my $case (
	[ 'a new key', "SELECT idem_execute('standby-1', '$IdemTAP::biz_sql', 'standby-1'::text, 0, 1)" ],
	[ 'a replay', "SELECT idem_execute('pre-1', '$IdemTAP::biz_sql', 'pre-1'::text, 0, 1)" ],
	[ 'idem_purge', 'SELECT idem_purge()' ])
{
	my ($label, $call) = @$case;
	my ($ret, $stdout, $stderr) =
	  $standby->psql('postgres', "\\set VERBOSITY verbose\n$call");
	isnt($ret, 0, "standby: $label fails");
	like($stderr, qr/ERROR:  25006:/, "standby: $label fails with SQLSTATE 25006");
}
is($standby->safe_psql('postgres', $state_sql),
	$standby_state, 'standby: nothing changed');
is($primary->safe_psql('postgres', $state_sql),
	$primary_state, 'primary: nothing changed');

# Workload, then the primary dies.
my @scripts = map { client_script($_, $ncalls) } 1 .. $nclients;
my @clients = start_clients($primary, 'postgres', 'failover', \@scripts);
ok( $primary->poll_query_until(
		'postgres', "SELECT count(*) >= $crash_after FROM idem.keys"),
	"workload committed $crash_after keys");
$primary->stop('immediate');
my @before = wait_clients(@clients);

my (%sent, %acked);
for my $c (@before)
{
	isnt($c->{status}, 0, "client $c->{id} was cut off by the failover");
	$sent{$_} = 1 for @{ $c->{sent} };
	$acked{$_} = $c->{acks}{$_}[1] for keys %{ $c->{acks} };
}
note scalar(keys %sent) . " keys sent, " . scalar(keys %acked) . " acknowledged";

$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
	'standby promoted');

my %committed = check_pairing($standby, 'postgres', 'after failover');
is(join(',', grep { !defined $committed{$_} } sort keys %acked),
	'', 'every acknowledged key survived the failover');
is(join(',', grep { $committed{$_} ne $acked{$_} } sort keys %acked),
	'', 'with the acknowledged response');
note scalar(grep { !defined $acked{$_} && !/^pre-/ } keys %committed)
  . ' keys reached the standby without being acknowledged; '
  . scalar(grep { !defined $committed{$_} } keys %sent)
  . ' keys sent did not reach it';
is(scalar(grep { !$sent{$_} && !/^pre-/ } keys %committed),
	0, 'every key record belongs to a key some client sent');

# Every client retries every key it sent, against the new primary.
my @retry_scripts;
for my $c (@before)
{
	my $s = "SET idem.outbox_topic = 'orders';\n";
	for my $key (@{ $c->{sent} })
	{
		my ($client, $n) =
		  $key =~ /^c(\d+)-(\d+)$/ ? ($1, $2 + 0)
		  : $key =~ /^s-(\d+)$/ ? (0, $1 + 0)
		  : die "bad key $key";
		$s .= call_sql($key, $client, $n, 'retry');
	}
	push @retry_scripts, $s;
}
my @retries = wait_clients(
	start_clients($standby, 'postgres', 'failover_retry', \@retry_scripts));
my (%fresh, $bad);
$bad = '';
for my $c (@retries)
{
	is($c->{status}, 0, "retry client $c->{id} succeeded") or diag $c->{stderr};
	for my $key (@{ $c->{sent} })
	{
		my ($replayed, $response) = @{ $c->{acks}{$key} // [ 'x', '' ] };
		if (defined $committed{$key})
		{
			$bad .= "$key: replayed=$replayed\n"
			  unless $replayed eq 't' && $response eq $committed{$key};
		}
		elsif ($replayed eq 'f')
		{
			$fresh{$key}++;
		}
		else
		{
			$bad .= "$key: no answer\n" if $replayed ne 't';
		}
	}
}
is($bad, '',
	'every retry of a key that reached the standby replayed its response');
is(join(',', grep { !defined $committed{$_} && ($fresh{$_} // 0) != 1 } sort keys %sent),
	'', 'every other key was executed exactly once by the retries');

my %final = check_pairing($standby, 'postgres', 'after the retries');
is(scalar(grep { !$final{$_} } keys %sent), 0, 'every key sent is recorded');

# The promoted standby still tells requests apart.
my ($ret, $stdout, $stderr) = $standby->psql('postgres',
	"\\set VERBOSITY verbose\nSELECT idem_execute('pre-1', '$IdemTAP::biz_sql', 'pre-1'::text, 0, 2)");
like($stderr, qr/ERROR:  ID422:/,
	'the new primary rejects a different request under an old key');

$standby->stop;
done_testing();
