
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
unlike(slurp_file($node->logfile, $logstart),
	$worker_failed, 'no worker failed in the whole test');

unlike(slurp_file($node->logfile), qr/\b(ERROR|FATAL|PANIC):/,
	'no error in the server log: the launcher never failed either');

$blocker->quit;
$dropper->quit;
$node->stop;
done_testing();
