
# Copyright (c) 2026, idem authors

# A text (or varchar) argument whose $n the statement types as text is
# already its value: it is passed and hashed as it came, not copied to a C
# string and read back with text's input function.  Those copies made a
# call with a 64 MB text argument raise the backend's peak memory (VmHWM)
# by 68 MB beyond reading the argument; now by 4 MB.  The call is the
# request an untyped string makes, and an argument that the statement
# types otherwise is still read with that type's input function.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $mb = 64;
my $node = idem_node('textarg');
$node->start;
# md5 hex digits do not compress much: the value is stored out of line
$node->safe_psql('postgres',
	"CREATE EXTENSION idem; CREATE TABLE big AS SELECT string_agg(md5(g::text), '') AS t"
	  . " FROM generate_series(1, $mb * 1024 * 1024 / 32) AS g");

my $s = $node->background_psql('postgres', on_error_stop => 0);
my $pid = $s->query_safe('SELECT pg_backend_pid()');
# the argument read (detoasted) twice, as the call reads it (its
# fingerprint, then its statement): the baseline peak
is($s->query_safe('SELECT length(t) + length(t) FROM big'),
	2 * $mb * 1024 * 1024, 'the argument is read');
my $before = backend_memory_kb($pid, 'VmHWM');
is( $s->query_safe(
		q{SELECT idem_execute('big', 'SELECT length($1) AS n', t) -> 'rows' FROM big}),
	'[{"n": ' . ($mb * 1024 * 1024) . '}]',
	"a call with a text argument of $mb MB");
my $after = backend_memory_kb($pid, 'VmHWM');
note("backend VmHWM: $before kB after reading the argument, $after kB after the call");
cmp_ok($after - $before, '<', 16 * 1024,
	"the call takes less than 16 MB beyond reading the argument ($before kB, then $after kB)");

# the same request as the argument untyped, and as varchar
is( $s->query_safe(
		q{SELECT (idem_execute_ex('big', 'SELECT length($1) AS n', t::varchar)).replayed FROM big}),
	't', 'the argument as varchar is the same request');
is( $s->query_safe(
		q{SELECT replayed FROM idem_execute_ex('small', 'SELECT $1 AS v', 'a')}),
	'f', 'an untyped string');
is( $s->query_safe(
		q{SELECT replayed FROM idem_execute_ex('small', 'SELECT $1 AS v', 'a'::text)}),
	't', 'is the request its text makes');
# a string the statement types otherwise is read as that type
is( $s->query_safe(
		q{SELECT idem_execute('int', 'SELECT $1 + 1 AS v', '41'::text) -> 'rows'}),
	'[{"v": 42}]', 'a text argument the statement types as an integer');
$s->quit;

$node->stop;
done_testing();
