
# Copyright (c) 2026, idem authors

# Backup: pg_dump of a database using idem, restored with pg_restore.
#
# idem.keys and idem.outbox are extension configuration tables
# (pg_extension_config_dump), so pg_dump writes their rows and the restore
# re-creates the extension (empty) and then loads them.
#
# 1. Restored into a fresh database of the same cluster: key records and
#    outbox rows are identical; every key replays its response (also keys
#    written by an ordinary role); a different request under an old key is
#    still rejected; an expired key still counts as absent; new keys get
#    fresh ids from the restored sequences.
#    A workflow run (idem.runs is a configuration table
#    too) resumes where it stopped: its completed step replays, the next one
#    executes and completes it.  idem_key() and idem_state_hash() give the
#    same strings as in the source, also for values of types the restore
#    re-creates under new OIDs.  A queue's run leased for an hour stays
#    leased (a claim takes only the queue's other run, whose signal stored
#    before the dump is received); once its lease is over it is claimed
#    again, its completed step replays and the next executes.
# 2. Restored into a fresh cluster (roles from pg_dumpall --globals-only,
#    so they get new OIDs there): keys written by the bootstrap superuser
#    (always OID 10) replay, and keys written by an ordinary role replay for
#    that role and no other: idem.keys.owner is a regrole, which pg_dump
#    writes as the role's name, so the restore maps it to the new OID; so
#    do a queue's role lists (regrole[]).

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $tmp = $PostgreSQL::Test::Utils::tmp_check;

my $node = idem_node('source');
$node->start;
# Role zed is created before app here; pg_dumpall --globals-only creates
# them in name order, so in a fresh cluster they swap OIDs.
$node->safe_psql('postgres', 'CREATE ROLE zed LOGIN; CREATE ROLE app LOGIN');
idem_setup_db($node, 'src');
$node->safe_psql('src',
	'GRANT INSERT, SELECT ON biz TO app, zed; GRANT USAGE ON SEQUENCE biz_id_seq TO app, zed');
$node->safe_psql('src',
	"SELECT idem_outbox_grant('orders', 'app', 'publish'), idem_outbox_grant('orders', 'zed', 'publish')");

sub call
{
	my ($key, $n) = @_;
	$n //= 1;
	return
	    "SELECT left(replayed::text, 1) || '|' || response || '|' || first_executed_at "
	  . "FROM idem_execute_ex('$key', '$IdemTAP::biz_sql', '$key'::text, 0, $n);\n";
}

my $sql = "SET idem.outbox_topic = 'orders';\n";
$sql .= call("su-$_") for 1 .. 5;
$sql .= "SET ROLE app;\n";
$sql .= call("app-$_") for 1 .. 5;
$sql .= "RESET ROLE;\nSET idem.ttl = 1;\n" . call('exp-1');
$node->safe_psql('src', $sql);

# a run of app's, stopped after its first step; derived keys of typed values
$node->safe_psql(
	'src', q{
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE DOMAIN cents AS bigint CHECK (VALUE >= 0);
CREATE TABLE claims (id int PRIMARY KEY, m mood, c cents, note jsonb, at timestamptz);
INSERT INTO claims VALUES (42, 'happy', 2500, '{"b": 1, "a": [1, 2]}', '2026-12-01 10:00+02');
CREATE TABLE shipped (id serial PRIMARY KEY, run text NOT NULL, step text NOT NULL);
GRANT INSERT, SELECT ON shipped TO app; GRANT USAGE ON SEQUENCE shipped_id_seq TO app;
GRANT SELECT ON claims TO app;
SET ROLE app;
SELECT status FROM idem_run_begin('run-1', steps => ARRAY['pack', 'ship']);
SELECT idem_step('run-1', 'pack', 'INSERT INTO shipped (run, step) VALUES ($1, $2) RETURNING id, step', 'run-1', 'pack');
});
# a queue whose role lists name app and zed; a run of app's leased to zed
# for an hour after its first step, and another with a signal stored
# before any wait for it
$node->safe_psql(
	'src', q{
CREATE TABLE dispatched (id serial PRIMARY KEY, run text NOT NULL, step text NOT NULL);
GRANT INSERT, SELECT ON dispatched TO zed; GRANT USAGE ON SEQUENCE dispatched_id_seq TO zed;
SELECT idem_queue_create('dispatch', producers => '{app}', workers => '{zed}', signallers => '{app}');
SET ROLE app;
SELECT status FROM idem_run_begin('qrun-1', steps => ARRAY['pack', 'ship'], queue => 'dispatch');
SET ROLE zed;
SELECT lease_token AS tok FROM idem_run_claim('dispatch', 1, '1 hour', 'before dump') \gset
SELECT (idem_call(NULL, 'INSERT INTO dispatched (run, step) VALUES ($1, $2) RETURNING step',
	ARRAY['qrun-1', 'pack'], run_id => 'qrun-1', step => 'pack', lease_token => :'tok')).replayed;
SET ROLE app;
SELECT status FROM idem_run_begin('qrun-2', steps => ARRAY['approve', 'ship'], queue => 'dispatch');
SELECT idem_run_signal('qrun-2', 'approve', '{"by": "boss"}');
});
my $derived_sql = q{
SELECT idem_key('adjust', c.id, c.m, c.c, c.at, idem_state_hash(c)) FROM claims c;
SELECT idem_state_hash(c.m) || ' ' || idem_state_hash(c.c) FROM claims c;
};
my $src_derived = $node->safe_psql('src', $derived_sql);
ok( $node->poll_query_until(
		'src', "SELECT expires_at <= now() FROM idem.keys WHERE key = 'exp-1'"),
	'exp-1 has expired');

my $full_sql = q{
SELECT key, fingerprint, response, created_at, expires_at FROM idem.keys ORDER BY key;
SELECT event_id, key, topic, payload, created_at FROM idem.outbox ORDER BY event_id;
SELECT * FROM biz ORDER BY id;
};
my $owner_sql = q{
SELECT key, owner::regrole FROM idem.keys ORDER BY key;
SELECT event_id, owner::regrole FROM idem.outbox ORDER BY event_id;
};
my $src_state = $node->safe_psql('src', $full_sql);
my $src_owners = $node->safe_psql('src', $owner_sql);
my %src_keys =
  query_map($node, 'src', "SELECT key, response::text || '|' || created_at FROM idem.keys");
is(scalar(keys %src_keys), 13, 'source has 13 key records (two of them steps)');

$node->command_ok(
	[ 'pg_dump', '-Fc', '-f', "$tmp/src.dump", '-d', 'src' ],
	'pg_dump of the source database');

# Replays and expiry in a restored database.
sub check_restored
{
	my ($n, $db, $label) = @_;

	is($n->safe_psql($db, $full_sql), $src_state,
		"$label: key records, outbox and business rows restored unchanged");
	is($n->safe_psql($db, $owner_sql), $src_owners,
		"$label: records belong to the same roles as before");

	for my $key (sort keys %src_keys)
	{
		next if $key eq 'exp-1' || $key =~ /^idem\.step:/;
		my $setrole = $key =~ /^app-/ ? "SET ROLE app;\n" : '';
		my ($ret, $out, $err) = $n->psql($db, $setrole . call($key));
		is($out, "t|$src_keys{$key}",
			"$label: $key replays its response and first execution time")
		  or diag $err;
	}

	{
		# keys are per role: zed's 'app-1' is zed's own key, which executes
		# (rolled back here) and never serves app's response
		my ($ret, $out, $err) = $n->psql($db,
			"BEGIN;\nSET ROLE zed;\n" . call('app-1') . "ROLLBACK;\n");
		like($out, qr/^f\|/,
			"$label: another role's same key text is its own key and executes");
		isnt($out, "t|$src_keys{'app-1'}",
			"$label: another role never gets app's response");
	}

	my ($ret, $out, $err) = $n->psql($db,
		"\\set VERBOSITY verbose\n" . call('su-1', 2));
	like($err, qr/ERROR:  ID422:/,
		"$label: a different request under a restored key is rejected");

	$out = $n->safe_psql($db, "SET idem.outbox_topic = 'orders';\n" . call('exp-1'));
	like($out, qr/^f\|/, "$label: the expired key counts as absent and executes");
	is($n->safe_psql($db, "SELECT count(*) FROM biz WHERE key = 'exp-1'"),
		'2', "$label: exp-1 now has its old and its new business row");

	$out = $n->safe_psql($db, "SET idem.outbox_topic = 'orders';\n" . call('new-1'));
	like($out, qr/^f\|/, "$label: a new key executes");
	is( $n->safe_psql(
			$db,
			"SELECT count(*) FROM biz WHERE id = (SELECT max(id) FROM biz) AND key = 'new-1'"
		),
		'1',
		"$label: with an id after every restored one");
	is( $n->safe_psql(
			$db,
			"SELECT (SELECT count(*) FROM idem.keys), (SELECT count(*) FROM idem.outbox), (SELECT count(*) FROM biz)"
		),
		'14|13|13',
		"$label: 14 key records, the 11 restored outbox rows plus 2, 13 business rows"
	);

	is($n->safe_psql($db, $derived_sql), $src_derived,
		"$label: idem_key and idem_state_hash give the same strings as before");
	my $step_sql =
	  q{SELECT idem_step('run-1', '%s', 'INSERT INTO shipped (run, step) VALUES ($1, $2) RETURNING id, step', 'run-1', '%s')};
	is( $n->safe_psql($db,
			"SET ROLE app;\nSELECT status || ' ' || next_step FROM idem_run_status('run-1')"),
		'running ship', "$label: the run is where it stopped");
	$n->safe_psql($db, "SET ROLE app;\n" . sprintf($step_sql, 'pack', 'pack'));
	$n->safe_psql($db, "SET ROLE app;\n" . sprintf($step_sql, 'ship', 'ship'));
	# the queue, its leased run and its stored signal
	is( $n->safe_psql($db,
			"SELECT producers::text || ' ' || workers::text || ' ' || signallers::text FROM idem.queues WHERE queue = 'dispatch'"),
		'{app} {zed} {app}', "$label: the queue's lists name the same roles");
	is( $n->safe_psql(
			$db,
			"SET ROLE zed;\nSELECT run_id, lease_token AS tok FROM idem_run_claim('dispatch', 10, '1 min', 'after restore') \\gset\n"
			  . "SELECT :'run_id' || ' ' || state || ' ' || payload FROM idem_run_await(:'run_id', 'approve', :'tok')"),
		'qrun-2 signalled {"by": "boss"}',
		"$label: the leased run stays leased; the other is claimed, and its stored signal received");
	$n->safe_psql($db,
		"UPDATE idem.runs SET due_at = now() - interval '1 s' WHERE run_id = 'qrun-1'");
	my $qstep =
	  q{SELECT (idem_call(NULL, 'INSERT INTO dispatched (run, step) VALUES ($1, $2) RETURNING step', ARRAY['qrun-1', '%s'], run_id => 'qrun-1', step => '%s', lease_token => :'tok')).replayed;};
	is( $n->safe_psql(
			$db,
			"SET ROLE zed;\nSELECT lease_token AS tok FROM idem_run_claim('dispatch', 1, '1 min', 'after lease') \\gset\n"
			  . sprintf($qstep, 'pack', 'pack') . "\n"
			  . sprintf($qstep, 'ship', 'ship') . "\n"
			  . "SELECT string_agg(step, ',' ORDER BY id) FROM dispatched"),
		"t\nf\npack,ship",
		"$label: after its lease the run is claimed again, its completed step replays, the next executes"
	);
	is( $n->safe_psql(
			$db,
			"SET ROLE app;\nSELECT status FROM idem_run_status('run-1');\n"
			  . "SELECT string_agg(step, ',' ORDER BY id) FROM shipped"),
		"completed\npack,ship",
		"$label: the completed step replayed, the next executed and completed the run");
}

########################################################################
# 1. Same cluster, fresh database.
########################################################################

$node->safe_psql('postgres', 'CREATE DATABASE dst');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', 'dst', "$tmp/src.dump" ],
	'pg_restore into a fresh database');
check_restored($node, 'dst', 'same cluster');

########################################################################
# 2. Fresh cluster.
########################################################################

$node->command_ok(
	[ 'pg_dumpall', '--globals-only', '-f', "$tmp/globals.sql" ],
	'pg_dumpall --globals-only');
my $fresh = idem_node('fresh');
$fresh->start;
# The bootstrap superuser exists already; the globals script's CREATE ROLE
# for it fails harmlessly, so run it without ON_ERROR_STOP.
$fresh->psql('postgres', slurp_file("$tmp/globals.sql"), on_error_stop => 0);
$fresh->safe_psql('postgres', 'CREATE DATABASE dst');
$fresh->command_ok([ 'pg_restore', '--exit-on-error', '-d', 'dst', "$tmp/src.dump" ],
	'pg_restore into a fresh cluster');
note 'role app has OID '
  . $node->safe_psql('postgres', "SELECT 'app'::regrole::oid")
  . ' in the source cluster and '
  . $fresh->safe_psql('postgres', "SELECT 'app'::regrole::oid")
  . ' in the fresh one';
check_restored($fresh, 'dst', 'fresh cluster');

$fresh->stop;
$node->stop;
done_testing();
