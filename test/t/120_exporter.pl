
# Copyright (c) 2026, idem authors

# Monitoring (issue 11): Debian's prometheus-postgres-exporter, given the
# custom-queries file that make install put in the extension directory,
# exposes idem_stats as Prometheus metrics.  The exporter serves on
# loopback, reads a throwaway preloaded cluster over its Unix socket, and
# its /metrics (fetched with curl) follows the calls made.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $timeout = $PostgreSQL::Test::Utils::timeout_default;
my $exporter = '/usr/bin/prometheus-postgres-exporter';

my $node = idem_node('exporter');
# two databases with a row of their own (and two pairs of database and
# role): the others share the overflow row
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem'\nidem.stats_max_databases = 2\nidem.stats_max_roles = 2");
$node->start;
idem_setup_db($node, 'postgres');

my $queries = $node->config_data('--sharedir') . '/extension/idem_postgres_exporter.yaml';
ok(-f $queries, 'make install put the custom-queries file in the extension directory');

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $dsn = sprintf('host=%s port=%d dbname=postgres user=%s sslmode=disable',
	$node->host, $node->port, scalar(getpwuid($<)));
my ($eout, $eerr) = ('', '');
my $h = IPC::Run::start(
	[
		$exporter, "--web.listen-address=127.0.0.1:$port",
		"--extend.query-path=$queries", '--disable-default-metrics',
		'--disable-settings-metrics'
	],
	'<', \undef, '>', \$eout, '2>', \$eerr,
	init => sub {
		# The DSN says everything.  The exporter's driver (lib/pq) panics
		# on libpq variables it does not support, such as the PGSYSCONFDIR
		# that pg_virtualenv (autopkgtest) sets, so none reach it.
		delete $ENV{$_} for grep { /^PG/ } keys %ENV;
		$ENV{DATA_SOURCE_NAME} = $dsn;
	});

# one scrape: the idem_stats_* samples of a database (postgres unless
# given), by name
my $last_curl_error = '';
sub scrape
{
	my ($datname) = @_;
	my ($stdout, $stderr);
	$datname //= 'postgres';
	# loopback is never reached through a proxy, whatever the environment
	# says (autopkgtest passes apt's proxy on to the tests)
	IPC::Run::run(
		[
			'curl', '-sS', '--noproxy', '*', '--max-time', '10',
			"http://127.0.0.1:$port/metrics"
		],
		'>', \$stdout, '2>', \$stderr);
	$last_curl_error = $stderr // '';
	my %m;
	for (split /\n/, $stdout // '')
	{
		$m{$1} = $2 if /^(idem_stats_\w+)\{[^}]*datname="\Q$datname\E"[^}]*\} (\S+)$/;
	}
	return \%m;
}

my $m;
my $deadline = time + $timeout;
do { usleep(200_000); eval { $h->pump_nb }; $m = scrape(); }
  until exists $m->{idem_stats_executions} or time > $deadline;
ok(exists $m->{idem_stats_executions}, 'the exporter serves idem_stats_executions')
  or diag("exporter stderr:\n$eerr\ncurl stderr:\n$last_curl_error");
is($m->{idem_stats_executions} // '', '0', 'no executions yet');
ok(exists $m->{$_}, "and $_")
  for qw(idem_stats_replays idem_stats_mismatches idem_stats_in_progress
  idem_stats_conflicts idem_stats_errors idem_stats_lock_waits
  idem_stats_lock_wait_seconds idem_stats_purged_keys idem_stats_audit_dropped
  idem_stats_outbox_claimed idem_stats_outbox_dead idem_stats_purged_outbox_events
  idem_stats_runs_claimed idem_stats_run_lease_expiries idem_stats_run_retries
  idem_stats_run_signals idem_stats_runs_failed);

$node->safe_psql('postgres', call_sql("m-$_", 0, $_)) for 1 .. 3;
$node->safe_psql('postgres', call_sql('m-1', 0, 1)) for 1 .. 2;
$node->psql('postgres', call_sql('m-1', 0, 99));

$m = scrape();
is($m->{idem_stats_executions}, '3', 'three executions show up in /metrics');
is($m->{idem_stats_replays}, '2', 'two replays');
is($m->{idem_stats_mismatches}, '1', 'one mismatch');
# the calls were the test's role's, the only one that made any
is($m->{idem_stats_roles_executions}, '3', 'and per role: three executions');
is($m->{idem_stats_roles_replays}, '2', 'two replays');

# The second row goes to a database dropped since, whose row (no datname)
# is not served; the next database takes that row over, and the one after
# it counts in the overflow row, served with an empty datname, so that
# summing over databases misses no call; so does its (database, role) pair
# in idem_stats_roles' overflow row.
idem_setup_db($node, 'gone');
$node->safe_psql('gone', call_sql('g-1', 0, 1));
$node->safe_psql('postgres', 'DROP DATABASE gone');
$m = scrape('');
ok(!exists $m->{idem_stats_executions}, 'the dropped database\'s row is not served');
idem_setup_db($node, 'other');
$node->safe_psql('other', call_sql("o-$_", 0, $_)) for 1 .. 2;
is(scrape('other')->{idem_stats_executions}, '2',
	'the next database takes over the dropped one\'s row');
idem_setup_db($node, 'more');
$node->safe_psql('more', call_sql("m-$_", 0, $_)) for 1 .. 3;
$m = scrape('');
is($m->{idem_stats_executions}, '3',
	'the one after it counts in the overflow row, served with datname ""');
is($m->{idem_stats_roles_executions}, '3', 'and the roles\' overflow row');
is(scrape()->{idem_stats_executions}, '3', 'while database postgres keeps its own');

$h->kill_kill;
done_testing();
