
# Copyright (c) 2026, idem authors

# A batch ack refuses more than 10,000 events, and counts them from the
# arrays' dimensions before unpacking them: it unpacked both arrays first
# (a pointer and a flag per element, 45 MB for each of two 5-million-element
# arrays) and only then refused them.  The backend's peak memory (VmHWM)
# must not grow past what building the arrays took.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $n = 5_000_000;
my $node = idem_node('ackbatch');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $array = "array_fill(gen_random_uuid(), ARRAY[$n])";
my $s = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
# the arrays built as the ack's call builds them: the baseline peak
is($s->query_safe("SELECT cardinality($array) + cardinality($array)"),
	2 * $n, 'the arrays are built');
my $before = backend_memory_kb($pid, 'VmHWM');
my ($out, $ret) = $s->query("SELECT idem_outbox_ack_batch($array, $array)");
like($s->{stderr}, qr/at most 10000 events can be acknowledged at once/,
	'a batch of 5 million events is refused');
my $after = backend_memory_kb($pid, 'VmHWM');
$s->quit;

# unpacked, each array is 45 MB of pointers and flags
note("backend VmHWM: $before kB after building the arrays, $after kB after the ack");
cmp_ok($after - $before, '<', 20 * 1024,
	"refusing the batch takes less than 20 MB beyond building its arrays ($before kB, then $after kB)");

$node->stop;
done_testing();
