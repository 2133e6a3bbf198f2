
# Copyright (c) 2026, idem authors

# The reference pages say what the server has.  doc/configuration.md has a
# section for every idem.* setting and none for a setting that does not
# exist, and each section's Default and Who are the setting's default and
# context as pg_settings shows them; the settings of context postmaster
# exist only when idem is preloaded.  doc/api.md names every function,
# view and type the extension installs, no function it lacks, and every
# SQLSTATE the C code raises in its SQLSTATE table.  (The pages' examples
# are run by test/doc/run.py; this checks the prose they do not show.)

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $doc = "$FindBin::RealBin/../../doc";

# The sections of doc/configuration.md: name => { default, who }.
my %section;
{
	my $name;
	for my $line (split /\n/, slurp_file("$doc/configuration.md"))
	{
		if ($line =~ /^### `(idem\.[a-z_]+)`/)
		{
			$name = $1;
			$section{$name} = {};
		}
		elsif ($line =~ /^#/)
		{
			undef $name;
		}
		elsif (defined $name && $line =~ /^- Default: `([^`]*)`/)
		{
			$section{$name}{default} = $1;
		}
		elsif (defined $name && $line =~ /^- Who: (\w+)/)
		{
			$section{$name}{who} = $1;
		}
	}
}

# A documented default ('', 1d, 32MB, 1s, on) in the setting's unit.
my %factor = (
	ms => 1, s => 1000, min => 60_000, h => 3_600_000, d => 86_400_000,
	B => 1, kB => 1024, MB => 1024**2, GB => 1024**3);
my %time = map { $_ => 1 } qw(ms s min h d);

sub doc_value
{
	my ($text, $unit) = @_;

	return '' if $text eq "''";
	return $text
	  unless $text =~ /^(\d+)\s*(ms|s|min|h|d|B|kB|MB|GB)?$/
	  && defined $unit && $unit ne '';
	my ($n, $u) = ($1, $2 // $unit);
	return "$n $u (mixes time and size)" if ($time{$u} // 0) != ($time{$unit} // 0);
	return $n * $factor{$u} / $factor{$unit};
}

my $node = idem_node('docref');
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem'");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my %setting;
for my $row (query_list($node, 'postgres',
	"SELECT name, boot_val, coalesce(unit, ''), context FROM pg_settings
	  WHERE name LIKE 'idem.%' ORDER BY name"))
{
	my ($name, $boot, $unit, $context) = split /\|/, $row, -1;
	$setting{$name} = { boot => $boot, unit => $unit, context => $context };
}
ok(scalar(keys %setting) > 20, 'preloaded, the server has the idem.* settings');

is_deeply([ sort keys %section ], [ sort keys %setting ],
	'doc/configuration.md has a section for each setting, and only those');

for my $name (sort keys %setting)
{
	next unless $section{$name};
	my $s = $setting{$name};
	is($section{$name}{who}, $s->{context},
		"$name: the Who of its section is its context");
	is(doc_value($section{$name}{default} // '(none)', $s->{unit}),
		$s->{boot}, "$name: the Default of its section is its default");
}

# Loaded by a session, not preloaded: the postmaster settings do not exist.
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$node->restart;
my @loaded = query_list($node, 'postgres',
	"LOAD 'idem'; SELECT name FROM pg_settings WHERE name LIKE 'idem.%' ORDER BY name");
is_deeply(\@loaded,
	[ grep { $setting{$_}{context} ne 'postmaster' } sort keys %setting ],
	'not preloaded, exactly the settings of context postmaster are missing');

# Every function, view and type of the extension is named in doc/api.md.
my $api = slurp_file("$doc/api.md");
my @objects = query_list($node, 'postgres', q{
WITH member AS (
	SELECT classid, objid FROM pg_depend
	 WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem'))
SELECT CASE WHEN p.pronamespace = 'idem'::regnamespace THEN 'idem.' ELSE '' END
	   || p.proname
  FROM pg_proc p WHERE (p.tableoid, p.oid) IN (SELECT * FROM member)
UNION
SELECT c.relname FROM pg_class c
 WHERE c.relkind = 'v' AND (c.tableoid, c.oid) IN (SELECT * FROM member)
UNION
SELECT t.typname FROM pg_type t WHERE (t.tableoid, t.oid) IN (SELECT * FROM member)
   -- not the row types of its tables and views, nor array types, which
   -- 17 and later record as the extension's members too
   AND t.typcategory <> 'A'
   AND (t.typrelid = 0 OR (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c')
 ORDER BY 1});
ok(scalar(@objects) > 50, 'the extension has its functions, views and types');
my @missing = grep { $api !~ /`\Q$_\E[`(]/ } @objects;
is(join(', ', @missing), '', 'doc/api.md names every function, view and type of the extension');

# ... and names no function the extension does not have (the Citus tenant
# functions are made by idem_citus_colocate(), not by the extension).
my %have = map { $_ => 1 } @objects;
my ($table) = $api =~ /\n## Functions\n(.*?)\n## /s;
my %named = map { $_ => 1 } $table =~ /`((?:idem\.)?idem_[a-z_]+)\b/g;
my @unknown = grep { !$have{$_} && !/^idem_citus_/ && $_ ne 'idem_admin' }
  sort keys %named;
is(join(', ', @unknown), '', "doc/api.md's function table names no function the extension lacks");

# Every SQLSTATE the C code raises (errcode(ERRCODE_...)) has a row in
# doc/api.md's SQLSTATE table.  idem's own codes are read from src/idem.h;
# PostgreSQL's are asked of the server, by their PL/pgSQL condition names
# (the ERRCODE_ names, lower case, without a class prefix such as T_R_).
my $src = "$FindBin::RealBin/../../src";
my %raised;
for my $file (split /\n/, `find '$src' -name '*.c'`)
{
	$raised{$_} = 1 for slurp_file($file) =~ /errcode\(ERRCODE_(\w+)\)/g;
}
ok(scalar(keys %raised) > 20, 'the C sources raise their SQLSTATEs');

my %code;
my $header = slurp_file("$src/idem.h");
while ($header =~
	/#define\s+ERRCODE_(\w+)\s+MAKE_SQLSTATE\('(.)',\s*'(.)',\s*'(.)',\s*'(.)',\s*'(.)'\)/g)
{
	$code{$1} = "$2$3$4$5$6";
}
for my $name (sort keys %raised)
{
	next if $code{$name};
	(my $condition = lc $name) =~ s/^(t_r|e_r_i_e|e_r_e|s_r_e)_//;
	($code{$name}) = $node->safe_psql('postgres', qq{
CREATE OR REPLACE FUNCTION pg_temp.code() RETURNS text LANGUAGE plpgsql AS
\$\$ BEGIN RAISE EXCEPTION USING ERRCODE = '$condition';
EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END \$\$;
SELECT pg_temp.code();});
}
my ($codes) = $api =~ /\n## SQLSTATEs\n(.*?)\n## /s;
my %listed = map { $_ => 1 } $codes =~ /^\| `(\w{5})`/mg;
$listed{$_} = 1 for $codes =~ /^\| `\w{5}` \/ `(\w{5})`/mg;
my @unlisted = map { "$_ ($code{$_})" } grep { !$listed{ $code{$_} } } sort keys %raised;
is(join(', ', @unlisted), '', "doc/api.md's SQLSTATE table lists every SQLSTATE the code raises");

$node->stop;
done_testing();
