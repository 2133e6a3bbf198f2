
# Copyright (c) 2026, idem authors

# One role cannot hurt everyone (issue 19), with shared_preload_libraries.
#
# 1. The audit queue is shared fairly: one role flooding it with rejected
#    attempts in a single statement loses its own entries, not those of
#    another role in its database or of another database; each drop is
#    counted in the row of the database and role that lost it.  No purge
#    worker can start (max_worker_processes = 1 is the launcher's), so
#    nothing drains the queue while the test reads it.
# 2. idem_stats_roles shows a role its own rows only, in every database;
#    members of pg_read_all_stats see every row, as in pg_stat_statements.
# 3. outbox_claimed counts for the claiming role, not the tables' owner.
# 4. A topic's NOTIFY channel is given to its consumers only; a producer's
#    commit notifies that channel with an empty payload, and nothing on
#    idem_outbox, so a role that may not consume learns neither the topic
#    nor its producers.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('roles');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idem'
max_worker_processes = 1
idem.audit = all
idem.audit_queue_size = 60
});
$node->start;
idem_setup_db($node, 'postgres');
idem_setup_db($node, 'other');
$node->safe_psql('postgres', q{
CREATE ROLE flood LOGIN;
CREATE ROLE quiet LOGIN;
CREATE ROLE watcher LOGIN IN ROLE pg_read_all_stats;
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval) TO quiet;
GRANT EXECUTE ON FUNCTION idem_outbox_channel(text) TO flood, quiet;
});

# n rejected attempts (ID422) of role in db, in one statement
sub reject
{
	my ($db, $role, $n) = @_;
	$node->safe_psql($db, qq{
SET ROLE $role;
SELECT idem_execute('roles:k', 'SELECT 1');
DO \$\$
BEGIN
	FOR i IN 1..$n LOOP
		BEGIN
			PERFORM idem_execute('roles:k', 'SELECT 2');
		EXCEPTION WHEN SQLSTATE 'ID422' THEN NULL;
		END;
	END LOOP;
END
\$\$;
});
}

sub audit_counts
{
	my ($db, $role) = @_;
	return $node->safe_psql($db, qq{
SELECT audit_queued || '/' || audit_dropped FROM idem_stats_roles
 WHERE datname = current_database() AND rolname = '$role'});
}

########################################################################
# 1. A flood of rejections takes its share of the queue, no more.
########################################################################

reject('postgres', 'flood', 300);
reject('postgres', 'quiet', 5);
reject('other', 'flood', 5);

my ($fq, $fd) = split m{/}, audit_counts('postgres', 'flood');
cmp_ok($fd, '>', 0, 'the flooding role loses entries');
is($fq + $fd, 300, 'every attempt of the flood is either queued or counted as dropped');
cmp_ok($fq, '<=', 20, 'the flood holds at most a third of the queue');
is(audit_counts('postgres', 'quiet'), '5/0',
	'another role of the flooded database keeps every entry');
is(audit_counts('other', 'flood'), '5/0',
	'the same role in another database keeps every entry');
is( $node->safe_psql(
		'postgres',
		"SELECT audit_dropped FROM idem_stats WHERE datname = 'postgres'"),
	$fd,
	"the database's drops are the flooding role's");

########################################################################
# 2. Role-level statistics are visible to the role and to readers of
#    all statistics.
########################################################################

is( $node->safe_psql(
		'postgres', q{
SET ROLE quiet;
SELECT string_agg(DISTINCT coalesce(rolname, '(overflow)'), ',') FROM idem_stats_roles}),
	'quiet',
	'a role sees only its own rows in idem_stats_roles');
is( $node->safe_psql(
		'postgres', q{
SET ROLE quiet;
SELECT count(*) FROM idem_stats(true) WHERE roleid IS DISTINCT FROM 'quiet'::regrole}),
	'0',
	'nor through idem_stats(true)');
is( $node->safe_psql(
		'postgres', q{
SET ROLE flood;
SELECT string_agg(datname, ',' ORDER BY datname) FROM idem_stats_roles}),
	'other,postgres',
	'its own rows in every database');
is( $node->safe_psql(
		'postgres', q{
SET ROLE watcher;
SELECT string_agg(DISTINCT rolname, ',' ORDER BY rolname) FROM idem_stats_roles
 WHERE rolname IN ('flood', 'quiet')}),
	'flood,quiet',
	'a member of pg_read_all_stats sees every role');
cmp_ok(
	$node->safe_psql(
		'postgres', q{
SET ROLE quiet;
SELECT sum(executions) FROM idem_stats}), '>=', 3,
	'idem_stats (per database) stays readable by everyone');

########################################################################
# 3. outbox_claimed is the claiming role's.
########################################################################

$node->safe_psql('postgres', q{
SELECT idem_outbox_create_topic('roles', ARRAY['flood']::regrole[], ARRAY['quiet']::regrole[]);
});
$node->safe_psql('postgres', q{
SET ROLE flood;
SET idem.outbox_topic = 'roles';
SELECT idem_execute('roles:e1', 'SELECT 1');
SELECT idem_execute('roles:e2', 'SELECT 2');
});
is( $node->safe_psql(
		'postgres', q{
SET ROLE quiet;
SELECT count(*) FROM idem_outbox_claim('roles', 10, '1 min', 'c');
}),
	'2',
	'the consumer claims both events');
is( $node->safe_psql(
		'postgres', q{
SELECT string_agg(rolname || ':' || outbox_claimed, ',' ORDER BY rolname)
  FROM idem_stats_roles
 WHERE datname = current_database() AND outbox_claimed > 0}),
	'quiet:2',
	'outbox_claimed counts for the claiming role only');

########################################################################
# 4. The NOTIFY channel of a topic.
########################################################################

my $channel = $node->safe_psql('postgres',
	"SET ROLE quiet; SELECT idem_outbox_channel('roles')");
like($channel, qr/^idem_outbox_[0-9a-f]{32}$/,
	'a consumer gets its topic\'s channel');
my ($rc, $stdout, $stderr) = $node->psql('postgres',
	"\\set VERBOSITY verbose\nSET ROLE flood;\nSELECT idem_outbox_channel('roles');");
like($stderr, qr/ERROR:  42501: permission denied/,
	'a role that may not consume the topic is refused it (42501)');
$node->safe_psql('other', q{
SELECT idem_outbox_create_topic('roles');
});
isnt($node->safe_psql('other', "SELECT idem_outbox_channel('roles')"),
	$channel, 'the same topic in another database has another channel');

# psql prints the notifications its session received after each statement;
# a session's own notifications reach it after its commit
my $heard = $node->safe_psql('postgres', qq{
LISTEN idem_outbox;
LISTEN "$channel";
SET ROLE flood;
SET idem.outbox_topic = 'roles';
SET idem.outbox_notify = on;
SELECT idem_execute('roles:n1', 'SELECT 3') IS NOT NULL;
SELECT 'done';
});
like($heard, qr/Asynchronous notification "\Q$channel\E" received/,
	'the commit notifies the topic\'s channel');
unlike($heard, qr/notification "idem_outbox"/, 'and nothing on idem_outbox');
unlike($heard, qr/with payload/, 'with an empty payload');

$node->stop;
done_testing();
