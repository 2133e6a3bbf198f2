
# Copyright (c) 2026, idem authors

# A backlog of runs larger than the shared lock table is purged, in
# batches, by the purge worker, by CALL idem_purge_all() and by
# idem_purge() (shared_preload_libraries = 'idem', a cycle a second).
# Removing a run takes its lock until the transaction commits, one slot of
# the shared lock table each; the server has max_locks_per_transaction =
# 10, its least, so the table holds a few hundred locks and a few thousand
# runs are more than it can take in one transaction.
#
# 1. CALL idem_purge_all() with idem.run_retention set removes every
#    finished run of the backlog, with its step's record.
# 2. The runs of a dropped role, as many: idem_purge() removes as many
#    as max_locks_per_transaction of them, and the worker all of them
#    (idem.run_retention unset).
# 3. With idem.run_retention set for the database, the worker removes a
#    backlog of finished runs, cycle after cycle, batch after batch.
# Each time nothing fails with 53200 (out of shared memory), in the log
# or to the caller.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $nruns = 3000;

my $node = idem_node('runbacklog');
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'idem'
idem.purge_interval = 1
max_locks_per_transaction = 10
));
$node->start;
idem_setup_db($node, 'postgres');

# $n finished runs named prefix-N, each with one completed step, begun,
# stepped and completed one transaction each
sub finished_runs
{
	my ($prefix, $n, $role) = @_;
	my $set = defined $role ? "SET ROLE $role;" : '';
	$node->safe_psql('postgres', qq{
$set
DO \$\$
BEGIN
	FOR g IN 1..$n LOOP
		PERFORM idem_run_begin('$prefix-' || g, steps => ARRAY['a']);
		PERFORM idem_step('$prefix-' || g, 'a', 'SELECT 1 AS one');
		COMMIT;
	END LOOP;
END
\$\$;
});
	return;
}

sub count_runs
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idem.runs WHERE run_id LIKE '$prefix-%'");
}

sub count_step_records
{
	my ($prefix) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idem.keys WHERE key LIKE '%$prefix-%'");
}

# whether sql returns true within secs seconds (poll_query_until waits
# minutes, which would make the failure before the fix slow to see)
sub within
{
	my ($secs, $sql) = @_;
	my $until = time() + $secs;

	while (time() < $until)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		sleep(0.2);
	}
	return 0;
}

my $lock_table = lock_table_slots($node);
cmp_ok($lock_table * 2, '<', $nruns,
	"the backlog ($nruns runs) is more than the shared lock table ($lock_table locks) can take");

my $oom = qr/out of shared memory|53200/;

########################################################################
# 1. CALL idem_purge_all().
########################################################################

finished_runs('all', $nruns);
is(count_runs('all'), $nruns, "$nruns finished runs");
# the worker has no idem.run_retention: only the call removes them
sleep(1.5);
my $logstart = -s $node->logfile;
my $t0 = time();
my ($rc, $out, $err) = $node->psql('postgres',
	"SET idem.run_retention = '1s'; CALL idem_purge_all()");
my $took = time() - $t0;
is($rc, 0, 'CALL idem_purge_all() succeeds');
unlike($err, $oom, '... with no 53200');
is(count_runs('all'), '0', '... and removes every finished run');
is(count_step_records('all'), '0', "... with its step's record");
diag(sprintf('idem_purge_all: %d runs in %.2f s', $nruns, $took));

########################################################################
# 2. The runs of a dropped role.
########################################################################

# the worker held off: the launcher's next cycle, after the reload, is
# its last for an hour
$node->safe_psql('postgres', "ALTER SYSTEM SET idem.purge_interval = 3600; SELECT pg_reload_conf()");
sleep(1);
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'idem purge worker'")
  or die 'the purge worker did not finish';
$node->safe_psql('postgres', 'CREATE ROLE regress_backlog_gone');
finished_runs('gone', $nruns, 'regress_backlog_gone');
$node->safe_psql('postgres', 'DROP ROLE regress_backlog_gone');
($rc, $out, $err) = $node->psql('postgres', 'SELECT idem_purge()');
is($rc, 0, 'idem_purge() with a dropped role owning more runs than the lock table holds succeeds');
unlike($err, $oom, '... with no 53200');
is(count_runs('gone'), $nruns - 10,
	'... and removes as many of its runs as max_locks_per_transaction');

$node->safe_psql('postgres', "ALTER SYSTEM RESET idem.purge_interval; SELECT pg_reload_conf()");
$t0 = time();
ok(within(60, "SELECT count(*) = 0 FROM idem.runs WHERE run_id LIKE 'gone-%'"),
	'the worker removes every run of the dropped role');
diag(sprintf('worker: %d runs of a dropped role in %.2f s', $nruns - 10, time() - $t0));
is(count_step_records('gone'), '0', "... with their steps' records");

########################################################################
# 3. The worker, with idem.run_retention.
########################################################################

finished_runs('aged', $nruns);
is(count_runs('aged'), $nruns, "$nruns finished runs again");
$node->safe_psql('postgres', "ALTER DATABASE postgres SET idem.run_retention = '1s'");
$t0 = time();
ok(within(60, "SELECT count(*) = 0 FROM idem.runs WHERE run_id LIKE 'aged-%'"),
	'with idem.run_retention the worker removes every finished run of the backlog');
$took = time() - $t0;
is(count_step_records('aged'), '0', "... with its step's record");
diag(sprintf('worker: %d finished runs in %.2f s (from the setting)', $nruns, $took));
$node->safe_psql('postgres', "ALTER DATABASE postgres RESET idem.run_retention");

my $log = slurp_file($node->logfile, $logstart);
unlike($log, $oom, 'no purge failed with 53200');
unlike($log, qr/"idem purge worker[^"]*" \(PID \d+\) exited with exit code [1-9]/,
	'no purge worker failed');

$node->stop;
done_testing();
