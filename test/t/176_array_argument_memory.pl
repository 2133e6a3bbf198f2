
# Copyright (c) 2026, idem authors

# A request's fingerprint hashes an array argument element by element,
# without unpacking it first: unpacked, an argument of 10 million int4
# took 90 MB more (a pointer and a flag per element), and the hashing
# loop, seconds long, could not be cancelled.  The backend's peak memory
# (VmHWM) must not grow past what reading the argument takes; and a
# statement timeout stops the hashing.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $n = 10_000_000;
my $node = idem_node('arrayarg');
$node->start;
$node->safe_psql('postgres',
	"CREATE EXTENSION idem; CREATE TABLE big AS SELECT array_fill(1, ARRAY[$n]) AS a");

my $s = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
# the argument read (detoasted) twice, as the call reads it (its
# fingerprint, then its statement): the baseline peak
is($s->query_safe('SELECT cardinality(a) + cardinality(a) FROM big'),
	2 * $n, 'the argument is read');
my $before = backend_memory_kb($pid, 'VmHWM');
is( $s->query_safe(
		q{SELECT idem_execute('big', 'SELECT cardinality($1) AS n', a) -> 'rows' FROM big}),
	qq([{"n": $n}]),
	'a call with an argument of 10 million elements');
my $after = backend_memory_kb($pid, 'VmHWM');
note("backend VmHWM: $before kB after reading the argument, $after kB after the call");
cmp_ok($after - $before, '<', 20 * 1024,
	"hashing the argument takes less than 20 MB beyond reading it ($before kB, then $after kB)");

# the hashing of a retry's argument is interrupted by a statement timeout
my $t0 = time;
my ($ret, $out, $err) = $s->query(
	q{SET statement_timeout = '100ms';
SELECT idem_execute('big', 'SELECT cardinality($1) AS n', a) FROM big;});
my $took = time - $t0;
like($s->{stderr}, qr/canceling statement due to statement timeout/,
	'a statement timeout cancels the call');
note("cancelled after $took s");
$s->quit;

$node->stop;
done_testing();
