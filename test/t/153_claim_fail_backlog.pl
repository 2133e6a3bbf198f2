
# Copyright (c) 2026, idem authors

# A claim fails, instead of leasing, each due run that can never be
# worked: its lease ran out on its last attempt (its workers died), or its
# owner role was dropped.  It goes on down the queue until it has leased
# max_runs, so one claim may fail any number of runs, in one transaction.
# Each run's lock was kept until the claim committed, one slot of the
# shared lock table each: a backlog of such runs larger than the table
# made every claim of the queue fail with 53200 (out of shared memory),
# and the queue never moved again.  The server has
# max_locks_per_transaction = 10, its least.
#
# 1. A dropped role's runs, more than the lock table holds, alone on
#    their queue (a claim of one role's runs scans them in due order): a
#    claim fails them all, and holds no lock of a run it failed until it
#    commits.  The next claim leases a live run enqueued after.
# 2. Runs whose leases ran out on their last attempt, as many: the next
#    claim fails them all.
# 3. A claim of max_runs = 1000 runs, its most, leases them all, and holds
#    no lock of a run once it has leased it.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nruns = 3000;

my $node = idem_node('claimfailbacklog');
$node->append_conf('postgresql.conf', 'max_locks_per_transaction = 10');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $lock_table = lock_table_slots($node);
cmp_ok($lock_table * 2, '<', $nruns,
	"the $nruns runs are more than the shared lock table ($lock_table locks) can take");

my $oom = qr/out of shared memory|53200/;

sub statuses
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(status || ' ' || n, ', ' ORDER BY status) FROM"
		  . " (SELECT status, count(*) n FROM idem.runs WHERE run_id LIKE '$prefix-%' GROUP BY 1) s");
}

# a claim of one run in a transaction that then counts the advisory locks
# it holds: (run_id leased, locks held), or the error
sub claim_one
{
	my ($queue) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', qq{
BEGIN;
SELECT coalesce((SELECT string_agg(run_id, ',') FROM idem_run_claim('$queue', 1, '5 min', 'w')), 'none');
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
});
	return ($rc, $err, split(/\n/, $out));
}

########################################################################
# 1. A dropped role's runs.
########################################################################

$node->safe_psql('postgres', q{
SELECT idem_queue_create('q');
CREATE ROLE regress_gone;
SELECT idem_queue_grant('q', 'regress_gone', 'produce');
});
enqueue_runs($node, 'q', 'gone', $nruns, 'regress_gone');
$node->safe_psql('postgres', q{
SELECT idem_queue_revoke('q', 'regress_gone', 'produce');
DROP ROLE regress_gone;
});
is(statuses('gone'), "running $nruns", "a dropped role's $nruns runs wait on the queue");

my ($rc, $out, $err, $leased, $held);
($rc, $err, $leased, $held) = claim_one('q');
is($rc, 0, "a claim of $nruns runs of a dropped role succeeds");
unlike($err // '', $oom, '... with no 53200');
is($leased, 'none', '... and leases none of them');
cmp_ok($held // 'none', '<=', 2, '... holding no lock of a run it failed (' . ($held // 'none') . ' advisory locks)');
is(statuses('gone'), "failed $nruns", "the dropped role's runs are failed");
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem.runs WHERE run_id LIKE 'gone-%' AND last_error = 'its owner role was dropped'"),
	$nruns, '... as their owner role was dropped');
enqueue_runs($node, 'q', 'live', 1);
($rc, $err, $leased, $held) = claim_one('q');
is($leased, 'live-1', 'the next claim leases a live run');

########################################################################
# 2. Leases that ran out on the last attempt.
########################################################################

$node->safe_psql('postgres', "SELECT idem_queue_create('q2', max_attempts => 1)");
enqueue_runs($node, 'q2', 'dead', $nruns);
# leased by workers that die, 100 a claim
$node->safe_psql('postgres', qq{
DO \$\$
BEGIN
	FOR i IN 1 .. $nruns / 100 LOOP
		PERFORM idem_run_claim('q2', 100, '1 s', 'doomed');
		COMMIT;
	END LOOP;
END
\$\$;
});
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem.runs WHERE run_id LIKE 'dead-%' AND queue_state = 'leased'"),
	$nruns, "$nruns runs leased on their last attempt");
sleep(2);
($rc, $err, $leased, $held) = claim_one('q2');
is($rc, 0, "a claim once their leases ran out succeeds");
unlike($err // '', $oom, '... with no 53200');
is($leased, 'none', '... leasing none');
cmp_ok($held // 'none', '<=', 2, '... holding no lock of a run it failed (' . ($held // 'none') . ' advisory locks)');
is(statuses('dead'), "failed $nruns", '... and fails every run whose lease ran out');

########################################################################
# 3. A claim of 1000 runs, its most.
########################################################################

$node->safe_psql('postgres', "SELECT idem_queue_create('q3')");
enqueue_runs($node, 'q3', 'many', 1000);
($rc, $out, $err) = $node->psql('postgres', q{
BEGIN;
SELECT count(*) FROM idem_run_claim('q3', 1000, '5 min', 'w');
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
});
is($rc, 0, 'a claim of 1000 runs, more than the lock table holds, succeeds');
unlike($err, $oom, '... with no 53200');
($leased, $held) = split /\n/, $out;
is($leased, '1000', '... and leases them all');
cmp_ok($held // 'none', '<=', 2, '... holding no lock per run until it commits (' . ($held // 'none') . ' advisory locks)');

$node->stop;
done_testing();
