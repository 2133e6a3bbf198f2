
# Copyright (c) 2026, idem authors

# A backlog of finished tenant runs larger than the shared lock table is
# purged by idem_citus_run_purge(), which the purge worker and
# idem_purge_all() call on the coordinator (test/t/151_purge_run_backlog.pl
# is the same for idem.runs).  One Citus node holding its shards, with
# max_locks_per_transaction = 10, its least, so that its lock table holds
# a few hundred locks and the backlog is more than that.
#
# 1. idem_citus_run_purge() removes every finished run of the backlog,
#    with its step's record, and nothing fails with 53200 (out of shared
#    memory).
# 2. The runs of a dropped role, as many, go as well, running or not.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $nruns = 4000;

my $node = citus_node('single', "citus.shard_count = 4\nmax_locks_per_transaction = 10");
citus_database('postgres', $node);
$node->safe_psql(
	'postgres', q{
SELECT citus_set_node_property('127.0.0.1', } . $node->port . q{, 'shouldhaveshards', true);
CREATE EXTENSION idem;
CREATE TABLE pay (tenant bigint NOT NULL);
SELECT create_distributed_table('pay', 'tenant');
SELECT idem_citus_colocate('pay');
});

my $lock_table = lock_table_slots($node);
cmp_ok($lock_table * 2, '<', $nruns,
	"the backlog ($nruns runs) is more than the shared lock table ($lock_table locks) can take");

# $n runs prefix-N of tenants 1 to 50, each with its one step completed
# (so finished), in transactions of 100
sub finished_runs
{
	my ($prefix, $n, $role) = @_;
	my $set = defined $role ? "SET ROLE $role;" : '';
	$node->safe_psql('postgres', qq{
SET client_min_messages = warning;
$set
DO \$\$
BEGIN
	FOR g IN 1..$n LOOP
		PERFORM idem_citus_run_begin(g % 50, '$prefix-' || g, ARRAY['a']);
		PERFORM idem_citus_step_complete(g % 50, '$prefix-' || g, 'a', '{"ok": true}');
		IF g % 100 = 0 THEN
			COMMIT;
		END IF;
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
		"SELECT count(*) FROM idem.citus_runs WHERE run_id LIKE '$prefix-%'");
}

my $oom = qr/out of shared memory|53200/;

########################################################################
# 1. Finished runs.
########################################################################

my $t0 = time();
finished_runs('done', $nruns);
diag(sprintf('%d finished tenant runs made in %.1f s', $nruns, time() - $t0));
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem.citus_runs WHERE run_id LIKE 'done-%' AND status = 'completed'"),
	$nruns, "$nruns finished tenant runs");
my $steps = "SELECT count(*) FROM idem.citus_keys WHERE key LIKE 'idem.step:%'";
is($node->safe_psql('postgres', $steps), $nruns, '... each with its step\'s record');

$t0 = time();
my ($rc, $out, $err) = $node->psql('postgres', q{
BEGIN;
SELECT idem_citus_run_purge(now() + interval '1 day');
SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid();
COMMIT;
});
my $took = time() - $t0;
is($rc, 0, 'idem_citus_run_purge() of the backlog succeeds');
unlike($err, $oom, '... with no 53200');
my ($removed, $held) = split /\n/, $out;
is($removed, $nruns, '... and says it removed every run');
# the shards' relations and indexes, Citus's metadata: not one per run
cmp_ok($held, '<', 100, "... holding $held locks until it commits");
is(count_runs('done'), '0', '... which are gone');
is($node->safe_psql('postgres', $steps), '0', "... with their steps' records");
diag(sprintf('idem_citus_run_purge: %d runs in %.1f s', $nruns, $took));

########################################################################
# 2. The runs of a dropped role.
########################################################################

$node->safe_psql('postgres', q{
CREATE ROLE regress_gone;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO regress_gone;
});
finished_runs('gone', $nruns, 'regress_gone');
$node->safe_psql('postgres', 'DROP OWNED BY regress_gone; DROP ROLE regress_gone');
is(count_runs('gone'), $nruns, "a dropped role's $nruns runs stay behind");
($rc, $out, $err) = $node->psql('postgres',
	"SELECT idem_citus_run_purge(now() - interval '1 day')");
is($rc, 0, "idem_citus_run_purge() of the dropped role's runs succeeds");
unlike($err, $oom, '... with no 53200');
is(count_runs('gone'), '0', '... and removes them all');

$node->stop;
done_testing();
