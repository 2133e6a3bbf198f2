
# Copyright (c) 2026, idem authors

# A claim that waits on a capped queue holds no other claim up.  The count
# of a capped queue's leases takes turns on a lock; a waiting claim took it
# at its first poll and kept it for its whole wait (up to an hour), so
# every other claim of the queue, even one that does not wait, waited
# behind it.  A poll that leased nothing now lets the lock go: another
# claim is answered at once (no lock timeout), and the waiting claim still
# gets the run that a release makes free.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('claimcap');
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
SELECT idem_queue_create('q', concurrency => 1);
SELECT idem_run_begin('r1', steps => ARRAY['s'], queue => 'q');
SELECT idem_run_begin('r2', steps => ARRAY['s'], queue => 'q');
});

# the cap is taken
my ($run, $token) = split /\|/, $node->safe_psql('postgres',
	"SELECT run_id, lease_token FROM idem_run_claim('q', lease => '10 min')");
is($run, 'r1', 'r1 is leased: the queue is at its cap of one');

# a claim that waits for room
my $waiter = $node->background_psql('postgres', on_error_stop => 1);
my $pid = $waiter->query_safe('SELECT pg_backend_pid()');
$waiter->query_until(qr/started/,
	"\\echo started\nSELECT run_id FROM idem_run_claim('q', wait => '20 s');\n");
wait_for_backend($node, $pid, "query LIKE '%idem_run_claim%' AND state = 'active'");
sleep(1);

# another claim, which does not wait, is answered at once
my ($ret, $out, $err) = $node->psql('postgres',
	"SET lock_timeout = '2s'; SELECT count(*) FROM idem_run_claim('q')");
is($ret, 0, 'a claim beside the waiting one is not held up by it') or diag($err);
is($out, '0', '... and leases nothing: the cap is taken');

# room made: the waiting claim gets a run
$node->safe_psql('postgres', "SELECT idem_run_release('r1', '$token')");
my $got = $waiter->query_until(qr/r\d/, '');
like($got, qr/^r[12]$/m, 'the waiting claim leases a run once the release makes room');
$waiter->quit;
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem_runs WHERE queue = 'q' AND state = 'leased' AND lease_until > now()"),
	'1', 'one lease, as the cap says');

$node->stop;
done_testing();
