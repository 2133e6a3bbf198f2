
# Copyright (c) 2026, idem authors

# A response of many rows needs memory of about its size.  The rows were
# put into the response with pushJsonbValue(), which unpacks each row's
# jsonb into JsonbValues and converts them all back: some 700 bytes for a
# row of one column, and seconds for a million rows in a loop that did not
# check for interrupts.  Each row's jsonb is now copied into the response
# whole, the loop checking for interrupts.  The backend's private memory
# (RssAnon, read while the call runs) must grow by a small multiple of the
# response's size.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $nrows = 200000;

my $node = idem_node('responserows');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $s = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
$s->query_safe('SET idem.max_response_size = 536870911');
my $sql = "SELECT g FROM generate_series(1, $nrows) g";
my ($before, $peak, $out) = peak_private_kb($s, $pid,
	"SELECT pg_column_size(idem_execute('big', '$sql'))");
my ($size) = $out =~ /^(\d+)$/m;
ok(defined $size && $size > 0, "the response of $nrows rows is built")
  or diag("output: $out\nerrors: $s->{stderr}");
$size //= 0;
is( $s->query_safe(
		"SELECT jsonb_array_length(idem_execute('big', '$sql') -> 'rows')"),
	$nrows, "the replayed response holds the $nrows rows");
my $grown = $peak - $before;
note("response $size bytes; backend RssAnon $before kB before, at most $peak kB during the call");
cmp_ok($grown * 1024, '<', 4 * $size + 8 * 1024 * 1024,
	"the call grows the backend by less than four times the response's size and 8 MB ($grown kB for $size bytes)");

$s->quit;

$node->stop;
done_testing();
