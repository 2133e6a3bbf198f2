
# Copyright (c) 2026, idem authors

# An agent runs the returns workflow (check inventory, create a label at a
# carrier outside the database, refund, notify through the outbox) and its
# backend is killed with SIGKILL inside each step in turn: the server
# crashes and recovers.  The agent then re-runs the whole sequence from the
# start.  Each run must end completed with every step executed exactly
# once: one inventory check, one label at the carrier (which deduplicates by
# idem_step_key, as a real carrier does by Idempotency-Key), one refund, one
# notification event.  A last re-run replays everything and adds nothing.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('runcrash');
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->start;
$node->safe_psql(
	'postgres', q{
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('notifications');
CREATE TABLE effects (id serial PRIMARY KEY, run_id text NOT NULL, step text NOT NULL);
CREATE TABLE carrier_attempts (id serial PRIMARY KEY, idem_key text NOT NULL);
CREATE TABLE carrier_labels (idem_key text PRIMARY KEY, label text NOT NULL);
});

my @steps = qw(check_inventory create_label refund notify);

# One step's business statement: it records its effect, then sleeps for
# test.sleep_<step> seconds (unset: not at all), so the backend can be
# killed between the write and the commit.  The sleep is a setting, so the
# re-run sends the very same request.
sub step_sql
{
	my ($run, $step) = @_;
	my $sql =
	    q{INSERT INTO effects (run_id, step) VALUES ($1, $2) RETURNING id, }
	  . qq{(SELECT 0 FROM pg_sleep(current_setting('test.sleep_$step', true)::float8)) AS slept};
	return "SELECT idem_step('$run', '$step', \$q\$$sql\$q\$, '$run'::text, '$step'::text);\n";
}

# The agent's whole sequence, as psql input.  create_label, unless the run
# says it is done, calls the carrier with the step's key and records the
# label; the sleep sits between the carrier's answer and the record.
sub agent_script
{
	my ($run) = @_;
	my $s =
	    "SELECT status FROM idem_run_begin('$run', "
	  . "steps => ARRAY['check_inventory', 'create_label', 'refund', 'notify'], "
	  . "input => '{\"return_id\": \"$run\", \"amount\": 25.00}');\n";
	$s .= step_sql($run, 'check_inventory');
	$s .= "SELECT idem_step_key('$run', 'create_label') AS label_key \\gset\n";
	$s .=
	    "SELECT state = 'completed' AS label_done FROM idem_run_steps('$run') "
	  . "WHERE step = 'create_label' \\gset\n";
	$s .= "\\if :label_done\n";
	$s .= "SELECT response FROM idem_run_steps('$run') WHERE step = 'create_label';\n";
	$s .= "\\else\n";
	$s .= "INSERT INTO carrier_attempts (idem_key) VALUES (:'label_key');\n";
	$s .=
	    "INSERT INTO carrier_labels (idem_key, label) VALUES (:'label_key', 'LB-$run') "
	  . "ON CONFLICT (idem_key) DO NOTHING;\n";
	$s .=
	  "SELECT pg_sleep(current_setting('test.sleep_create_label', true)::float8);\n";
	$s .=
	    "SELECT idem_step_complete('$run', 'create_label', "
	  . "(SELECT jsonb_build_object('label_id', label) FROM carrier_labels WHERE idem_key = :'label_key'));\n";
	$s .= "\\endif\n";
	$s .= step_sql($run, 'refund');
	$s .= "SET idem.outbox_topic = 'notifications';\n";
	$s .= step_sql($run, 'notify');
	$s .= "RESET idem.outbox_topic;\n";
	return $s;
}

sub run_state
{
	my ($run) = @_;
	return $node->safe_psql(
		'postgres', qq{
SELECT (SELECT string_agg(step || '=' || n, ' ' ORDER BY step)
          FROM (SELECT step, count(*) AS n FROM effects WHERE run_id = '$run' GROUP BY step) e)
    || ' | labels=' || (SELECT count(*) FROM carrier_labels WHERE label = 'LB-$run')
    || ' | events=' || (SELECT count(*) FROM idem.outbox WHERE key = idem_step_key('$run', 'notify'))
    || ' | ' || (SELECT status || ' ' || steps_done FROM idem_run_status('$run'))});
}

my $expected_done =
  'check_inventory=1 notify=1 refund=1 | labels=1 | events=1 | completed 4';

foreach my $crash_step (@steps)
{
	my $run = "ret-$crash_step";

	my $agent = $node->background_psql('postgres', on_error_stop => 1);
	my $pid = $agent->query_safe('SELECT pg_backend_pid()');
	$agent->query_safe("SET test.sleep_$crash_step = 600");
	$agent->query_until(qr/started/, "\\echo started\n" . agent_script($run));
	wait_for_backend($node, $pid, "wait_event = 'PgSleep'");

	my $logstart = -s $node->logfile;
	ok(kill('KILL', $pid), "$crash_step: SIGKILL the agent's backend inside the step");
	bg_finish($agent);
	$node->wait_for_log(qr/all server processes terminated; reinitializing/,
		$logstart);
	ok($node->poll_query_until('postgres', 'SELECT 1', '1'),
		"$crash_step: server accepts connections again");

	# what the crash left: the steps before it, nothing of it
	my $before = $node->safe_psql('postgres',
		"SELECT cardinality(done_steps) FROM idem.runs WHERE run_id = '$run'");
	my $index = 0;
	$index++ while $steps[$index] ne $crash_step;
	is($before, $index,
		"$crash_step: the $index steps before it survived, the killed one did not");

	# the restarted agent re-runs the whole sequence
	$node->safe_psql('postgres', agent_script($run));
	is(run_state($run), $expected_done,
		"$crash_step: after the re-run every step executed exactly once");

	my $attempts = $node->safe_psql('postgres',
		"SELECT count(*) FROM carrier_attempts WHERE idem_key = idem_step_key('$run', 'create_label')");
	is( $attempts,
		$crash_step eq 'create_label' ? 2 : 1,
		"$crash_step: the carrier was called "
		  . ($crash_step eq 'create_label' ? 'again with the same key' : 'once'));

	# one more re-run replays everything and adds nothing
	$node->safe_psql('postgres', agent_script($run));
	is(run_state($run), $expected_done, "$crash_step: a further re-run adds nothing");

	# attempts: executions and committed replays; the killed attempt left
	# none, and the label step, read back instead of redone, has one
	my $want = join(' ',
		map { $steps[$_] eq 'create_label' ? 1 : $_ < $index ? 3 : 2 } 0 .. $#steps);
	is( $node->safe_psql(
			'postgres',
			"SELECT string_agg(attempts::text, ' ' ORDER BY ordinal) FROM idem_run_steps('$run')"
		),
		$want,
		"$crash_step: attempts count executions and replays, not the killed attempt");
}

$node->stop;
done_testing();
