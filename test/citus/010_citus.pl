
# Copyright (c) 2026, idem authors

# idem on Citus: a coordinator and two workers (with metadata) on loopback,
# payments distributed by tenant_id in 8 shards, idem's tenant key records
# co-located with it by idem_citus_colocate('payments').  Needs Citus
# installed into the same PostgreSQL (scripts/test-citus.sh does that).
#
# Checked:
#  - before colocation, idem_execute() of a statement that Citus runs on a
#    worker is refused (IDC02), writing nothing; colocation with a table
#    that is not distributed is refused (IDC03)
#  - idem.citus_keys is in payments' colocation group; declaring it again
#    changes nothing; declaring another group while keys exist is IDC03
#  - a call from the coordinator executes on the worker of the tenant's
#    shard: the key record and the business row carry the same xmin there
#    (one local transaction), nothing is written on the coordinator
#  - a business statement that fails records no key and leaves no row
#  - the retry through each other entry node (the workers) replays the
#    same response; one row
#  - two tenants on one shard under the same key: both execute; each
#    retry replays its own; the same key with another request is ID422
#  - a call Citus does not delegate (SELECT idem_citus_call(...), 1) is
#    IDC02; a statement that writes another tenant (on another node, or on
#    another shard of the same node, entering through the coordinator or
#    on the shard's node) is IDC03; neither leaves anything behind; nor does
#    an INSERT of the tenant as an integer literal into the bigint column
#    (IDC03, whose hint says to write it as 1::bigint, which executes)
#  - on the shard's node, a call in a transaction block after a read of
#    other nodes is IDC02, the error naming the read; after the call, the
#    read commits with it; a read of every shard under a tenant runs
#    (Citus does not check reads it plans across shards)
#  - after citus_move_shard_placement moves the tenant's shard group to
#    the other worker, the retry replays (no second row), and a new call
#    executes there, its key and row in one transaction on the new node
#  - the coordinator crashes while the shard's node runs a call (held on a
#    lock there): after the restart the retry replays if the call committed
#    on the shard's node, executes if it did not; one row either way
#  - the shard's node is killed between a call's business write and its
#    commit: the call fails, nothing of it remains, the retry executes once
#  - the tenant's shard group moves while 3 entry nodes x 4 clients call
#    and retry 3000 of its keys, once blocking writes and once by logical
#    replication: no key executes twice, one key record per row, and every
#    key replays through every entry node after the move
#  - 3 entry nodes x 16 clients on 50 hot keys over 8 tenants: every
#    (tenant, key) has exactly one row and one key record
#  - idem.ttl set on idem_citus_call (ALTER FUNCTION) holds on the shard's
#    node; idem_citus_purge() removes expired tenant records on every
#    shard, and only those; a call whose key's record has expired runs
#    again and leaves one record, on either worker
#  - a call in a REPEATABLE READ transaction whose key was recorded after
#    its snapshot fails with 40001 before its statement runs, and writes
#    nothing
#  - idem_citus_call_outbox() writes its event to the tenant's shard of
#    idem.citus_outbox (co-located: on the node of its payments), in the
#    business row's transaction, none to a node's idem.outbox; a replay, a
#    failing statement, an unregistered topic and a stray statement write
#    none; one consumer per node, then three per node, deliver each event
#    exactly once; a tenant's events written before a move of its shard
#    group move with it (same ids, pending), a claim on the old node no
#    longer finds them, and the new node's consumers deliver them, with
#    those written after; an event leased before a move: its ack on the old
#    node is IDE04, and the new node delivers it again (attempt 2) once the
#    lease ran out; a move waits for a claim's transaction on the shard's
#    node (its session's list of shards read by an earlier claim); a
#    node's idem_outbox_purge() removes the delivered events of the shards
#    placed there (past idem.outbox_retention), and not another node's
#  - the retry storm's move again (blocking writes, then by logical
#    replication), its calls writing events while two consumers per node
#    claim them and acknowledge them in a later transaction: each event
#    acknowledged exactly once; an event claimed twice only after its ack
#    on the old node failed with IDE04, its next claim on the new node,
#    attempt counted; an event written after the move delivered there; the
#    retries write no event
#  - a worker drained (citus_drain_node) and removed (citus_remove_node)
#    with 32 tenants' events undelivered: all of them pending on the nodes
#    that remain, none claimable on the removed worker, and delivered once
#    each by the remaining nodes' consumers
#  - idem_citus_call_with(): text arguments typed by the statement; its ttl,
#    outbox_topic and wait options hold on the shard's node; a retry
#    without them replays, another amount is ID422, a bad ttl writes nothing
#  - psycopg (Python values as server-side parameters, prepared) calls and
#    retries through the coordinator and a worker; psql's retries through
#    the other worker replay
#  - two tenant calls in one transaction block from the coordinator, their
#    shards on different nodes: both commit, and their retries replay
#  - a run's step whose statement Citus would run on a worker is IDC02 and
#    records nothing (through idem_step() and idem_call()), so is a dry run
#    of such a statement; a step on a local table runs
#  - tenant runs: idem.citus_runs is in payments' colocation group; a run
#    of three steps entering through the coordinator and both workers,
#    begun again (the same run, or ID422 with other steps or input), its
#    steps retried through every entry node (replayed, one row each); its
#    first step's row, record and the run's progress in one transaction on
#    the shard's node; out of order (ID425), undeclared (ID400), unknown
#    run (ID404), a failing statement, a step Citus did not delegate
#    (IDC02) or writing another tenant (IDC03) write nothing; two tenants
#    of one shard with one run id; the shard group moved between steps:
#    completed steps replay through every entry node and the last runs on
#    the new node, completing the run there; an external step's result;
#    idem_citus_step_with()'s text arguments and its event on the shard's
#    node; fail, resume, complete, cancel; three agents stepping one run at
#    once through the three entry nodes: each step once; a role that is not
#    a superuser has its own run under the same id and cannot read
#    idem.citus_runs; idem_citus_run_steps() gives idem_run_steps()'s rows
#    and columns through every entry node (completed, pending, a run
#    without declared steps; ID404, 22004); with owner => a superuser, a
#    member of idem_admin and a member of the owner read and act on
#    another role's run, another role is refused (42501) and changes
#    nothing, an unknown role is 42704; idem_citus_run_purge() removes the
#    finished runs of every shard with their steps' records, and the run
#    of a dropped role however it stands, and keeps a running one;
#    idem_purge_all() does too once idem.run_retention is set
#  - a role that is not a superuser calls through every entry node: its
#    call executes once and replays elsewhere, its keys are its own (the
#    same key of another role executes), its event needs its publish
#    grant, and it cannot read idem.citus_keys
#  - a role whose OID differs on each node: its call and its run's step
#    replay through every entry node after its tenant's shard group moved
#    to the other worker, its next step runs there, and the records on the
#    new node are its own (another role's call under its key executes)
#  - the shard node's TimeZone is part of the request: after a move to a
#    node where it differs, the retry is ID422 and writes nothing; pinned
#    on the function (ALTER FUNCTION ... SET, propagated), it replays
#  - a column added to idem.citus_keys and dropped again: a call executes
#    once and replays
#  - a text tenant column with collation "C" (a database of its own):
#    idem's tenant columns take it, and a call executes once and replays;
#    after DROP EXTENSION idem CASCADE a tenant function left behind is
#    IDC01, and with idem created again the colocation is declared again
#    (a call executes once and replays through every node)
#  - a text tenant (a database of its own): tenants and keys that spell
#    each other's together, each executes once and replays through the
#    workers; without idem.citus_runs (a colocation declared before tenant
#    runs) a run function is IDC01, and declaring the colocation again adds
#    the runs and keeps the keys; declared again, a colocation of an older
#    build gets idem_citus_run_steps(), replaces the old shape of
#    idem_citus_run_status() and keeps a setting on a function it had
#  - a shard split (the halves on both workers), citus_drain_node() and
#    rebalance_table_shards(): after each, every key replays through every
#    entry node, with no second row
#  - doc/citus.md's examples (its sql-citus blocks), verbatim
#  - idem.keys made a Citus table by hand: calls through the coordinator
#    and a worker are IDC04; given back with Citus's drop functions, calls
#    work again and a key recorded before replays
#  - with idem preloaded on the coordinator, the purge worker removes the
#    expired tenant records on every shard, and only those, and with
#    idem.run_retention the finished tenant runs

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";
use IdemTAP;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @nodes = citus_cluster(q(
max_connections = 160
wal_level = logical
max_wal_senders = 10
max_replication_slots = 10
));
my ($coord, $w1, $w2) = @nodes;

$coord->safe_psql('postgres', 'CREATE EXTENSION idem');
for my $w ($w1, $w2)
{
	is($w->safe_psql('postgres',
			"SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
		$coord->safe_psql('postgres',
			"SELECT extversion FROM pg_extension WHERE extname = 'idem'"),
		$w->name . ': CREATE EXTENSION idem propagated');
}

$coord->safe_psql(
	'postgres', q{
CREATE TABLE payments (tenant_id bigint NOT NULL, note text NOT NULL,
	amount int NOT NULL, CHECK (amount > 0));
SELECT create_distributed_table('payments', 'tenant_id');
CREATE TABLE plain_local (id int);
});

my $insert =
  q{'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount'};

# The node (by port) holding the placement of tenant $t's shard, and the shard.
sub placement
{
	my ($t) = @_;
	my ($shard, $port) = split /\|/, $coord->safe_psql(
		'postgres', qq{
SELECT s.shardid, s.nodeport FROM citus_shards s
 WHERE s.shardid = get_shard_id_for_distribution_column('payments', ${t}::bigint)});
	my ($node) = grep { $_->port == $port } @nodes;
	return ($node, $shard);
}

# a call through $node; returns (stdout, stderr) of psql
sub call
{
	my ($node, $sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($out, $err);
}

# Hold shard relation $rel of $node in EXCLUSIVE mode for $secs seconds,
# in a session of its own (Citus lets it change a shard by hand); returns
# the session's handle once the lock is granted.
sub hold_shard_lock
{
	my ($node, $rel, $secs) = @_;
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start(
		[
			'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c',
			"SET citus.override_table_visibility = off; SET citus.enable_manual_changes_to_shards = on;"
			  . " BEGIN; LOCK $rel IN EXCLUSIVE MODE; SELECT pg_sleep($secs); COMMIT;"
		],
		'<', \$in, '>', \$out, '2>', \$err);
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_locks WHERE relation = '$rel'::regclass AND granted AND mode = 'ExclusiveLock'"
	) or die "$rel was not locked";
	return $h;
}

# $sql through $node in a session of its own, in the background: its
# handle and a reference to its output.
sub start_call
{
	my ($node, $sql) = @_;
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres'), '-c', $sql ],
		'<', \$in, '>', \$out, '2>', \$err);
	return ($h, \$out);
}

sub sqlstate_of
{
	my ($err) = @_;
	return $err =~ /ERROR:\s+([0-9A-Z]{5}):/ ? $1 : 'none';
}

sub rows
{
	my ($where) = @_;
	return $coord->safe_psql('postgres',
		"SELECT count(*) FROM payments WHERE $where");
}

# --- before colocation: the unsafe shape is refused
{
	my ($out, $err) = call($coord,
		"SELECT idem_execute('a-key', $insert, 1::bigint, 'shape-a', 5)");
	is(sqlstate_of($err), 'IDC02',
		'idem_execute() of a statement Citus runs on a worker: IDC02');
	is(rows("note = 'shape-a'"), '0', '... and the row was rolled back');
	is($coord->safe_psql('postgres', 'SELECT count(*) FROM idem.keys'),
		'0', '... and no key recorded');
	($out, $err) = call($coord, "SELECT idem_citus_colocate('plain_local')");
	is(sqlstate_of($err), 'IDC03', 'colocation with a local table: IDC03');
}

# --- colocation
$coord->safe_psql('postgres', "SELECT idem_citus_colocate('payments')");
is( $coord->safe_psql(
		'postgres', q{
SELECT count(DISTINCT colocationid) FROM pg_dist_partition
 WHERE logicalrelid IN ('payments'::regclass, 'idem.citus_keys'::regclass)}),
	'1',
	'idem.citus_keys is in payments\' colocation group');
$coord->safe_psql('postgres', "SELECT idem_citus_colocate('payments')");
is($coord->safe_psql('postgres', 'SELECT count(*) FROM idem.citus_keys'),
	'0', 'declaring the same colocation again keeps the table');

# --- atomic with the write, on the shard's node
my ($n1, $shard1) = placement(1);
my ($out, $err) = call($coord,
	"SELECT replayed, response FROM idem_citus_call(1::bigint, 'k1', $insert, 1::bigint, 'k1', 100)"
);
like($out, qr/^f\|/, 'first call executes') or diag($err);
my $keys_shard = $n1->safe_psql('postgres',
	"SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'idem.citus_keys'::regclass"
	  . " AND shardid = get_shard_id_for_distribution_column('idem.citus_keys', 1::bigint)"
);
my $xmins = $n1->safe_psql(
	'postgres', qq{
SET citus.override_table_visibility = off;
SELECT (SELECT xmin FROM idem.citus_keys_$keys_shard WHERE tenant = 1 AND key = 'k1')
	 = (SELECT xmin FROM public.payments_$shard1 WHERE tenant_id = 1 AND note = 'k1'),
	(SELECT count(*) FROM public.payments_$shard1 WHERE note = 'k1')});
is($xmins, 't|1',
	'key record and row written by one local transaction on the shard\'s node');

($out, $err) = call($coord,
	"SELECT replayed FROM idem_citus_call(1::bigint, 'k-fail', $insert, 1::bigint, 'k-fail', -1)"
);
is(sqlstate_of($err), '23514', 'a failing business statement raises its error');
is( $coord->safe_psql(
		'postgres', "SELECT count(*) FROM idem.citus_keys WHERE key = 'k-fail'"),
	'0',
	'... and records no key');

# --- retries through every other entry node replay
my $first = $coord->safe_psql('postgres',
	"SELECT response FROM idem.citus_keys WHERE tenant = 1 AND key = 'k1'");
for my $entry ($w1, $w2, $coord)
{
	($out, $err) = call($entry,
		"SELECT replayed, response FROM idem_citus_call(1::bigint, 'k1', $insert, 1::bigint, 'k1', 100)"
	);
	is($out, "t|$first", 'retry through ' . $entry->name . ' replays')
	  or diag($err);
}
is(rows("note = 'k1'"), '1', 'one row for k1');

# --- two tenants on one shard, one key
my $other = $coord->safe_psql(
	'postgres', q{
SELECT t FROM generate_series(2, 1000) t
 WHERE get_shard_id_for_distribution_column('payments', t::bigint)
	 = get_shard_id_for_distribution_column('payments', 1::bigint)
 LIMIT 1});
for my $t (1, $other)
{
	($out, $err) = call($coord,
		"SELECT replayed, response->'rows'->0->>'amount' FROM idem_citus_call(${t}::bigint, 'shared', $insert, ${t}::bigint, 'shared', $t)"
	);
	is($out, "f|$t", "tenant $t executes under the shared key") or diag($err);
}
for my $t (1, $other)
{
	($out, $err) = call($w2,
		"SELECT replayed, response->'rows'->0->>'amount' FROM idem_citus_call(${t}::bigint, 'shared', $insert, ${t}::bigint, 'shared', $t)"
	);
	is($out, "t|$t", "tenant ${t}'s retry replays its own response")
	  or diag($err);
}
($out, $err) = call($coord,
	"SELECT replayed FROM idem_citus_call(1::bigint, 'shared', $insert, 1::bigint, 'shared', 7)"
);
is(sqlstate_of($err), 'ID422', 'same tenant and key, another request: ID422');

# --- refusals
($out, $err) = call($coord,
	"SELECT idem_citus_call(1::bigint, 'k-shape', $insert, 1::bigint, 'k-shape', 1), 1"
);
is(sqlstate_of($err), 'IDC02', 'a call Citus does not delegate: IDC02');
is(rows("note = 'k-shape'"), '0', '... and wrote nothing');
my $far = $coord->safe_psql(
	'postgres', qq{
SELECT t FROM generate_series(2, 1000) t
 WHERE (SELECT nodeport FROM citus_shards
		 WHERE shardid = get_shard_id_for_distribution_column('payments', t::bigint))
	<> @{[ $n1->port ]}
 LIMIT 1});
# another tenant's shard on the same node: Citus would run it locally,
# in the same transaction, but it is not the tenant's
my $near = $coord->safe_psql(
	'postgres', qq{
SELECT t FROM generate_series(2, 1000) t
 WHERE (SELECT nodeport FROM citus_shards
		 WHERE shardid = get_shard_id_for_distribution_column('payments', t::bigint))
	= @{[ $n1->port ]}
   AND get_shard_id_for_distribution_column('payments', t::bigint)
	<> get_shard_id_for_distribution_column('payments', 1::bigint)
 LIMIT 1});
for my $case (
	[ $coord, $far, 'another node, entering through the coordinator' ],
	[ $n1, $far, 'another node, entering on the shard\'s node' ],
	[ $n1, $near, 'another shard of the same node, entering there' ])
{
	my ($entry, $t, $what) = @$case;
	($out, $err) = call($entry,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-other', $insert, ${t}::bigint, 'k-other', 1)"
	);
	is(sqlstate_of($err), 'IDC03',
		"a statement writing another tenant ($what): IDC03");
}
is(rows("note = 'k-other'"), '0', '... no row written');
# the tenant as an int literal in an INSERT's VALUES: Citus compares the
# constant as written (integer, not bigint) and refuses; the error says how
# to write it, and written so it runs
($out, $err) = call($coord,
	q{SELECT replayed FROM idem_citus_call(1::bigint, 'k-literal', 'INSERT INTO payments VALUES (1, $1, 1)', 'k-literal')}
);
is(sqlstate_of($err), 'IDC03',
	'the tenant as an integer literal of a bigint column: IDC03');
like($err, qr/Citus compares a constant as it is written/,
	'... and the hint says to write it in the column\'s type');
is(rows("note = 'k-literal'"), '0', '... no row written');
($out, $err) = call($coord,
	q{SELECT replayed FROM idem_citus_call(1::bigint, 'k-literal', 'INSERT INTO payments VALUES (1::bigint, $1, 1)', 'k-literal')}
);
is($out, 'f', '... written as 1::bigint, the call executes');
# entering on the shard's node in a transaction block: a read of other
# nodes before the call opened transactions there (refused, and the error
# says so), a read after it does not matter
($out, $err) = call($n1,
	"BEGIN; SELECT count(*) FROM payments; SELECT replayed FROM idem_citus_call(1::bigint, 'k-block', $insert, 1::bigint, 'k-block', 1); COMMIT"
);
is(sqlstate_of($err), 'IDC02',
	'a call after a read of other nodes in its transaction block: IDC02');
like($err, qr/a read in a transaction block/, '... and the error says a read did it');
($out, $err) = call($n1,
	"BEGIN; SELECT replayed FROM idem_citus_call(1::bigint, 'k-block', $insert, 1::bigint, 'k-block', 1); SELECT count(*) > 0 FROM payments; COMMIT"
);
is(sqlstate_of($err), 'none', '... a read after the call commits with it');
is(rows("note = 'k-block'"), '1', '... one row');
# a read that Citus plans across shards is not refused (Citus does not
# check it, doc/citus.md): its response counts another node's tenant too
$coord->safe_psql('postgres', "INSERT INTO payments VALUES ($far, 'k-read', 1)");
($out, $err) = call($coord,
	q{SELECT response->'rows'->0->>'count' FROM idem_citus_call(1::bigint, 'k-read', 'SELECT count(*) FROM payments')}
);
is($out, rows('true'),
	'a read of every shard under a tenant: recorded, with every tenant\'s rows');
is( $coord->safe_psql(
		'postgres', "SELECT count(*) FROM idem.citus_keys WHERE key = 'k-other'"),
	'0',
	'... and no key recorded');
$coord->safe_psql(
	'postgres', q{
CREATE TABLE other_group (id text NOT NULL);
SELECT create_distributed_table('other_group', 'id', colocate_with => 'none');
});
($out, $err) = call($coord, "SELECT idem_citus_colocate('other_group')");
is(sqlstate_of($err), 'IDC03',
	'another colocation group while keys exist: IDC03');

# --- keys follow the shard
my ($to) = grep { $_->port != $n1->port && $_ != $coord } ($w1, $w2);
$coord->safe_psql('postgres',
	"SELECT citus_move_shard_placement($shard1, '127.0.0.1', "
	  . $n1->port
	  . ", '127.0.0.1', "
	  . $to->port
	  . ", shard_transfer_mode => 'block_writes')");
my ($n1_after) = placement(1);
is($n1_after->port, $to->port, "tenant 1's shard moved to " . $to->name);
for my $entry ($coord, $w1, $w2)
{
	($out, $err) = call($entry,
		"SELECT replayed, response FROM idem_citus_call(1::bigint, 'k1', $insert, 1::bigint, 'k1', 100)"
	);
	is($out, "t|$first", 'after the move, retry through ' . $entry->name . ' replays')
	  or diag($err);
}
is(rows("note = 'k1'"), '1', 'still one row for k1');
($out, $err) = call($w1,
	"SELECT replayed FROM idem_citus_call(1::bigint, 'k-after', $insert, 1::bigint, 'k-after', 3)"
);
is($out, 'f', 'a new key after the move executes') or diag($err);
is( $to->safe_psql(
		'postgres', qq{
SET citus.override_table_visibility = off;
SELECT (SELECT xmin FROM idem.citus_keys_$keys_shard WHERE tenant = 1 AND key = 'k-after')
	 = (SELECT xmin FROM public.payments_$shard1 WHERE tenant_id = 1 AND note = 'k-after')}),
	't',
	'... its key and row in one transaction on the new node');

# --- the coordinator crashes while the shard's node runs a call: the call
# commits there or not at all, and the retry replays or executes
{
	my ($node_now, $shard_now) = placement(1);
	my $blocker = hold_shard_lock($node_now, "public.payments_$shard_now", 6);
	my ($call) = start_call($coord,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-crash', $insert, 1::bigint, 'k-crash', 9)");
	$node_now->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE '%k-crash%' AND wait_event_type = 'Lock'"
	) or die 'call did not reach the shard\'s node';
	$coord->stop('immediate');
	$call->finish;
	$blocker->finish;
	$node_now->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE query LIKE '%k-crash%' AND pid <> pg_backend_pid()"
	) or die 'the call did not end on the shard\'s node';
	$coord->start;
	my $before = rows("note = 'k-crash'");
	($out, $err) = call($coord,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-crash', $insert, 1::bigint, 'k-crash', 9)"
	);
	is($out, $before eq '1' ? 't' : 'f',
		"retry after a coordinator crash mid-call: "
		  . ($before eq '1' ? 'committed there, replays' : 'rolled back there, executes'))
	  or diag($err);
	is(rows("note = 'k-crash'"), '1', '... one row');
}

# --- the shard's node is killed between the call's business write and its
# commit (the key record's insert held on a lock there): the call fails,
# nothing of it remains after the restart, and the retry executes once
{
	my ($node_now, $shard_now) = placement(1);
	my $kshard = $coord->safe_psql('postgres',
		"SELECT get_shard_id_for_distribution_column('idem.citus_keys', 1::bigint)");
	my $blocker = hold_shard_lock($node_now, "idem.citus_keys_$kshard", 60);
	my ($call, $cout) = start_call($coord,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-kill', $insert, 1::bigint, 'k-kill', 11)");
	# the business row is written (its shard locked by the call's insert)
	# and the key record's insert waits
	$node_now->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid"
		  . " WHERE a.query LIKE '%k-kill%' AND a.wait_event_type = 'Lock'"
		  . " AND l.relation = 'public.payments_$shard_now'::regclass AND l.mode = 'RowExclusiveLock' AND l.granted"
	) or die 'call did not write on the shard\'s node';
	$node_now->stop('immediate');
	$call->finish;
	$blocker->finish;
	isnt($call->result(0), 0, "the call fails when the shard's node dies before its commit");
	is($$cout, '', '... and returns nothing');
	$node_now->start;
	is(rows("note = 'k-kill'"), '0', '... nothing of it remains after the restart');
	($out, $err) = call($coord,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-kill', $insert, 1::bigint, 'k-kill', 11)");
	is($out, 'f', '... the retry executes') or diag($err);
	($out, $err) = call($w1,
		"SELECT replayed FROM idem_citus_call(1::bigint, 'k-kill', $insert, 1::bigint, 'k-kill', 11)");
	is($out, 't', '... and the next one replays') or diag($err);
	is(rows("note = 'k-kill'"), '1', '... one row');
}

# A move back to a node keeps failing while the shard an earlier move left
# there awaits its deferred drop: drop them now.
sub clean_orphans
{
	for my $try (1 .. 60)
	{
		$coord->psql('postgres', 'CALL citus_cleanup_orphaned_resources()');
		last if $coord->safe_psql('postgres',
			'SELECT count(*) = 0 FROM pg_dist_cleanup') eq 't';
		sleep(1);
	}
}

# --- the tenant's shard group moves while 3 entry nodes x 4 clients call
# and retry 3000 keys of the tenant: each key executes once, wherever the
# shard is, and every key's retry after the move replays; a move that
# blocks writes, then one by logical replication (the rebalancer's way when
# every table of the group has a replica identity), whose catch-up copies
# the key records and rows written on the old node during the move
#
# With events => 1 each call also writes an event of topic storm (the
# storm on 5000 keys for 12 s, longer than the move by logical replication
# takes here, so that new keys write events on both sides of its
# switch-over), and consumers on every node claim and, in a later
# transaction, acknowledge them during the move and after it (storm_consume,
# each claim and ack logged in its node's storm_log); doc/citus.md promises
# each event acknowledged exactly once, and a second delivery only of an
# event leased on the old node whose ack there came after the move (IDE04),
# claimed again on the new node once its lease ran out.
sub storm_move
{
	my ($mode, $p, %opt) = @_;
	my $t = $opt{tenant} // 1;
	clean_orphans();
	my ($from, $shard_now) = placement($t);
	my ($dest) = grep { $_->port != $from->port && $_ != $coord } ($w1, $w2);
	# the call of key $k (a pgbench variable or a key)
	my $call_of = sub {
		my ($k) = @_;
		return $opt{events}
		  ? "SELECT replayed FROM idem_citus_call_outbox(${t}::bigint, 'storm', '$k', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', ${t}::bigint, '$k', 1);\n"
		  : "SELECT replayed FROM idem_citus_call(${t}::bigint, '$k', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', ${t}::bigint, '$k', 1);\n";
	};
	my $storm = PostgreSQL::Test::Utils::tempdir() . "/$p.sql";
	PostgreSQL::Test::Utils::append_to_file($storm,
		"\\set k random(1, " . ($opt{events} ? 5000 : 3000) . ")\n" . $call_of->("$p-:k"));
	my @consumers;
	if ($opt{events})
	{
		for my $node (@nodes)
		{
			$node->safe_psql('postgres', 'TRUNCATE storm_log, storm_stop');
			for my $c (1 .. 2)
			{
				my ($in, $o, $e) = ('', '', '');
				my $h = IPC::Run::start(
					[
						'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d',
						$node->connstr('postgres'), '-c',
						"CALL storm_consume('" . $node->name . "-$c')"
					],
					'<', \$in, '>', \$o, '2>', \$e);
				push @consumers, [ $h, \$e ];
			}
		}
	}
	my @storm;
	for my $entry (@nodes)
	{
		my ($o, $e) = ('', '');
		my $h = IPC::Run::start(
			[
				'pgbench', '-n', '-M', 'simple', '-c', 4, '-j', 2,
				'-T', $opt{events} ? 12 : 6, '-f', $storm, '-h', '127.0.0.1', '-p', $entry->port,
				'postgres'
			],
			'>', \$o, '2>', \$e,
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
		push @storm, [ $entry, $h, \$o, \$e ];
	}
	$coord->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM payments WHERE tenant_id = $t AND note LIKE '$p-%'")
	  or die 'the storm did not start';
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard_now, '127.0.0.1', "
		  . $from->port
		  . ", '127.0.0.1', "
		  . $dest->port
		  . ", shard_transfer_mode => '$mode')");
	my $moved_at = $coord->safe_psql('postgres',
		"SELECT count(*) FROM payments WHERE tenant_id = $t AND note LIKE '$p-%'");
	my $calls = 0;
	for my $r (@storm)
	{
		my ($entry, $h, $o, $e) = @$r;
		$h->finish;
		$calls += $1 if $$o =~ /number of transactions actually processed: (\d+)/;
	}
	is((placement($t))[0]->port, $dest->port,
		"$mode: the shard group moved to " . $dest->name . " during the storm");
	# an event certainly written after the move, for the new node's consumers
	($out, $err) = call($from, $call_of->("$p-after"));
	is($out, 'f', "$mode: a new key after the move executes") or diag($err);
	cmp_ok($calls, '>', 40, "$mode: the storm made $calls calls ($moved_at keys done when the move ended)");
	is( $coord->safe_psql(
			'postgres', qq{
SELECT count(*) FROM (SELECT note FROM payments
 WHERE tenant_id = $t AND note LIKE '$p-%' GROUP BY 1 HAVING count(*) > 1) d}),
		'0',
		"$mode: storm during a move: no key executed twice");
	is( $coord->safe_psql(
			'postgres', qq{
SELECT (SELECT count(*) FROM payments WHERE tenant_id = $t AND note LIKE '$p-%')
	 = (SELECT count(*) FROM idem.citus_keys WHERE tenant = $t AND key LIKE '$p-%')}),
		't',
		"$mode: one key record per row");
	my @done = split /,/, $coord->safe_psql('postgres',
		"SELECT string_agg(note, ',' ORDER BY note) FROM payments WHERE tenant_id = $t AND note LIKE '$p-%'");
	my $retries = join('', map { $call_of->($_) } @done);
	for my $entry (@nodes)
	{
		($out, $err) = call($entry, $retries);
		is(join('', sort { $a cmp $b } split /\n/, $out), 't' x scalar(@done),
			"$mode: after the move, all " . scalar(@done) . ' keys replay through ' . $entry->name)
		  or diag($err);
	}
	is(rows("note LIKE '$p-%'"), scalar(@done), "$mode: ... and no row more");
	return unless $opt{events};

	# every event acknowledged (acks delete): then the consumers stop
	ok($coord->poll_query_until('postgres',
			"SELECT count(*) = 0 FROM idem.citus_outbox WHERE topic = 'storm'"),
		"$mode: the consumers delivered every event");
	$_->safe_psql('postgres', 'INSERT INTO storm_stop VALUES (true)') for @nodes;
	for (@consumers)
	{
		my ($h, $e) = @$_;
		$h->finish;
		is($$e, '', "$mode: a consumer ran without error");
	}
	# event => [claims], [acks], [failed acks]; a claim is "node attempt"
	my (%ev, @log);
	for my $node (@nodes)
	{
		push @log, map { [ $node->name, split /\|/ ] } split /\n/, $node->safe_psql('postgres',
			"SELECT extract(epoch FROM at), event_id, what, coalesce(attempt, 0), coalesce(sqlstate, '-') FROM storm_log");
	}
	for (sort { $a->[1] <=> $b->[1] } @log)
	{
		my ($name, $at, $id, $what, $attempt, $state) = @$_;
		my $e = $ev{$id} //= { claims => [], acks => 0, failed => [] };
		push @{ $e->{claims} }, "$name $attempt" if $what eq 'claim';
		$e->{acks}++ if $what eq 'ack';
		push @{ $e->{failed} }, "$name $state" if $what eq 'ack failed';
	}
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM payments WHERE tenant_id = $t AND note LIKE '$p-%'"),
		scalar(keys %ev), "$mode: one event per executed key, each claimed");
	is(scalar(grep { $_->{acks} != 1 } values %ev), 0,
		"$mode: each event acknowledged exactly once");
	my @failed = map { @{ $_->{failed} } } values %ev;
	is(join(',', grep { $_ ne $from->name . ' IDE04' } @failed), '',
		"$mode: every failed ack (" . scalar(@failed) . ') was IDE04, on the node the shard left');
	is(scalar(grep { @{ $_->{claims} } != 1 + @{ $_->{failed} } } values %ev), 0,
		"$mode: an event claimed again only after its ack failed so");
	my @again = grep { @{ $_->{failed} } } values %ev;
	is(scalar(grep { $_->{claims}[-1] ne $dest->name . ' ' . scalar(@{ $_->{claims} }) } @again), 0,
		"$mode: ... its next claim on the new node, its attempt counted ("
		  . scalar(@again) . ' events delivered twice)');
	is($dest->safe_psql('postgres', "SELECT count(*) FROM storm_log WHERE key = '$p-after'"),
		'1', "$mode: its event claimed on the new node");
	my %acks;
	$acks{ $_->[0] }++ for grep { $_->[3] eq 'ack' } @log;
	diag("$mode: acks per node: " . join(', ', map { "$_ " . ($acks{$_} // 0) } map { $_->name } @nodes));
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM idem.citus_outbox WHERE topic = 'storm'"),
		'0', "$mode: the retries after the move wrote no event");
}

storm_move('block_writes', 'storm');
$coord->safe_psql('postgres', 'ALTER TABLE payments REPLICA IDENTITY FULL');
storm_move('force_logical', 'lstorm');

# --- 3 entry nodes x 16 clients on 50 hot keys over 8 tenants
my $clients = 16;
my $script = PostgreSQL::Test::Utils::tempdir() . '/hot.sql';
PostgreSQL::Test::Utils::append_to_file(
	$script, qq{\\set t random(101, 108)
\\set k random(1, 50)
SELECT replayed FROM idem_citus_call(:t::bigint, 'hot-:k', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', :t::bigint, 'hot-:k', 1);
});
my @runs;
for my $entry (@nodes)
{
	my ($o, $e) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-M', 'simple', '-c', $clients, '-j', 2,
			'-t', 40, '-f', $script, '-h', '127.0.0.1', '-p', $entry->port,
			'postgres'
		],
		'>', \$o, '2>', \$e,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	push @runs, [ $entry, $h, \$o, \$e ];
}
for my $r (@runs)
{
	my ($entry, $h, $o, $e) = @$r;
	$h->finish;
	is($h->result(0), 0, 'pgbench through ' . $entry->name . ' succeeded')
	  or diag($$e);
	like($$o, qr/number of failed transactions: 0/, '... no failed transaction')
	  if $$o =~ /failed transactions/;
}
is( $coord->safe_psql(
		'postgres', q{
SELECT count(*) FROM (SELECT tenant_id, note FROM payments
 WHERE tenant_id BETWEEN 101 AND 108 GROUP BY 1, 2 HAVING count(*) > 1) d}),
	'0',
	'hot keys: no (tenant, key) executed twice');
is( $coord->safe_psql(
		'postgres', q{
SELECT (SELECT count(*) FROM payments WHERE tenant_id BETWEEN 101 AND 108)
	 = (SELECT count(*) FROM idem.citus_keys WHERE tenant BETWEEN 101 AND 108)}),
	't',
	'hot keys: one key record per row');

# --- a setting on the function reaches the shard's node (a session's SET
# does not: doc/citus.md); expired tenant records are purged on every
# shard, from the coordinator
my $fn = 'idem_citus_call(bigint, text, text, VARIADIC "any")';
$coord->safe_psql('postgres', "ALTER FUNCTION $fn SET idem.ttl = '1s'");
$coord->safe_psql('postgres',
	join('', map { "SELECT replayed FROM idem_citus_call(${_}::bigint, 'k-exp', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', ${_}::bigint, 'k-exp', 1);\n" } 201 .. 216));
$coord->safe_psql('postgres', "ALTER FUNCTION $fn RESET idem.ttl");
is($coord->safe_psql('postgres',
		q{SELECT count(*) FROM idem.citus_keys WHERE tenant BETWEEN 201 AND 216
		   AND expires_at - created_at < interval '1 minute'}),
	'16', "the function's idem.ttl holds on the shard's node");
my %ports = map { ((placement($_))[0]->port => 1) } 201 .. 216;
is(scalar(keys %ports), 2, 'the short-lived records are on both workers');
my $kept = $coord->safe_psql('postgres',
	'SELECT count(*) FROM idem.citus_keys WHERE tenant NOT BETWEEN 201 AND 216');
# a record counts from its commit, with a second of slack (doc/semantics.md)
sleep(3);
is($coord->safe_psql('postgres', 'SELECT idem_citus_purge()'),
	'16', 'idem_citus_purge() removes the 16 expired records');
is($coord->safe_psql('postgres',
		'SELECT count(*) FROM idem.citus_keys WHERE tenant BETWEEN 201 AND 216'),
	'0', '... from every shard');
is($coord->safe_psql('postgres',
		'SELECT count(*) FROM idem.citus_keys WHERE tenant NOT BETWEEN 201 AND 216'),
	$kept, '... and no record that has not expired');
$coord->safe_psql('postgres', 'CALL idem_purge_all()');

# an expired record is replaced by the next call of its key, which runs
# the statement again: two tenants, one on each worker
my @exp_tenants = (231);
my $exp_port = (placement(231))[0]->port;
for my $t (232 .. 260)
{
	next if (placement($t))[0]->port == $exp_port;
	push @exp_tenants, $t;
	last;
}
is(scalar(@exp_tenants), 2, 'a tenant on each worker');
my $exp_in = join(', ', @exp_tenants);
$coord->safe_psql('postgres', "ALTER FUNCTION $fn SET idem.ttl = '1s'");
my $exp_call = join('', map { "SELECT replayed FROM idem_citus_call(${_}::bigint, 'k-exp2', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', ${_}::bigint, 'k-exp2', 1);\n" } @exp_tenants);
is($coord->safe_psql('postgres', $exp_call), "f\nf", 'two calls with a ttl of 1 s');
$coord->safe_psql('postgres', "ALTER FUNCTION $fn RESET idem.ttl");
sleep(3);
is($coord->safe_psql('postgres', $exp_call), "f\nf",
	'after their records expired, the same calls run again');
is($coord->safe_psql('postgres', $exp_call), "t\nt", '... and then replay');
is($coord->safe_psql('postgres',
		qq{SELECT count(*), count(*) FILTER (WHERE expires_at - created_at > interval '1 minute')
		    FROM idem.citus_keys WHERE tenant IN ($exp_in) AND key = 'k-exp2'}),
	'2|2', '... with one record each, of the default ttl');
is($coord->safe_psql('postgres',
		qq{SELECT count(*) FROM payments WHERE tenant_id IN ($exp_in) AND note = 'k-exp2'}),
	'4', '... and two rows each');

# a REPEATABLE READ call whose key another call recorded after the
# snapshot was taken: 40001, as idem_execute() would, before the
# statement runs (not a unique violation after it)
{
	my ($rr_node) = placement(233);
	my $rr_call = "SELECT replayed FROM idem_citus_call(233::bigint, 'k-rr', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', 233::bigint, 'k-rr', 1)";
	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start(
		[
			'psql', '-XAtq', '-v', 'VERBOSITY=verbose', '-d',
			$rr_node->connstr('postgres'), '-c',
			"BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) >= 0 FROM pg_class;"
			  . " SELECT pg_sleep(4); $rr_call; COMMIT;"
		],
		'<', \$in, '>', \$out, '2>', \$err);
	$rr_node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep(4)%' AND pid <> pg_backend_pid()"
	) or die 'the REPEATABLE READ session did not start';
	is($coord->safe_psql('postgres', $rr_call), 'f',
		'a call records its key while a REPEATABLE READ transaction waits');
	$h->finish;
	is(sqlstate_of($err), '40001',
		'... the same call in that transaction, on the shard\'s node: 40001')
	  or diag($err);
	is(rows("tenant_id = 233 AND note = 'k-rr'"), '1',
		'... and its statement did not run');
}

# --- outbox events: written with the call, in its transaction, to the
# tenant's shard of idem.citus_outbox; each node's consumers deliver the
# events of the shards placed there, and the events move with the shards
is($coord->safe_psql('postgres',
		q{SELECT count(*) FROM run_command_on_all_nodes($$SELECT idem_outbox_create_topic('refunds')$$) WHERE success}),
	'3', 'the topic registered on every node');
# the calls of keys ev-$from .. ev-$to, tenant 301 + n % 16, through $entry
sub event_calls
{
	my ($entry, $from, $to) = @_;
	my ($out, $err) = call($entry,
		join('', map { my $t = 301 + $_ % 16; "SELECT replayed FROM idem_citus_call_outbox(${t}::bigint, 'refunds', 'ev-$_', $insert, ${t}::bigint, 'ev-$_', 1);\n" } $from .. $to));
	return (join('', sort { $a cmp $b } split /\n/, $out), $err);
}
# the undelivered events: on every shard, and in each node's own outbox
sub events_pending
{
	my $n = $coord->safe_psql('postgres',
		"SELECT count(*) FROM idem.citus_outbox WHERE topic = 'refunds'");
	$n += $_->safe_psql('postgres',
		"SELECT count(*) FROM idem.outbox WHERE topic = 'refunds'") for @nodes;
	return $n;
}
# the port of the node holding tenant $t's shard of idem.citus_outbox
sub events_port
{
	my ($t) = @_;
	return $coord->safe_psql('postgres', qq{
SELECT s.nodeport FROM citus_shards s
 WHERE s.shardid = get_shard_id_for_distribution_column('idem.citus_outbox', ${t}::bigint)});
}
($out, $err) = call($coord,
	"SELECT idem_citus_call_outbox(301::bigint, 'no-such-topic', 'ev-x', $insert, 301::bigint, 'ev-x', 1)");
is(sqlstate_of($err), '42704', 'an unregistered topic: 42704');
($out, $err) = call($coord,
	"SELECT idem_citus_call_outbox(301::bigint, 'refunds', 'ev-bad', $insert, 301::bigint, 'ev-bad', 0)");
is(sqlstate_of($err), '23514', 'a failing business statement raises its error');
($out, $err) = call($coord,
	"SELECT idem_citus_call_outbox(301::bigint, 'refunds', 'ev-stray', $insert, 302::bigint, 'ev-stray', 1)");
is(sqlstate_of($err), 'IDC03', 'a statement writing another tenant: IDC03');
is(rows("note IN ('ev-x', 'ev-bad', 'ev-stray')"), '0', '... none of the three wrote a row');
is(events_pending(), '0', '... or an event');
my $entry_no = 0;
for my $entry (@nodes)
{
	my $from = 1 + 20 * $entry_no++;
	($out, $err) = event_calls($entry, $from, $from + 19);
	is($out, 'f' x 20, 'ev-' . $from . '.. through ' . $entry->name . ' execute') or diag($err);
}
($out, $err) = event_calls($w2, 1, 60);
is($out, 't' x 60, 'their retries through one worker replay') or diag($err);
is(events_pending(), '60', 'one event per executed call, none per replay');
is($coord->safe_psql('postgres', q{
SELECT count(*) FROM idem.citus_outbox o
 WHERE o.tenant <> 301 + substr(o.key, 4)::int % 16
	OR o.owner_name <> current_user OR o.state <> 'pending'}),
	'0', "each event is on its tenant's shard of idem.citus_outbox, pending, its owner named");
is($coord->safe_psql('postgres', q{
SELECT count(DISTINCT (p.nodeport = e.nodeport)) FROM generate_series(301, 316) t,
	LATERAL (SELECT nodeport FROM citus_shards WHERE shardid =
		get_shard_id_for_distribution_column('payments', t::bigint)) p,
	LATERAL (SELECT nodeport FROM citus_shards WHERE shardid =
		get_shard_id_for_distribution_column('idem.citus_outbox', t::bigint)) e}),
	'1', "... on the node of the tenant's payments");
{
	my ($node, $shard) = placement(301 + 1 % 16);
	my $eshard = $coord->safe_psql('postgres',
		"SELECT get_shard_id_for_distribution_column('idem.citus_outbox', 302::bigint)");
	is( $node->safe_psql(
			'postgres', qq{
SET citus.override_table_visibility = off;
SELECT (SELECT xmin FROM idem.citus_outbox_$eshard WHERE key = 'ev-1')
	 = (SELECT xmin FROM public.payments_$shard WHERE note = 'ev-1')}),
		't', "... written in the business row's transaction");
	is(join(',', map { $_->safe_psql('postgres',
			"SELECT count(*) FROM idem.outbox WHERE topic = 'refunds'") } @nodes),
		'0,0,0', "... and none in a node's own idem.outbox");
}

# consumers: a procedure that claims and acks until the topic is empty,
# logging each delivery in a table of its node
$coord->safe_psql('postgres', q{
CREATE PROCEDURE consume(c text) LANGUAGE plpgsql AS $$
DECLARE
	e record;
	n int;
BEGIN
	LOOP
		n := 0;
		FOR e IN SELECT * FROM idem_outbox_claim('refunds', 3, '30 s', c) LOOP
			INSERT INTO delivered_log VALUES (e.event_id, e.key, c);
			PERFORM idem_outbox_ack(e.event_id, e.lease_token);
			n := n + 1;
		END LOOP;
		COMMIT;
		EXIT WHEN n = 0;
	END LOOP;
END $$});
for my $node (@nodes)
{
	$node->safe_psql('postgres',
		'CREATE TABLE delivered_log (event_id uuid, key text, consumer text)');
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM pg_proc WHERE proname = 'consume'"),
		'1', $node->name . ': the consumer procedure is there');
}
# run $per consumers on every node (or on those given) at once; the log
# of all nodes
sub deliver
{
	my ($per, @on) = @_;
	my @h;
	@on = @nodes unless @on;
	for my $node (@on)
	{
		for my $c (1 .. $per)
		{
			my ($in, $out, $err) = ('', '', '');
			my $h = IPC::Run::start(
				[
					'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-d',
					$node->connstr('postgres'), '-c',
					"CALL consume('" . $node->name . "-$c')"
				],
				'<', \$in, '>', \$out, '2>', \$err);
			push @h, [ $h, \$err ];
		}
	}
	for (@h)
	{
		my ($h, $err) = @$_;
		$h->finish;
		is($$err, '', 'a consumer ran without error');
	}
	return join("\n", grep { $_ ne '' } map { $_->safe_psql('postgres',
		"SELECT string_agg(event_id || ' ' || key || ' ' || consumer, E'\\n') FROM delivered_log") } @on);
}
sub check_log
{
	my ($log, $keys, $what) = @_;
	my (%events, %keys);
	for (split /\n/, $log)
	{
		my ($ev, $key) = split / /;
		$events{$ev}++;
		$keys{$key}++;
	}
	is(scalar(grep { $_ > 1 } values %events), 0, "$what: no event delivered twice");
	is(join(',', sort keys %keys), join(',', sort @$keys), "$what: every event delivered");
	is(events_pending(), '0', "$what: no event left");
}
check_log(deliver(1), [ map { "ev-$_" } 1 .. 60 ], 'one consumer per node');

# events of a tenant written before its shard group moves move with it,
# and are delivered from the new node, under the same event ids; those
# after are written on the new node
my $mover = 301 + 61 % 16;
my ($old_node, $mshard) = placement($mover);
($out, $err) = event_calls($coord, 61, 90);
is($out, 'f' x 30, 'ev-61..90 execute') or diag($err);
my $moved_ids = $coord->safe_psql('postgres',
	"SELECT string_agg(event_id::text, ',' ORDER BY key) FROM idem.citus_outbox WHERE key IN ('ev-61', 'ev-77')");
is(events_port($mover), $old_node->port, "tenant ${mover}'s events are on its node");
my ($new_node) = grep { $_ != $old_node && $_ != $coord } ($w1, $w2);
sub move_group
{
	my ($shard, $from, $to) = @_;
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', "
		  . $from->port . ", '127.0.0.1', " . $to->port
		  . ", shard_transfer_mode => 'block_writes')");
}
move_group($mshard, $old_node, $new_node);
is((placement($mover))[0]->port, $new_node->port, "tenant ${mover}'s shard group moved");
is(events_port($mover), $new_node->port, "... its shard of idem.citus_outbox with it");
is($coord->safe_psql('postgres',
		"SELECT string_agg(event_id::text, ',' ORDER BY key) FROM idem.citus_outbox WHERE key IN ('ev-61', 'ev-77') AND state = 'pending'"),
	$moved_ids, '... and its events written before the move, pending, under the same ids');
is($old_node->safe_psql('postgres',
		"BEGIN; SELECT count(*) FROM idem_outbox_claim('refunds', 100, '30 s') WHERE key IN ('ev-61', 'ev-77'); ROLLBACK"),
	'0', '... which a claim on the old node no longer finds');
($out, $err) = event_calls($w1, 61, 120);
is($out, 'f' x 30 . 't' x 30, 'ev-91..120 execute, ev-61..90 replay after the move') or diag($err);
$_->safe_psql('postgres', 'TRUNCATE delivered_log') for @nodes;
my $log = deliver(3);
check_log($log, [ map { "ev-$_" } 61 .. 120 ], 'three consumers per node');
my $new_name = $new_node->name;
is(scalar(grep { / ev-(61|77|93|109) \Q$new_name\E-/ } split /\n/, $log), 4,
	"tenant ${mover}'s events delivered from the new node, before and after the move");
is(join(',', map { (split / /)[0] } sort { (split / /, $a)[1] cmp (split / /, $b)[1] }
		grep { / ev-(61|77) / } split /\n/, $log),
	$moved_ids, '... under the ids they were written with');

# an event leased on one node whose shard group then moves: its ack there
# fails (IDE04), and the new node delivers it again once the lease ran out
($out, $err) = event_calls($coord, 125, 125);
is($out, 'f', "ev-125 (tenant $mover) executes") or diag($err);
my ($lease_id, $token) = split /\|/, $new_node->safe_psql('postgres',
	"SELECT event_id, lease_token FROM idem_outbox_claim('refunds', 10, '2 s', 'before-move')");
is($coord->safe_psql('postgres', "SELECT key FROM idem.citus_outbox WHERE event_id = '$lease_id'"),
	'ev-125', "claimed on tenant ${mover}'s node");
move_group($mshard, $new_node, $old_node);
is(events_port($mover), $old_node->port, '... then its shard group moved back');
($out, $err) = call($new_node, "SELECT idem_outbox_ack('$lease_id', '$token')");
is(sqlstate_of($err), 'IDE04', '... the ack on the node it left: IDE04, the event not found there');
like($err, qr/whose shard moved to another node/, '... saying why it may be');
is($coord->safe_psql('postgres', "SELECT state || ' ' || attempts FROM idem.citus_outbox WHERE event_id = '$lease_id'"),
	'leased 1', '... the event still leased, on the new node');
sleep 3;
my ($again_id, $attempt, $again_token) = split /\|/, $old_node->safe_psql('postgres',
	"SELECT event_id, attempt, lease_token FROM idem_outbox_claim('refunds', 10, '30 s', 'after-move')");
is("$again_id $attempt", "$lease_id 2", '... claimed there again once the lease ran out, the same event, attempt 2');
($out, $err) = call($old_node, "SELECT idem_outbox_ack('$again_id', '$again_token')");
is($err, '', '... and acknowledged there') or diag($err);
is(events_pending(), '0', '... none left');

# a verb's transaction keeps its node's shards of idem.citus_outbox: a
# move waits for it, also when its session listed them in an earlier verb
{
	my ($node, $shard) = placement($mover);
	my ($other) = grep { $_ != $node && $_ != $coord } ($w1, $w2);
	clean_orphans();
	my ($h) = start_call($node,
		"SELECT count(*) FROM idem_outbox_claim('refunds', 1, '30 s');"
		  . " BEGIN; SELECT count(*) FROM idem_outbox_claim('refunds', 1, '30 s');"
		  . " SELECT pg_sleep(4); COMMIT;");
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND query LIKE '%pg_sleep(4)%'")
	  or die 'the claim did not start';
	my ($move) = start_call($coord,
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $node->port
		  . ", '127.0.0.1', " . $other->port . ", shard_transfer_mode => 'block_writes')");
	ok( $node->poll_query_until('postgres',
			"SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"),
		"a move waits for a claim's transaction on the shard's node, whose session listed the shards before");
	is((placement($mover))[0]->port, $node->port, '... the shard group still there meanwhile');
	$h->finish;
	$move->finish;
	is((placement($mover))[0]->port, $other->port, '... and moved once the claim committed');
}

# the other verbs on a tenant's event, on its node: extend, fail to a dead
# letter, requeue, release, and an ack that keeps it delivered for
# idem_citus_purge()
{
	($out, $err) = event_calls($coord, 141, 141);
	is($out, 'f', "ev-141 (tenant $mover) executes") or diag($err);
	my $verbs_node = (placement($mover))[0];
	my $state = sub {
		$coord->safe_psql('postgres',
			"SELECT state || ' ' || attempts || ' ' || coalesce(last_error, '-') FROM idem.citus_outbox WHERE key = 'ev-141'");
	};
	my $claim = sub {
		split /\|/, $verbs_node->safe_psql('postgres',
			"SELECT event_id, lease_token FROM idem_outbox_claim('refunds', 10, '30 s', 'verbs')");
	};
	my ($id, $tok) = $claim->();
	is($verbs_node->safe_psql('postgres',
			"SELECT idem_outbox_extend('$id', '$tok', '10 min') > now() + interval '9 min'"),
		't', 'a tenant event: its lease extended on its node');
	is($coord->safe_psql('postgres',
			"SELECT next_attempt_at > now() + interval '9 min' FROM idem.citus_outbox WHERE event_id = '$id'"),
		't', '... on its shard');
	is($verbs_node->safe_psql('postgres',
			"SET idem.outbox_max_attempts = 1; SELECT idem_outbox_fail('$id', '$tok', 'boom') IS NULL"),
		't', '... failed on its last attempt');
	is($state->(), 'dead 1 boom', '... a dead letter, with its error');
	$verbs_node->safe_psql('postgres', "SELECT idem_outbox_requeue('$id')");
	is($state->(), 'pending 0 boom', '... requeued');
	($id, $tok) = $claim->();
	$verbs_node->safe_psql('postgres', "SELECT idem_outbox_release('$id', '$tok')");
	is($state->(), 'pending 0 boom', '... claimed and released, the attempt not counted');
	($id, $tok) = $claim->();
	$verbs_node->safe_psql('postgres',
		"SET idem.outbox_keep_delivered = on; SELECT idem_outbox_ack('$id', '$tok')");
	is($state->(), 'delivered 1 boom', '... acknowledged, kept as delivered');

	# a node's idem_outbox_purge() purges the delivered events of the
	# shards placed there, as its own
	my ($other) = grep { $_ != $verbs_node && $_ != $coord } ($w1, $w2);
	is($other->safe_psql('postgres',
			"SET idem.outbox_retention = 0; SELECT idem_outbox_purge()"),
		'0', "idem_outbox_purge() on a node without the tenant's shard: nothing");
	is($verbs_node->safe_psql('postgres', 'SELECT idem_outbox_purge()'),
		'0', "... on the tenant's node, within idem.outbox_retention: nothing");
	is($state->(), 'delivered 1 boom', '... the event kept');
	is($verbs_node->safe_psql('postgres',
			"SET idem.outbox_retention = 0; SELECT idem_outbox_purge(), idem_outbox_purge()"),
		'1|0', "... past it: the delivered tenant event, counted once");
	is($state->(), '', '... and removed from its shard');

	($out, $err) = event_calls($coord, 142, 142);
	is($out, 'f', 'ev-142 (tenant ' . (301 + 142 % 16) . ') executes') or diag($err);
	my $ev142 = (placement(301 + 142 % 16))[0];
	($id, $tok) = split /\|/, $ev142->safe_psql('postgres',
		"SELECT event_id, lease_token FROM idem_outbox_claim('refunds', 10, '30 s', 'verbs')");
	$ev142->safe_psql('postgres',
		"SET idem.outbox_keep_delivered = on; SELECT idem_outbox_ack('$id', '$tok')");
	cmp_ok($coord->safe_psql('postgres',
			"SET idem.outbox_retention = 0; SELECT idem_citus_purge()"),
		'>=', 1, 'idem_citus_purge() counts a delivered tenant event');
	is($coord->safe_psql('postgres', "SELECT count(*) FROM idem.citus_outbox WHERE key = 'ev-142'"),
		'0', '... and removed it from its shard');
}

# --- a shard move during a retry storm whose calls write events, while
# every node's consumers claim and acknowledge them: each event is
# acknowledged once, and delivered again only as doc/citus.md says (an
# ack on the old node after the move, IDE04, then a claim on the new one)
is($coord->safe_psql('postgres',
		q{SELECT count(*) FROM run_command_on_all_nodes($$SELECT idem_outbox_create_topic('storm')$$) WHERE success}),
	'3', 'topic storm registered on every node');
$coord->safe_psql('postgres', q{
CREATE PROCEDURE storm_consume(c text) LANGUAGE plpgsql AS $$
DECLARE
	e record;
	ids uuid[];
	tokens uuid[];
BEGIN
	LOOP
		ids := '{}';
		tokens := '{}';
		FOR e IN SELECT * FROM idem_outbox_claim('storm', 10, '5 s', c) LOOP
			INSERT INTO storm_log VALUES (e.event_id, 'claim', e.attempt, NULL, e.key);
			ids := ids || e.event_id;
			tokens := tokens || e.lease_token;
		END LOOP;
		COMMIT;
		IF cardinality(ids) = 0 THEN
			EXIT WHEN EXISTS (SELECT FROM storm_stop);
			PERFORM pg_sleep(0.05);
			CONTINUE;
		END IF;
		-- the acks in a transaction of their own, as a consumer that
		-- delivers the events before it acknowledges them: a move can
		-- come in between
		PERFORM pg_sleep(0.02);
		FOR i IN 1 .. cardinality(ids) LOOP
			BEGIN
				PERFORM idem_outbox_ack(ids[i], tokens[i]);
				INSERT INTO storm_log VALUES (ids[i], 'ack', NULL, NULL, NULL);
			EXCEPTION WHEN OTHERS THEN
				INSERT INTO storm_log VALUES (ids[i], 'ack failed', NULL, SQLSTATE, NULL);
			END;
		END LOOP;
		COMMIT;
	END LOOP;
END $$});
$_->safe_psql('postgres', q{
CREATE TABLE storm_log (event_id uuid, what text, attempt int, sqlstate text,
	key text, at timestamptz DEFAULT clock_timestamp());
CREATE TABLE storm_stop (stop boolean)}) for @nodes;
storm_move('block_writes', 'bestorm', events => 1, tenant => 601);
storm_move('force_logical', 'lestorm', events => 1, tenant => 601);

# --- idem_citus_call_with(): idem_call() for a tenant, its arguments as
# text typed by the statement, its options carried to the shard's node
{
	my $sql = q{'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount'};
	my $with = "SELECT replayed, response FROM idem_citus_call_with(451::bigint, 'with-1', $sql,"
	  . " ARRAY['451', 'with-1', '9'], ttl => '7 days', outbox_topic => 'refunds')";
	($out, $err) = call($coord, $with);
	like($out, qr/^f\|\{.*"amount": 9/, 'with: executes, its text arguments typed by the statement') or diag($err);
	my $first = (split /\|/, $out, 2)[1];
	is($coord->safe_psql('postgres',
			"SELECT expires_at - created_at BETWEEN '7 days' AND '7 days 1 minute' FROM idem.citus_keys WHERE tenant = 451 AND key = 'with-1'"),
		't', "... its ttl option holds on the shard's node");
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM idem.citus_outbox WHERE tenant = 451 AND key = 'with-1' AND topic = 'refunds'"),
		'1', "... and its outbox_topic option wrote the event, on the tenant's shard");
	($out, $err) = call($w2, "SELECT replayed, response FROM idem_citus_call_with(451::bigint, 'with-1', $sql,"
		  . " ARRAY['451', 'with-1', '9'])");
	is($out, "t|$first", '... the retry through a worker, without the options, replays') or diag($err);
	($out, $err) = call($w1, "SELECT replayed FROM idem_citus_call_with(451::bigint, 'with-1', $sql,"
		  . " ARRAY['451', 'with-1', '10'])");
	is(sqlstate_of($err), 'ID422', '... another amount under the key: ID422');
	($out, $err) = call($coord, "SELECT replayed FROM idem_citus_call_with(451::bigint, 'with-0', $sql,"
		  . " ARRAY['451', 'with-0', '9'], ttl => '0 s')");
	is(sqlstate_of($err), '22023', 'a ttl of 0 s: 22023');
	is(rows("note = 'with-0'"), '0', '... nothing written');

	# wait => false: the key is held by a call whose transaction is open
	my ($h) = start_call($coord,
		"BEGIN; SELECT idem_citus_call_with(452::bigint, 'with-w', $sql, ARRAY['452', 'with-w', '1']);"
		  . " SELECT pg_sleep(4); COMMIT;");
	$coord->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE query LIKE '%pg_sleep(4)%' AND wait_event = 'PgSleep'")
	  or die 'the holding call did not start';
	($out, $err) = call($w1, "SELECT replayed FROM idem_citus_call_with(452::bigint, 'with-w', $sql,"
		  . " ARRAY['452', 'with-w', '1'], wait => false)");
	is(sqlstate_of($err), 'ID409', 'wait => false while the key is held on the shard\'s node: ID409');
	$h->finish;
	($out, $err) = call($w1, "SELECT replayed FROM idem_citus_call_with(452::bigint, 'with-w', $sql,"
		  . " ARRAY['452', 'with-w', '1'], wait => false)");
	is($out, 't', '... once it committed, the retry replays') or diag($err);
	is(rows("note IN ('with-1', 'with-w')"), '2', 'one row each');
}

# --- a driver's retry: psycopg, with Python values as server-side
# parameters, prepared from the first execution, calls
# idem_citus_call_with() through the coordinator and retries it through a
# worker; psql retries through the other worker
{
	my $py = PostgreSQL::Test::Utils::tempdir() . '/driver.py';
	PostgreSQL::Test::Utils::append_to_file($py, q{
import sys, psycopg
out = []
for dsn in sys.argv[1:]:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0)
    for tenant in (461, 462, 463):
        for attempt in range(3):
            row = conn.execute(
                "SELECT replayed, response FROM idem_citus_call_with(%s, %s,"
                " 'INSERT INTO payments VALUES ($1, $2, $3) RETURNING tenant_id, note, amount', %s)",
                (tenant, "drv-%d" % tenant, [str(tenant), "drv-%d" % tenant, "25"])).fetchone()
            out.append("%s:%d" % ("t" if row[0] else "f", row[1]["rows"][0]["amount"]))
    conn.close()
print(" ".join(out))
});
	my ($stdout, $stderr) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', $py, $coord->connstr('postgres'), $w1->connstr('postgres') ],
		'>', \$stdout, '2>', \$stderr);
	is($stdout, join(' ', ('f:25', 't:25', 't:25') x 3, ('t:25') x 9) . "\n",
		'psycopg: each tenant executes once through the coordinator, its prepared retries and those through worker1 replay')
	  or diag($stderr);
	($out, $err) = call($w2, join('', map { "SELECT replayed FROM idem_citus_call_with(${_}::bigint, 'drv-$_', $insert, ARRAY['$_', 'drv-$_', '25']);\n" } 461 .. 463));
	is($out, "t\nt\nt", "psql's retries through worker2 replay") or diag($err);
	is(rows("note LIKE 'drv-%'"), '3', 'one row per tenant');
}

# --- two tenant calls in one transaction block, tenants on different
# nodes: both commit, and their retries replay
{
	my ($na) = placement(501);
	my $tb = (grep { (placement($_))[0]->port != $na->port } 502 .. 540)[0];
	($out, $err) = call($coord, qq{
BEGIN;
SELECT replayed FROM idem_citus_call(501::bigint, 'tx-a', $insert, 501::bigint, 'tx-a', 1);
SELECT replayed FROM idem_citus_call(${tb}::bigint, 'tx-b', $insert, ${tb}::bigint, 'tx-b', 1);
COMMIT;});
	is($out, "f\nf", 'both execute') or diag($err);
	is(rows("note IN ('tx-a', 'tx-b')"), '2', '... and both rows committed');
	($out, $err) = call($w1, qq{
SELECT replayed FROM idem_citus_call(501::bigint, 'tx-a', $insert, 501::bigint, 'tx-a', 1);
SELECT replayed FROM idem_citus_call(${tb}::bigint, 'tx-b', $insert, ${tb}::bigint, 'tx-b', 1);});
	is($out, "t\nt", '... their retries through a worker replay') or diag($err);
	is(rows("note IN ('tx-a', 'tx-b')"), '2', '... one row each');
}

# --- runs are not distributed: a step whose statement Citus would run on
# a worker is refused like idem_execute(), recording nothing
$coord->safe_psql('postgres',
	"SELECT idem_run_begin('run-c1', steps => ARRAY['pay', 'mail'])");
($out, $err) = call($coord,
	"SELECT idem_step('run-c1', 'pay', $insert, 1::bigint, 'run-c1', 5)");
is(sqlstate_of($err), 'IDC02', 'a step writing a distributed table: IDC02');
is(rows("note = 'run-c1'"), '0', '... no row');
is($coord->safe_psql('postgres',
		"SELECT done_steps FROM idem.runs WHERE run_id = 'run-c1'"),
	'{}', '... and the step is not recorded');
($out, $err) = call($coord,
	"SELECT idem_call(NULL, $insert, ARRAY['1', 'run-c1', '5'], run_id => 'run-c1', step => 'pay')");
is(sqlstate_of($err), 'IDC02', '... so is the same step through idem_call()');
($out, $err) = call($coord,
	"SELECT idem_dry_run('k-dry', $insert, 1::bigint, 'k-dry', 5)");
is(sqlstate_of($err), 'IDC02', '... and a dry run of such a statement, as the call would be');
is(rows("note IN ('run-c1', 'k-dry')"), '0', '... none wrote a row');
($out, $err) = call($coord,
	"SELECT idem_step('run-c1', 'pay', 'INSERT INTO plain_local VALUES (1) RETURNING id')");
is($err, '', 'a step on a local table runs') or diag($err);

# --- an application role that is not a superuser: its calls, its keys,
# its events
$coord->safe_psql('postgres', q{
CREATE ROLE app LOGIN;
CREATE ROLE app2 LOGIN;
GRANT SELECT, INSERT ON payments TO app, app2;
});
is($coord->safe_psql('postgres',
		q{SELECT count(*) FROM run_command_on_all_nodes($$SELECT idem_outbox_grant('refunds', 'app', 'publish')$$) WHERE success}),
	'3', 'app may publish to the topic on every node');
sub call_as
{
	my ($node, $role, $sql) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $sql,
		extra_params => [ '-U', $role, '-v', 'VERBOSITY=verbose' ]);
	return ($out, $err);
}
my $app_call = "SELECT replayed, response FROM idem_citus_call_outbox(401::bigint, 'refunds', 'app-1', $insert, 401::bigint, 'app-1', 7)";
($out, $err) = call_as($coord, 'app', $app_call);
like($out, qr/^f\|/, 'app: a call through the coordinator executes') or diag($err);
my $app_first = (split /\|/, $out, 2)[1];
for my $entry ($w1, $w2)
{
	($out, $err) = call_as($entry, 'app', $app_call);
	is($out, "t|$app_first", 'app: the retry through ' . $entry->name . ' replays') or diag($err);
}
($out, $err) = call_as($w1, 'app2', $app_call);
is(sqlstate_of($err), '42501', 'app2, not a publisher of the topic: 42501');
($out, $err) = call_as($w1, 'app2',
	"SELECT replayed FROM idem_citus_call(401::bigint, 'app-1', $insert, 401::bigint, 'app-1', 7)");
is($out, 'f', "app2's key app-1 is not app's: it executes") or diag($err);
is(rows("note = 'app-1'"), '2', 'one row for each role');
is( $coord->safe_psql('postgres',
		"SELECT string_agg(owner::text, ',' ORDER BY owner::text) FROM idem.citus_keys WHERE tenant = 401 AND key = 'app-1'"),
	'app,app2', "each role's key record");
is($coord->safe_psql('postgres',
		"SELECT string_agg(owner_name, ',') FROM idem.citus_outbox WHERE tenant = 401 AND key = 'app-1'"),
	'app', "app's event, on its tenant's shard, and none of app2's refused call");
($out, $err) = call_as($coord, 'app', 'SELECT count(*) FROM idem.citus_keys');
is(sqlstate_of($err), '42501', 'app cannot read idem.citus_keys');

# --- a role's records follow its name across nodes: each node gives a
# role its own OID (here two roles made on worker1 alone shift it), and a
# shard move copies the records as they are
$w1->safe_psql('postgres',
	'SET citus.enable_ddl_propagation = off; CREATE ROLE w1_only_a; CREATE ROLE w1_only_b');
$coord->safe_psql('postgres', q{
CREATE ROLE mover LOGIN;
GRANT SELECT, INSERT ON payments TO mover;
});
isnt($w1->safe_psql('postgres', "SELECT 'mover'::regrole::oid"),
	$w2->safe_psql('postgres', "SELECT 'mover'::regrole::oid"),
	'the role has another OID on each worker');
{
	my $t = 451;
	my ($from, $shard) = placement($t);
	my ($to) = grep { $_ != $from && $_ != $coord } ($w1, $w2);
	my $mv_call = "SELECT replayed, response FROM idem_citus_call(${t}::bigint, 'mv-1', $insert, ${t}::bigint, 'mv-1', 5)";
	($out, $err) = call_as($coord, 'mover', $mv_call);
	like($out, qr/^f\|/, 'mover: a call executes on ' . $from->name) or diag($err);
	my $mv_first = (split /\|/, $out, 2)[1];
	($out, $err) = call_as($w1, 'mover',
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'mv-run', ARRAY['a', 'b'])");
	is($out, 't', 'mover begins a run') or diag($err);
	my $mv_step = sub {
		my ($node, $step, $n) = @_;
		return call_as($node, 'mover',
			"SELECT replayed FROM idem_citus_step(${t}::bigint, 'mv-run', '$step', $insert, ${t}::bigint, 'mv-run:$step', $n)");
	};
	($out, $err) = $mv_step->($w2, 'a', 1);
	is($out, 'f', "... and its first step executes") or diag($err);
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $from->port
		  . ", '127.0.0.1', " . $to->port . ", shard_transfer_mode => 'block_writes')");
	is((placement($t))[0]->port, $to->port, "the tenant's shard group moved to " . $to->name);
	for my $entry ($coord, $w1, $w2)
	{
		($out, $err) = call_as($entry, 'mover', $mv_call);
		is($out, "t|$mv_first", 'after the move, the retry through ' . $entry->name . ' replays')
		  or diag($err);
		($out, $err) = $mv_step->($entry, 'a', 1);
		is($out, 't', '... and so does the completed step') or diag($err);
	}
	is(rows("note IN ('mv-1', 'mv-run:a')"), '2', 'one row each');
	($out, $err) = $mv_step->($coord, 'b', 2);
	is($out, 'f', 'the next step executes on ' . $to->name) or diag($err);
	($out, $err) = call_as($w1, 'mover', "SELECT status FROM idem_citus_run_status(${t}::bigint, 'mv-run')");
	is($out, 'completed', '... completing the run') or diag($err);
	is($coord->safe_psql('postgres',
			"SELECT status || ':' || steps_done FROM idem_citus_run_status(${t}::bigint, 'mv-run', owner => 'mover')"),
		'completed:2', "a superuser reads mover's run through the coordinator");
	is($to->safe_psql('postgres', q{
SET citus.override_table_visibility = off;
SELECT string_agg(DISTINCT owner::text, ',') FROM idem.citus_keys WHERE key IN ('mv-1', 'mv-run:a', idem_step_key('mv-run', 'a'))
UNION ALL
SELECT string_agg(owner::text, ',') FROM idem.citus_runs WHERE run_id = 'mv-run'}),
		"mover\nmover", "on the new node, the records and the run are mover's");
	($out, $err) = call_as($to, 'app', $mv_call);
	is($out =~ /^f\|/ ? 'f' : $out, 'f', "app's call under mover's key is its own: it executes") or diag($err);
}

# --- the settings that change a statement's meaning are the shard node's
# (the caller's do not travel) and are part of the request: after a move
# to a node whose TimeZone differs, the retry is refused, never replayed
# nor executed again; the same setting pinned on the function, which
# Citus propagates to every node, makes it replay
{
	my $t = 461;
	my ($from, $shard) = placement($t);
	my ($to) = grep { $_ != $from && $_ != $coord } ($w1, $w2);
	my $tz = $from->safe_psql('postgres', 'SHOW timezone');
	my $other_tz = $tz eq 'Asia/Tokyo' ? 'America/Lima' : 'Asia/Tokyo';
	$to->safe_psql('postgres', "ALTER SYSTEM SET timezone = '$other_tz'");
	$to->reload;
	my $tz_call = "SELECT replayed FROM idem_citus_call(${t}::bigint, 'tz-1', $insert, ${t}::bigint, 'tz-1', 4)";
	($out, $err) = call($coord, $tz_call);
	is($out, 'f', "a call on a node whose TimeZone is $tz executes") or diag($err);
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $from->port
		  . ", '127.0.0.1', " . $to->port . ", shard_transfer_mode => 'block_writes')");
	for my $entry ($coord, $to)
	{
		($out, $err) = call($entry, $tz_call);
		is(sqlstate_of($err), 'ID422',
			"after a move to a node whose TimeZone is $other_tz, the retry through " . $entry->name . ' is refused: ID422');
	}
	is(rows("note = 'tz-1'"), '1', '... and writes nothing');
	$coord->safe_psql('postgres',
		qq{ALTER FUNCTION idem_citus_call(bigint, text, text, "any") SET TimeZone = '$tz'});
	for my $entry ($coord, $w1, $w2)
	{
		($out, $err) = call($entry, $tz_call);
		is($out, 't', "with TimeZone pinned on the function, the retry through " . $entry->name . ' replays')
		  or diag($err);
	}
	$coord->safe_psql('postgres',
		q{ALTER FUNCTION idem_citus_call(bigint, text, text, "any") RESET TimeZone});
	$to->safe_psql('postgres', 'ALTER SYSTEM RESET timezone');
	$to->reload;
}

# --- a column added to idem.citus_keys and dropped again (Citus does both
# on every shard): calls write their records with it null, and replay
$coord->safe_psql('postgres',
	'ALTER TABLE idem.citus_keys ADD COLUMN note text; ALTER TABLE idem.citus_keys DROP COLUMN note');
{
	my $dc = "SELECT replayed FROM idem_citus_call(471::bigint, 'dropped-col', $insert, 471::bigint, 'dropped-col', 2)";
	my @seen;
	for my $entry ($coord, $w1, $w2)
	{
		($out, $err) = call($entry, $dc);
		push @seen, $out;
		diag($err) if $err ne '';
	}
	is(join(',', @seen), 'f,t,t',
		'with a dropped column on the shards, a call executes once and replays through the workers');
	is(rows("note = 'dropped-col'"), '1', '... one row');
}

# --- a text tenant, in a database of its own (one colocation per
# database): calls from every entry node, tenants whose value and key
# together spell another's
# a database of its own on every node, Citus and its nodes in it, and idem
# $sql in database $db through $node; returns (stdout, stderr) of psql
sub call_db
{
	my ($node, $db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, $sql,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($out, $err);
}

# a database of its own with Citus and idem on every node
sub idem_database
{
	my ($db) = @_;
	citus_database($db, @nodes);
	$coord->safe_psql($db, 'CREATE EXTENSION idem');
}
idem_database('tt');
$coord->safe_psql('tt', q{
CREATE TABLE accounts (tenant text NOT NULL, note text NOT NULL);
SELECT create_distributed_table('accounts', 'tenant');
SELECT idem_citus_colocate('accounts');
});
is($coord->safe_psql('tt',
		"SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = 'idem.citus_keys'::regclass AND attname = 'tenant'"),
	'text', 'idem.citus_keys follows a text distribution column');
my $tt_insert = q{'INSERT INTO accounts VALUES ($1, $2) RETURNING tenant, note'};
my @pairs = ([ 'acme', 'k:1' ], [ 'acme:k', '1' ], [ 'ümlaut tenant', 'k:1' ]);
for my $entry (@nodes)
{
	for my $p (@pairs)
	{
		my ($t, $k) = @$p;
		my ($ret, $o, $e) = $entry->psql('tt',
			"SELECT replayed FROM idem_citus_call('$t'::text, '$k', $tt_insert, '$t'::text, '$k')");
		is($o, $entry == $coord ? 'f' : 't',
			"text tenant '$t', key '$k' through " . $entry->name
			  . ($entry == $coord ? ': executes' : ': replays')) or diag($e);
	}
}
is($coord->safe_psql('tt', 'SELECT count(*) FROM accounts'), '3', 'one row per (tenant, key)');
is($coord->safe_psql('tt', 'SELECT count(*) FROM idem.citus_keys'), '3', 'one key record each');

# a text distribution column with a collation of its own: Citus co-locates
# only columns of one collation, so idem's tenant columns take it
idem_database('tc');
$coord->safe_psql('tc', q{
CREATE TABLE accounts (tenant text COLLATE "C" NOT NULL, note text NOT NULL);
SELECT create_distributed_table('accounts', 'tenant');
});
($out, $err) = call_db($coord, 'tc', "SELECT idem_citus_colocate('accounts')");
is($err, '', 'a colocation with a tenant column of collation "C"') or diag($err);
is($coord->safe_psql('tc', q{
SELECT string_agg(c.relname || ':' || l.collname, ',' ORDER BY c.relname)
  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_collation l ON l.oid = a.attcollation
 WHERE a.attrelid IN ('idem.citus_keys'::regclass, 'idem.citus_runs'::regclass) AND a.attname = 'tenant'}),
	'citus_keys:C,citus_runs:C', "idem's tenant columns take the table's collation");
# $sql in database $db through every node in turn: their outputs, joined
sub through_nodes
{
	my ($db, $sql) = @_;
	my @seen;
	for my $entry (@nodes)
	{
		my ($ret, $o, $e) = $entry->psql($db, $sql);
		push @seen, $o;
		diag($e) if $e ne '';
	}
	return join(',', @seen);
}
is( through_nodes('tc',
		"SELECT replayed FROM idem_citus_call('acme'::text, 'c-1', $tt_insert, 'acme'::text, 'c-1')"),
	'f,t,t',
	'... and a call executes once and replays through the workers');

# DROP EXTENSION idem CASCADE drops idem's tables and leaves the tenant
# functions (Citus lets no distributed function depend on an extension);
# with the extension created again, the colocation is declared again over
# them
$coord->safe_psql('tc', 'DROP EXTENSION idem CASCADE');
($out, $err) = call_db($w1, 'tc',
	"SELECT replayed FROM idem_citus_call('acme'::text, 'c-2', $tt_insert, 'acme'::text, 'c-2')");
is(sqlstate_of($err), 'IDC01',
	'after DROP EXTENSION idem CASCADE, a tenant function left behind is IDC01');
$coord->safe_psql('tc', 'CREATE EXTENSION idem');
($out, $err) = call_db($coord, 'tc', "SELECT idem_citus_colocate('accounts')");
is($err, '', '... and with idem created again, the colocation is declared again')
  or diag($err);
is( through_nodes('tc',
		"SELECT replayed FROM idem_citus_call('acme'::text, 'c-2', $tt_insert, 'acme'::text, 'c-2')"),
	'f,t,t',
	'... a call executes once and replays through the workers');
my $tc_fns = q{SELECT count(*) FROM pg_proc WHERE proname LIKE 'idem\_citus\_%'};
is(through_nodes('tc', $tc_fns),
	join(',', ($coord->safe_psql('tc', $tc_fns)) x 3),
	'... and every node has as many of them as the coordinator');

# a colocation declared by a build without tenant runs: without
# idem.citus_runs a run function is IDC01; declared again, the colocation
# gets the table and the functions, and keeps its key records
$coord->safe_psql('tt', 'DROP TABLE idem.citus_runs');
{
	my ($ret, $o, $e) = $w1->psql('tt',
		"SELECT created FROM idem_citus_run_begin('acme'::text, 'run-1')",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	is(sqlstate_of($e), 'IDC01', 'a run function without idem.citus_runs: IDC01');
	$coord->safe_psql('tt', q{
DO $$DECLARE f regprocedure;
BEGIN
	FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname ~ '^idem_citus_(run|step)' LOOP
		EXECUTE 'DROP FUNCTION ' || f;
	END LOOP;
END$$});
	$coord->safe_psql('tt', "SELECT idem_citus_colocate('accounts')");
	($ret, $o, $e) = $w2->psql('tt',
		"SELECT created FROM idem_citus_run_begin('acme'::text, 'run-1')");
	is($o, 't', 'declared again, the colocation gets tenant runs') or diag($e);
	is($coord->safe_psql('tt', 'SELECT count(*) FROM idem.citus_keys'), '3',
		'... and keeps its key records');

	# declared by a build before idem_citus_run_steps() and owner =>: the
	# colocation declared again gets the one and replaces the old shape of
	# the other (a call of that shape would match both), and keeps what
	# was set on a function it already has
	$coord->safe_psql('tt', q{
DROP FUNCTION idem_citus_run_steps(text, text, regrole);
DROP FUNCTION idem_citus_run_status(text, text, regrole);
CREATE FUNCTION idem_citus_run_status(tenant text, run_id text, OUT status text)
RETURNS text LANGUAGE sql AS $$SELECT 'old shape'$$;
SELECT create_distributed_function('idem_citus_run_status(text, text)', 'tenant',
	colocate_with => 'idem.citus_keys', force_delegation => true);
ALTER FUNCTION idem_citus_run_begin(text, text, text[], jsonb) SET idem.wait = off;
});
	($ret, $o, $e) = $w1->psql('tt', "SELECT status FROM idem_citus_run_status('acme'::text, 'run-1')");
	is($o, 'old shape', 'a colocation of an older build has the old run status');
	$coord->safe_psql('tt', "SELECT idem_citus_colocate('accounts')");
	for my $entry ($w1, $w2)
	{
		($ret, $o, $e) = $entry->psql('tt',
			"SELECT status FROM idem_citus_run_status('acme'::text, 'run-1')");
		is($o, 'running', 'declared again, the run status of the old shape runs through ' . $entry->name) or diag($e);
		($ret, $o, $e) = $entry->psql('tt',
			"SELECT step FROM idem_citus_run_steps('acme'::text, 'run-1')");
		is("$ret|$o", '0|', '... and idem_citus_run_steps() exists') or diag($e);
	}
	is($coord->safe_psql('tt',
			"SELECT proconfig FROM pg_proc WHERE oid = 'idem_citus_run_begin(text, text, text[], jsonb)'::regprocedure"),
		'{idem.wait=off}', '... and a function it had keeps its setting');
}

# --- a shard split, draining a node and the rebalancer: the key records
# go where their rows go, and every retry replays
# the calls of [tenant, key] pairs, one statement each
sub calls_of
{
	return join('', map { my ($t, $k) = @$_; "SELECT replayed FROM idem_citus_call(${t}::bigint, '$k', $insert, ${t}::bigint, '$k', 1);\n" } @_);
}
sub retry_all
{
	my ($keys, $what) = @_;
	my $script = calls_of(@$keys);
	for my $entry (@nodes)
	{
		my ($out, $err) = call($entry, $script);
		is(join('', split /\n/, $out), 't' x scalar(@$keys),
			"$what: all " . scalar(@$keys) . ' keys replay through ' . $entry->name)
		  or diag($err);
	}
}
sub node_id
{
	my ($node) = @_;
	return $coord->safe_psql('postgres',
		'SELECT nodeid FROM pg_dist_node WHERE nodeport = ' . $node->port);
}
{
	my (undef, $shard) = placement(701);
	my @ten = split /,/, $coord->safe_psql('postgres', qq{
SELECT string_agg(t::text, ',') FROM generate_series(701, 1000) t
 WHERE get_shard_id_for_distribution_column('payments', t::bigint) = $shard});
	@ten = @ten[0 .. 11] if @ten > 12;
	my @keys = map { [ $_, "split-$_" ] } @ten;
	($out, $err) = call($coord, calls_of(@keys));
	is(join('', split /\n/, $out), 'f' x scalar(@keys), scalar(@keys) . " tenants of shard $shard execute") or diag($err);
	my ($lo, $hi) = split /\|/, $coord->safe_psql('postgres',
		"SELECT shardminvalue, shardmaxvalue FROM pg_dist_shard WHERE shardid = $shard");
	my $mid = int(($lo + $hi) / 2);
	$coord->safe_psql('postgres',
		"SELECT citus_split_shard_by_split_points($shard, ARRAY['$mid'], ARRAY["
		  . node_id($w1) . ', ' . node_id($w2) . "], 'block_writes')");
	is($coord->safe_psql('postgres', 'SELECT count(DISTINCT nodeport) FROM (SELECT (SELECT s.nodeport FROM citus_shards s WHERE s.shardid = get_shard_id_for_distribution_column(\'payments\', t::bigint) LIMIT 1) AS nodeport FROM unnest(ARRAY[' . join(',', @ten) . ']::bigint[]) t) x'),
		'2', 'the split put the tenants on both workers');
	retry_all(\@keys, 'after the split');
	is(rows("note LIKE 'split-%'"), scalar(@keys), '... no row more');
	is($coord->safe_psql('postgres', "SELECT count(*) FROM idem.citus_keys WHERE key LIKE 'split-%'"),
		scalar(@keys), '... one key record each');

	my @reb = map { [ $_, "reb-$_" ] } 801 .. 832;
	($out, $err) = call($w1, calls_of(@reb));
	is(join('', split /\n/, $out), 'f' x 32, '32 tenants over all shards execute') or diag($err);
	$coord->safe_psql('postgres',
		"SELECT citus_drain_node('127.0.0.1', " . $w2->port . ", 'block_writes')");
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM citus_shards WHERE nodeport = " . $w2->port),
		'0', 'citus_drain_node() moved every shard off worker2');
	retry_all([ @reb, @keys ], 'after the drain');
	$coord->safe_psql('postgres',
		"SELECT citus_set_node_property('127.0.0.1', " . $w2->port . ", 'shouldhaveshards', true)");
	$coord->safe_psql('postgres',
		"SELECT rebalance_table_shards(shard_transfer_mode => 'block_writes')");
	cmp_ok($coord->safe_psql('postgres',
			"SELECT count(*) FROM citus_shards WHERE nodeport = " . $w2->port),
		'>', 0, 'the rebalancer moved shards back to worker2');
	retry_all([ @reb, @keys ], 'after the rebalance');
	is(rows("note LIKE 'reb-%' OR note LIKE 'split-%'"), 32 + scalar(@keys), '... and no row more');
}

# --- tenant runs: the run in idem.citus_runs and its steps' records in
# idem.citus_keys, on the tenant's shard, in the step's local transaction
is( $coord->safe_psql(
		'postgres', q{
SELECT count(DISTINCT colocationid) FROM pg_dist_partition
 WHERE logicalrelid IN ('payments'::regclass, 'idem.citus_runs'::regclass)}),
	'1',
	"idem.citus_runs is in payments' colocation group");
{
	my $t = 501;
	my $step = sub {
		my ($node, $tenant, $run, $name, $note, $amount, $role) = @_;
		my $sql = "SELECT replayed, response FROM idem_citus_step(${tenant}::bigint, '$run', '$name', $insert, ${tenant}::bigint, '$note', $amount)";
		return $role ? call_as($node, $role, $sql) : call($node, $sql);
	};
	my $begin = "SELECT status, next_step, created FROM idem_citus_run_begin(${t}::bigint, 'order-9', ARRAY['pay', 'ship', 'mail'], '{\"order\": 9}')";
	($out, $err) = call($coord, $begin);
	is($out, 'running|pay|t', 'a tenant run begins through the coordinator') or diag($err);
	for my $entry ($w1, $w2)
	{
		($out, $err) = call($entry, $begin);
		is($out, 'running|pay|f', 'begun again through ' . $entry->name . ': the same run') or diag($err);
	}
	($out, $err) = call($w1,
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-9', ARRAY['pay', 'ship'], '{\"order\": 9}')");
	is(sqlstate_of($err), 'ID422', 'the same run id with other steps: ID422');
	($out, $err) = call($w2,
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-9', ARRAY['pay', 'ship', 'mail'], '{\"order\": 10}')");
	is(sqlstate_of($err), 'ID422', '... with another input: ID422');

	# bad input, through a worker: nothing written
	($out, $err) = $step->($w1, $t, 'order-9', 'ship', 'order-9:ship', 1);
	is(sqlstate_of($err), 'ID425', 'a step out of its declared order: ID425');
	($out, $err) = $step->($w1, $t, 'order-9', 'refund', 'order-9:refund', 1);
	is(sqlstate_of($err), 'ID400', 'a step the run did not declare: ID400');
	($out, $err) = $step->($w2, $t, 'no-such-run', 'pay', 'no-such-run', 1);
	is(sqlstate_of($err), 'ID404', 'a step of a run that does not exist: ID404');
	($out, $err) = call($w2, "SELECT status FROM idem_citus_run_status(${t}::bigint, 'no-such-run')");
	is(sqlstate_of($err), 'ID404', '... and its status: ID404');
	($out, $err) = $step->($coord, $t, 'order-9', 'pay', 'order-9:pay', -1);
	is(sqlstate_of($err), '23514', 'a step whose statement fails raises its error');
	($out, $err) = call($coord,
		"SELECT idem_citus_step(${t}::bigint, 'order-9', 'pay', $insert, ${t}::bigint, 'order-9:pay', 1), 1");
	is(sqlstate_of($err), 'IDC02', 'a step Citus does not delegate: IDC02');
	($out, $err) = call($coord,
		"SELECT replayed FROM idem_citus_step(${t}::bigint, 'order-9', 'pay', $insert, ${far}::bigint, 'order-9:pay', 1)");
	is(sqlstate_of($err), 'IDC03', "a step writing another tenant's shard: IDC03");
	is(rows("note LIKE 'order-9:%'"), '0', '... none of them wrote a row');
	is($coord->safe_psql('postgres',
			"SELECT done_steps FROM idem.citus_runs WHERE tenant = $t AND run_id = 'order-9'"),
		'{}', '... or moved the run on');

	# the first step, from the coordinator: one local transaction there
	($out, $err) = $step->($coord, $t, 'order-9', 'pay', 'order-9:pay', 11);
	like($out, qr/^f\|/, 'step pay executes') or diag($err);
	my $pay = (split /\|/, $out, 2)[1];
	my ($node, $shard) = placement($t);
	my ($keys_shard, $runs_shard) = split /\|/, $coord->safe_psql('postgres', qq{
SELECT get_shard_id_for_distribution_column('idem.citus_keys', ${t}::bigint),
	   get_shard_id_for_distribution_column('idem.citus_runs', ${t}::bigint)});
	is( $node->safe_psql(
			'postgres', qq{
SET citus.override_table_visibility = off;
SELECT count(DISTINCT x) FROM (
	SELECT xmin::text FROM public.payments_$shard WHERE note = 'order-9:pay'
	UNION ALL SELECT xmin::text FROM idem.citus_keys_$keys_shard
	 WHERE tenant = $t AND key = idem_step_key('order-9', 'pay')
	UNION ALL SELECT xmin::text FROM idem.citus_runs_$runs_shard
	 WHERE tenant = $t AND run_id = 'order-9') s(x)}),
		'1',
		"the row, the step's record and the run's progress: one local transaction on the shard's node");
	($out, $err) = $step->($w1, $t, 'order-9', 'ship', 'order-9:ship', 12);
	like($out, qr/^f\|/, 'step ship executes through worker1') or diag($err);
	my $ship = (split /\|/, $out, 2)[1];
	for my $entry ($w1, $w2, $coord)
	{
		($out, $err) = $step->($entry, $t, 'order-9', 'pay', 'order-9:pay', 11);
		is($out, "t|$pay", 'retry of pay through ' . $entry->name . ' replays') or diag($err);
	}
	($out, $err) = $step->($w2, $t, 'order-9', 'pay', 'order-9:pay', 99);
	is(sqlstate_of($err), 'ID422', 'pay again with another amount: ID422');
	is(rows("note = 'order-9:pay'"), '1', 'one row for pay');
	is($coord->safe_psql('postgres',
			"SELECT status, next_step, steps_done, steps_total, input FROM idem_citus_run_status(${t}::bigint, 'order-9')"),
		'running|mail|2|3|{"order": 9}', 'status: running, mail next, 2 of 3 done');

	# a completed step whose record was removed by hand never runs again
	# (XX001), and the error names the table the record was in
	($out, $err) = call($w1,
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-lost', ARRAY['pay', 'ship'])");
	is($out, 't', 'run order-lost begins') or diag($err);
	($out, $err) = $step->($w2, $t, 'order-lost', 'pay', 'order-lost:pay', 1);
	like($out, qr/^f\|/, 'its step pay executes') or diag($err);
	$coord->safe_psql('postgres',
		"DELETE FROM idem.citus_keys WHERE tenant = $t AND key = idem_step_key('order-lost', 'pay')");
	($out, $err) = $step->($coord, $t, 'order-lost', 'pay', 'order-lost:pay', 1);
	is(sqlstate_of($err), 'XX001', 'pay again after its record was deleted: XX001');
	like($err, qr/DETAIL:\s+The key record idem\.step:order-lost:pay was removed from idem\.citus_keys\./,
		'... whose detail names idem.citus_keys');
	is(rows("note = 'order-lost:pay'"), '1', '... and pay did not run again');
	($out, $err) = call($w2, "SELECT idem_citus_run_cancel(${t}::bigint, 'order-lost')");
	is($out, 'cancelled', 'run order-lost is cancelled') or diag($err);

	# two tenants on one shard, the same run id: two runs
	my $twin = $coord->safe_psql(
		'postgres', qq{
SELECT t FROM generate_series(502, 2000) t
 WHERE get_shard_id_for_distribution_column('payments', t::bigint)
	 = get_shard_id_for_distribution_column('payments', ${t}::bigint)
 LIMIT 1});
	($out, $err) = call($w2,
		"SELECT status, next_step, created FROM idem_citus_run_begin(${twin}::bigint, 'order-9', ARRAY['pay'])");
	is($out, 'running|pay|t', "tenant $twin on the same shard begins its own run order-9") or diag($err);
	($out, $err) = $step->($w2, $twin, 'order-9', 'pay', 'order-9:pay', 7);
	like($out, qr/^f\|.*"amount": 7/, "... its pay executes, not replaying tenant ${t}'s") or diag($err);
	is($coord->safe_psql('postgres',
			"SELECT status, steps_done FROM idem_citus_run_status(${twin}::bigint, 'order-9')"),
		'completed|1', '... and completes its run alone');
	is($coord->safe_psql('postgres',
			"SELECT status, steps_done FROM idem_citus_run_status(${t}::bigint, 'order-9')"),
		'running|2', "tenant ${t}'s run is unchanged");

	# the shard group moves between steps: the run goes with it
	my ($to) = grep { $_->port != $node->port && $_ != $coord } ($w1, $w2);
	$coord->safe_psql('postgres',
		"SELECT citus_move_shard_placement($shard, '127.0.0.1', " . $node->port
		  . ", '127.0.0.1', " . $to->port . ", shard_transfer_mode => 'block_writes')");
	is((placement($t))[0]->port, $to->port, "tenant ${t}'s shard moved to " . $to->name);
	for my $entry ($coord, $w1, $w2)
	{
		($out, $err) = $step->($entry, $t, 'order-9', 'pay', 'order-9:pay', 11);
		is($out, "t|$pay", 'after the move, pay through ' . $entry->name . ' replays') or diag($err);
		($out, $err) = $step->($entry, $t, 'order-9', 'ship', 'order-9:ship', 12);
		is($out, "t|$ship", '... and so does ship') or diag($err);
	}
	($out, $err) = $step->($w2, $t, 'order-9', 'mail', 'order-9:mail', 13);
	like($out, qr/^f\|/, 'the last step executes on the new node') or diag($err);
	is( $to->safe_psql(
			'postgres', qq{
SET citus.override_table_visibility = off;
SELECT r.status, r.done_steps, r.xmin = p.xmin
  FROM idem.citus_runs_$runs_shard r, public.payments_$shard p
 WHERE r.tenant = $t AND r.run_id = 'order-9' AND p.note = 'order-9:mail'}),
		'completed|{pay,ship,mail}|t',
		'... which completes the run there, in the row\'s transaction');
	is(rows("note LIKE 'order-9:%'"), '4', 'one row per executed step (and the twin\'s)');
	($out, $err) = $step->($w1, $t, 'order-9', 'mail', 'order-9:mail', 13);
	like($out, qr/^t\|/, 'a completed run\'s step replays') or diag($err);

	# an external step's result, and a run without declared steps
	($out, $err) = call($w1,
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'free-1')");
	is($out, 't', 'a run without declared steps begins') or diag($err);
	for my $entry ($w1, $coord)
	{
		($out, $err) = call($entry,
			"SELECT replayed, response FROM idem_citus_step_complete(${t}::bigint, 'free-1', 'label', '{\"label\": \"LB-1\"}')");
		is($out, ($entry == $w1 ? 'f' : 't') . '|{"label": "LB-1"}',
			'an external step\'s result ' . ($entry == $w1 ? 'is recorded' : 'replays')) or diag($err);
	}
	($out, $err) = call($w2,
		"SELECT replayed FROM idem_citus_step_complete(${t}::bigint, 'free-1', 'label', '{\"label\": \"LB-2\"}')");
	is(sqlstate_of($err), 'ID422', '... another result for it: ID422');

	($out, $err) = call($w2, "SELECT idem_citus_run_complete(${t}::bigint, 'free-1')");
	is($out, 'completed', '... and it completes when the caller says so') or diag($err);

	# the run verbs, through the workers
	call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-10', ARRAY['pay'])");
	($out, $err) = call($w1, "SELECT idem_citus_run_fail(${t}::bigint, 'order-10', 'card declined')");
	is($out, 'failed', 'a tenant run fails') or diag($err);
	($out, $err) = $step->($w2, $t, 'order-10', 'pay', 'order-10:pay', 1);
	is(sqlstate_of($err), 'ID423', '... and refuses its steps: ID423');
	($out, $err) = call($w2, "SELECT idem_citus_run_resume(${t}::bigint, 'order-10')");
	is($out, 'running', '... until it is resumed') or diag($err);
	($out, $err) = call($w1, "SELECT idem_citus_run_cancel(${t}::bigint, 'order-10')");
	is($out, 'cancelled', 'a tenant run is cancelled') or diag($err);
	($out, $err) = call($coord, "SELECT idem_citus_run_resume(${t}::bigint, 'order-10')");
	is(sqlstate_of($err), 'ID423', '... for good: resuming it is ID423');
	($out, $err) = call($coord,
		"SELECT status, last_error FROM idem_citus_run_status(${t}::bigint, 'order-10')");
	is($out, 'cancelled|cancelled', '... its status says so') or diag($err);
	is(rows("note = 'order-10:pay'"), '0', '... and none of its steps ran');

	# three agents run one run's steps at once, one through each entry node
	call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-11', ARRAY['a', 'b', 'c'])");
	{
		my $seq = join('', map { "SELECT replayed FROM idem_citus_step(${t}::bigint, 'order-11', '$_', $insert, ${t}::bigint, 'order-11:$_', 1);\n" } qw(a b c));
		my @agents = map {
			my %io = (in => $seq, out => '', err => '');
			$io{h} = IPC::Run::start([ 'psql', '-XAtq', '-d', $_->connstr('postgres') ],
				'<', \$io{in}, '>', \$io{out}, '2>', \$io{err});
			\%io;
		} @nodes;
		$_->{h}->finish for @agents;
		my $all = join('', map { $_->{out} } @agents);
		is(join('', map { $_->{err} } @agents), '', 'concurrent agents: no errors');
		is(scalar(() = $all =~ /^f$/mg) . '/' . scalar(() = $all =~ /^t$/mg), '3/6',
			'... each step executed once and replayed twice');
	}
	is(rows("note LIKE 'order-11:%'"), '3', '... one row per step');
	is($coord->safe_psql('postgres',
			"SELECT status, steps_done FROM idem_citus_run_status(${t}::bigint, 'order-11')"),
		'completed|3', '... and the run completed');

	# idem_citus_step_with(): text arguments, and the step's event on the
	# shard's node (a session's setting would not reach it)
	call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-12', ARRAY['notify'])");
	($out, $err) = call($w1,
		"SELECT replayed, response->'rows'->0->>'amount' FROM idem_citus_step_with(${t}::bigint, 'order-12', 'notify', $insert, ARRAY['$t', 'order-12:notify', '8'], outbox_topic => 'refunds')");
	is($out, 'f|8', 'idem_citus_step_with(): text arguments typed by the statement') or diag($err);
	($out, $err) = call($w2,
		"SELECT replayed FROM idem_citus_step_with(${t}::bigint, 'order-12', 'notify', $insert, ARRAY['$t', 'order-12:notify', '8'])");
	is($out, 't', '... its retry without the topic replays') or diag($err);
	is($coord->safe_psql('postgres',
			"SELECT count(*), min(topic), min(run_id), min(step) FROM idem.citus_outbox WHERE tenant = $t AND key = idem_step_key('order-12', 'notify')"),
		'1|refunds|order-12|notify', "... and its one event is on the tenant's shard, with its run and step");

	# a role that is not a superuser: its own runs under the same ids
	($out, $err) = call_as($w1, 'app',
		"SELECT status, created FROM idem_citus_run_begin(${t}::bigint, 'order-9', ARRAY['pay'])");
	is($out, 'running|t', "app's run order-9 of tenant $t is its own") or diag($err);
	($out, $err) = $step->($coord, $t, 'order-9', 'pay', 'order-9:app', 5, 'app');
	like($out, qr/^f\|/, "app's step executes through the coordinator") or diag($err);
	my $app_pay = (split /\|/, $out, 2)[1];
	($out, $err) = $step->($w2, $t, 'order-9', 'pay', 'order-9:app', 5, 'app');
	is($out, "t|$app_pay", '... and replays through worker2') or diag($err);
	($out, $err) = call_as($coord, 'app',
		"SELECT status, steps_done FROM idem_citus_run_status(${t}::bigint, 'order-9')");
	is($out, 'completed|1', "... completing app's run") or diag($err);
	($out, $err) = call_as($coord, 'app', 'SELECT count(*) FROM idem.citus_runs');
	is(sqlstate_of($err), '42501', 'app cannot read idem.citus_runs');
	($out, $err) = call_as($w1, 'app2',
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'free-1')");
	is(sqlstate_of($err), 'ID404', "another role does not see the run: ID404");

	# idem_citus_run_steps(): idem_run_steps()'s rows, read on the tenant's
	# shard, through every entry node
	my $steps_of = "SELECT ordinal, step, state, response->'rows'->0->>'amount',"
	  . " executed_at IS NOT NULL, attempts > 0, step_key = idem_step_key('order-9', step)"
	  . " FROM idem_citus_run_steps(${t}::bigint, 'order-9')";
	for my $entry (@nodes)
	{
		($out, $err) = call($entry, $steps_of);
		is($out, "1|pay|completed|11|t|t|t\n2|ship|completed|12|t|t|t\n3|mail|completed|13|t|t|t",
			'idem_citus_run_steps() through ' . $entry->name . ': each step, its response and key')
		  or diag($err);
	}
	is( $coord->safe_psql('postgres', q{
SELECT (SELECT string_agg(n || ' ' || format_type(t, NULL), ', ' ORDER BY i)
		  FROM unnest(p.proargnames, p.proallargtypes, p.proargmodes) WITH ORDINALITY u(n, t, m, i)
		 WHERE m IN ('o', 't'))
	 = (SELECT string_agg(n || ' ' || format_type(t, NULL), ', ' ORDER BY i)
		  FROM unnest(l.proargnames, l.proallargtypes, l.proargmodes) WITH ORDINALITY u(n, t, m, i)
		 WHERE m IN ('o', 't'))
  FROM pg_proc p, pg_proc l
 WHERE p.oid = 'idem_citus_run_steps(bigint, text, regrole)'::regprocedure
   AND l.oid = 'idem_run_steps(text)'::regprocedure}),
		't', "... the columns of idem_run_steps()");
	call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-17', ARRAY['a', 'b'])");
	call($coord, "SELECT replayed FROM idem_citus_step_complete(${t}::bigint, 'order-17', 'a', '{}')");
	($out, $err) = call($w1,
		"SELECT ordinal, step, state, response, attempts FROM idem_citus_run_steps(${t}::bigint, 'order-17')");
	is($out, "1|a|completed|{}|1\n2|b|pending||0", '... a pending step has no response') or diag($err);
	call($coord, "SELECT idem_citus_run_cancel(${t}::bigint, 'order-17')");
	($out, $err) = call($coord,
		"SELECT step, state, response FROM idem_citus_run_steps(${t}::bigint, 'free-1')");
	is($out, 'label|completed|{"label": "LB-1"}', '... a run without declared steps: its completed steps') or diag($err);
	($out, $err) = call($w2, "SELECT step FROM idem_citus_run_steps(${t}::bigint, 'no-such-run')");
	is(sqlstate_of($err), 'ID404', '... an unknown run: ID404');
	($out, $err) = call($w2, "SELECT step FROM idem_citus_run_steps(${t}::bigint, NULL)");
	is(sqlstate_of($err), '22004', '... a null run id: 22004');
	($out, $err) = call_as($coord, 'app2', "SELECT step FROM idem_citus_run_steps(${t}::bigint, 'free-1')");
	is(sqlstate_of($err), 'ID404', "... another role's run: ID404");

	# owner =>: an administrator (a superuser, a member of idem_admin) or a
	# member of the owner reads and acts on another role's run; any other
	# role is refused (42501) and changes nothing
	$coord->safe_psql('postgres', q{
CREATE ROLE ops LOGIN;
GRANT idem_admin TO ops;
CREATE ROLE app_member LOGIN IN ROLE app;
});
	($out, $err) = call($w1,
		"SELECT status, steps_done FROM idem_citus_run_status(${t}::bigint, 'order-9', owner => 'app')");
	is($out, 'completed|1', "a superuser reads app's run with owner =>") or diag($err);
	($out, $err) = call_as($w2, 'ops',
		"SELECT step, response->'rows'->0->>'note' FROM idem_citus_run_steps(${t}::bigint, 'order-9', owner => 'app')");
	is($out, 'pay|order-9:app', "... a member of idem_admin reads its steps") or diag($err);
	($out, $err) = call_as($coord, 'app_member',
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-9', 'app')");
	is($out, 'completed', '... and so does a member of app') or diag($err);
	($out, $err) = call_as($w1, 'app2',
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-9', owner => 'app')");
	is(sqlstate_of($err), '42501', 'another role reading it: 42501');
	like($err, qr/permission denied to read runs of role "app"/, '... saying whose');
	($out, $err) = call_as($w1, 'app2',
		"SELECT step FROM idem_citus_run_steps(${t}::bigint, 'order-9', owner => 'app')");
	is(sqlstate_of($err), '42501', '... or its steps: 42501');
	($out, $err) = call($w1,
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-9', owner => 'no_such_role')");
	is(sqlstate_of($err), '42704', 'owner => a role that does not exist: 42704');
	($out, $err) = call($w1,
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-12', owner => 'app')");
	is(sqlstate_of($err), 'ID404', "owner => a role without that run: ID404");
	($out, $err) = call($w1,
		"SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-12', owner => NULL)");
	is($out, 'completed', "owner => NULL: the caller's own run") or diag($err);

	($out, $err) = call_as($coord, 'app',
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-14')");
	is($out, 't', "app begins run order-14") or diag($err);
	my $app_run = "SELECT status, last_error FROM idem_citus_run_status(${t}::bigint, 'order-14', owner => 'app')";
	for my $verb (
		"idem_citus_run_fail(${t}::bigint, 'order-14', 'stop', owner => 'app')",
		"idem_citus_run_resume(${t}::bigint, 'order-14', owner => 'app')",
		"idem_citus_run_complete(${t}::bigint, 'order-14', owner => 'app')",
		"idem_citus_run_cancel(${t}::bigint, 'order-14', 'stop', owner => 'app')")
	{
		my ($name) = $verb =~ /^(\w+)/;
		($out, $err) = call_as($w2, 'app2', "SELECT $verb");
		is(sqlstate_of($err), '42501', "$name of app's run by another role: 42501");
	}
	is($coord->safe_psql('postgres', $app_run), 'running|',
		'... none of them changed the run');
	($out, $err) = call($w1, "SELECT idem_citus_run_fail(${t}::bigint, 'order-14', 'stopped by ops', owner => 'app')");
	is($out, 'failed', "a superuser fails app's run") or diag($err);
	is($coord->safe_psql('postgres', $app_run), 'failed|stopped by ops', '... app\'s run failed');
	($out, $err) = call_as($w2, 'ops', "SELECT idem_citus_run_resume(${t}::bigint, 'order-14', owner => 'app')");
	is($out, 'running', '... a member of idem_admin resumes it') or diag($err);
	($out, $err) = call_as($coord, 'app_member', "SELECT idem_citus_run_complete(${t}::bigint, 'order-14', owner => 'app')");
	is($out, 'completed', '... a member of app completes it') or diag($err);
	($out, $err) = call_as($coord, 'app',
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-15')");
	($out, $err) = call_as($w1, 'ops', "SELECT idem_citus_run_cancel(${t}::bigint, 'order-15', owner => 'app')");
	is($out, 'cancelled', '... and cancels another') or diag($err);
	($out, $err) = call_as($w1, 'app', "SELECT status FROM idem_citus_run_status(${t}::bigint, 'order-15')");
	is($out, 'cancelled', "... as app sees it") or diag($err);
	($out, $err) = call($w1, "SELECT idem_citus_run_fail(${t}::bigint, 'order-14', 'x', owner => 'no_such_role')");
	is(sqlstate_of($err), '42704', 'a verb with owner => a role that does not exist: 42704');

	# a role that was dropped leaves runs behind: its running run, with a
	# completed step, which the purge removes whatever its status
	$coord->safe_psql('postgres', 'CREATE ROLE gone LOGIN');
	($out, $err) = call_as($w2, 'gone',
		"SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-16', ARRAY['label', 'ship'])");
	is($out, 't', 'a role that will be dropped begins a run') or diag($err);
	($out, $err) = call_as($w1, 'gone',
		"SELECT replayed FROM idem_citus_step_complete(${t}::bigint, 'order-16', 'label', '{\"label\": \"LB-9\"}')");
	is($out, 'f', '... and records a step') or diag($err);
	$coord->safe_psql('postgres', "GRANT SELECT, INSERT ON payments TO gone");
	($out, $err) = call_as($w2, 'gone',
		"SELECT replayed FROM idem_citus_call(${t}::bigint, 'gone-1', $insert, ${t}::bigint, 'gone-1', 1)");
	is($out, 'f', '... and makes a call') or diag($err);
	$coord->safe_psql('postgres', 'REVOKE SELECT, INSERT ON payments FROM gone');
	$coord->safe_psql('postgres', 'DROP ROLE gone');
	is($coord->safe_psql('postgres',
			"SELECT status FROM idem.citus_runs WHERE run_id = 'order-16'"),
		'running', '... its run stays behind, running');
	my $kept_keys = q{SELECT count(*) FROM idem.citus_keys WHERE owner <> 'gone' AND expires_at > now() + interval '1 hour'};
	my $kept = $coord->safe_psql('postgres', $kept_keys);
	$coord->safe_psql('postgres', 'SELECT idem_citus_purge()');
	is($coord->safe_psql('postgres', "SELECT count(*) FROM idem.citus_keys WHERE owner = 'gone'"),
		'0', "idem_citus_purge() removes the dropped role's records, its call's and its step's");
	is($coord->safe_psql('postgres', $kept_keys), $kept, '... and no live record of another role');

	# the purge of finished tenant runs, on every shard, from the coordinator
	call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, 'order-13', ARRAY['a', 'b'])");
	($out, $err) = $step->($w1, $t, 'order-13', 'a', 'order-13:a', 1);
	like($out, qr/^f\|/, 'a run still running has a completed step') or diag($err);
	my $finished = $coord->safe_psql('postgres',
		"SELECT count(*) FROM idem.citus_runs WHERE status <> 'running'");
	cmp_ok($finished, '>=', 7, "$finished finished runs, on several shards");
	is($coord->safe_psql('postgres',
			"SELECT has_function_privilege('public', 'idem_citus_run_purge(timestamptz)', 'EXECUTE')"),
		'f', 'idem_citus_run_purge() is not granted to PUBLIC');
	is($coord->safe_psql('postgres', "SELECT idem_citus_run_purge(now() - interval '1 day')"),
		'1', "a purge of runs finished before yesterday removes only the dropped role's run, running as it was");
	is($coord->safe_psql('postgres', q{
SELECT count(*) FROM idem.citus_runs WHERE run_id = 'order-16'
UNION ALL SELECT count(*) FROM idem.citus_keys WHERE key = idem_step_key('order-16', 'label')}),
		"0\n0", '... with its step\'s record');
	is($coord->safe_psql('postgres', "SELECT idem_citus_run_purge(now() + interval '1 day')"),
		$finished, 'a purge of runs finished before tomorrow removes each finished run');
	is($coord->safe_psql('postgres',
			"SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM idem.citus_runs"),
		'order-13:running', '... and keeps the running one');
	is($coord->safe_psql('postgres',
			"SELECT string_agg(key, ',') FROM idem.citus_keys WHERE key LIKE 'idem.step:%'"),
		$coord->safe_psql('postgres', "SELECT idem_step_key('order-13', 'a')"),
		"... and its step's record, and none of the purged runs' steps");
	($out, $err) = $step->($w2, $t, 'order-9', 'pay', 'order-9:pay', 11);
	is(sqlstate_of($err), 'ID404', 'a step of a purged run: ID404');

	# idem_purge_all() purges tenant runs too once idem.run_retention is set
	for my $run ('order-18', 'order-19')
	{
		call($coord, "SELECT created FROM idem_citus_run_begin(${t}::bigint, '$run')");
		call($coord, "SELECT idem_citus_run_cancel(${t}::bigint, '$run')");
	}
	$coord->safe_psql('postgres',
		"UPDATE idem.citus_runs SET finished_at = now() - interval '2 days' WHERE tenant = $t AND run_id = 'order-18'");
	my $runs_left = "SELECT string_agg(run_id || ':' || status, ',' ORDER BY run_id) FROM idem.citus_runs";
	$coord->safe_psql('postgres', 'CALL idem_purge_all()');
	is($coord->safe_psql('postgres', $runs_left), 'order-13:running,order-18:cancelled,order-19:cancelled',
		'idem_purge_all() without idem.run_retention keeps finished tenant runs');
	$coord->safe_psql('postgres', "SET idem.run_retention = '1d';\nCALL idem_purge_all();");
	is($coord->safe_psql('postgres', $runs_left), 'order-13:running,order-19:cancelled',
		'... with idem.run_retention = 1d it removes the one finished two days ago, not the younger');
}

# --- doc/citus.md's examples (its ```sql-citus blocks), verbatim, in a
# database of their own
{
	open my $fh, '<', "$FindBin::RealBin/../../doc/citus.md" or die $!;
	my $doc = do { local $/; <$fh> };
	close $fh;
	my @blocks = $doc =~ /^```sql-citus\n(.*?)^```$/msg;
	is(scalar(@blocks), 6, "doc/citus.md has six examples for this test");
	idem_database('docs');
	my ($ret, $o, $e) = $coord->psql('docs', $blocks[0]);
	is($e, '', 'doc: the setup runs') or diag($e);
	($ret, $o, $e) = $coord->psql('docs', $blocks[1]);
	like($o, qr/^\{.*\}\|f\|/, 'doc: the call executes') or diag($e);
	($ret, $o, $e) = $coord->psql('docs', $blocks[1]);
	like($o, qr/^\{.*\}\|t\|/, 'doc: run again, it replays') or diag($e);
	($ret, $o, $e) = $coord->psql('docs', $blocks[2]);
	like($o, qr/\|f\|/, 'doc: the call that writes an event executes') or diag($e);
	is($e, '', '... the whole example runs on the coordinator') or diag($e);
	my ($node) = grep { $_->port == $coord->safe_psql('docs', q{
SELECT nodeport FROM citus_shards
 WHERE shardid = get_shard_id_for_distribution_column('payments', 42::bigint)}) } @nodes;
	my ($claim) = $blocks[2] =~ /(SELECT \* FROM idem_outbox_claim\(.*?\);)/s;
	like($node->safe_psql('docs', $claim), qr/refund-77/,
		"doc: the claim on the tenant's worker gets the event");
	like($coord->safe_psql('docs', $blocks[3]), qr/\|1$/m,
		"doc: the undelivered events' query counts the event");
	my ($ev, $tok) = split /\|/, $coord->safe_psql('docs',
		"SELECT event_id, lease_token FROM idem.citus_outbox WHERE key = 'refund-77'");
	$node->safe_psql('docs', "SELECT idem_outbox_ack('$ev', '$tok')");
	unlike($coord->safe_psql('docs', $blocks[3]), qr/\|[1-9]\d*$/m,
		'... and none once it is acknowledged');
	($ret, $o, $e) = $coord->psql('docs', $blocks[4]);
	is($o, "running|charge|t\nf|{\"rows\": [{\"note\": \"fulfil-1234:charge\", \"amount\": 100}], \"command\": \"INSERT\", \"rowcount\": 1}\nf\ncompleted||2\ncharge|completed|100\nship|completed|1",
		'doc: the run begins, both steps execute, the run completes, and its steps say so') or diag($e);
	($ret, $o, $e) = $w2->psql('docs', $blocks[4]);
	is($o, "completed||f\nt|{\"rows\": [{\"note\": \"fulfil-1234:charge\", \"amount\": 100}], \"command\": \"INSERT\", \"rowcount\": 1}\nt\ncompleted||2\ncharge|completed|100\nship|completed|1",
		'doc: run again through a worker, the run is found and its steps replay') or diag($e);
	is($coord->safe_psql('docs', "SELECT count(*) FROM payments WHERE note LIKE 'fulfil-1234:%'"),
		'2', '... one row per step');
	$coord->safe_psql('docs', "SELECT create_distributed_table('idem.keys', 'key', colocate_with => 'none')");
	($ret, $o, $e) = $coord->psql('docs', "SELECT idem_execute('doc-k', 'SELECT 1')");
	like($e, qr/is a Citus table/, 'doc: idem.keys made a Citus table is refused');
	($ret, $o, $e) = $coord->psql('docs', $blocks[5]);
	is($ret, 0, 'doc: giving it back runs') or diag($e);
	($ret, $o, $e) = $coord->psql('docs', "SELECT idem_execute('doc-k', 'SELECT 1')");
	is($e, '', '... and calls work again') or diag($e);
}

# --- idem's own tables made Citus tables by hand are refused
($out, $err) = call($coord, "SELECT replayed FROM idem_execute_ex('k-before-taken', 'SELECT 1')");
is($out, 'f', 'a key recorded on the coordinator');
($out, $err) = call($coord, "SELECT create_distributed_table('idem.keys', 'key', colocate_with => 'none')");
unlike($err, qr/ERROR/, 'Citus accepts idem.keys distributed by hand');
for my $entry ($coord, $w1)
{
	($out, $err) = call($entry, "SELECT idem_execute('k-taken', 'SELECT 1')");
	is(sqlstate_of($err), 'IDC04', 'then a call through ' . $entry->name . ' is IDC04');
}
like($err, qr/relation "idem.keys" is a Citus table/, '... saying which table');
($out, $err) = call($coord, "SELECT undistribute_table('idem.keys')");
is(sqlstate_of($err), 'XX000', 'undistribute_table() refuses a table of an extension');
# what doc/citus.md says to do instead: Citus's own functions that its drop
# trigger runs, which leave the table on each node as it was
($out, $err) = call($coord, q{
SELECT citus_drop_all_shards('idem.keys', 'idem', 'keys');
SELECT master_remove_distributed_table_metadata_from_workers('idem.keys', 'idem', 'keys');
SELECT master_remove_partition_metadata('idem.keys', 'idem', 'keys');
});
is($err, '', "Citus's drop functions give idem.keys back") or diag($err);
for my $entry ($coord, $w1)
{
	($out, $err) = call($entry, "SELECT idem_execute('k-given-back', 'SELECT 1')");
	is($err, '', 'then calls through ' . $entry->name . ' work again') or diag($err);
}
($out, $err) = call($coord, "SELECT replayed FROM idem_execute_ex('k-before-taken', 'SELECT 1')");
is($out, 't', '... and the key recorded before replays') or diag($err);

# --- with idem preloaded on the coordinator, its purge worker removes
# expired tenant records on every shard
$coord->safe_psql('postgres', "ALTER FUNCTION $fn SET idem.ttl = '1s'");
$coord->safe_psql('postgres',
	join('', map { "SELECT replayed FROM idem_citus_call(${_}::bigint, 'k-worker', 'INSERT INTO payments VALUES (\$1, \$2, \$3) RETURNING tenant_id, note', ${_}::bigint, 'k-worker', 1);\n" } 601 .. 616));
$coord->safe_psql('postgres', "ALTER FUNCTION $fn RESET idem.ttl");
my $live = $coord->safe_psql('postgres',
	"SELECT count(*) FROM idem.citus_keys WHERE key <> 'k-worker'");
my $live_steps = $coord->safe_psql('postgres',
	"SELECT count(*) FROM idem.citus_keys WHERE key LIKE 'idem.step:%'");
$coord->append_conf('postgresql.conf', qq(
shared_preload_libraries = 'citus, idem'
idem.purge_interval = 1
idem.run_retention = 1
));
$coord->restart;
ok( $coord->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idem.citus_keys WHERE key = 'k-worker'"),
	"the coordinator's purge worker removed the 16 expired tenant records");
is($coord->safe_psql('postgres',
		"SELECT count(*) FROM idem.citus_keys WHERE key <> 'k-worker'"),
	$live, '... and no other');
ok( $coord->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM idem.citus_runs WHERE run_id = 'order-19'"),
	"with idem.run_retention, it removes the finished tenant runs of every shard");
is($coord->safe_psql('postgres',
		"SELECT string_agg(run_id || ':' || status, ',') FROM idem.citus_runs"),
	'order-13:running', '... and keeps the running one');
is($coord->safe_psql('postgres',
		"SELECT count(*) FROM idem.citus_keys WHERE key LIKE 'idem.step:%'"),
	$live_steps, "... and its step's record");

# --- a worker drained and removed from the cluster leaves no undelivered
# event behind: the events move with its shards, and the nodes that remain
# deliver them
{
	# the events of earlier sections nobody delivered yet
	my @before = split /,/, $coord->safe_psql('postgres',
		"SELECT string_agg(key, ',') FROM idem.citus_outbox WHERE topic = 'refunds'");
	($out, $err) = call($coord,
		join('', map { "SELECT replayed FROM idem_citus_call_outbox(${_}::bigint, 'refunds', 'drain-$_', $insert, ${_}::bigint, 'drain-$_', 1);\n" } 901 .. 932));
	is(join('', split /\n/, $out), 'f' x 32, '32 tenants write an event each') or diag($err);
	my $on_w2 = grep { events_port($_) == $w2->port } 901 .. 932;
	cmp_ok($on_w2, '>', 0, "... $on_w2 of them on worker2's shards");
	$coord->safe_psql('postgres',
		"SELECT citus_drain_node('127.0.0.1', " . $w2->port . ", 'block_writes')");
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM citus_shards WHERE nodeport = " . $w2->port),
		'0', 'citus_drain_node() moved every shard off worker2');
	($out, $err) = call($coord, "SELECT citus_remove_node('127.0.0.1', " . $w2->port . ")");
	is($err, '', 'citus_remove_node() removed worker2') or diag($err);
	is($coord->safe_psql('postgres',
			"SELECT count(*) FROM idem.citus_outbox WHERE key LIKE 'drain-%' AND state = 'pending'"),
		'32', '... its events all pending on the nodes that remain');
	is($w2->safe_psql('postgres',
			"BEGIN; SELECT count(*) FROM idem_outbox_claim('refunds', 100, '30 s'); ROLLBACK"),
		'0', '... and none claimed on worker2 any more');
	$_->safe_psql('postgres', 'TRUNCATE delivered_log') for ($coord, $w1);
	check_log(deliver(2, $coord, $w1), [ @before, map { "drain-$_" } 901 .. 932 ],
		'after worker2 was drained and removed');
}

$_->stop for reverse @nodes;
done_testing();
