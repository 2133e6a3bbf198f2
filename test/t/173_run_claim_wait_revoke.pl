
# Copyright (c) 2026, idem authors

# A waiting claim is checked at every poll, as a call is.  The work grant
# was checked when the claim began and never again: a worker whose grant
# was revoked while its claim waited (up to an hour) still leased the runs
# enqueued after the revoke, and then, refused at its every call (42501),
# held them until the lease ran out, an attempt lost each time.  The
# revoke now ends the wait with 42501, and the run stays due.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('claimrevoke');
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
CREATE ROLE worker;
SELECT idem_queue_create('q', workers => '{worker}');
});

# a worker's claim waits on the empty queue
my $waiter = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/started/,
	    "SET ROLE worker;\n\\echo started\n"
	  . "SELECT run_id FROM idem_run_claim('q', lease => '10 min', wait => '20 s');\n"
	  . "\\echo done :LAST_ERROR_SQLSTATE\n");
wait_for_backend($node, $pid, "query LIKE '%idem_run_claim%' AND state = 'active'");

# its grant is revoked, then a run is enqueued
$node->safe_psql('postgres', "SELECT idem_queue_revoke('q', 'worker', 'work')");
sleep(1);
$node->safe_psql('postgres',
	"SELECT idem_run_begin('r1', steps => ARRAY['s'], queue => 'q')");

my $got = $waiter->query_until(qr/done \w+/, '');
like($got, qr/done 42501/, 'the revoke ends the waiting claim with 42501');
unlike($got, qr/r1/, '... which leases nothing');
$waiter->quit;
is($node->safe_psql('postgres', "SELECT state FROM idem_runs WHERE run_id = 'r1'"),
	'ready', 'the run stays due for the workers the queue has');

$node->stop;
done_testing();
