
# Copyright (c) 2026, idem authors

# idem_run_begin() under an existing run id with other steps or input is
# ID422, and counted and audited like a key's mismatch (issue 19): one more
# mismatch in idem_stats, an audit entry with the run id, outcome mismatch
# and SQLSTATE ID422.  Rejected attempts are counted and audited only with
# shared_preload_libraries (shared memory and the worker write them).

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('run_begin');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = 1
idem.audit = 'all'
});
$node->start;
idem_setup_db($node, 'postgres');

$node->safe_psql('postgres', q{SELECT idem_run_begin('r', ARRAY['a'], '{"n": 1}')});
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');

# the same steps and input: the run, no mismatch
$node->safe_psql('postgres', q{SELECT idem_run_begin('r', ARRAY['a'], '{"n": 1}')});
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET application_name = 'begin-other'; SELECT idem_run_begin('r', ARRAY['a'], '{"n": 2}')});
like($err, qr/already begun with different input/, 'other input is refused');
($rc, $out, $err) = $node->psql('postgres',
	q{SET application_name = 'begin-other'; SELECT idem_run_begin('r', ARRAY['b'], '{"n": 1}')});
like($err, qr/already begun with different steps/, 'other steps are refused');

is( $node->safe_psql('postgres',
		'SELECT mismatches FROM idem_stats WHERE datname = current_database()'),
	'2', 'both refusals counted as mismatches');
$node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM idem_audit WHERE application_name = 'begin-other'")
  or die 'the worker did not write the refused attempts';
is( $node->safe_psql('postgres',
		"SELECT string_agg(key || ':' || run_id || ':' || outcome || ':' || sqlstate, ',' ORDER BY at) FROM idem_audit WHERE application_name = 'begin-other'"),
	'idem.run:r:r:mismatch:ID422,idem.run:r:r:mismatch:ID422',
	'both refusals audited under the run, as ID422 mismatches');
is($node->safe_psql('postgres', q{SELECT input FROM idem_run_status('r')}),
	'{"n": 1}', 'the run is unchanged');

$node->stop;
done_testing();
