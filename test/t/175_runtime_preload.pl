
# Copyright (c) 2026, idem authors

# The runtime with and without shared_preload_libraries.  Every run
# function works both ways: retries, a failed run, a wait for a signal
# and the signal, an operator's cancel of a run whose lease ran out, a
# sleep and a claim that waits for it, a claim that waits and is woken by
# another session's enqueue (preloaded through shared memory, else by its
# polling).  Preloaded, idem_stats counts the claims, the lease that ran
# out, the retry, the signal and the failed run; without preloading it
# answers zeros and says why.  An outbox claim's wait works both ways too:
# it is woken by a producer's commit (through shared memory, else by its
# polling).  What needs shared memory says so (55000 with a hint):
# idem_outbox_wait().

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

for my $preload (0, 1)
{
	my $label = $preload ? 'preloaded' : 'not preloaded';
	my $node = idem_node($preload ? 'rt_preload' : 'rt_nopreload');
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idem'") if $preload;
	$node->start;
	$node->safe_psql('postgres', q{
CREATE EXTENSION idem;
SELECT idem_queue_create('q', max_attempts => 2, backoff_base => '0 s');
SELECT idem_outbox_create_topic('t');
});

	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM idem_run_begin('r1', steps => '{s}', queue => 'q') \gset
SELECT lease_token AS tok FROM idem_run_claim('q', 1, '1 min', 'w') \gset
SELECT idem_step_fail('r1', 's', :'tok', 'first') IS NOT NULL AS retried;
SELECT lease_token AS tok, attempt FROM idem_run_claim('q', 1, '1 min', 'w') \gset
SELECT :attempt || ' ' || (idem_step_fail('r1', 's', :'tok', 'second') IS NULL);
SELECT status FROM idem_run_status('r1');
}),
		"t\n2 true\nfailed",
		"$label: a failed step is retried, its last attempt fails the run");

	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM idem_run_begin('r2', steps => '{approve,ship}', queue => 'q') \gset
SELECT lease_token AS tok FROM idem_run_claim('q', 1, '1 min', 'w') \gset
SELECT state FROM idem_run_await('r2', 'approve', :'tok');
SELECT idem_run_signal('r2', 'approve', '{"ok": true}');
SELECT run_id, lease_token AS tok FROM idem_run_claim('q', 1, '1 min', 'w') \gset
SELECT :'run_id' || ' ' || state || ' ' || payload FROM idem_run_await('r2', 'approve', :'tok');
}),
		"waiting\nt\nr2 signalled {\"ok\": true}",
		"$label: a run waits for a signal, and is claimed again with it");

	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM idem_run_begin('r3', steps => '{s}', queue => 'q') \gset
SELECT run_id FROM idem_run_claim('q', 1, '1 ms', 'dies');
SELECT pg_sleep(0.05) \gset
SELECT idem_run_cancel('r3', 'stalled');
}),
		"r3\ncancelled",
		"$label: an operator cancels a run whose lease ran out");

	is( $node->safe_psql(
			'postgres', q{
SELECT status FROM idem_run_begin('r4', steps => '{s}', queue => 'q') \gset
SELECT lease_token AS tok FROM idem_run_claim('q', 1, '1 min', 'w') \gset
SELECT idem_run_sleep('r4', :'tok', clock_timestamp() + interval '0.5 s');
SELECT clock_timestamp() AS t0 \gset
SELECT run_id FROM idem_run_claim('q', 1, '1 min', 'w', wait => '10 s');
SELECT clock_timestamp() - :'t0' BETWEEN interval '0.3 s' AND interval '9 s';
}),
		"t\nr4\nt",
		"$label: a claim that waits takes the run that slept once it is due");

	# a claim waiting in another session, woken by an enqueue
	my $waiter = $node->background_psql('postgres', on_error_stop => 1);
	$waiter->query_until(qr/waiting/, q{
\echo waiting
SELECT run_id FROM idem_run_claim('q', 1, '1 min', 'w', wait => '30 s');
});
	sleep 1;
	my $t0 = time;
	$node->safe_psql('postgres',
		"SELECT status FROM idem_run_begin('r5', steps => '{s}', queue => 'q')");
	$waiter->{timeout}->start(60);
	pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/r5/);
	my $woken = time - $t0;
	like($waiter->{stdout}, qr/r5/, "$label: a waiting claim is woken by an enqueue");
	cmp_ok($woken, '<', 10, "$label: within 10 s of the enqueue (${woken} s)");
	$waiter->quit;

	my ($ret, $out, $err) = $node->psql('postgres',
		"SELECT runs_claimed || ' ' || run_lease_expiries || ' ' || run_retries || ' ' "
		  . "|| run_signals || ' ' || runs_failed FROM idem_stats WHERE datname = 'postgres'");
	if ($preload)
	{
		is($out, '8 1 1 1 1',
			"$label: idem_stats counts 8 claims, the lease that ran out, the retry, the signal, the failed run"
		);
	}
	else
	{
		is($out, '0 0 0 0 0', "$label: idem_stats answers zeros");
		like($err, qr/NOTICE:  idem is not collecting statistics.*HINT:  Add idem to shared_preload_libraries/s,
			"$label: and says it needs preloading");
	}

	($ret, $out, $err) = $node->psql('postgres',
		"SELECT count(*) FROM idem_outbox_claim('t', wait => '0.2 s')");
	is($out, '0', "$label: an outbox claim with a wait and nothing to claim returns nothing");

	# an outbox claim waiting in another session, woken by a producer's commit
	$waiter = $node->background_psql('postgres', on_error_stop => 1);
	$waiter->query_until(qr/waiting/, q{
\echo waiting
SELECT key FROM idem_outbox_claim('t', 10, '1 min', wait => '30 s');
});
	sleep 1;
	$t0 = time;
	$node->safe_psql('postgres',
		"SET idem.outbox_topic = 't'; SELECT idem_execute('ev-1', 'SELECT 1 AS n')");
	$waiter->{timeout}->start(60);
	pump_until($waiter->{run}, $waiter->{timeout}, \$waiter->{stdout}, qr/ev-1/);
	$woken = time - $t0;
	like($waiter->{stdout}, qr/ev-1/, "$label: a waiting outbox claim gets an event committed meanwhile");
	cmp_ok($woken, '<', 10, "$label: within 10 s of its commit (${woken} s)");
	$waiter->quit;

	($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSELECT idem_outbox_wait('t', '0.2 s')");
	if ($preload)
	{
		is($out, 'f', "$label: idem_outbox_wait() waits");
	}
	else
	{
		like($err, qr/ERROR:  55000: idem_outbox_wait\(\) needs shared memory.*HINT:  Add idem to shared_preload_libraries/s,
			"$label: idem_outbox_wait() says it needs preloading (55000)");
	}
	$node->stop;
}

done_testing();
