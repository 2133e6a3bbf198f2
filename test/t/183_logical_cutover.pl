
# Copyright (c) 2026, idem authors

# Moving to another server by logical replication (a blue-green cutover):
# a publisher FOR ALL TABLES, a subscriber with the same schema made by
# hand (CREATE EXTENSION idem, the business table), the same role names
# with other OIDs (regrole columns travel as names in the text protocol).
#
# While subscribed:
# - the apply worker applies every idem table without an error, the
#   table sync too (idem.lock_seed, the per-database secret, keeps the
#   subscriber's own row: a second row would stop every idem call);
# - the registries' triggers fire in the apply worker: a queue's revoke
#   replicated reaches a subscriber session that read the queue before;
# - the publisher's audit purge deletes with a publication that publishes
#   deletes (idem.audit has a replica identity), and the delete replicates;
# - a retry on the subscriber replays the replicated key.
#
# After the cutover (caught up, subscription dropped, publisher stopped):
# - every retry replays (same response, business write once), from the
#   same role; another request under the same key is ID422;
# - the run resumes: claimed after its lease, step a replays, the
#   external step started on the publisher is claimed as started (attempt
#   2), the signal is there, the run completes with each write once;
# - the pending outbox event and the one whose lease ran out are
#   delivered once, the delivered one never;
# - stats are the subscriber's own, the purge worker purges;
# - idem uses no sequence; the business table's sequence is set by hand.
#
# A subscription with binary = true: the apply worker sends the regrole
# columns as OIDs, so a key written after the sync belongs to whichever
# role has the publisher's OID of app on the subscriber (filler, here);
# from PostgreSQL 16 the table sync copies in binary too, so the synced
# keys go the same way (on 15 it copies text: names).  Documented, never
# binary with idem's tables.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = idem_node('pub', allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', "idem.audit = all\nidem.outbox_keep_delivered = on\n");
$pub->start;
my $sub = idem_node('sub');
$sub->append_conf(
	'postgresql.conf', qq(
log_line_prefix = '%m [%p] %b %e '
shared_preload_libraries = 'idem'
idem.purge_interval = 1
idem.audit = all
idem.outbox_keep_delivered = on
));
$sub->start;

sub as_app
{
	my ($node, $sql, $db) = @_;
	return $node->safe_psql($db // 'postgres', $sql, extra_params => [ '-U', 'app' ]);
}

# sql, run as app, fails with sqlstate
sub refused
{
	my ($node, $label, $sql, $sqlstate) = @_;
	my ($ret, $out, $err) = $node->psql(
		'postgres', "\\set VERBOSITY verbose\n$sql",
		extra_params => [ '-U', 'app' ]);
	like($err, qr/ERROR:  $sqlstate:/, "$label fails with $sqlstate");
	return;
}

my $schema = q{
CREATE EXTENSION idem;
CREATE TABLE biz (id serial PRIMARY KEY, what text NOT NULL);
GRANT ALL ON biz, biz_id_seq TO app;
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) TO app;
};
$pub->safe_psql('postgres', "CREATE ROLE app LOGIN;\n$schema");
# another role first: app gets another OID on the subscriber
$sub->safe_psql('postgres', "CREATE ROLE filler;\nCREATE ROLE app LOGIN;\n$schema");
my $oid_sql = "SELECT 'app'::regrole::oid";
isnt($sub->safe_psql('postgres', $oid_sql), $pub->safe_psql('postgres', $oid_sql),
	'app has another OID on the subscriber');
$sub->safe_psql('postgres', "CREATE DATABASE bin;");
$sub->safe_psql('bin', $schema);

my $ins = 'INSERT INTO biz (what) VALUES ($1) RETURNING id, what';
# before the subscription (the table sync copies it): the registries, k0
$pub->safe_psql(
	'postgres', qq{
SELECT idem_queue_create('q', producers => '{app}', workers => '{app}', signallers => '{app}');
SELECT idem_queue_create('q2', workers => '{app}');
SELECT idem_outbox_create_topic('t', publishers => '{app}', consumers => '{app}');
CREATE PUBLICATION p FOR ALL TABLES;
});
as_app($pub, "SELECT idem_execute('k0', '$ins', 'zero')");

my $connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres', "CREATE SUBSCRIPTION s CONNECTION '$connstr' PUBLICATION p");
$sub->safe_psql('bin',
	"CREATE SUBSCRIPTION sb CONNECTION '$connstr' PUBLICATION p WITH (binary = true)");
my $synced = "SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate NOT IN ('r', 's')";
ok($sub->poll_query_until('postgres', $synced), 'table sync done');
ok($sub->poll_query_until('bin', $synced), 'table sync done (binary)');

is($sub->safe_psql('postgres', 'SELECT count(*) FROM idem.lock_seed'),
	'1', 'the subscriber keeps one lock seed, its own');
isnt($sub->safe_psql('postgres', 'SELECT seed FROM idem.lock_seed'),
	$pub->safe_psql('postgres', 'SELECT seed FROM idem.lock_seed'),
	'the publisher\'s seed is not copied');

# a subscriber session that reads q2's grants (a claim that finds nothing
# writes nothing)
my $s2 = $sub->background_psql('postgres', on_error_stop => 0,
	extra_params => [ '-U', 'app' ]);
$s2->query_safe('\\set VERBOSITY verbose');
is($s2->query_safe("SELECT count(*) FROM idem_run_claim('q2', lease => '1 s')"),
	'0', 'subscriber: app may claim from q2');

# --- the workload, on the publisher, streamed by the apply worker --------
my $r1 = as_app($pub, "SELECT idem_execute('k1', '$ins', 'one')");
my $r3 = as_app($pub,
	"SELECT response FROM idem_call('k3', '$ins', ARRAY['three'], outbox_topic => 't')");
my ($e3, $etok3) = split /\|/,
  as_app($pub, "SELECT event_id, lease_token FROM idem_outbox_claim('t', 10, '30 s', 'c1')");
as_app($pub, "SELECT idem_outbox_ack('$e3', '$etok3')");
# k4's event is leased (2 s) when the publisher stops
as_app($pub, "SELECT response FROM idem_call('k4', '$ins', ARRAY['four'], outbox_topic => 't')");
is(as_app($pub, "SELECT key FROM idem_outbox_claim('t', 10, '2 s', 'c1')"),
	'k4', 'publisher: k4\'s event is leased');
my $r2 = as_app($pub,
	"SELECT response FROM idem_call('k2', '$ins', ARRAY['two'], outbox_topic => 't')");
as_app($pub,
	"SELECT idem_execute('kb', 'INSERT INTO biz (what) VALUES (\$1)', 'binary')");
# r1: step a done, external step x started, signal ev sent, lease 2 s
my $tok = as_app(
	$pub, q{
SELECT created FROM idem_run_begin('r1', steps => ARRAY['a', 'x', 'ev', 'b'],
	input => '{}', queue => 'q') \gset
SELECT lease_token FROM idem_run_claim('q', lease => '2 s', worker => 'w1')});
as_app(
	$pub, qq{
SELECT replayed FROM idem_call(NULL, '$ins', ARRAY['r1:a'], run_id => 'r1', step => 'a',
	lease_token => '$tok');
SELECT attempt FROM idem_step_start('r1', 'x', '$tok');
SELECT idem_run_signal('r1', 'ev', '{"v": 1}');
});
$pub->safe_psql('postgres', "SELECT idem_queue_revoke('q2', 'app', 'work')");
# an audit entry past its retention: the purge deletes it on the publisher
$pub->safe_psql('postgres',
	"INSERT INTO idem.audit (at, key, owner, outcome, pid) VALUES (now() - interval '2 days', 'old', 'app', 'executed', 0)"
);
my ($ret, $out, $err) = $pub->psql('postgres',
	"SET idem.audit_retention = '1d'; SELECT idem_purge_audit()");
is("$ret $out", '0 1', 'publisher: the audit purge deletes under a publication FOR ALL TABLES')
  or diag $err;

$pub->wait_for_catchup('s');
$pub->wait_for_catchup('sb');

my $state_sql = q{SELECT
	(SELECT string_agg(concat_ws(' ', owner, key, response), ';' ORDER BY key) FROM idem.keys),
	(SELECT string_agg(concat_ws(' ', owner, run_id, done_steps, started_step, started_count,
		queue_state, lease_token, due_at), ';' ORDER BY run_id) FROM idem.runs),
	(SELECT string_agg(concat_ws(' ', owner, run_id, claim, attempt, leased_by), ';') FROM idem.run_attempts),
	(SELECT string_agg(concat_ws(' ', owner, run_id, event, payload, signalled_by), ';') FROM idem.run_signals),
	(SELECT string_agg(concat_ws(' ', event_id, key, owner, state, attempts, leased_by, delivered_at), ';'
		ORDER BY event_id) FROM idem.outbox),
	(SELECT string_agg(concat_ws(' ', queue, producers, workers, signallers), ';' ORDER BY queue) FROM idem.queues),
	(SELECT string_agg(concat_ws(' ', topic, publishers, consumers), ';') FROM idem.outbox_topics),
	(SELECT string_agg(concat_ws(' ', key, owner, outcome), ';' ORDER BY at, key, outcome) FROM idem.audit),
	(SELECT string_agg(concat_ws(' ', id, what), ';' ORDER BY id) FROM biz)};
my $pub_state = $pub->safe_psql('postgres', $state_sql);
is($sub->safe_psql('postgres', $state_sql), $pub_state,
	'subscriber: every idem table as on the publisher, owners by name');
unlike($pub_state, qr/\bold\b/, 'the purged audit entry is gone on both');
like($pub_state, qr/ k3 app delivered 1 /, 'the delivered event is there, delivered');
is( $sub->safe_psql('postgres',
		"SELECT count(*) FROM idem.keys WHERE owner = 'app'::regrole AND owner::oid = ($oid_sql)"),
	$pub->safe_psql('postgres', 'SELECT count(*) FROM idem.keys'),
	'subscriber: every key\'s owner is its own OID of app');
is( $sub->safe_psql(
		'postgres', 'SELECT sum(apply_error_count + sync_error_count) FROM pg_stat_subscription_stats'),
	'0', 'no error in the apply worker or the table sync');

# the revoke of q2, replicated, reached the session that had read q2
$s2->{stderr} = '';
$s2->query("SELECT count(*) FROM idem_run_claim('q2', lease => '1 s')");
like($s2->{stderr}, qr/ERROR:  42501:/, 'subscriber: the replicated revoke is seen at once');
$s2->quit;

# a retry on the subscriber while subscribed replays what was replicated
is(as_app($sub, "SELECT replayed FROM idem_execute_ex('k1', '$ins', 'one')"),
	't', 'subscriber, while subscribed: a retry replays');

# binary = true: the apply worker sends OIDs, and the table sync too from 16
if ($sub->safe_psql('postgres', 'SHOW server_version_num') >= 160000)
{
	is($sub->safe_psql('bin', "SELECT owner::oid FROM idem.keys WHERE key = 'k0'"),
		$pub->safe_psql('postgres', $oid_sql),
		'binary subscription: a synced key\'s owner is the publisher\'s OID of app (the sync is binary from 16)');
}
else
{
	is($sub->safe_psql('bin', "SELECT owner::text FROM idem.keys WHERE key = 'k0'"),
		'app', 'binary subscription: a synced key\'s owner maps by name (the sync copies text on 15)');
}
is($sub->safe_psql('bin', "SELECT owner::oid FROM idem.keys WHERE key = 'kb'"),
	$pub->safe_psql('postgres', $oid_sql),
	'binary subscription: an applied key\'s owner is the publisher\'s OID of app (another role here)');
note 'binary subscription: kb\'s owner reads as ' . $sub->safe_psql('bin', "SELECT owner FROM idem.keys WHERE key = 'kb'");
$sub->safe_psql('bin', 'DROP SUBSCRIPTION sb');

# --- cutover -------------------------------------------------------------
$pub->safe_psql('postgres', "ALTER ROLE app NOLOGIN");
$pub->wait_for_catchup('s');
$sub->safe_psql('postgres', 'DROP SUBSCRIPTION s');
$pub->stop;
my $cutover = $sub->safe_psql('postgres', 'SELECT now()');
is( $sub->safe_psql(
		'postgres',
		"SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'idem' AND c.relkind = 'S'"
	),
	'0',
	'idem has no sequence to carry over');
# the business table's sequence is not replicated: set by hand
$sub->safe_psql('postgres', "SELECT setval('biz_id_seq', (SELECT max(id) FROM biz))");

is(as_app($sub, "SELECT idem_execute('k1', '$ins', 'one')"), $r1, 'k1 replays its response');
is(as_app($sub, "SELECT response FROM idem_call('k2', '$ins', ARRAY['two'])"),
	$r2, 'k2 (idem_call) replays its response');
is(as_app($sub, "SELECT response FROM idem_call('k3', '$ins', ARRAY['three'], outbox_topic => 't')"),
	$r3, 'k3 replays its response');
refused($sub, 'another request under k1', "SELECT idem_execute('k1', '$ins', 'uno')", 'ID422');
is($sub->safe_psql('postgres', 'SELECT string_agg(what, \',\' ORDER BY id) FROM biz'),
	'zero,one,three,four,two,binary,r1:a', 'no business write repeated');

# the run: claimed once its lease is over
my $claim = as_app($sub,
	q{SELECT concat_ws(' ', run_id, attempt, next_step, started_step, started_attempts,
	(SELECT string_agg(k, ',') FROM jsonb_object_keys(results) k)), lease_token
  FROM idem_run_claim('q', lease => '30 s', worker => 'w2', wait => '10 s')});
my ($claimed, $tok2) = split /\|/, $claim;
is($claimed, 'r1 2 x x 1 a',
	'r1 is claimed at the started external step x, step a\'s result there');
is( as_app(
		$sub, qq{
SELECT replayed FROM idem_call(NULL, '$ins', ARRAY['r1:a'], run_id => 'r1', step => 'a',
	lease_token => '$tok2');
SELECT attempt FROM idem_step_start('r1', 'x', '$tok2');
SELECT idem_step_complete('r1', 'x', '{"ok": 1}', '$tok2');
SELECT state || ' ' || payload FROM idem_run_await('r1', 'ev', '$tok2');
SELECT replayed FROM idem_call(NULL, '$ins', ARRAY['r1:b'], run_id => 'r1', step => 'b',
	lease_token => '$tok2');
SELECT status FROM idem_runs WHERE run_id = 'r1';
}),
	"t\n2\n{\"ok\": 1}\nsignalled {\"v\": 1}\nf\ncompleted",
	'r1 resumes: a replays, x is started again (attempt 2), the signal is there, b runs');
is($sub->safe_psql('postgres', "SELECT count(*) FROM biz WHERE what LIKE 'r1:%'"),
	'2', 'each step of r1 wrote once');

# the outbox: the pending event and the one whose lease ran out, once;
# the delivered one never
ok($sub->poll_query_until('postgres',
		"SELECT next_attempt_at < now() FROM idem.outbox WHERE key = 'k4'"),
	'k4\'s lease runs out');
is( as_app(
		$sub, q{
CREATE TEMP TABLE c2 AS SELECT * FROM idem_outbox_claim('t', 10, '30 s', 'c2');
SELECT string_agg(key || ':' || attempt, ',' ORDER BY key) FROM c2;
SELECT count(idem_outbox_ack(event_id, lease_token)) FROM c2;}),
	"k2:1,k4:2\n2",
	'the pending event is claimed, the leased one (attempt 2), not the delivered one');
is(as_app($sub, "SELECT count(*) FROM idem_outbox_claim('t', 10, '30 s', 'c3')"),
	'0', 'nothing else to claim');

# stats are per server, not replicated: the subscriber counts the
# executions made on it since the cutover (the run's steps), as its audit
# trail has them
is( $sub->safe_psql(
		'postgres',
		"SELECT (SELECT sum(executions) FROM idem_stats) = count(*) AND count(*) > 0 FROM idem.audit WHERE outcome = 'executed' AND at >= '$cutover'"
	),
	't',
	'subscriber stats count only what executed on it');
as_app($sub, "SELECT replayed FROM idem_call('short', 'SELECT 1', ttl => '1 s')");
ok($sub->poll_query_until('postgres', "SELECT count(*) = 0 FROM idem.keys WHERE key = 'short'"),
	'the purge worker purges on the subscriber');

my @bad = grep { /\b(ERROR|FATAL|PANIC):/ } split /\n/, slurp_file($sub->logfile);
# (DROP SUBSCRIPTION ends its workers: 57P01; from 17 the backend type
# reads "logical replication apply worker")
@bad = grep { !/ (ID422|42501) ERROR:|logical replication (apply )?worker 57P01 FATAL:/ } @bad;
is(join("\n", @bad), '', 'subscriber log: no unexpected error');

$sub->stop;
done_testing();
