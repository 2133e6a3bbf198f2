
# Copyright (c) 2026, idem authors

# The purge worker when a database or the extension goes away under it
# (shared_preload_libraries = 'idem', a cycle a second).  Databases a, b
# and c have the extension; a session in a holds idem.keys locked, so the
# cycle's worker for a waits there, in the middle of its cycle.
#
# 1. b is dropped while the cycle is in a: the launcher listed b at the
#    start of the cycle, notices it is gone, says so in one line and goes
#    on to c.  No worker fails to connect ("database N does not exist").
# 2. DROP EXTENSION idem in a while a's worker is in its cycle: the drop
#    waits for the batch in progress, then the worker notices, says so in
#    one line and exits cleanly ("could not open relation with OID N" and
#    a failed worker before).
# 3. Meanwhile and afterwards c is purged cycle after cycle, and a is
#    purged again once the extension is back.
# 4. A cycle longer than the 5 s that ALTER DATABASE ... RENAME, CREATE
#    DATABASE ... TEMPLATE and DROP DATABASE give the other sessions of a
#    database to leave (a purge of old audit entries one at a time, each
#    batch made to last a second): each succeeds, the worker giving way after the batch
#    in progress, and the next cycle goes on with the rest.
# 5. A database whose sessions are read-only (ALTER DATABASE ... SET
#    default_transaction_read_only = on) is purged all the same, as
#    autovacuum vacuums it, with no worker failing every cycle.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('dropworker');
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'idem'
idem.purge_interval = 1
));
$node->start;
idem_setup_db($node, $_) for qw(a b c);

# five key records in db that expire at once (ttl 1 s plus the slack)
sub expiring_keys
{
	my ($db, $prefix) = @_;
	$node->safe_psql($db,
		"SET idem.ttl = 1; SELECT count(idem_execute('$prefix-' || g, 'SELECT 1 AS one')) FROM generate_series(1, 5) g;"
	);
	return;
}

sub purged
{
	my ($db, $prefix) = @_;
	return $node->poll_query_until($db,
		"SELECT count(*) = 0 FROM idem.keys WHERE key LIKE '$prefix-%'");
}

sub worker_waits_in
{
	my ($db) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idem purge worker' AND datname = '$db' AND wait_event_type = 'Lock'"
	);
}

my $worker_failed =
  qr/could not open relation|database \d+ does not exist|"idem purge worker[^"]*" \(PID \d+\) (exited with exit code [1-9]|was terminated)/;

expiring_keys('c', 'c0');
ok(purged('c', 'c0'), 'the worker purges c');

########################################################################
# 1. A database dropped during the cycle that listed it.
########################################################################

my $logstart = -s $node->logfile;
my $blocker = $node->background_psql('a');
$blocker->query_safe('BEGIN');
$blocker->query_safe('LOCK TABLE idem.keys IN ACCESS EXCLUSIVE MODE');
ok(worker_waits_in('a'), "the cycle's worker for a waits on idem.keys");

my $b_oid = $node->safe_psql('postgres',
	"SELECT oid FROM pg_database WHERE datname = 'b'");
$node->safe_psql('postgres', 'DROP DATABASE b');
expiring_keys('c', 'c1');
$blocker->query_safe('COMMIT');
ok(purged('c', 'c1'), 'the launcher goes on to c');

my $log = slurp_file($node->logfile, $logstart);
like(
	$log,
	qr/idem launcher skipped database $b_oid: it was dropped/,
	'the launcher says in one line that b is gone');
is(scalar(() = $log =~ /skipped database $b_oid/g), 1, 'once');
unlike($log, $worker_failed, 'and no worker failed');

########################################################################
# 2. DROP EXTENSION during a worker's cycle.
########################################################################

$logstart = -s $node->logfile;
$blocker->query_safe('BEGIN');
$blocker->query_safe('LOCK TABLE idem.keys IN ACCESS EXCLUSIVE MODE');
ok(worker_waits_in('a'), "the next cycle's worker for a waits on idem.keys");

my $dropper = $node->background_psql('a');
my $dropper_pid = $dropper->query_safe('SELECT pg_backend_pid()');
$dropper->query_until(qr/dropping/,
	"\\echo dropping\nDROP EXTENSION idem CASCADE;\n");
wait_for_backend($node, $dropper_pid, "wait_event_type = 'Lock'");
pass('DROP EXTENSION idem waits');
expiring_keys('c', 'c2');
$blocker->query_safe('COMMIT');
is($dropper->query_safe('SELECT count(*) FROM pg_extension WHERE extname = $$idem$$'),
	'0', 'the extension is dropped');
ok(purged('c', 'c2'), 'and the launcher goes on to c');

$log = slurp_file($node->logfile, $logstart);
like(
	$log,
	qr/idem purge worker stopped: extension "idem" was dropped from database \d+ during its cycle/,
	"a's worker says in one line that the extension is gone");
unlike($log, $worker_failed, 'and exits cleanly');

########################################################################
# 3. The extension back in a: purged again.
########################################################################

$node->safe_psql('a', 'CREATE EXTENSION idem');
expiring_keys('a', 'a3');
expiring_keys('c', 'c3');
ok(purged('a', 'a3'), 'a is purged again');
ok(purged('c', 'c3'), 'and c still is');

########################################################################
# 4. Commands that need a database to themselves, during a long cycle.
########################################################################

# batches of one entry from the start
$node->safe_psql('postgres',
	'ALTER SYSTEM SET idem.purge_batch_size = 1; SELECT pg_reload_conf()');
$node->poll_query_until('postgres', "SELECT current_setting('idem.purge_batch_size') = '1'");
idem_setup_db($node, 'd');
$node->safe_psql('d', q{
CREATE FUNCTION slow_batch() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN PERFORM pg_sleep(1); RETURN NULL; END$$;
CREATE TRIGGER slow_batch AFTER DELETE ON idem.audit
	FOR EACH STATEMENT EXECUTE FUNCTION slow_batch();
INSERT INTO idem.audit (at, key, owner, outcome, pid)
SELECT now() - interval '2 days', 'aged-' || g, current_user::regrole, 'executed', 1
  FROM generate_series(1, 60) g;
ALTER DATABASE d SET idem.audit_retention = '1d';
});

# a worker in the middle of purging the database named
sub purging
{
	my ($db) = @_;
	return $node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idem purge worker' AND datname = '$db' AND query = 'idem: purging audit entries past idem.audit_retention'"
	);
}

my $log4start = -s $node->logfile;
ok(purging('d'), 'a long cycle purges d');
my ($ret, $stdout, $stderr) =
  $node->psql('postgres', 'ALTER DATABASE d RENAME TO e');
is($ret, 0, 'ALTER DATABASE ... RENAME during the cycle succeeds')
  or diag($stderr);
ok(purging('e'), 'the next cycle purges it under its new name');
($ret, $stdout, $stderr) =
  $node->psql('postgres', 'CREATE DATABASE f TEMPLATE e');
is($ret, 0, 'CREATE DATABASE with it as template during the cycle succeeds')
  or diag($stderr);
ok(purging('e'), 'and the next cycle goes on');
($ret, $stdout, $stderr) = $node->psql('postgres', 'DROP DATABASE e');
is($ret, 0, 'DROP DATABASE during the cycle succeeds') or diag($stderr);
$node->safe_psql('postgres', 'DROP DATABASE f');
$node->safe_psql('postgres',
	'ALTER SYSTEM RESET idem.purge_batch_size; SELECT pg_reload_conf()');
like(
	slurp_file($node->logfile, $log4start),
	qr/idem purge worker stopped its cycle in database \d+: another session needs the database to itself/,
	'the worker says in one line that it gave way');


########################################################################
# 5. A read-only database.
########################################################################

my $log5start = -s $node->logfile;
idem_setup_db($node, 'r');
$node->safe_psql('r', q{
INSERT INTO idem.keys (key, owner, fingerprint, response, created_at, expires_at, fingerprint_version)
SELECT 'old-' || g, current_user::regrole, '\x00', '{}', now() - interval '2 days', now() - interval '1 day', 3
  FROM generate_series(1, 5) g;
INSERT INTO idem.audit (at, key, owner, outcome, pid)
VALUES (now() - interval '2 days', 'aged', current_user::regrole, 'executed', 1);
ALTER DATABASE r SET idem.audit_retention = '1d';
ALTER DATABASE r SET default_transaction_read_only = on;
});
ok( $node->poll_query_until('r',
		"SELECT (SELECT count(*) FROM idem.keys) + (SELECT count(*) FROM idem.audit) = 0"),
	'a read-only database has its keys and audit entries purged');
expiring_keys('c', 'c5');
ok(purged('c', 'c5'), 'cycle after cycle');
unlike(slurp_file($node->logfile, $log5start),
	qr/$worker_failed|read-only transaction/, 'with no worker failing');

unlike(slurp_file($node->logfile, $logstart),
	$worker_failed, 'no worker failed in the whole test');

unlike(slurp_file($node->logfile), qr/\b(ERROR|FATAL|PANIC):/,
	'no error in the server log: the launcher never failed either');

$blocker->quit;
$dropper->quit;
$node->stop;
done_testing();
