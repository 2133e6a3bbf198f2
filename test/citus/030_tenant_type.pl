
# Copyright (c) 2026, idem authors

# The handle of Citus's get_shard_id_for_distribution_column() that a
# backend keeps for its tenant calls (src/workflow/tenant.c) is built for
# the tenant's type, and built again when a call of the same session has a
# tenant of another type: idem's colocation declared again with a table
# distributed by another type.  One Citus node holding its shards, one
# session, the colocation declared again and again with two bigint and two
# text tables, so that the first call after every other declaration has a
# tenant of another type than the call before:
#  - every call executes and its retry replays (the handle is the new
#    type's, not the old one's)
#  - a call that rebuilds the handle leaves no more in the backend's
#    TopMemoryContext than a call that does not (each rebuild once left the
#    old call expression there: about 300 bytes), over 12 of each, and the
#    handle's own context stays one context of the same size.  A
#    declaration itself leaves about 1 kB in TopMemoryContext whether the
#    type changes or not (Citus's DDL), which is why calls are compared
#    with calls.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = citus_node('single', 'citus.shard_count = 2');
citus_database('postgres', $node);
$node->safe_psql(
	'postgres', q{
SELECT citus_set_node_property('127.0.0.1', } . $node->port . q{, 'shouldhaveshards', true);
CREATE EXTENSION idem;
CREATE TABLE pay_b (tenant bigint NOT NULL);
SELECT create_distributed_table('pay_b', 'tenant', colocate_with => 'none');
CREATE TABLE pay_b2 (tenant bigint NOT NULL);
SELECT create_distributed_table('pay_b2', 'tenant', colocate_with => 'none');
CREATE TABLE pay_t (tenant text NOT NULL);
SELECT create_distributed_table('pay_t', 'tenant', colocate_with => 'none');
CREATE TABLE pay_t2 (tenant text NOT NULL);
SELECT create_distributed_table('pay_t2', 'tenant', colocate_with => 'none');
SELECT idem_citus_colocate('pay_b');
});

my $s = $node->background_psql('postgres', on_error_stop => 0);
$s->query_safe('SET client_min_messages = warning');

# the bytes in use in the backend's TopMemoryContext
sub top_used
{
	return $s->query_safe(
		"SELECT total_bytes - free_bytes FROM pg_backend_memory_contexts"
		  . " WHERE name = 'TopMemoryContext'");
}

# the handle's contexts: how many, and their size
sub handle_cxt
{
	return $s->query_safe(
		"SELECT count(*) || '|' || coalesce(sum(total_bytes), 0)"
		  . " FROM pg_backend_memory_contexts"
		  . " WHERE name = 'idem citus shard function'");
}

# Declare idem's colocation with $table (its records deleted first: another
# group is refused while they exist), then call with $tenant under $key and
# retry.  Returns "f|t" when the call executed and its retry replayed, and
# how much TopMemoryContext grew across the first call.
sub declare_and_call
{
	my ($table, $tenant, $key) = @_;
	$s->query_safe(
		"DELETE FROM idem.citus_keys; SELECT idem_citus_colocate('$table')");
	my $call = "SELECT replayed FROM idem_citus_call($tenant, '$key', 'SELECT 1 AS one')";
	my $before = top_used();
	my $first = $s->query_safe($call);
	my $grew = top_used() - $before;
	return ("$first|" . $s->query_safe($call), $grew);
}

# each table and type once, to warm the session's caches (Citus's, idem's)
for my $t ([ 'pay_t', "'w'::text" ], [ 'pay_t2', "'w'::text" ],
	[ 'pay_b', '7::bigint' ], [ 'pay_b2', '7::bigint' ])
{
	my ($r) = declare_and_call(@$t, "warm-$t->[0]");
	is($r, 'f|t', "warm-up with $t->[0]: the call executes, then replays");
}
my $handle0 = handle_cxt();
like($handle0, qr/^1\|\d+$/, 'the handle is built in one context of its own');

my ($ok, $rebuilds, $reuses) = (1, 0, 0);
for my $i (1 .. 6)
{
	# pay_b2 came last: pay_t's call rebuilds, pay_t2's does not, and so on
	for my $t ([ 'pay_t', "'t$i'::text", 1 ], [ 'pay_t2', "'u$i'::text", 0 ],
		[ 'pay_b', "${i}::bigint", 1 ], [ 'pay_b2', "${i}::bigint", 0 ])
	{
		my ($r, $grew) = declare_and_call($t->[0], $t->[1], "k-$t->[0]-$i");
		if ($r ne 'f|t')
		{
			$ok = 0;
			diag("cycle $i, $t->[0]: $r");
		}
		if   ($t->[2]) { $rebuilds += $grew; }
		else           { $reuses   += $grew; }
	}
}
ok($ok, '24 declarations, 12 of them changing the tenant type: every call executes once and replays');
note("TopMemoryContext across 12 calls that rebuilt the handle: $rebuilds bytes; across 12 that did not: $reuses bytes");
cmp_ok($rebuilds - $reuses, '<', 1024,
	'the calls that rebuild the handle leave no more in TopMemoryContext than those that do not');
is(handle_cxt(), $handle0, 'the handle\'s context: still one, of the same size');

$s->quit;
$node->stop;
done_testing();
