
# Copyright (c) 2026, idem authors

# A claim of many runs needs the memory of one.  Each run's results (its
# completed steps' results, up to 256 MB) are read and built into the
# claim's row; they were kept until the claim returned, so a claim of
# max_runs runs held max_runs runs' results at once, and a claim of a
# thousand large runs could exhaust the server's memory.  The rows are in
# the claim's tuplestore (spilled to disk past work_mem): the claiming
# backend's peak memory (VmHWM) must grow by about one run's results, not
# by all of them.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nruns = 16;
my $nsteps = 10;

my $node = idem_node('claimresults');
$node->start;

# each run: $nsteps results of 1 MB (compressed to next to nothing on disk,
# so the claim's reads touch few shared buffers), and a last step pending
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idem;
SELECT idem_queue_create('q');
SELECT count(*) FROM (
	SELECT idem_run_begin('m' || g,
		steps => ARRAY(SELECT 's' || i FROM generate_series(1, $nsteps) i) || ARRAY['last'],
		queue => 'q')
	  FROM generate_series(1, $nruns) g) s;
DO \$\$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT * FROM idem_run_claim('q', max_runs => $nruns, lease => '5 min') LOOP
		FOR i IN 1..$nsteps LOOP
			PERFORM idem_step_complete(r.run_id, 's' || i,
				jsonb_build_object('x', repeat('y', 1000000)), lease_token => r.lease_token);
		END LOOP;
		PERFORM idem_run_release(r.run_id, r.lease_token);
	END LOOP;
END
\$\$;
});
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem.runs WHERE cardinality(done_steps) = $nsteps AND queue_state = 'ready'"),
	$nruns,
	"$nruns runs of $nsteps completed steps each are due");

my $claimer = $node->background_psql('postgres', on_error_stop => 1);
my $pid = $claimer->query_safe('SELECT pg_backend_pid()');
my $before = backend_memory_kb($pid, 'VmHWM');
is( $claimer->query_safe(
		"SELECT count(*) FILTER (WHERE (SELECT count(*) FROM jsonb_object_keys(results)) = $nsteps) "
		  . "FROM idem_run_claim('q', max_runs => $nruns)"),
	$nruns,
	"one claim leases the $nruns runs, each with its $nsteps results");
my $after = backend_memory_kb($pid, 'VmHWM');
$claimer->quit;

# all the runs' results are $nruns * $nsteps MB; one run's, $nsteps MB
my $all_kb = $nruns * $nsteps * 1024;
note("claiming backend VmHWM: $before kB, after the claim $after kB");
cmp_ok($after - $before, '<', $all_kb / 2,
	"the claim's peak memory grows by less than half of all the runs' results ($before kB, then $after kB)"
);

$node->stop;
done_testing();
