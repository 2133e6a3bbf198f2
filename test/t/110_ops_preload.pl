
# Copyright (c) 2026, idem authors

# Operations with shared_preload_libraries = 'idem' (issue 11).
#
# 1. idem_stats counts every outcome exactly: executions, replays,
#    mismatches, in-progress rejections (ID409, and ID508 of a nested call),
#    conflicts, lock waits (and their time), business errors;
#    idem_stats_reset() zeroes them.
# 2. The launcher is in pg_stat_activity as "idem launcher"; its purge
#    worker removes expired keys in batches and never a live key, and shows
#    up as "idem purge worker" while it works; with idem.run_retention it
#    removes the runs finished before it and those of dropped roles.
# 3. The audit queue under concurrency: 16 clients provoking mismatches,
#    in-progress rejections, conflicts (a business statement failing with
#    40001) and business errors with idem.audit = all; the entries the
#    worker writes plus the dropped counter equal the attempts made.
# 4. kill -9 of the launcher: the server restarts it, and purging goes on.
# 5. DROP DATABASE of a database the worker purges succeeds; DROP and
#    CREATE EXTENSION are picked up at the next cycle; templates are not
#    visited, nor databases still at 1.0.
# 6. A fast shutdown stops the launcher cleanly.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $timeout = $PostgreSQL::Test::Utils::timeout_default;

my $node = idem_node('ops');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idem'
restart_after_crash = on
# delivered events stay for the purge to remove (the default deletes them)
idem.outbox_keep_delivered = on
idem.purge_interval = 1
idem.purge_batch_size = 1000
idem.audit_queue_size = 64
idem.stats_max_databases = 2
idem.stats_max_roles = 3
});
$node->start;
idem_setup_db($node, 'postgres');

sub stats
{
	my ($db, $cols) = @_;
	return $node->safe_psql($db,
		"SELECT $cols FROM idem_stats WHERE datname = current_database()");
}

########################################################################
# 1. Counters.
########################################################################

$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
is(stats('postgres', 'executions, replays, mismatches, errors'),
	'0|0|0|0', 'counters start at zero after a reset');

my $pay = q{'INSERT INTO biz (key, client, n) VALUES ($1, 0, $2) RETURNING id'};
$node->safe_psql('postgres', "SELECT idem_execute('s-1', $pay, 's-1', 1)");
$node->safe_psql('postgres', "SELECT idem_execute('s-1', $pay, 's-1', 1)")
  for 1 .. 3;
$node->psql('postgres', "SELECT idem_execute('s-1', $pay, 's-1', 2)") for 1 .. 2;
$node->psql('postgres', "SELECT idem_execute('s-err', 'SELECT 1/0 AS x')");

# a wait: s-2 held by an open transaction, a second caller waits for it
my $holder = $node->background_psql('postgres', on_error_stop => 0);
$holder->query_safe('BEGIN');
$holder->query_safe("SELECT idem_execute('s-2', $pay, 's-2', 1)");
my $waiter = $node->background_psql('postgres', on_error_stop => 0);
$waiter->query_until(qr/started/,
	"\\echo started\nSELECT idem_execute('s-2', $pay, 's-2', 1);\n");
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
  or die 'the waiter never waited';
# meanwhile a caller that will not wait gets ID409
my ($ret, $out, $err) = $node->psql('postgres',
	"SET idem.wait = off; SELECT idem_execute('s-2', $pay, 's-2', 1)");
like($err, qr/is in use by another transaction/, 'idem.wait = off: ID409');
$node->safe_psql('postgres', 'SELECT pg_sleep(0.2)');
$holder->query_safe('COMMIT');
$out = $waiter->query_until(qr/rowcount/, '');
like($out, qr/"rowcount": 1/, 'the waiter got the response once the holder committed');
$waiter->quit;

# a conflict: a REPEATABLE READ snapshot older than the record
$holder->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$holder->query_safe('SELECT count(*) FROM biz');
$node->safe_psql('postgres', "SELECT idem_execute('s-3', $pay, 's-3', 1)");
$holder->query("SELECT idem_execute('s-3', $pay, 's-3', 1)");
like($holder->{stderr}, qr/could not serialize access/, 'an old snapshot gets 40001');
$holder->query('ROLLBACK');
$holder->quit;

is( stats('postgres',
		'executions, replays, mismatches, in_progress, conflicts, errors, lock_waits'),
	'3|4|2|1|1|1|1',
	'every outcome counted once: 3 executions, 4 replays (one after the wait), 2 mismatches, 1 ID409, 1 conflict, 1 error, 1 lock wait'
);
ok(stats('postgres', 'lock_wait_time') >= 150,
	'the wait time covers the 0.2 s the holder kept the key');

$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
is(stats('postgres', 'executions + replays + mismatches + lock_waits'),
	'0', 'idem_stats_reset() zeroes the counters');

# a nested call with its own key: the inner call is refused like a held key
# (in_progress, as ID409), the outer one fails with its statement's error
# (errors); neither is a sequencing error
$node->psql('postgres',
	q{SELECT idem_execute('nest-1', $$SELECT idem_execute('nest-1', 'SELECT 1')$$)},
	stderr => \my $nest_err);
like($nest_err, qr/already being executed by an enclosing/, 'a nested call with its own key gets ID508');
is(stats('postgres', 'in_progress, errors, sequencing_errors'),
	'1|1|0', 'ID508 counts once under in_progress, the outer call once under errors');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');

# per role: each call counts for its role, the database's row for all of
# them; roles beyond idem.stats_max_roles (3 pairs: postgres was counted
# above) share the overflow row
$node->safe_psql('postgres', q{
CREATE ROLE agent_a; CREATE ROLE agent_b; CREATE ROLE agent_c; CREATE ROLE agent_d;
GRANT INSERT, SELECT ON biz TO agent_a, agent_b, agent_c, agent_d;
GRANT USAGE ON SEQUENCE biz_id_seq TO agent_a, agent_b, agent_c, agent_d;
});
$node->safe_psql('postgres', qq{
SET ROLE agent_a;
SELECT idem_execute('r-a', $pay, 'r-a', 1);
SELECT idem_execute('r-a', $pay, 'r-a', 1);
SELECT idem_execute('r-a', $pay, 'r-a', 1);
SET ROLE agent_b;
SELECT idem_execute('r-b', $pay, 'r-b', 1);
SET ROLE agent_c;
SELECT idem_execute('r-c', $pay, 'r-c', 1);
SET ROLE agent_d;
SELECT idem_execute('r-d', $pay, 'r-d', 1);
SELECT idem_execute('r-d', $pay, 'r-d', 1);
});
is( $node->safe_psql('postgres', q{
		SELECT string_agg(coalesce(rolname, '(overflow)') || ':' || executions || '/' || replays, ' '
						  ORDER BY rolname NULLS LAST)
		  FROM idem_stats_roles WHERE executions + replays > 0}),
	'agent_a:1/2 agent_b:1/0 (overflow):2/1',
	'idem_stats_roles: each role its own calls, the pairs beyond idem.stats_max_roles in the overflow row');
is(stats('postgres', 'executions, replays'), '4|3',
	'and the database row counts every role');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
is( $node->safe_psql('postgres',
		'SELECT sum(executions + replays) FROM idem_stats_roles'),
	'0', 'idem_stats_reset() zeroes the roles too');

# outbox delivery: 4 events written, claimed, 3 acked (one alone, two in a
# batch), one failed, claimed again and failed on its last attempt (dead);
# a fifth one leased on its last attempt whose lease runs out (dead at the
# next claim); the 3 delivered ones purged
$node->safe_psql('postgres', q{
SELECT idem_outbox_create_topic('stats', publishers => '{postgres}', consumers => '{postgres}');
SET idem.outbox_topic = 'stats';
SELECT idem_execute('ob-' || i, 'SELECT $1::int AS i', i) FROM generate_series(1, 4) i;
});
is(stats('postgres', 'outbox_written'), '4', 'outbox: 4 events written');
$node->safe_psql('postgres', q{
SET idem.outbox_max_attempts = 2;
CREATE TEMP TABLE c AS SELECT * FROM idem_outbox_claim('stats', max_events => 10, lease => '1 min') ORDER BY key;
SELECT idem_outbox_ack(event_id, lease_token) FROM c WHERE key = 'ob-1';
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(lease_token)) FROM c WHERE key IN ('ob-2', 'ob-3');
SELECT idem_outbox_fail(event_id, lease_token, 'first') FROM c WHERE key = 'ob-4';
UPDATE idem.outbox SET next_attempt_at = '-infinity' WHERE key = 'ob-4';
SELECT idem_outbox_fail(event_id, lease_token, 'last')
  FROM idem_outbox_claim('stats', max_events => 10, lease => '1 min');
});
is(stats('postgres', 'outbox_claimed, outbox_acked, outbox_failed, outbox_dead'),
	'5|3|1|1', 'outbox: 5 claims, 3 acks, 1 failure, 1 dead letter after the last attempt');
$node->safe_psql('postgres', q{
SET idem.outbox_topic = 'stats';
SELECT idem_execute('ob-5', 'SELECT 5 AS i');
});
$node->safe_psql('postgres', q{
SET idem.outbox_max_attempts = 1;
SELECT count(*) FROM idem_outbox_claim('stats', max_events => 10, lease => '10 ms');
SELECT pg_sleep(0.1);
SELECT count(*) FROM idem_outbox_claim('stats', max_events => 10, lease => '10 ms');
});
is(stats('postgres', 'outbox_claimed, outbox_dead'), '6|2',
	'outbox: a claim that finds the last lease expired counts a dead letter, not a claim');
is($node->safe_psql('postgres', "SELECT state FROM idem_outbox_events WHERE key = 'ob-5'"),
	'dead', 'and the event is dead');
$node->safe_psql('postgres', q{
SET idem.outbox_retention = 0;
SELECT idem_outbox_purge();
});
$node->poll_query_until('postgres',
	"SELECT purged_outbox_events = 3 FROM idem_stats WHERE datname = current_database()")
  or die 'purged_outbox_events never reached 3';
pass('outbox: the 3 delivered events purged are counted');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');

########################################################################
# 2. The purge worker.
########################################################################

is( $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem launcher'"),
	'1',
	'the launcher is in pg_stat_activity with its own backend_type');

my $expired = q{
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT 'old-' || g, current_user::regrole, '\x00', '{}', now() - interval '2 days', now() - interval '1 day', 2
  FROM generate_series(1, %d) g;
};
$node->safe_psql('postgres', "SET idem.ttl = '1d';\n" . call_sql("live-$_", 0, $_))
  for 1 .. 20;
$node->safe_psql('postgres', sprintf($expired, 5000));
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
  or die 'the worker did not purge';
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.keys WHERE key LIKE 'live-%'"),
	'20', 'the worker purged the 5000 expired keys and none of the 20 live ones');
ok(stats('postgres', 'purged_keys') >= 5000, 'purged keys are counted');
is( $node->safe_psql('postgres',
		'SELECT coalesce(sum(purged_keys), 0) FROM idem_stats_roles'),
	'0', "the worker's purge counts in its database's row only, no role's");

# a worker blocked on a lock another session holds shows who it is (a
# table lock: a row lock taken after the rows were committed could come
# after a cycle that already purged the row, and nothing would block)
$node->safe_psql('postgres', sprintf($expired, 10));
$holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
$holder->query_safe('LOCK TABLE idem.keys IN EXCLUSIVE MODE');
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idem purge worker' AND datname = 'postgres' AND wait_event_type = 'Lock'")
  or die 'no purge worker in pg_stat_activity';
pass('a purge worker is in pg_stat_activity as "idem purge worker", in its database');
$holder->query_safe('ROLLBACK');
$holder->quit;
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
  or die 'the worker did not finish';

# a dropped role leaves no OID in a queue's role list, nor runs, for a
# role given that OID later to inherit (test/sql/security.sql)
$node->safe_psql('postgres', q{
CREATE ROLE gone;
SELECT idem_queue_create('gone_q', workers => '{gone}');
SET ROLE gone;
SELECT idem_run_begin('gone-q-1', ARRAY['a']);
RESET ROLE;
DROP ROLE gone;
});
$node->poll_query_until('postgres',
	"SELECT cardinality(workers) = 0 FROM idem.queues WHERE queue = 'gone_q'")
  or die 'the worker left the dropped role in the queue';
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.runs WHERE run_id = 'gone-q-1'"),
	'0', "the worker took a dropped role out of a queue's workers, and removed its runs");

# audit entries past idem.audit_retention (set for the database, which the
# worker's connection picks up) and delivered outbox events past
# idem.outbox_retention go too; younger ones stay
$node->safe_psql('postgres', q{
INSERT INTO idem.audit (at, key, owner, outcome, pid)
SELECT now() - interval '2 days', 'aged-' || g, current_user::regrole, 'executed', 1
  FROM generate_series(1, 300) g;
INSERT INTO idem.audit (at, key, owner, outcome, pid)
VALUES (now(), 'young', current_user::regrole, 'executed', 1);
SELECT idem_outbox_create_topic('aged', publishers => '{postgres}', consumers => '{postgres}');
SET idem.outbox_topic = 'aged';
SELECT idem_execute('aged-' || g, 'SELECT $1::int AS g', g) FROM generate_series(1, 3) g;
});
$node->safe_psql('postgres', q{
SELECT idem_outbox_ack(event_id, lease_token) FROM idem_outbox_claim('aged', 10, '1 min');
UPDATE idem.outbox SET delivered_at = now() - interval '8 days' WHERE key IN ('aged-1', 'aged-2');
});
my $purged_before = stats('postgres', 'purged_audit_entries');
$node->safe_psql('postgres', "ALTER DATABASE postgres SET idem.audit_retention = '1d'");
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.audit WHERE key LIKE 'aged-%'")
  or die 'the worker did not purge the old audit entries';
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM idem.outbox WHERE key LIKE 'aged-%'")
  or die 'the worker did not purge the delivered outbox events';
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.audit WHERE key = 'young'"),
	'1', 'the worker purged the 300 audit entries past idem.audit_retention, not the young one');
is($node->safe_psql('postgres', "SELECT key FROM idem.outbox WHERE key LIKE 'aged-%'"),
	'aged-3', 'and the delivered events past idem.outbox_retention (7 days), not the recent one');
ok(stats('postgres', 'purged_audit_entries') - $purged_before >= 300,
	'purged audit entries are counted');
$node->safe_psql('postgres', "ALTER DATABASE postgres RESET idem.audit_retention");

# runs finished longer ago than idem.run_retention go with their steps'
# records; a running run and a younger finished one stay, and while it is
# 0 only the run of a dropped role goes (as in every cycle)
$node->safe_psql('postgres', q{
SELECT idem_run_begin('aged-run', steps => ARRAY['a']);
SELECT idem_step('aged-run', 'a', 'SELECT 1 AS one');
SELECT idem_run_begin('young-run', steps => ARRAY['a']);
SELECT idem_step('young-run', 'a', 'SELECT 1 AS one');
SELECT idem_run_begin('running-run', steps => ARRAY['a']);
UPDATE idem.runs SET finished_at = now() - interval '2 days' WHERE run_id = 'aged-run';
CREATE ROLE regress_run_gone;
SET ROLE regress_run_gone;
SELECT idem_run_begin('gone-run');
RESET ROLE;
DROP ROLE regress_run_gone;
});
# two cycles: the first one's run purge came after its key purge
for (1 .. 2)
{
	$node->safe_psql('postgres', sprintf($expired, 1));
	$node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
	  or die 'the worker did not run a cycle';
}
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.runs WHERE run_id LIKE '%-run'"),
	'3', "without idem.run_retention the worker removes only the dropped role's run");
is($node->safe_psql('postgres', "SELECT count(*) FROM idem.runs WHERE run_id = 'gone-run'"),
	'0', '... which is the one gone');
$node->safe_psql('postgres', "ALTER DATABASE postgres SET idem.run_retention = '1d'");
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.runs WHERE run_id IN ('aged-run', 'gone-run')")
  or die 'the worker did not purge the old runs';
is($node->safe_psql('postgres',
		"SELECT string_agg(run_id, ',' ORDER BY run_id) FROM idem.runs WHERE run_id LIKE '%-run'"),
	'running-run,young-run',
	'with idem.run_retention the worker removes the run finished before it, not the others');
is($node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE key = idem_step_key('aged-run', 'a')) || ','
	|| count(*) FILTER (WHERE key = idem_step_key('young-run', 'a')) FROM idem.keys}),
	'0,1', "... with its step's record");
$node->safe_psql('postgres', "ALTER DATABASE postgres RESET idem.run_retention");

########################################################################
# 3. The audit queue under concurrency.
########################################################################

$node->safe_psql('postgres',
	"ALTER SYSTEM SET idem.audit = 'all'; SELECT pg_reload_conf();");
$node->poll_query_until('postgres', "SELECT current_setting('idem.audit') = 'all'");
$node->safe_psql('postgres', "SELECT idem_execute('storm-base', 'SELECT \$1::int AS n', 0)");
# a business statement that fails as a serialization failure would
$node->safe_psql('postgres', q{
CREATE FUNCTION storm_conflict() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'simulated conflict' USING ERRCODE = '40001';
END $$;
});
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');

$holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
$holder->query_safe("SELECT idem_execute('storm-held', 'SELECT 1 AS one')");

# one of each, in order, first: nothing is dropped
$node->psql('postgres', "SET application_name = 'one-each'; SET idem.wait = off;\n"
	  . "SELECT idem_execute('storm-base', 'SELECT \$1::int AS n', 1);\n"
	  . "SELECT idem_execute('storm-held', 'SELECT 1 AS one');\n"
	  . "SELECT idem_execute('one-c', 'SELECT storm_conflict()');\n"
	  . "SELECT idem_execute('one-e', 'SELECT 1/0');\n"
	  . "SELECT idem_execute('storm-base', 'SELECT \$1::int AS n', 0);\n",
	on_error_stop => 0);
$node->poll_query_until('postgres',
	"SELECT count(*) = 5 FROM idem_audit WHERE application_name = 'one-each'")
  or die 'the worker did not write the rejected attempts';
is( $node->safe_psql('postgres',
		"SELECT string_agg(key || ':' || outcome || ':' || coalesce(sqlstate, '-') || ':' || (fingerprint IS NOT NULL), ',' ORDER BY at) FROM idem_audit WHERE application_name = 'one-each'"
	),
	'storm-base:mismatch:ID422:true,storm-held:in_progress:ID409:true,one-c:conflict:40001:true,one-e:error:22012:true,storm-base:replayed:-:true',
	'audit = all: each rejected attempt through the queue, the replay in its transaction, in order');

# a queued entry keeps a run id and step name of the longest length whole,
# multibyte characters included
$node->psql('postgres', q{
SET application_name = 'long-names';
SELECT status FROM idem_run_begin(repeat('é', 127), ARRAY['a', repeat('ß', 127)]);
SELECT idem_step(repeat('é', 127), repeat('ß', 127), 'SELECT 1');
}, on_error_stop => 0);
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM idem_audit WHERE application_name = 'long-names'")
  or die 'the worker did not write the rejected step';
is( $node->safe_psql('postgres',
		"SELECT outcome, octet_length(run_id), run_id = repeat('é', 127), step = repeat('ß', 127) FROM idem_audit_history(run_id => repeat('é', 127))"),
	'sequencing|254|t|t',
	'a queued entry keeps a 254-byte run id and step name whole');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');

my $nclients = 16;
my $per_kind = 25;
my @h;
for my $c (1 .. $nclients)
{
	my $script = "\\set ON_ERROR_STOP 0\nSET application_name = 'storm';\nSET idem.wait = off;\n";
	for my $i (1 .. $per_kind)
	{
		$script .= "SELECT idem_execute('storm-base', 'SELECT \$1::int AS n', "
		  . ($c * 1000 + $i) . ");\n";
		$script .= "SELECT idem_execute('storm-held', 'SELECT 1 AS one');\n";
		$script .= "SELECT idem_execute('storm-c-$c-$i', 'SELECT storm_conflict()');\n";
		$script .= "SELECT idem_execute('storm-e-$c-$i', 'SELECT 1/0');\n";
	}
	my ($o, $e);
	push @h,
	  IPC::Run::start(
		[ $node->installed_command('psql'), '-XAtq', '-d', $node->connstr('postgres') ],
		'<', \$script, '>', \$o, '2>', \$e, IPC::Run::timeout($timeout));
}
$_->finish for @h;
$holder->query_safe('ROLLBACK');
$holder->quit;

my $attempts = $nclients * $per_kind * 4;
is(stats('postgres', 'mismatches + in_progress + conflicts + errors'),
	$attempts, "$attempts rejected attempts counted");
is(stats('postgres', 'audit_queued + audit_dropped'),
	$attempts, 'each one queued for the audit trail or counted as dropped');
$node->poll_query_until('postgres',
	"SELECT count(*) = (SELECT audit_queued FROM idem_stats WHERE datname = current_database()) FROM idem_audit WHERE application_name = 'storm'")
  or die 'the worker did not write the queue out';
is( $node->safe_psql('postgres',
		"SELECT count(*) + (SELECT audit_dropped FROM idem_stats WHERE datname = current_database()) FROM idem_audit WHERE application_name = 'storm'"),
	$attempts,
	'audit entries of the storm + dropped = attempts');
is( $node->safe_psql('postgres',
		"SELECT count(*) FROM idem_audit WHERE application_name = 'storm' AND (outcome, sqlstate) NOT IN (('conflict', '40001'), ('error', '22012'), ('in_progress', 'ID409'), ('mismatch', 'ID422'))"),
	'0',
	'every entry says what was rejected and why');
note('audit entries dropped in the storm: '
	  . stats('postgres', 'audit_dropped'));
$node->safe_psql('postgres',
	"ALTER SYSTEM RESET idem.audit; SELECT pg_reload_conf();");

########################################################################
# 4. kill -9 of the launcher.
########################################################################

my $pid = $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem launcher'");
kill 'KILL', $pid;
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idem launcher' AND pid <> $pid")
  or die 'the launcher did not come back';
pass('after kill -9 the launcher is restarted');
$node->safe_psql('postgres', sprintf($expired, 3000));
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
  or die 'no purge after the restart';
pass('and purges again');

########################################################################
# 5. DROP DATABASE, DROP/CREATE EXTENSION.
########################################################################

idem_setup_db($node, 'other');
$node->safe_psql('other', sprintf($expired, 500));
$node->poll_query_until('other',
	"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
  or die 'the worker did not purge the other database';
pass('the worker purges every database with the extension');
# a few cycles may start while DROP DATABASE runs: it must still succeed
for my $i (1 .. 5)
{
	$node->safe_psql('postgres', "CREATE DATABASE scratch$i");
	$node->safe_psql("scratch$i", 'CREATE EXTENSION idem');
	$node->safe_psql('postgres', 'SELECT pg_sleep(0.3)');
	$node->safe_psql('postgres', "DROP DATABASE scratch$i");
}
$node->safe_psql('postgres', 'DROP DATABASE other');
pass('DROP DATABASE succeeds while the worker runs');

$node->safe_psql('postgres', 'DROP EXTENSION idem CASCADE');
$node->safe_psql('postgres', 'SELECT pg_sleep(1.5)');
$node->safe_psql('postgres', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', sprintf($expired, 200));
$node->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
  or die 'no purge after DROP/CREATE EXTENSION';
pass('after DROP and CREATE EXTENSION the worker purges the new catalog');

# Two purges of postgres seen from outside: at least one whole cycle over
# every database ran after the caller's last change.
sub two_full_cycles
{
	for my $i (1 .. 2)
	{
		$node->safe_psql('postgres', sprintf($expired, 10));
		$node->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE 'old-%'")
		  or die 'no purge cycle';
	}
	return;
}

# templates are left alone: a connection would make CREATE DATABASE fail
$node->safe_psql('template1', 'CREATE EXTENSION idem');
$node->safe_psql('template1', sprintf($expired, 10));
two_full_cycles();
is($node->safe_psql('template1', "SELECT count(*) FROM idem.keys WHERE key LIKE 'old-%'"),
	'10', 'after two full cycles the expired keys in template1 are still there');
$node->safe_psql('template1', 'DROP EXTENSION idem');

# a database still at 1.0 is left alone until it is updated
$node->safe_psql('postgres', 'CREATE DATABASE old10');
$node->safe_psql('old10', "CREATE EXTENSION idem VERSION '1.0'");
$node->safe_psql('old10', q{
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at)
SELECT 'old-' || g, current_user::regrole, '\x00', '{}', now() - interval '2 days', now() - interval '1 day'
  FROM generate_series(1, 10) g;
});
my $logpos = -s $node->logfile;
two_full_cycles();
is($node->safe_psql('old10', "SELECT count(*) FROM idem.keys"),
	'10', 'a database at 1.0 is not purged');
ok(!$node->log_contains(qr/ERROR|FATAL/, $logpos), 'nor does its visit log an error');
$node->safe_psql('old10', 'ALTER EXTENSION idem UPDATE');
$node->poll_query_until('old10', "SELECT count(*) = 0 FROM idem.keys")
  or die 'no purge after the update';
pass('after ALTER EXTENSION idem UPDATE it is');
# postgres and other took the two rows idem.stats_max_databases allows;
# other was dropped since, and the purge worker counts old10 in its row
is( $node->safe_psql('postgres',
		"SELECT string_agg(coalesce(datname, '(overflow)') || ':' || purged_keys, ',' ORDER BY dbid) FROM idem_stats WHERE dbid IS NULL OR datname = 'old10'"),
	'old10:10',
	'the purge worker counts a database beyond idem.stats_max_databases in the row of a dropped one');
$node->safe_psql('postgres', 'DROP DATABASE old10');

my $log = slurp_file($node->logfile);
ok($log !~ /PANIC|TRAP|"idem purge worker[^"]*" \(PID \d+\) (was terminated by signal|exited with exit code [2-9])/,
	'no purge worker crashed');
ok($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem launcher'}) == 1,
	'one launcher after all that');

########################################################################
# 6. Shutdown.
########################################################################

my $logstart = -s $node->logfile;
$node->stop('fast');
ok($node->log_contains(qr/database system is shut down/, $logstart),
	'a fast shutdown completes');
ok(!$node->log_contains(qr/(terminated by signal|exited with exit code [2-9])/, $logstart),
	'and the launcher exits as asked, not by a crash');
command_like([ 'pg_controldata', $node->data_dir ],
	qr/Database cluster state:\s+shut down/, 'the cluster is cleanly shut down');

done_testing();
