
# Copyright (c) 2026, idem authors

# A queue with more unfinished runs than the shared lock table holds is
# dropped with cascade => true, in one transaction, all or nothing.
# Cancelling a run takes its lock; a drop that kept each lock until it
# committed took one slot of the shared lock table per run, and a queue of
# a few thousand runs failed with 53200 (out of shared memory) and could
# not be dropped at all.  The server has max_locks_per_transaction = 10,
# its least, so the table holds a few hundred locks.
#
# 1. A drop rolled back changes nothing: the queue and every run stay.
# 2. The drop succeeds, cancels every run (a leased one too: its worker's
#    next call is ID412), and holds no more locks than a drop of one run
#    while it is uncommitted.
# 3. A drop in a transaction that fails after it leaves every run as it
#    was.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nruns = 3000;

my $node = idem_node('queuedropbacklog');
$node->append_conf('postgresql.conf', 'max_locks_per_transaction = 10');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $lock_table = lock_table_slots($node);
cmp_ok($lock_table * 2, '<', $nruns,
	"the queue's $nruns runs are more than the shared lock table ($lock_table locks) can take");

# a queue of $n unfinished runs prefix-N, each failed by its first failed
# attempt (a failed run counts: a retry would put it back)
sub fill_queue
{
	my ($queue, $prefix, $n) = @_;
	$node->safe_psql('postgres',
		"SELECT idem_queue_create('$queue', max_attempts => 1)");
	enqueue_runs($node, $queue, $prefix, $n);
	return;
}

sub statuses
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT string_agg(status || ' ' || n, ', ' ORDER BY status) FROM"
		  . " (SELECT status, count(*) n FROM idem.runs WHERE run_id LIKE '$prefix-%' GROUP BY 1) s");
}

my $oom = qr/out of shared memory|53200/;

fill_queue('q', 'r', $nruns);
my ($leased, $token) = split /\|/, $node->safe_psql('postgres',
	"SELECT run_id, lease_token FROM idem_run_claim('q', 1, '5 min', 'w')");
$node->safe_psql('postgres',
	"SELECT idem_step_fail(c.run_id, 's', c.lease_token, 'boom') FROM idem_run_claim('q', 1, '5 min', 'w2') c");
is(statuses('r'), "failed 1, running " . ($nruns - 1),
	"$nruns unfinished runs on the queue, one leased, one failed");

########################################################################
# 1. Rolled back.
########################################################################

my ($rc, $out, $err) = $node->psql('postgres',
	"BEGIN; SELECT idem_queue_drop('q', cascade => true); ROLLBACK;");
unlike($err, $oom, 'a drop rolled back: no 53200');
is(statuses('r'), "failed 1, running " . ($nruns - 1), '... and every run as it was');
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.queues WHERE queue = 'q'"),
	'1', '... and the queue is still there');

########################################################################
# 2. The drop.
########################################################################

($rc, $out, $err) = $node->psql('postgres', qq{
BEGIN;
SELECT idem_queue_drop('q', cascade => true);
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
COMMIT;
});
is($rc, 0, "idem_queue_drop(cascade => true) of a queue of $nruns unfinished runs succeeds");
unlike($err, $oom, '... with no 53200');
like($err, qr/drop cascades to $nruns unfinished runs/, '... and cancels them all');
my ($held) = $out =~ /(\d+)\s*\z/;
cmp_ok($held // 'none', '<=', 2, "... holding at most 2 advisory locks until it commits (held " . ($held // 'none') . ')');
is(statuses('r'), "cancelled $nruns", 'every run is cancelled');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem.runs WHERE run_id LIKE 'r-%' AND last_error = 'run queue \"q\" dropped'"),
	$nruns, '... with the reason');
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.queues WHERE queue = 'q'"),
	'0', 'the queue is gone');
($rc, $out, $err) = $node->psql('postgres',
	"SELECT idem_run_extend('$leased', '$token', '1 min')");
like($err, qr/lease token does not hold run/, "the lease holder's next call is ID412");

########################################################################
# 3. A transaction that fails after the drop.
########################################################################

fill_queue('q2', 'f', $nruns);
($rc, $out, $err) = $node->psql('postgres', q{
BEGIN;
SELECT idem_queue_drop('q2', cascade => true);
SELECT 1 / 0;
COMMIT;
});
like($err, qr/division by zero/, 'a transaction fails after its drop');
unlike($err, $oom, '... with no 53200');
is(statuses('f'), "running $nruns", '... and every run stays as it was');
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.queues WHERE queue = 'q2'"),
	'1', '... and the queue too');

$node->stop;
done_testing();
