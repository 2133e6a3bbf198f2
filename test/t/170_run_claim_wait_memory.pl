
# Copyright (c) 2026, idem authors

# A claim that waits does not grow its backend's memory.  While another
# transaction holds the locks of a queue's due runs (as in-flight steps
# do), idem_run_claim(..., wait =>) finds them due at every poll and can
# lease none; what each poll allocated for them was kept until the claim
# returned, some 10 MB a second with 2,000 such runs, for a wait of up to
# an hour.  The claiming backend's private memory (RssAnon) must stay
# nearly flat across a few seconds of polling.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $nruns = 2000;

my $node = idem_node('claimwait');
$node->start;
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idem;
SELECT idem_queue_create('q');
SELECT count(*) FROM (SELECT idem_run_begin('m' || g, steps => ARRAY['s'], queue => 'q')
                        FROM generate_series(1, $nruns) g) s;
});

# the runs' locks, held by an open transaction
my $holder = $node->background_psql('postgres', on_error_stop => 1);
$holder->query_safe('BEGIN');
is( $holder->query_safe(
		"SELECT count(*) FILTER (WHERE idem_run_try_lock(current_user::regrole, 'm' || g)) "
		  . "FROM generate_series(1, $nruns) g"),
	$nruns,
	'another transaction holds every due run');

my $claimer = $node->background_psql('postgres', on_error_stop => 1);
my $pid = $claimer->query_safe('SELECT pg_backend_pid()');
$claimer->query_until(qr/started/,
	"\\echo started\nSELECT count(*) AS claimed FROM idem_run_claim('q', wait => '7 s');\n");
wait_for_backend($node, $pid, "query LIKE '%idem_run_claim%' AND state = 'active'");

# the first polls allocate what every poll needs; from then on, flat
sleep(2);
my $before = backend_memory_kb($pid, 'RssAnon');
sleep(4);
my $after = backend_memory_kb($pid, 'RssAnon');
note("claiming backend RssAnon: $before kB, 4 s later $after kB");
cmp_ok($after - $before, '<', 4096,
	"a waiting claim's memory stays flat ($before kB, then $after kB)");

my $out = $claimer->query_until(qr/\d/, '');
like($out, qr/^0$/m, 'the claim leased none of the held runs');
$claimer->quit;
$holder->query_safe('COMMIT');
$holder->quit;

is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem_run_claim('q', max_runs => 10)"),
	'10', 'the runs are claimed once their locks are free');

$node->stop;
done_testing();
