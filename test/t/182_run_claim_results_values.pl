
# Copyright (c) 2026, idem authors

# A claimed run's results need memory of about their size, however many
# values they hold.  They were built with pushJsonbValue(), which unpacks
# each step's result into JsonbValues and converts them all back: a run of
# 20 results, each an array of 30,000 small objects (18 MB in all), grew
# the claiming backend by 430 MB.  Each result is now copied into the
# object whole.  The backend's private memory (RssAnon, read while the
# claim runs) must grow by a small multiple of the results' size; that a
# claim of many runs holds one run's results at a time is
# test/t/172_run_claim_results_memory.pl.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nsteps = 10;
my $nvalues = 30000;

my $node = idem_node('claimvalues');
$node->start;
$node->safe_psql(
	'postgres', qq{
CREATE EXTENSION idem;
SELECT idem_queue_create('q');
SELECT idem_run_begin('r',
	steps => ARRAY(SELECT 's' || i FROM generate_series(1, $nsteps) i) || ARRAY['last'],
	queue => 'q');
DO \$\$
DECLARE
	tok uuid;
BEGIN
	SELECT lease_token INTO tok FROM idem_run_claim('q', lease => '5 min');
	FOR i IN 1..$nsteps LOOP
		PERFORM idem_step_complete('r', 's' || i,
			(SELECT jsonb_agg(jsonb_build_object('g', g)) FROM generate_series(1, $nvalues) g),
			lease_token => tok);
	END LOOP;
	PERFORM idem_run_release('r', tok);
END
\$\$;
});

my $s = $node->background_psql('postgres', on_error_stop => 1);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
my ($before, $peak, $out) = peak_private_kb($s, $pid,
	"SELECT pg_column_size(results) || ' ' || jsonb_array_length(results -> 's$nsteps') "
	  . "FROM idem_run_claim('q')");
$s->quit;
my ($size, $n) = $out =~ /^(\d+) (\d+)$/m;
is($n, $nvalues, "the claim returns the run's $nsteps results")
  or diag("output: $out\nerrors: $s->{stderr}");
$size //= 0;
my $grown = $peak - $before;
note("results $size bytes; claiming backend RssAnon $before kB before, at most $peak kB during the claim");
cmp_ok($grown * 1024, '<', 4 * $size + 8 * 1024 * 1024,
	"the claim grows the backend by less than four times the results' size and 8 MB ($grown kB for $size bytes)");

$node->stop;
done_testing();
