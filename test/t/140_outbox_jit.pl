
# Copyright (c) 2026, idem authors

# idem's own queries (the outbox's purge) are never
# JIT-compiled (issue 10's benchmark found a claim taking 0.4 s of JIT
# compilation per call once the outbox held 7.2 million events, because a
# generic plan estimates "LIMIT $n" at a tenth of the scan).  With
# jit_above_cost = 0 every statement the session plans is JIT-compiled, as
# pg_stat_statements (tracking nested statements) shows for the outer
# statements; idem's nested queries show no JIT functions.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = idem_node('jit');
$node->append_conf(
	'postgresql.conf', qq(
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
jit = on
jit_above_cost = 0
jit_inline_above_cost = 0
jit_optimize_above_cost = 0
));
$node->start;

if ($node->safe_psql('postgres', 'SELECT pg_jit_available()') ne 't')
{
	$node->stop;
	plan skip_all => 'this PostgreSQL has no JIT (llvmjit)';
}

idem_setup_db($node, 'postgres');
$node->safe_psql('postgres', 'CREATE EXTENSION pg_stat_statements');
$node->safe_psql('postgres', 'SELECT pg_stat_statements_reset()');
$node->safe_psql(
	'postgres', q{
SET idem.outbox_topic = 'orders';
SELECT idem_execute('j-' || i, 'SELECT $1::int AS i', i) FROM generate_series(1, 20) i;
});
$node->safe_psql(
	'postgres', q{
SELECT idem_outbox_ack_batch(array_agg(event_id), array_agg(lease_token))
  FROM idem_outbox_claim('orders', 10, '30 s');
SELECT idem_outbox_fail(event_id, lease_token, 'x') FROM idem_outbox_claim('orders', 5, '30 s');
SELECT idem_outbox_ack(event_id, lease_token) FROM idem_outbox_claim('orders', 5, '30 s');
SET idem.outbox_retention = 0;
SELECT idem_outbox_purge();
});

my $outer = $node->safe_psql('postgres',
	"SELECT count(*) FROM pg_stat_statements WHERE toplevel AND query LIKE '%idem_outbox_claim%' AND jit_functions > 0");
cmp_ok($outer, '>', 0,
	'the outer statements were JIT-compiled (jit_above_cost = 0)');
my $inner = $node->safe_psql('postgres',
	"SELECT count(*) FROM pg_stat_statements WHERE NOT toplevel AND query ~ 'idem\\.outbox'");
# the purge's delete (claims, acks and fails read and write the table
# without a statement)
cmp_ok($inner, '>=', 1, "idem's nested queries on idem.outbox are tracked ($inner)");
is( $node->safe_psql('postgres',
		"SELECT coalesce(string_agg(left(query, 60), ' | '), 'none') FROM pg_stat_statements WHERE NOT toplevel AND query ~ 'idem\\.outbox' AND jit_functions > 0"),
	'none',
	"none of idem's nested queries was JIT-compiled");
is($node->safe_psql('postgres', 'SHOW jit'), 'on', 'and the session still has jit on');

$node->stop;
done_testing();
