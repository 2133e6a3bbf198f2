
# Copyright (c) 2026, idem authors

# The stats rows of dropped databases and roles are reclaimed (stats.c),
# with shared_preload_libraries and tables of 3 databases and 4
# (database, role) pairs.
#
# 1. Databases: once the table is full, a new database counts in the
#    overflow row; once databases are dropped, new ones get their rows,
#    not the overflow's, and the dropped databases' counts go with their
#    rows.  An error's count, made while the error is being cleaned up,
#    reclaims nothing; the session's next count does.
# 2. Roles: a dropped role's pairs are reclaimed, except the pair a
#    session of that role still counts in: it keeps counting there, and
#    the roles that took the other pairs keep their own counts.  Once the
#    session ends its pair is reclaimed too.
# 3. Two loops create a database, count in it and drop it, while a third
#    session counts in postgres: every database counts exactly its own
#    calls in its own row, and the overflow rows stay empty.
# 4. Not preloaded: one row of zeros and a notice, as before.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('stats_reclaim');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.stats_max_databases = 3
idem.stats_max_roles = 4
idem.purge_interval = 3600
});
$node->start;
# every database made below has the extension already
$node->safe_psql('template1', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# n new keys in db (as role, if given): n executions
sub calls
{
	my ($db, $n, $role) = @_;
	my $set = defined $role ? "SET ROLE $role;" : '';
	$node->safe_psql($db, qq{$set
SELECT count(idem_execute('k-' || g || '-' || clock_timestamp(), 'SELECT 1'))
  FROM generate_series(1, $n) g;});
	return;
}

# database:executions of the rows that counted, the overflow as "(overflow)",
# a dropped database's row as "(dropped)"
sub db_rows
{
	return $node->safe_psql('postgres', q{
SELECT string_agg(CASE WHEN dbid IS NULL THEN '(overflow)'
					   ELSE coalesce(datname, '(dropped)') END || ':' || executions,
				  ' ' ORDER BY datname NULLS LAST, dbid NULLS LAST)
  FROM idem_stats WHERE executions > 0});
}

sub role_rows
{
	return $node->safe_psql('postgres', q{
SELECT string_agg(CASE WHEN roleid IS NULL THEN '(overflow)'
					   ELSE coalesce(datname, '(dropped)') || '/' || coalesce(rolname, '(dropped)') END
				  || ':' || executions,
				  ' ' ORDER BY datname NULLS LAST, rolname NULLS LAST, roleid NULLS LAST)
  FROM idem_stats_roles WHERE executions > 0});
}

# 1. databases
calls('postgres', 1);
for my $db ('d1', 'd2', 'd3')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	calls($db, 2);
}
is(db_rows(), 'd1:2 d2:2 postgres:1 (overflow):2',
	'a full table counts the next database in the overflow row');

$node->safe_psql('postgres', 'DROP DATABASE d1');
$node->safe_psql('postgres', 'DROP DATABASE d2');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM idem_stats WHERE dbid IS NOT NULL AND datname IS NULL'),
	'2', 'the dropped databases\' rows stay until their slots are needed');
for my $db ('d4', 'd5')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	calls($db, 3);
}
is(db_rows(), 'd4:3 d5:3 postgres:1 (overflow):2',
	'new databases take the rows of dropped ones, not the overflow row; the dropped ones\' counts went with their rows');
is($node->safe_psql('postgres',
		'SELECT count(*) FROM idem_stats WHERE dbid IS NOT NULL AND datname IS NULL'),
	'0', 'no row of a dropped database is left');

# an error's count is made in its PG_CATCH block, where the catalogs are
# not read: with the table full it goes to the overflow row; the session's
# next count reclaims d4's row
$node->safe_psql('postgres', 'DROP DATABASE d4');
$node->safe_psql('postgres', 'CREATE DATABASE d6');
my ($ret, $out, $err) = $node->psql('d6', q{
\set ON_ERROR_STOP 0
SELECT idem_execute('boom', 'SELECT 1/0');
SELECT idem_execute('fine', 'SELECT 1');
});
like($err, qr/division by zero/, 'the first call of d6 fails');
is( $node->safe_psql('postgres', q{
SELECT string_agg(coalesce(datname, '(overflow)') || ':' || executions || '/' || errors, ' '
				  ORDER BY datname NULLS LAST)
  FROM idem_stats WHERE dbid IS NULL OR datname = 'd6'}),
	'd6:1/0 (overflow):2/1',
	'its error counts in the overflow row, its next call in a row of its own');

# 2. roles: the pairs of d3, d5 and d6 (dropped now) make room
$node->safe_psql('postgres', "DROP DATABASE $_") for ('d3', 'd5', 'd6');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
$node->safe_psql('postgres',
	"CREATE ROLE $_") for ('r1', 'r2', 'r3', 'r4', 'r5', 'r6', 'r7', 'r8');
calls('postgres', 1, $_) for ('r1', 'r2', 'r3');
calls('postgres', 1, 'r4');
is(role_rows(), 'postgres/r1:1 postgres/r2:1 postgres/r3:1 (overflow):1',
	'a full table of pairs counts the next role in the overflow row');

# a session of r2 counts, and stays while r2 is dropped
my $r2 = $node->background_psql('postgres');
$r2->query_safe(q{SET ROLE r2; SELECT idem_execute('r2-a', 'SELECT 1')});
my $r2_oid = $node->safe_psql('postgres', q{SELECT 'r2'::regrole::oid});
$node->safe_psql('postgres', "DROP ROLE $_") for ('r1', 'r2', 'r3');
calls('postgres', 1, 'r5');
calls('postgres', 1, 'r6');
calls('postgres', 1, 'r7');
is(role_rows(), "postgres/r5:1 postgres/r6:1 postgres/(dropped):2 (overflow):2",
	'new roles take the pairs of dropped roles that no session holds; the next one counts in the overflow row');
$r2->query_safe(q{SELECT idem_execute('r2-b', 'SELECT 1'); SELECT idem_execute('r2-c', 'SELECT 1')});
is( $node->safe_psql('postgres', qq{
SELECT string_agg(coalesce(rolname, roleid::text) || ':' || executions, ' ' ORDER BY roleid)
  FROM idem_stats_roles WHERE roleid IS NOT NULL AND executions > 0}),
	"$r2_oid:4 r5:1 r6:1",
	'the session of the dropped role keeps counting in its own row, not in another role\'s');
$r2->quit;
$node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()})
  or die 'the session of r2 did not end';
calls('postgres', 1, 'r8');
is(role_rows(), 'postgres/r5:1 postgres/r6:1 postgres/r8:1 (overflow):2',
	'once that session ended, its pair is reclaimed');

# 3. concurrent create/drop loops
$node->safe_psql('postgres', "DROP ROLE $_") for ('r4', 'r5', 'r6', 'r7', 'r8');
$node->safe_psql('postgres', 'SELECT idem_stats_reset()');
my $rounds = 6;
my @scripts;
for my $loop ('a', 'b')
{
	my $sql = '';
	for my $i (1 .. $rounds)
	{
		my $db = "churn_${loop}_$i";
		$sql .= qq{\\c postgres
CREATE DATABASE $db;
\\c $db
SELECT count(idem_execute('c-' || g, 'SELECT 1')) FROM generate_series(1, $i) g;
SELECT 'row', executions FROM idem_stats WHERE datname = current_database();
SELECT 'pair', executions FROM idem_stats_roles WHERE datname = current_database();
\\c postgres
DROP DATABASE $db;
};
	}
	push @scripts, $sql;
}
push @scripts, join('',
	map { "SELECT count(idem_execute('steady-$_-' || g, 'SELECT 1')) FROM generate_series(1, 100) g;\n" }
	  1 .. 10);
my @clients = start_clients($node, 'postgres', 'churn', \@scripts);
for my $c (@clients)
{
	eval { $c->{h}->finish; };
	is(slurp_file("$c->{base}.err"), '', "churn client $c->{id} had no error");
}
for my $c (@clients[ 0 .. 1 ])
{
	my $want = join('', map { "$_\nrow|$_\npair|$_\n" } 1 .. $rounds);
	is(slurp_file("$c->{base}.out"), $want,
		"churn client $c->{id}: each database counted its own calls in its own rows");
}
is( $node->safe_psql('postgres', q{
SELECT (SELECT executions FROM idem_stats WHERE datname = 'postgres') || '/' ||
	   (SELECT executions FROM idem_stats_roles WHERE datname = 'postgres' AND rolname = 'postgres') || ' ' ||
	   coalesce((SELECT executions FROM idem_stats WHERE dbid IS NULL), 0) || '/' ||
	   coalesce((SELECT executions FROM idem_stats_roles WHERE dbid IS NULL), 0)}),
	'1000/1000 0/0',
	'meanwhile postgres counted all its calls, and nothing reached the overflow rows');
ok(!$node->log_contains(qr/PANIC|TRAP|server process .* was terminated/),
	'no backend crashed');

# 4. not preloaded
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$node->restart;
$node->safe_psql('postgres', 'CREATE DATABASE later');
($ret, $out, $err) = $node->psql('later', q{
SELECT idem_execute('k', 'SELECT 1');
SELECT datname, executions FROM idem_stats;
SELECT rolname, executions FROM idem_stats_roles;
});
is($out, "{\"rows\": [{\"?column?\": 1}], \"command\": \"SELECT\", \"rowcount\": 1}\nlater|0\npostgres|0",
	'not preloaded: one row of zeros for the current database, and for it and the current role');
like($err, qr/NOTICE:  idem is not collecting statistics/, 'and the notice');

done_testing();
