
# Copyright (c) 2026, idem authors

# A queue's drop with cascade needs the memory of one run per run it
# cancels.  What cancelling a run allocated (its row read and written, its
# audit entry) was kept until the drop returned: some 1.7 kB a run, 170 MB
# for a queue of 100,000 unfinished runs, and a queue of millions could
# exhaust the server's memory.  The dropping backend's private memory
# (RssAnon, read while the drop runs) must grow by far less than that;
# what is left is the list of the runs.  The drop gives each run's lock
# back once the run is cancelled, so the server's default lock table is
# enough (test/t/152_queue_drop_backlog.pl).

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nruns = 40000;
my $batch = 2000;

my $node = idem_node('queuedrop');
$node->start;
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idem;
SELECT idem_queue_create('q');
DO \$\$
BEGIN
	FOR b IN 0 .. $nruns / $batch - 1 LOOP
		PERFORM idem_run_begin('r' || g, steps => ARRAY['s'], queue => 'q')
		   FROM generate_series(b * $batch + 1, (b + 1) * $batch) g;
		COMMIT;
	END LOOP;
END
\$\$;
});

my $s = $node->background_psql('postgres', on_error_stop => 1);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
my ($before, $peak) =
  peak_private_kb($s, $pid, "SELECT idem_queue_drop('q', true)");
$s->quit;
like($s->{stderr}, qr/drop cascades to $nruns unfinished runs/,
	"the drop cancels the queue's $nruns runs");
note("dropping backend RssAnon: $before kB before, $peak kB at most during the drop");
cmp_ok($peak - $before, '<', 24 * 1024,
	"the drop of $nruns runs grows the backend by less than 24 MB ($before kB, then at most $peak kB)");

is( $node->safe_psql(
		'postgres',
		"SELECT count(*) FILTER (WHERE status = 'cancelled') || '/' || count(*) FROM idem_runs"),
	"$nruns/$nruns",
	'every run is cancelled');

$node->stop;
done_testing();
