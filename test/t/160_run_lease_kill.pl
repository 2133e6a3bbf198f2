
# Copyright (c) 2026, idem authors

# Runs on queues survive their workers (issue 21).  A worker claims the
# returns run (check, label at a carrier outside the database, refund,
# notify through the outbox) under a 2 s lease and is killed at one point
# in turn: before a step (right after its claim committed), inside the
# refund's transaction, during the carrier call of the external step, and
# after the refund committed.  Half the kills are pg_terminate_backend(),
# half SIGKILL (a server crash and recovery).  A second worker's claim,
# waiting, takes the run over once the lease has run out, and runs the same
# code from the start: the run ends completed with each step's effect
# exactly once (the carrier deduplicates by the step key, as a real one
# does by Idempotency-Key), and idem.run_attempts holds both attempts, the
# first ended by the expired lease.  Last, the server restarts (immediate
# shutdown) while a run is leased; after the restart the lease still runs
# out and another worker completes the run.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('runlease');
$node->append_conf('postgresql.conf', qq(
restart_after_crash = on
shared_preload_libraries = 'idem'
));
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('notifications');
SELECT idem_queue_create('returns', max_attempts => 3);
CREATE TABLE effects (id serial PRIMARY KEY, run_id text NOT NULL, step text NOT NULL);
CREATE TABLE carrier_attempts (id serial PRIMARY KEY, idem_key text NOT NULL);
CREATE TABLE carrier_labels (idem_key text PRIMARY KEY, label text NOT NULL);
});

# A database step's statement: it records its effect, then sleeps for
# test.sleep_<step> seconds (unset: not at all), so the backend can be
# caught inside the step's transaction.
sub db_step
{
	my ($step, $extra) = @_;
	my $sql =
	    q{INSERT INTO effects (run_id, step) VALUES ($1, $2) RETURNING id, }
	  . qq{(SELECT 0 FROM pg_sleep(current_setting('test.sleep_$step', true)::float8)) AS slept};
	$extra //= '';
	return
	    "SELECT replayed FROM idem_call(NULL, \$q\$$sql\$q\$, ARRAY[:'run_id', '$step'], "
	  . "run_id => :'run_id', step => '$step', lease_token => :'tok'$extra);\n";
}

# The worker: claim (waiting for a due run), then every step from the
# start; completed steps replay, a started external step is called again
# with the same key.
my $worker_script =
    "SELECT run_id, lease_token AS tok FROM idem_run_claim('returns', 1, '2 s', "
  . "'worker ' || pg_backend_pid(), wait => '20 s') \\gset\n"
  . "SELECT pg_sleep(current_setting('test.sleep_claimed', true)::float8);\n"
  . db_step('check')
  . "SELECT step_key AS label_key, completed AS label_done "
  . "FROM idem_step_start(:'run_id', 'label', :'tok') \\gset\n"
  . "\\if :label_done\n\\else\n"
  . "INSERT INTO carrier_attempts (idem_key) VALUES (:'label_key');\n"
  . "INSERT INTO carrier_labels (idem_key, label) VALUES (:'label_key', 'LB-' || :'run_id') "
  . "ON CONFLICT (idem_key) DO NOTHING;\n"
  . "SELECT pg_sleep(current_setting('test.sleep_label', true)::float8);\n"
  . "SELECT idem_step_complete(:'run_id', 'label', "
  . "(SELECT jsonb_build_object('label_id', label) FROM carrier_labels WHERE idem_key = :'label_key'), "
  . "lease_token => :'tok');\n"
  . "\\endif\n"
  . db_step('refund')
  . "SELECT pg_sleep(current_setting('test.sleep_refunded', true)::float8);\n"
  . db_step('notify', ", outbox_topic => 'notifications'");

sub run_state
{
	my ($run) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT (SELECT string_agg(step || '=' || n, ' ' ORDER BY step)
          FROM (SELECT step, count(*) AS n FROM effects WHERE run_id = '$run' GROUP BY step) e)
    || ' | labels=' || (SELECT count(*) FROM carrier_labels WHERE label = 'LB-$run')
    || ' | events=' || (SELECT count(*) FROM idem.outbox WHERE key = idem_step_key('$run', 'notify'))
    || ' | ' || (SELECT status || ' ' || steps_done FROM idem_runs WHERE run_id = '$run')
    || ' | ' || (SELECT string_agg(outcome, ',' ORDER BY claim) FROM idem.run_attempts WHERE run_id = '$run')});
}

my $expected =
  'check=1 notify=1 refund=1 | labels=1 | events=1 | completed 4 | lease_expired,completed';

# where the worker sleeps to be killed, and how
my @cases = (
	[ 'claimed',  'terminate' ],
	[ 'refund',   'kill' ],
	[ 'label',    'terminate' ],
	[ 'refunded', 'kill' ],);

foreach my $case (@cases)
{
	my ($point, $how) = @$case;
	my $run = "ret-$point";

	$node->safe_psql('postgres',
		"SELECT status FROM idem_run_begin('$run', steps => ARRAY['check', 'label', 'refund', 'notify'], "
		  . "input => '{\"amount\": 25}', queue => 'returns')");

	my $worker = $node->background_psql('postgres', on_error_stop => 1);
	my $pid = $worker->query_safe('SELECT pg_backend_pid()');
	$worker->query_safe("SET test.sleep_$point = 600");
	$worker->query_until(qr/started/, "\\echo started\n" . $worker_script);
	wait_for_backend($node, $pid, "wait_event = 'PgSleep'");

	if ($how eq 'kill')
	{
		my $logstart = -s $node->logfile;
		ok(kill('KILL', $pid), "$point: SIGKILL the worker's backend");
		bg_finish($worker);
		$node->wait_for_log(qr/all server processes terminated; reinitializing/,
			$logstart);
		ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
			"$point: server accepts connections again");
	}
	else
	{
		is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"),
			't', "$point: pg_terminate_backend() of the worker");
		bg_finish($worker);
	}

	# (the lease may have run out meanwhile: it ends at the next claim)
	is($node->safe_psql('postgres',
			"SELECT queue_state || ' ' || attempt FROM idem.runs WHERE run_id = '$run'"),
		'leased 1', "$point: the run is still leased to the dead worker");

	# the next worker waits for the lease to run out, then runs the run
	$node->safe_psql('postgres', $worker_script);
	is(run_state($run), $expected,
		"$point: the second worker completed the run, each effect exactly once");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM carrier_attempts WHERE idem_key = idem_step_key('$run', 'label')"),
		$point eq 'label' ? 2 : 1,
		"$point: the carrier was called "
		  . ($point eq 'label' ? 'again with the same key' : 'once'));
}

# Restart while a run is leased: the lease is on disk and still runs out.
$node->safe_psql('postgres',
	"SELECT status FROM idem_run_begin('ret-restart', steps => ARRAY['check', 'label', 'refund', 'notify'], "
	  . "input => '{\"amount\": 25}', queue => 'returns')");
$node->safe_psql('postgres',
	"SELECT count(*) FROM idem_run_claim('returns', 1, '60 s', 'before restart')");
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres',
		"SELECT state || ' ' || holder || ' ' || (lease_until > now() + interval '30 s') FROM idem_runs WHERE run_id = 'ret-restart'"),
	'leased before restart true', 'restart: the lease survived the restart');
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem_run_claim('returns', 1, '2 s', 'too early')"),
	'0', 'restart: the run is not claimable before its lease ends');
# the lease's end, brought forward rather than waited for
$node->safe_psql('postgres',
	"UPDATE idem.runs SET due_at = now() - interval '1 s' WHERE run_id = 'ret-restart'");
$node->safe_psql('postgres', $worker_script);
is(run_state('ret-restart'), $expected,
	'restart: another worker completed the run after the lease, each effect once');
is( $node->safe_psql('postgres',
		"SELECT runs_claimed || ' ' || run_lease_expiries FROM idem_stats WHERE datname = 'postgres'"),
	'1 1', 'restart: idem_stats counts the claim and the expired lease since the restart');

# idem_stats counts retries, signals and failed runs too (shared memory)
$node->safe_psql(
	'postgres', q{
SELECT idem_stats_reset();
SELECT idem_queue_create('twice', max_attempts => 2, backoff_base => '0 s');
SELECT status FROM idem_run_begin('st-1', steps => ARRAY['s'], queue => 'twice');
SELECT status FROM idem_run_begin('st-2', steps => ARRAY['approve'], queue => 'returns');
SELECT idem_run_signal('st-2', 'approve');
SELECT idem_step_fail('st-1', 's', lease_token, 'first') IS NOT NULL FROM idem_run_claim('twice');
SELECT idem_step_fail('st-1', 's', lease_token, 'second') IS NULL FROM idem_run_claim('twice');
});
is( $node->safe_psql('postgres',
		"SELECT runs_claimed || ' ' || run_retries || ' ' || run_signals || ' ' || runs_failed "
		  . "FROM idem_stats WHERE datname = 'postgres'"),
	'2 1 1 1', 'idem_stats counts claims, retries, signals and failed runs');

# an operator who cancels a run whose worker died (its lease ran out, no
# claim took it over) ends a lease that expired: counted as one
$node->safe_psql(
	'postgres', q{
SELECT idem_stats_reset();
SELECT status FROM idem_run_begin('st-3', steps => ARRAY['s'], queue => 'twice');
SELECT count(*) FROM idem_run_claim('twice', 1, '1 ms', 'dead');
SELECT pg_sleep(0.01);
SELECT idem_run_cancel('st-3', 'stalled');
});
is( $node->safe_psql('postgres',
		"SELECT run_lease_expiries FROM idem_stats WHERE datname = 'postgres'"),
	'1', 'idem_stats counts the expired lease of a run an operator cancelled');

$node->stop;
done_testing();
