
# Copyright (c) 2026, idem authors

# Runs on queues and the outbox on a hot standby and across a failover to
# it, with a synchronous standby (remote_apply), once without and once with
# shared_preload_libraries = 'idem'.
#
# On the hot standby:
# - the read-only functions and views (idem_runs, idem_run_status,
#   idem_run_steps, idem_run_attempts, idem_audit_history, idem_stats,
#   idem_outbox_events) answer, with what the primary acknowledged;
# - every writing verb of runs and of the outbox, and idem_outbox_wait,
#   fails at once with 25006: a claim with wait => '5 s' does not sleep
#   first, and nothing changes on either node;
# - preloaded, the launcher and purge workers do not run (they start
#   once recovery has finished), so nothing error-loops in its log.
#
# Failover while a worker holds a lease mid-run (step a committed, step b
# in an open transaction) and a consumer holds an outbox event: the primary
# stops (immediate), the standby is promoted.  On the new primary:
# - the run is exactly as acknowledged: leased to the same token with the
#   same lease_until, step a done, step b not, the signals sent before
#   promotion are there, one attempt on record;
# - a session that was refused on the standby goes on after the promotion
#   and may write;
# - the lease still holds (lease_until is wall-clock time, carried in the
#   run's row): another worker's claim does not get the run, the old holder
#   goes on with its token (step a replays, step b executes once) and can
#   extend its lease;
# - once the lease has run out, another worker's claim takes the run over
#   (attempt 2, the cut attempt ended as lease_expired) and the old holder
#   is fenced (ID412); the new holder's steps replay, none re-executes,
#   and the run completes with each business write once;
# - a run whose lease ran out before the failover, with an external step
#   started, is claimed (attempt 2, started_step shown) and its step
#   started again under the same key; its old holder is ID412;
# - the outbox event leased on the old primary is not redelivered before
#   its lease ends, then is (attempt 2), and the old consumer's ack is
#   ID412;
# - preloaded, the launcher starts and the purge worker purges.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# A psql session for refused(): errors do not end it, and show their
# SQLSTATE.
sub session
{
	my ($node) = @_;
	my $s = $node->background_psql('postgres', on_error_stop => 0);
	$s->query_safe('\\set VERBOSITY verbose');
	return $s;
}

# sql fails with sqlstate in session (a transaction it opened is rolled
# back), within limit seconds if given
sub refused
{
	my ($session, $label, $sql, $sqlstate, $limit) = @_;
	# (a session keeps its stderr until it is cleared)
	$session->{stderr} = '';
	my $start = time;
	$session->query($sql);
	my $elapsed = time - $start;
	my $stderr = $session->{stderr};
	like($stderr, qr/^(psql:<stdin>:\d+: )?ERROR:  $sqlstate:/, "$label fails with $sqlstate");
	cmp_ok($elapsed, '<', $limit, "$label fails at once")
	  if defined $limit;
	$session->{stderr} = '';
	$session->query_safe('ROLLBACK') if $sql =~ /^BEGIN/;
	return;
}

sub scenario
{
	my ($preload) = @_;
	my $tag = $preload ? 'preloaded' : 'not preloaded';
	my $settings = "log_line_prefix = '%m [%p] %b %e '\nidem.audit = executions\n";
	$settings .= "shared_preload_libraries = 'idem'\nidem.purge_interval = 1\n"
	  if $preload;
	my ($primary, $standby) =
	  idem_sync_pair('remote_apply', $preload ? 'pre' : 'nopre', $settings);
	ok( $primary->poll_query_until(
			'postgres',
			"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = '"
			  . $standby->name . "'"),
		"$tag: the standby is synchronous");

	# r1: steps a (with an outbox event), b, ev (a signal), c, leased to w1
	# for 60 s; ev is signalled before anyone awaits it.  r3 awaits go and
	# is signalled.  r5's external step x is started under a 2 s lease that
	# runs out before the failover.  rc is cancelled (an audit entry).
	$primary->safe_psql(
		'postgres', q{
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('wf');
SELECT idem_queue_create('q');
CREATE TABLE biz (step text NOT NULL, run_id text NOT NULL);
SELECT status FROM idem_run_begin('r1', steps => ARRAY['a', 'b', 'ev', 'c'],
	input => '{}', queue => 'q');
CREATE TABLE w1 AS SELECT run_id, lease_token, lease_until
  FROM idem_run_claim('q', max_runs => 1, lease => '60 s', worker => 'w1');
SELECT status FROM idem_run_begin('r3', steps => ARRAY['go'], input => '{}', queue => 'q');
CREATE TABLE w3 AS SELECT run_id, lease_token
  FROM idem_run_claim('q', max_runs => 1, lease => '30 s', worker => 'w3');
SELECT state FROM idem_run_await('r3', 'go', (SELECT lease_token FROM w3));
SELECT status FROM idem_run_begin('r5', steps => ARRAY['x'], input => '{}', queue => 'q');
CREATE TABLE w5 AS SELECT run_id, lease_token
  FROM idem_run_claim('q', max_runs => 1, lease => '2 s', worker => 'w5');
SELECT attempt FROM idem_step_start('r5', 'x', (SELECT lease_token FROM w5));
SELECT idem_run_signal('r3', 'go', '{"go": true}');
SELECT idem_run_signal('r1', 'ev', '{"x": 1}');
SELECT status FROM idem_run_begin('rc', steps => ARRAY['a'], input => '{}', queue => 'q');
SELECT idem_run_cancel('rc', 'not needed');
SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES ($1, $2)', ARRAY['a', 'r1'],
	outbox_topic => 'wf', run_id => 'r1', step => 'a',
	lease_token => (SELECT lease_token FROM w1));
CREATE TABLE c1 AS SELECT event_id, lease_token, lease_until
  FROM idem_outbox_claim('wf', 10, '60 s', 'c1');
});
	is($primary->safe_psql('postgres', 'SELECT run_id FROM w1'),
		'r1', "$tag: w1 holds r1");
	is($primary->safe_psql('postgres', 'SELECT count(*) FROM c1'),
		'1', "$tag: c1 holds step a's event");
	my ($tok, $lease_until) =
	  split /\|/, $primary->safe_psql('postgres', 'SELECT lease_token, lease_until FROM w1');
	my ($event, $etok, $elease_until) =
	  split /\|/, $primary->safe_psql('postgres', 'SELECT event_id, lease_token, lease_until FROM c1');

	# w1 is inside step b's transaction when the primary dies
	my $w1 = $primary->background_psql('postgres', on_error_stop => 1);
	$w1->query_safe('BEGIN');
	$w1->query_safe(
		"SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['b', 'r1'], "
		  . "run_id => 'r1', step => 'b', lease_token => '$tok')");

	# --- hot standby -------------------------------------------------------
	# (r5 is left out: its lease runs out about now, and state is read
	# against the clock)
	my $runs_sql = q{SELECT run_id, owner, queue, status, state, next_step, steps_done,
	steps_total, attempt, holder, lease_until, next_due, awaiting, last_error
  FROM idem_runs WHERE run_id <> 'r5' ORDER BY run_id};
	my $state_sql = q{SELECT (SELECT string_agg(r::text, ';' ORDER BY run_id) FROM idem.runs r),
	(SELECT string_agg(a::text, ';' ORDER BY run_id, claim) FROM idem.run_attempts a),
	(SELECT string_agg(s::text, ';' ORDER BY run_id, event) FROM idem.run_signals s),
	(SELECT string_agg(o::text, ';' ORDER BY event_id) FROM idem.outbox o),
	(SELECT string_agg(k.key, ';' ORDER BY k.key) FROM idem.keys k),
	(SELECT string_agg(b::text, ';' ORDER BY b::text) FROM biz b)};
	my $primary_state = $primary->safe_psql('postgres', $state_sql);
	is($standby->safe_psql('postgres', $state_sql),
		$primary_state, "$tag: standby has what the primary acknowledged");

	for my $q (
		[ 'idem_runs', $runs_sql ],
		[ 'idem_run_status', "SELECT * FROM idem_run_status('r1')" ],
		[ 'idem_run_steps', "SELECT * FROM idem_run_steps('r1')" ],
		[ 'idem_run_attempts', 'SELECT * FROM idem_run_attempts ORDER BY run_id, claim' ],
		[ 'idem_audit_history', "SELECT outcome, run_id, actor FROM idem_audit_history(key => 'rc')" ],
		[ 'idem_outbox_events', 'SELECT event_id, state, attempts, lease_until FROM idem_outbox_events' ])
	{
		my ($label, $sql) = @$q;
		my $want = $primary->safe_psql('postgres', $sql);
		isnt($want, '', "$tag: $label has rows on the primary");
		is($standby->safe_psql('postgres', $sql), $want, "$tag: standby: $label answers");
	}
	like($standby->safe_psql('postgres', "SELECT state || ' ' || holder FROM idem_runs WHERE run_id = 'r1'"),
		qr/^leased w1$/, "$tag: standby: r1 is leased to w1");
	is($standby->safe_psql('postgres', 'SELECT count(*) > 0 FROM idem_stats'),
		't', "$tag: standby: idem_stats answers");

	my $ro = session($standby);
	for my $case (
		[ 'claim', "SELECT * FROM idem_run_claim('q', lease => '10 s')" ],
		[ 'claim with wait', "SELECT * FROM idem_run_claim('q', lease => '10 s', wait => '5 s')" ],
		[ 'extend', "SELECT idem_run_extend('r1', '$tok', '10 s')" ],
		[ 'release', "SELECT idem_run_release('r1', '$tok')" ],
		[ 'idem_call with a lease token',
			"SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'r1', step => 'b', lease_token => '$tok')" ],
		[ 'idem_call replaying a step',
			"SELECT * FROM idem_call(NULL, 'SELECT 1', run_id => 'r1', step => 'a', lease_token => '$tok')" ],
		[ 'idem_step',
			"BEGIN;\nSET LOCAL idem.lease_token = '$tok';\nSELECT idem_step('r1', 'b', 'SELECT 1');" ],
		[ 'step_start', "SELECT * FROM idem_step_start('r1', 'b', '$tok')" ],
		[ 'step_complete', "SELECT idem_step_complete('r1', 'b', '{}', '$tok')" ],
		[ 'step_fail', "SELECT idem_step_fail('r1', 'b', '$tok', 'boom')" ],
		[ 'await', "SELECT * FROM idem_run_await('r1', 'ev', '$tok')" ],
		[ 'sleep', "SELECT idem_run_sleep('r1', '$tok', now() + '1 min')" ],
		[ 'signal', "SELECT idem_run_signal('r1', 'c', '{}')" ],
		[ 'a signal already sent', "SELECT idem_run_signal('r1', 'ev', '{\"x\": 1}')" ],
		[ 'begin', "SELECT * FROM idem_run_begin('r9', steps => ARRAY['a'], input => '{}', queue => 'q')" ],
		[ 'begin of an existing run',
			"SELECT * FROM idem_run_begin('r1', steps => ARRAY['a', 'b', 'ev', 'c'], input => '{}', queue => 'q')" ],
		[ 'cancel', "SELECT idem_run_cancel('r1')" ],
		[ 'retry', "SELECT idem_run_retry('r1')" ],
		[ 'fail', "SELECT idem_run_fail('r1', 'x')" ],
		[ 'complete', "SELECT idem_run_complete('r1')" ],
		[ 'resume', "SELECT idem_run_resume('r1')" ],
		[ 'run purge', 'SELECT idem_run_purge(now())' ],
		[ 'queue_create', "SELECT idem_queue_create('q2')" ],
		[ 'outbox claim', "SELECT * FROM idem_outbox_claim('wf', 10, '10 s', 'c2')" ],
		[ 'outbox claim with wait', "SELECT * FROM idem_outbox_claim('wf', 10, '10 s', 'c2', wait => '5 s')" ],
		[ 'outbox wait', "SELECT idem_outbox_wait('wf', '5 s')" ],
		[ 'outbox ack', "SELECT idem_outbox_ack('$event', '$etok')" ],
		[ 'outbox ack_batch', "SELECT idem_outbox_ack_batch(ARRAY['$event']::uuid[], ARRAY['$etok']::uuid[])" ],
		[ 'outbox fail', "SELECT idem_outbox_fail('$event', '$etok', 'x')" ],
		[ 'outbox extend', "SELECT idem_outbox_extend('$event', '$etok', '10 s')" ],
		[ 'outbox release', "SELECT idem_outbox_release('$event', '$etok')" ])
	{
		my ($label, $sql) = @$case;
		refused($ro, "$tag: standby: $label", $sql, '25006', 2.5);
	}
	is($standby->safe_psql('postgres', $state_sql),
		$primary_state, "$tag: standby: nothing changed");
	is($primary->safe_psql('postgres', $state_sql),
		$primary_state, "$tag: primary: nothing changed");

	if ($preload)
	{
		# the workers start only once recovery has ended
		sleep 1;
		is($standby->safe_psql('postgres',
				"SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idem%'"),
			'0', "$tag: standby: no idem background worker runs");
	}
	my $log = slurp_file($standby->logfile);
	my @bad = grep { /\b(ERROR|FATAL|PANIC):/ && !/ client backend 25006 ERROR:/ }
	  split /\n/, $log;
	is(join("\n", @bad), '', "$tag: standby log: no error but the refusals");

	# --- failover ----------------------------------------------------------
	$primary->stop('immediate');
	bg_finish($w1);
	$standby->promote;
	ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'),
		"$tag: standby promoted");
	my $new = $standby;

	is( $new->safe_psql(
			'postgres', q{SELECT state, holder, next_step, steps_done, attempt, lease_until
  FROM idem_runs WHERE run_id = 'r1'}),
		"leased|w1|b|1|1|$lease_until",
		"$tag: r1 is as acknowledged: leased to w1 until the same time, at step b");
	is($new->safe_psql('postgres', "SELECT lease_token FROM idem.runs WHERE run_id = 'r1'"),
		$tok, "$tag: with the same token");
	is($new->safe_psql('postgres', 'SELECT string_agg(step, \',\' ORDER BY step) FROM biz'),
		'a', "$tag: step a's write is there, step b's is not");
	is($new->safe_psql('postgres',
			q{SELECT string_agg(run_id || ':' || event || '=' || payload::text, ' ' ORDER BY run_id)
  FROM idem.run_signals}),
		'r1:ev={"x": 1} r3:go={"go": true}',
		"$tag: the signals sent before the promotion are there");

	# right after the promotion: r3 (signalled) and r5 (its lease over) are
	# due, r1 (leased) is not, nor is the leased event.  The claim is made by
	# the session that was refused on the standby: it survived the promotion
	# and may write now.
	$ro->query_safe(
		q{CREATE TEMP TABLE w2 AS SELECT * FROM idem_run_claim('q', max_runs => 10, lease => '30 s', worker => 'w2')});
	is( $ro->query_safe(
			q{SELECT string_agg(concat_ws(':', run_id, attempt, started_step, started_attempts), ' ' ORDER BY run_id) FROM w2}),
		'r3:1 r5:2:x:1',
		"$tag: a claim gets the signalled run and the expired one with its started external step, not the leased one");
	my $tok5 = $new->safe_psql('postgres', 'SELECT lease_token FROM w5');
	refused($ro, "$tag: r5's old holder completing its external step",
		"SELECT idem_step_complete('r5', 'x', '{}', '$tok5')", 'ID412');
	is( $ro->query_safe(
			q{SELECT s.step_key || ' ' || s.attempt FROM w2, idem_step_start('r5', 'x', w2.lease_token) s WHERE w2.run_id = 'r5';
SELECT idem_step_complete('r5', 'x', '{"ok": 1}', lease_token => (SELECT lease_token FROM w2 WHERE run_id = 'r5'));
SELECT string_agg(claim || ':' || worker || ':' || outcome, ' ' ORDER BY claim) FROM idem_run_attempts WHERE run_id = 'r5'}),
		"idem.step:r5:x 2\n{\"ok\": 1}\n1:w5:lease_expired 2:w2:completed",
		"$tag: r5's external step is started again under the same key and completes");
	$ro->quit;
	is($new->safe_psql('postgres', "SELECT count(*) FROM idem_outbox_claim('wf', 10, '30 s', 'c2')"),
		'0', "$tag: the leased event is not redelivered while its lease holds");

	# the old holder, reconnected: step a replays, step b executes, and it
	# may extend its lease (here to 1 s, to let it run out)
	is( $new->safe_psql(
			'postgres',
			"SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['a', 'r1'], "
			  . "run_id => 'r1', step => 'a', lease_token => '$tok');\n"
			  . "SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['b', 'r1'], "
			  . "run_id => 'r1', step => 'b', lease_token => '$tok');\n"
			  . "SELECT idem_run_extend('r1', '$tok', '1 s') > now();"),
		"t\nf\nt",
		"$tag: the old holder goes on with its token on the new primary");
	# the old consumer too: its lease holds, it may extend it
	my $elease2 = $new->safe_psql('postgres', "SELECT idem_outbox_extend('$event', '$etok', '1 s')");
	isnt($elease2, '', "$tag: the old consumer extends its lease on the new primary");
	my $rlease2 = $new->safe_psql('postgres', "SELECT lease_until FROM idem_runs WHERE run_id = 'r1'");

	# after the lease: another worker takes r1 over, attempt 2
	my $claimed = $new->safe_psql(
		'postgres', qq{SELECT run_id, attempt, next_step, results::text, lease_token,
	clock_timestamp() >= '$rlease2'
  FROM idem_run_claim('q', max_runs => 10, lease => '30 s', worker => 'w2', wait => '20 s')});
	my ($run, $attempt, $next, $results, $tok2, $after) = split /\|/, $claimed;
	is("$run $attempt $next $after", 'r1 2 ev t',
		"$tag: after the lease another worker takes r1 over, attempt 2 at step ev");
	is($new->safe_psql('postgres', "SELECT string_agg(k, ',' ORDER BY k) FROM jsonb_object_keys('$results') k"),
		'a,b', "$tag: with steps a and b's results");

	my $old = session($new);
	refused($old, "$tag: the old holder's await", "SELECT * FROM idem_run_await('r1', 'ev', '$tok')",
		'ID412');
	refused($old, "$tag: the old holder's step",
		"SELECT * FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['c', 'r1'], "
		  . "run_id => 'r1', step => 'c', lease_token => '$tok')",
		'ID412');

	# the new holder runs the run from the start: a and b replay
	is( $new->safe_psql(
			'postgres',
			"SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['a', 'r1'], "
			  . "run_id => 'r1', step => 'a', lease_token => '$tok2');\n"
			  . "SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['b', 'r1'], "
			  . "run_id => 'r1', step => 'b', lease_token => '$tok2');\n"
			  . "SELECT state || ' ' || payload::text FROM idem_run_await('r1', 'ev', '$tok2');\n"
			  . "SELECT replayed FROM idem_call(NULL, 'INSERT INTO biz VALUES (\$1, \$2)', ARRAY['c', 'r1'], "
			  . "run_id => 'r1', step => 'c', lease_token => '$tok2');"),
		"t\nt\nsignalled {\"x\": 1}\nf",
		"$tag: the new holder's steps a and b replay, the signal is there, c executes");
	is($new->safe_psql('postgres', q{SELECT string_agg(step || '=' || n, ' ' ORDER BY step)
  FROM (SELECT step, count(*) AS n FROM biz GROUP BY step) s}),
		'a=1 b=1 c=1', "$tag: each step's write happened once");
	is( $new->safe_psql(
			'postgres', q{SELECT string_agg(claim || ':' || worker || ':' || step || ':' || outcome, ' ' ORDER BY claim)
  FROM idem_run_attempts WHERE run_id = 'r1'}),
		'1:w1:a:lease_expired 2:w2:ev:completed',
		"$tag: the attempt cut by the failover is on record, ended by its expired lease");
	is($new->safe_psql('postgres', "SELECT status FROM idem_runs WHERE run_id = 'r1'"),
		'completed', "$tag: r1 completed");

	# the event: redelivered once the extended lease is over, attempt 2
	my $re = $new->safe_psql(
		'postgres', qq{SELECT event_id, attempt, clock_timestamp() >= '$elease2', lease_token
  FROM idem_outbox_claim('wf', 10, '30 s', 'c2', wait => '20 s')});
	my ($event2, $eattempt, $eafter, $etok2) = split /\|/, $re;
	is("$event2 $eattempt $eafter", "$event 2 t",
		"$tag: the event leased on the old primary is redelivered after its lease, attempt 2");
	refused($old, "$tag: the old consumer's ack", "SELECT idem_outbox_ack('$event', '$etok')", 'ID412');
	$new->safe_psql('postgres', "SELECT idem_outbox_ack('$event', '$etok2')");
	is($new->safe_psql('postgres', "SELECT count(*) FROM idem.outbox WHERE event_id = '$event'"),
		'0', "$tag: the new consumer's ack delivers it");

	if ($preload)
	{
		ok( $new->poll_query_until(
				'postgres', "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'idem launcher'"),
			"$tag: the launcher runs on the new primary");
		$new->safe_psql('postgres', "SELECT replayed FROM idem_call('short', 'SELECT 1', ttl => '1 s')");
		ok($new->poll_query_until('postgres', "SELECT count(*) = 0 FROM idem.keys WHERE key = 'short'"),
			"$tag: the purge worker purges on the new primary");
	}
	$old->quit;
	$new->stop;
	return;
}

scenario(0);
scenario(1);

done_testing();
