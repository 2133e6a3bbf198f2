
# Copyright (c) 2026, idem authors

# Retry storm: the same 20-step workflow (create an order, add lines,
# reserve stock, price it, move money, write the ledger, pay, ship: mostly
# statements that are NOT idempotent by themselves) run four times, each in
# a fresh database, with every step retried 0, 1, 5 and 50 times, and with
# aborted attempts injected at random before any attempt: ROLLBACK after the
# call, an error later in the same transaction, a rolled-back savepoint, or
# the session terminated with the transaction open.
#
# Checked: within a run, the first committed attempt of each step executes
# and every later attempt replays the same response; aborted attempts leave
# nothing; and the final database state (business tables, key records,
# outbox) is identical across the four runs, apart from created_at,
# expires_at, event_id and the ids the sequences hand out (aborted attempts
# consume sequence values), which are left out of the comparison.  The
# state is also checked against the values computed here.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my @retry_counts = (0, 1, 5, 50);
my $abort_probability = 0.3;
my @abort_kinds = qw(rollback error savepoint terminate);

my $node = idem_node('storm');
$node->start;

my $schema = q{
CREATE EXTENSION idem;
SELECT idem_outbox_create_topic('workflow');
CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL);
CREATE TABLE account (name text PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE orders (id bigserial PRIMARY KEY, ref text NOT NULL,
	customer text NOT NULL, status text NOT NULL, total numeric NOT NULL);
CREATE TABLE order_line (id bigserial PRIMARY KEY, ref text NOT NULL,
	line int NOT NULL, sku text NOT NULL, qty int NOT NULL, price numeric NOT NULL);
CREATE TABLE ledger (id bigserial PRIMARY KEY, account text NOT NULL,
	amount numeric NOT NULL, memo text NOT NULL);
CREATE TABLE shipment (id bigserial PRIMARY KEY, ref text NOT NULL, seq int NOT NULL);
INSERT INTO stock VALUES ('apple', 100), ('pear', 100), ('plum', 100);
INSERT INTO account VALUES ('alice', 1000), ('shop', 0);
};

# The workflow: [key, sql, args (SQL literals)]
my @lines = (
	[ 1, 'apple', 3, '1.50' ],
	[ 2, 'pear', 2, '2.25' ],
	[ 3, 'plum', 5, '0.80' ],
	[ 4, 'apple', 1, '1.50' ],
	[ 5, 'pear', 4, '2.25' ],
	[ 6, 'plum', 2, '0.80' ]);
my @steps;
push @steps,
  [
	'W1/01-create',
	q{INSERT INTO orders (ref, customer, status, total) VALUES ($1, $2, 'new', 0) RETURNING id, ref, status},
	q{'W1'::text, 'alice'::text}
  ];
for my $l (@lines)
{
	my ($n, $sku, $qty, $price) = @$l;
	push @steps,
	  [
		sprintf('W1/%02d-line-%d', 1 + $n, $n),
		q{INSERT INTO order_line (ref, line, sku, qty, price) VALUES ($1, $2, $3, $4, $5) RETURNING id, line, sku, qty},
		qq{'W1'::text, $n, '$sku'::text, $qty, $price\::numeric}
	  ];
}
for my $l (@lines)
{
	my ($n, $sku, $qty) = @$l;
	push @steps,
	  [
		sprintf('W1/%02d-reserve-%d', 7 + $n, $n),
		q{UPDATE stock SET qty = qty - $2 WHERE sku = $1 RETURNING sku, qty},
		qq{'$sku'::text, $qty}
	  ];
}
push @steps,
  [
	'W1/14-price',
	q{UPDATE orders SET total = (SELECT sum(qty * price) FROM order_line WHERE ref = $1), status = 'priced' WHERE ref = $1 RETURNING ref, total, status},
	q{'W1'::text}
  ],
  [
	'W1/15-debit',
	q{UPDATE account SET balance = balance - (SELECT total FROM orders WHERE ref = $1) WHERE name = $2 RETURNING name, balance},
	q{'W1'::text, 'alice'::text}
  ],
  [
	'W1/16-credit',
	q{UPDATE account SET balance = balance + (SELECT total FROM orders WHERE ref = $1) WHERE name = $2 RETURNING name, balance},
	q{'W1'::text, 'shop'::text}
  ],
  [
	'W1/17-ledger-debit',
	q{INSERT INTO ledger (account, amount, memo) SELECT $2, -total, ref FROM orders WHERE ref = $1 RETURNING id, account, amount},
	q{'W1'::text, 'alice'::text}
  ],
  [
	'W1/18-ledger-credit',
	q{INSERT INTO ledger (account, amount, memo) SELECT $2, total, ref FROM orders WHERE ref = $1 RETURNING id, account, amount},
	q{'W1'::text, 'shop'::text}
  ],
  [
	'W1/19-pay',
	q{UPDATE orders SET status = 'paid' WHERE ref = $1 AND status = 'priced' RETURNING ref, status},
	q{'W1'::text}
  ],
  [
	'W1/20-ship',
	q{INSERT INTO shipment (ref, seq) SELECT $1, count(*) + 1 FROM shipment RETURNING id, ref, seq},
	q{'W1'::text}
  ];
is(scalar(@steps), 20, 'the workflow has 20 steps');

sub call
{
	my ($label, $step) = @_;
	my ($key, $sql, $args) = @$step;
	return
	    "SELECT '$label', '$key', replayed, response FROM "
	  . "idem_execute_ex('$key', \$q\$$sql\$q\$, $args);\n";
}

# An attempt that does not commit.
sub aborted_attempt
{
	my ($kind, $step) = @_;
	my $c = call('abort', $step);

	return "BEGIN;\n${c}ROLLBACK;\n" if $kind eq 'rollback';
	return "BEGIN;\n${c}SELECT 1/0;\nCOMMIT;\n" if $kind eq 'error';
	return "BEGIN;\nSAVEPOINT a;\n${c}ROLLBACK TO SAVEPOINT a;\nCOMMIT;\n"
	  if $kind eq 'savepoint';
	return "BEGIN;\n${c}SELECT pg_terminate_backend(pg_backend_pid());\nCOMMIT;\n"
	  if $kind eq 'terminate';
	die "unknown abort kind $kind";
}

# Normalised dump of everything the workflow leaves behind.  Generated ids
# (bigserial, also inside responses), timestamps and event ids are left out;
# the key records' lifetime is kept as expires_at - created_at, to the
# second (a record is written with a one-second slack for its commit).
my $dump_sql = q{
SELECT 'stock', sku, qty FROM stock ORDER BY sku;
SELECT 'account', name, balance FROM account ORDER BY name;
SELECT 'orders', ref, customer, status, total FROM orders ORDER BY ref;
SELECT 'order_line', ref, line, sku, qty, price FROM order_line ORDER BY ref, line;
SELECT 'ledger', account, amount, memo FROM ledger ORDER BY account, memo, amount;
SELECT 'shipment', ref, seq FROM shipment ORDER BY ref, seq;
SELECT 'key', key, owner::regrole, encode(fingerprint, 'hex'),
       response #- '{rows,0,id}', date_trunc('second', expires_at - created_at)
FROM idem.keys ORDER BY key;
SELECT 'outbox', key, topic, payload #- '{rows,0,id}' FROM idem.outbox ORDER BY key;
SELECT 'counts', (SELECT count(*) FROM idem.keys), (SELECT count(*) FROM idem.outbox);
};

my %dump;
my %aborts_seen = map { $_ => 0 } @abort_kinds;

for my $retries (@retry_counts)
{
	my $db = "run_r$retries";
	my $seed = 1000 + $retries;
	srand($seed);
	note "run with $retries retries per step, seed $seed";

	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, $schema);

	# Plan the attempts, cut into psql scripts at each terminated session.
	my @segments = ('');
	my %planned = map { $_ => 0 } @abort_kinds;
	for my $step (@steps)
	{
		for my $attempt (0 .. $retries)
		{
			if (rand() < $abort_probability)
			{
				my $kind = $abort_kinds[ int(rand(@abort_kinds)) ];
				$planned{$kind}++;
				$segments[-1] .= aborted_attempt($kind, $step);
				push @segments, '' if $kind eq 'terminate';
			}
			$segments[-1] .= call('ok', $step);
		}
	}
	$aborts_seen{$_} += $planned{$_} for @abort_kinds;
	note "aborted attempts: "
	  . join(', ', map { "$_ $planned{$_}" } @abort_kinds);

	my @results;
	my $connections_lost = 0;
	for my $segment (@segments)
	{
		my ($stdout, $stderr);
		my $rc = $node->psql(
			$db,
			"SET idem.outbox_topic = 'workflow';\n" . $segment,
			stdout => \$stdout,
			stderr => \$stderr,
			on_error_stop => 0,
			timeout => $PostgreSQL::Test::Utils::timeout_default);
		$connections_lost++
		  if $stderr =~ /terminating connection due to administrator command/;
		push @results, split(/\n/, $stdout);
	}
	is($connections_lost, scalar(@segments) - 1,
		"r=$retries: every terminated attempt lost its session");

	# Per step: committed attempts in order, and the aborted ones.
	my (%ok, %first_abort_fresh, $bad);
	$bad = '';
	for my $line (@results)
	{
		my ($label, $key, $replayed, $response) = split /\|/, $line, 4;
		if ($label eq 'ok')
		{
			push @{ $ok{$key} }, [ $replayed, $response ];
		}
		elsif ($label eq 'abort')
		{
			# an aborted attempt before the step committed executes
			# afresh each time; after it, it replays
			my $committed = exists $ok{$key};
			$bad .= "$key: aborted attempt replayed=$replayed\n"
			  if $replayed ne ($committed ? 't' : 'f');
		}
		elsif ($line ne '1' && $line ne 't')
		{
			$bad .= "unexpected output: $line\n";
		}
	}
	for my $step (@steps)
	{
		my $key = $step->[0];
		my @attempts = @{ $ok{$key} // [] };
		if (@attempts != $retries + 1)
		{
			$bad .= "$key: " . scalar(@attempts) . " committed attempts\n";
			next;
		}
		$bad .= "$key: first committed attempt did not execute\n"
		  if $attempts[0][0] ne 'f';
		for my $a (@attempts[ 1 .. $#attempts ])
		{
			$bad .= "$key: a retry did not replay the first response\n"
			  unless $a->[0] eq 't' && $a->[1] eq $attempts[0][1];
		}
	}
	is($bad, '',
		"r=$retries: each step executed once, every other attempt replayed its response"
	);

	is( $node->safe_psql(
			$db, q{
SELECT count(*) FROM idem.keys k
JOIN order_line l ON l.id = (k.response->'rows'->0->>'id')::bigint
                 AND l.line = (k.response->'rows'->0->>'line')::int
WHERE k.key LIKE 'W1/%-line-%'}),
		'6',
		"r=$retries: the generated ids in the stored responses are those of the business rows"
	);

	$dump{$retries} = $node->safe_psql($db, $dump_sql);
}

cmp_ok($aborts_seen{$_}, '>', 0, "aborted attempts of kind $_ were injected")
  for @abort_kinds;

# The state a single clean run must leave, computed independently.
my %stock = (apple => 100, pear => 100, plum => 100);
my $total = 0;
for my $l (@lines)
{
	$stock{ $l->[1] } -= $l->[2];
	$total += $l->[2] * $l->[3];
}
my $db = 'run_r0';
is( $node->safe_psql($db, 'SELECT sku, qty FROM stock ORDER BY sku'),
	join("\n", map { "$_|$stock{$_}" } sort keys %stock),
	'stock was reserved once per line');
is($node->safe_psql($db, "SELECT total = $total FROM orders"),
	't', 'the order total counts every line once');
is( $node->safe_psql(
		$db,
		"SELECT balance = 1000 - $total FROM account WHERE name = 'alice' "
		  . "UNION ALL SELECT balance = $total FROM account WHERE name = 'shop'"),
	"t\nt",
	'money moved once');
is( $node->safe_psql(
		$db,
		q{SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM order_line),
		(SELECT count(*) FROM ledger), (SELECT string_agg(seq::text, ',') FROM shipment),
		(SELECT count(*) FROM idem.keys), (SELECT count(*) FROM idem.outbox)}),
	'1|6|2|1|20|20',
	'one order, six lines, two ledger rows, one shipment, 20 keys, 20 events');

note "normalised final state:\n$dump{0}";
for my $retries (@retry_counts[ 1 .. $#retry_counts ])
{
	is($dump{$retries}, $dump{0},
		"final state with $retries retries per step equals the state with none"
	);
}

$node->stop;
done_testing();
