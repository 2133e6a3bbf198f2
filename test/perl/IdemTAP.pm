
# Copyright (c) 2026, idem authors

=pod

=head1 NAME

IdemTAP - helpers shared by idem's TAP tests (test/t/0[3-9]*.pl)

=head1 SYNOPSIS

  use FindBin;
  use lib "$FindBin::RealBin/../perl";
  use IdemTAP;

  my $node = idem_node('main');
  $node->start;
  idem_setup_db($node, 'postgres');

  my @clients = start_clients($node, 'postgres', 'crash', 4, 3000);
  ...
  crash_node($node);
  my $log = wait_clients(@clients);

=head1 DESCRIPTION

A "client" is a psql process running a script that, for every call, first
prints "sent KEY" (the client-side log, written before the request goes out)
and then runs one idem_execute_ex() in autocommit mode, printing
"ack|KEY|replayed|response" once the commit is acknowledged.  The business
statement inserts one row into biz(key, client, n), so a duplicate execution
shows up as a second row with the same key.

Every wait is bounded by $PostgreSQL::Test::Utils::timeout_default
(PG_TEST_TIMEOUT_DEFAULT, 180 s unless set).

=cut

package IdemTAP;

use strict;
use warnings FATAL => 'all';

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

our @EXPORT = qw(
  idem_node
  lock_table_slots
  enqueue_runs
  citus_cluster
  citus_node
  citus_database
  idem_sync_pair
  idem_setup_db
  crash_node
  call_sql
  client_script
  start_clients
  wait_clients
  parse_client_output
  check_pairing
  query_list
  query_map
  wait_for_backend
  bg_finish
  backend_memory_kb
  peak_private_kb
);

# The business statement every client call runs.  RETURNING id puts the
# generated id into the stored response: a replay that returns another id
# than the business row carries would be caught.
our $biz_sql =
  'INSERT INTO biz (key, client, n) VALUES ($1, $2, $3) RETURNING id, key, client, n';

=pod

=over

=item idem_node(name, %init_params)

A new, not yet started node with settings that suit these tests.

=cut

sub idem_node
{
	my ($name, %params) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);

	# the encoding and locale stated, not taken from the environment
	# (without LANG initdb makes a SQL_ASCII cluster)
	$params{extra} = [ '--encoding=UTF8', '--no-locale', @{ $params{extra} // [] } ];
	$node->init(%params);
	# Cluster.pm logs every statement; clients send thousands.  Streaming
	# nodes get shared_buffers = 1MB and max_connections = 10, too small
	# for several clients plus the test's own connections.
	$node->append_conf(
		'postgresql.conf', qq(
log_statement = none
log_min_duration_statement = -1
max_connections = 30
shared_buffers = 16MB
));
	return $node;
}

=pod

=item lock_table_slots(node)

How many locks the node's shared lock table holds in all
(max_locks_per_transaction times the backends and prepared transactions
it is sized for), as PostgreSQL sizes it.

=cut

sub lock_table_slots
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		"SELECT current_setting('max_locks_per_transaction')::int * (current_setting('max_connections')::int + current_setting('autovacuum_max_workers')::int + 1 + current_setting('max_worker_processes')::int + current_setting('max_wal_senders')::int + current_setting('max_prepared_transactions')::int)"
	);
}

=pod

=item enqueue_runs(node, queue, prefix, n, role)

Begins n runs named prefix-1 to prefix-n, each of one step 's', on the
queue, in database postgres, in transactions of 500 (so that a backlog
larger than the shared lock table can be made), as role if given.

=cut

sub enqueue_runs
{
	my ($node, $queue, $prefix, $n, $role) = @_;
	my $set = defined $role ? "SET ROLE $role;" : '';
	$node->safe_psql('postgres', qq{
$set
DO \$\$
BEGIN
	FOR b IN 0 .. ($n - 1) / 500 LOOP
		PERFORM idem_run_begin('$prefix-' || g, steps => ARRAY['s'], queue => '$queue')
		   FROM generate_series(b * 500 + 1, least((b + 1) * 500, $n)) g;
		COMMIT;
	END LOOP;
END
\$\$;
});
	return;
}

=pod

=item citus_cluster(settings)

A started Citus coordinator and two workers (named coordinator, worker1,
worker2) on loopback, each with the citus extension in database postgres
and the given postgresql.conf settings after Citus's own, and the workers
added to the coordinator's metadata.  Needs Citus installed into the same
PostgreSQL (scripts/test-citus.sh).  Returns (coordinator, worker1,
worker2).

=cut

sub citus_cluster
{
	my ($settings) = @_;
	my @nodes = map { citus_node($_, $settings) } ('coordinator', 'worker1', 'worker2');
	citus_database('postgres', @nodes);
	return @nodes;
}

=pod

=item citus_node(name, settings)

A started node with Citus preloaded, on loopback, and the given
postgresql.conf settings after Citus's own (8 shards a table unless they
say otherwise); no citus extension yet (citus_database()).

=cut

sub citus_node
{
	my ($name, $settings) = @_;
	my $node = idem_node($name);
	$node->append_conf(
		'postgresql.conf', qq(
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
max_prepared_transactions = 100
citus.shard_count = 8
$settings
));
	$node->start;
	return $node;
}

=pod

=item citus_database(db, coordinator, workers...)

The citus extension in database db (created unless it is postgres) on every
node, the coordinator's host set and the workers added to its metadata.

=cut

sub citus_database
{
	my ($db, $coord, @workers) = @_;
	for my $node ($coord, @workers)
	{
		$node->safe_psql('postgres', "CREATE DATABASE $db") if $db ne 'postgres';
		$node->safe_psql($db, 'CREATE EXTENSION citus');
	}
	$coord->safe_psql($db,
		"SELECT citus_set_coordinator_host('127.0.0.1', " . $coord->port . ')');
	$coord->safe_psql($db, "SELECT citus_add_node('127.0.0.1', " . $_->port . ')')
	  for @workers;
	return;
}

=pod

=item idem_sync_pair(synchronous_commit[, prefix, settings])

A started primary whose synchronous standby is named 'standby', with the
given synchronous_commit, and that standby, streaming from a base backup and
started.  The standby has no synchronous standby of its own, so it commits
without waiting once promoted.  Returns (primary, standby).

With prefix, the nodes are named prefix_primary and prefix_standby (so a
test can build more than one pair); settings are appended to the
primary's postgresql.conf before it starts, and the standby's base backup
carries them.

=cut

sub idem_sync_pair
{
	my ($synchronous_commit, $prefix, $settings) = @_;
	my $pname = defined $prefix ? "${prefix}_primary" : 'primary';
	my $sname = defined $prefix ? "${prefix}_standby" : 'standby';
	my $primary = idem_node($pname, allows_streaming => 1);

	$primary->append_conf(
		'postgresql.conf', qq(
synchronous_standby_names = '$sname'
synchronous_commit = $synchronous_commit
) . ($settings // ''));
	$primary->start;
	$primary->backup('base');

	my $standby = PostgreSQL::Test::Cluster->new($sname);
	$standby->init_from_backup($primary, 'base', has_streaming => 1);
	$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''");
	$standby->start;
	return ($primary, $standby);
}

=pod

=item idem_setup_db(node, dbname)

CREATE EXTENSION idem and the business table biz in dbname (created first
unless it is postgres).  biz has no unique constraint on key on purpose:
a second execution would add a second row, not fail.

=cut

sub idem_setup_db
{
	my ($node, $db) = @_;

	$node->safe_psql('postgres', "CREATE DATABASE $db") if $db ne 'postgres';
	$node->safe_psql(
		$db, q{
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('orders');
SELECT idem_outbox_create_topic('workflow');
CREATE TABLE biz (
	id		bigserial PRIMARY KEY,
	key		text NOT NULL,
	client	int NOT NULL,
	n		int NOT NULL
);
CREATE INDEX ON biz (key);
});
	return;
}

=pod

=item query_list(node, db, sql)

Rows of a query as a list of strings (columns joined by "|").

=cut

sub query_list
{
	my ($node, $db, $sql) = @_;
	my $out = $node->safe_psql($db, $sql, timeout => $PostgreSQL::Test::Utils::timeout_default);
	return grep { $_ ne '' } split /\n/, $out;
}

=pod

=item query_map(node, db, sql)

A hash from the first column of each row to the rest of the row.

=cut

sub query_map
{
	my ($node, $db, $sql) = @_;
	my %map;

	for my $row (query_list($node, $db, $sql))
	{
		my ($k, $v) = split /\|/, $row, 2;
		$map{$k} = $v;
	}
	return %map;
}

# Pids of the processes whose parent is $ppid (Linux /proc).
sub _children
{
	my ($ppid) = @_;
	my @pids;

	opendir(my $dh, '/proc') or return ();
	for my $pid (grep { /^\d+$/ } readdir $dh)
	{
		open(my $fh, '<', "/proc/$pid/stat") or next;
		my $stat = <$fh>;
		close $fh;
		next unless defined $stat;
		# pid (comm) state ppid ...; comm may contain spaces and parens
		push @pids, $pid
		  if $stat =~ /^\d+ \(.*\) \S (\d+) /s && $1 == $ppid;
	}
	closedir $dh;
	return @pids;
}

# Whether a pid is a live (not zombie) process.
sub _alive
{
	my ($pid) = @_;

	return 0 unless kill(0, $pid);
	if (open(my $fh, '<', "/proc/$pid/stat"))
	{
		my $stat = <$fh>;
		close $fh;
		return 0 if defined $stat && $stat =~ /^\d+ \(.*\) Z /s;
	}
	return 1;
}

=pod

=item crash_node(node)

Kill the whole server at once, as a machine or container crash would:
SIGKILL to the postmaster (C<< $node->kill9 >>) and to every process it
started, so that no backend finishes its transaction after the postmaster
died.  Returns once all of them are gone, so that a following
C<< $node->start >> runs crash recovery.

=cut

sub crash_node
{
	my ($node) = @_;
	my $pidfile = $node->data_dir . '/postmaster.pid';
	my ($pmpid) = split /\n/, slurp_file($pidfile);

	# Freeze the postmaster so that it forks nothing while we look.
	kill 'STOP', $pmpid;
	my @children = _children($pmpid);
	$node->kill9;
	kill 'KILL', @children if @children;
	note "crashed node " . $node->name . ": postmaster $pmpid, "
	  . scalar(@children) . " children killed";

	# A new postmaster refuses to start while the old one's pid exists
	# (even as a zombie not yet reaped) or while any child still has the
	# shared memory attached.
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (kill(0, $pmpid) || grep { _alive($_) } @children)
	{
		die "processes of crashed node still alive" if time() > $deadline;
		usleep(50_000);
	}
	return;
}

=pod

=item call_sql(key, client, n [, label])

One client call: log the key, then call idem_execute_ex().  Shared keys
(client 0) send the same request from every client.

=cut

sub call_sql
{
	my ($key, $client, $n, $label) = @_;
	$label = 'ack' unless defined $label;

	return "\\echo sent $key\n"
	  . "SELECT '$label', '$key', replayed, response FROM idem_execute_ex('$key', "
	  . "'$biz_sql', '$key'::text, $client, $n);\n";
}

=pod

=item client_script(client, ncalls)

A client's stream: odd calls use a private key "cC-N", even calls a key
"s-N" that every client sends (so clients also race on the same keys).

=cut

sub client_script
{
	my ($c, $ncalls) = @_;
	my $sql = "SET idem.outbox_topic = 'orders';\n";

	for my $i (1 .. $ncalls)
	{
		if ($i % 2)
		{
			$sql .= call_sql(sprintf('c%d-%05d', $c, $i), $c, $i);
		}
		else
		{
			$sql .= call_sql(sprintf('s-%05d', $i), 0, $i);
		}
	}
	return $sql;
}

=pod

=item start_clients(node, db, tag, [scripts])

Start one psql process per script, with ON_ERROR_STOP, output to files
under tmp_check.  Returns a list of client handles.

=cut

sub start_clients
{
	my ($node, $db, $tag, $scripts) = @_;
	my @clients;

	for my $c (1 .. scalar(@$scripts))
	{
		my $base = "$PostgreSQL::Test::Utils::tmp_check/${tag}_client$c";
		my $script = "$base.sql";
		open(my $fh, '>', $script) or die "could not write $script: $!";
		print $fh $scripts->[ $c - 1 ];
		close $fh;

		my @cmd = (
			$node->installed_command('psql'), '-XAtq',
			'-v', 'ON_ERROR_STOP=1',
			'-d', $node->connstr($db),
			'-f', $script);
		my $h = IPC::Run::start(\@cmd, '<', \undef,
			'>', "$base.out", '2>', "$base.err",
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
		push @clients, { id => $c, h => $h, base => $base };
	}
	return @clients;
}

=pod

=item parse_client_output(text)

Returns (sent => [keys in order], acks => {key => [replayed, response]},
nack => number of ack lines).  Lines labelled "pending" (a call inside a
transaction block that has not committed yet) are not acknowledgements.

=cut

sub parse_client_output
{
	my ($text) = @_;
	my (@sent, %acks, $nack);

	$nack = 0;
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^sent (\S+)$/)
		{
			push @sent, $1;
		}
		elsif ($line =~ /^(?:ack|retry)\|([^|]+)\|([tf])\|(.*)$/)
		{
			$acks{$1} = [ $2, $3 ];
			$nack++;
		}
		elsif ($line =~ /^pending\|/)
		{
			# a result inside a transaction that has not committed yet
		}
		else
		{
			die "unexpected client output line: $line";
		}
	}
	return (sent => \@sent, acks => \%acks, nack => $nack);
}

=pod

=item wait_clients(clients)

Wait for every client to exit.  Returns a list of hashes with id, exit
status, stderr and the parsed output.

=cut

sub wait_clients
{
	my (@clients) = @_;
	my @results;

	for my $c (@clients)
	{
		eval { $c->{h}->finish; };
		my $status = eval { $c->{h}->result(0) } // -1;
		my $out = slurp_file("$c->{base}.out");
		my $err = slurp_file("$c->{base}.err");
		push @results,
		  {
			id => $c->{id},
			status => $status,
			stderr => $err,
			parse_client_output($out)
		  };
	}
	return @results;
}

=pod

=item check_pairing(node, db, label [, loose => 1])

The invariants that must hold at any moment: every key record has exactly
one business row and one outbox event and vice versa, and the stored
response names the business row's id.  Returns the committed keys as a
hash key => response.

=cut

sub check_pairing
{
	my ($node, $db, $label, %opts) = @_;
	local $Test::Builder::Level = $Test::Builder::Level + 1;
	# loose: responses may carry more columns than biz; compare id only
	my $mismatch =
	  $opts{loose}
	  ? q{(k.response->'rows'->0->>'id')::bigint <> b.id}
	  : q{k.response <> jsonb_build_object('rows', jsonb_build_array(to_jsonb(b)),
                                       'command', 'INSERT', 'rowcount', 1)};

	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM biz b FULL JOIN idem.keys k USING (key)
WHERE b.key IS NULL OR k.key IS NULL}),
		'0',
		"$label: no key record without its business row and no business row without its key record"
	);
	is( $node->safe_psql(
			$db, 'SELECT count(*) FROM (SELECT key FROM biz GROUP BY key HAVING count(*) > 1) d'),
		'0',
		"$label: no key has two business rows");
	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM idem.outbox o FULL JOIN idem.keys k USING (key)
WHERE o.key IS NULL OR k.key IS NULL}),
		'0',
		"$label: every key record has its outbox event and vice versa");
	is( $node->safe_psql(
			$db, 'SELECT count(*) FROM (SELECT key FROM idem.outbox GROUP BY key HAVING count(*) > 1) d'),
		'0',
		"$label: no key has two outbox events");
	is( $node->safe_psql(
			$db, qq{
SELECT count(*) FROM biz b JOIN idem.keys k USING (key) JOIN idem.outbox o USING (key)
WHERE $mismatch OR k.response <> o.payload}),
		'0',
		"$label: each stored response (and outbox payload) is exactly the business row");

	return query_map($node, $db, 'SELECT key, response FROM idem.keys');
}

=pod

=item wait_for_backend(node, pid, condition)

Poll pg_stat_activity until the backend with this pid satisfies the SQL
condition (e.g. "wait_event = 'SyncRep'").  Dies on timeout.

=cut

sub wait_for_backend
{
	my ($node, $pid, $cond) = @_;

	$node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM pg_stat_activity WHERE pid = $pid AND $cond")
	  or die "timed out waiting for backend $pid: $cond";
	return;
}

=pod

=item bg_finish(session)

Wait for a BackgroundPsql session whose connection is gone (or is going)
to exit; returns its stdout and stderr.

psql gets end of input, not "\q": a psql whose server connection has
already dropped exits by itself, and writing to its closed stdin fails
inside IPC::Run before the harness has read the error psql printed.  If
the harness still fails, the failure is appended to stderr for the test
to show.

=cut

sub bg_finish
{
	my ($bg) = @_;

	if (!eval { $bg->{run}->finish; 1 })
	{
		$bg->{stderr} .= "\nbg_finish: $@";
		eval { $bg->{run}->kill_kill; };
	}
	return ($bg->{stdout}, $bg->{stderr});
}

=pod

=item backend_memory_kb(pid, field)

A backend's memory figure from /proc/<pid>/status in kB: field is e.g.
RssAnon (its private memory now) or VmHWM (its peak resident memory).
Linux only.

=cut

sub backend_memory_kb
{
	my ($pid, $field) = @_;

	open my $fh, '<', "/proc/$pid/status" or die "/proc/$pid/status: $!";
	while (<$fh>)
	{
		return $1 if /^\Q$field\E:\s+(\d+)\s+kB/;
	}
	die "no $field in /proc/$pid/status";
}

=pod

=item peak_private_kb(session, pid, sql)

Run sql in a BackgroundPsql session whose backend is pid, reading the
backend's private memory (RssAnon) every few milliseconds while it runs.
Returns (RssAnon before, the most read while it ran, the statement's
output); its errors are left in the session's stderr.  Memory
that grows with the statement's work is read close to its height, at
the statement's end.

=cut

sub peak_private_kb
{
	my ($s, $pid, $sql) = @_;
	my $before = backend_memory_kb($pid, 'RssAnon');
	my $peak = $before;
	my $timeout = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);

	$s->{stdout} = '';
	$s->{stdin} .= "$sql;\n\\echo peak_private_kb done\n";
	while ($s->{stdout} !~ /peak_private_kb done/)
	{
		die "timed out running $sql" if $timeout->is_expired;
		$s->{run}->pump_nb;
		my $now = backend_memory_kb($pid, 'RssAnon');
		$peak = $now if $now > $peak;
		usleep(5_000);
	}
	my $out = $s->{stdout};
	$out =~ s/peak_private_kb done\n?//;
	$s->{stdout} = '';
	return ($before, $peak, $out);
}

=pod

=back

=cut

1;
