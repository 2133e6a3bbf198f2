
# Copyright (c) 2026, idem authors

# The bad-input promise checked by machine over the whole SQL interface:
# "bad input gets a clear error with a documented SQLSTATE, and changes
# nothing".  Every function, procedure and view of the extension is read
# from the catalog after CREATE EXTENSION (a new one is swept without
# editing this file), and called with values drawn, under a fixed seed,
# from pools per parameter (names the fixtures hold: a run, a queue, a
# claimed run's and event's lease tokens) and per type (NULL, empty,
# 255/256/10000-byte and control-character strings, zero, negative, huge
# and infinite intervals and timestamps, integer bounds, empty, NULL-holding,
# duplicated and two-dimensional arrays, JSON of every shape and 10,000
# levels deep, the zero uuid, dropped and nonexistent roles, business
# statements that are empty, several, utility, transaction control,
# misspelled or use $99).  Each call runs in one of several states: in
# autocommit, or in a transaction block at REPEATABLE READ or SERIALIZABLE,
# READ ONLY, after a subtransaction that failed, or caught by a PL/pgSQL
# exception block, any of them as a role with no grants or under an idem
# setting.  The first calls go through every function with each argument in
# turn the hostile one and the others good (a template per function gives
# the run, step and lease token that go together); the rest draw every
# argument at random.
#
# Per call: the server stays up; an error's SQLSTATE is in doc/api.md's
# table (read from it), or, for a business statement that fails on its own,
# one that statement raises; in a transaction block the call is rolled back
# to its savepoint and, after COMMIT, idem's tables are what they were
# (anything a failed call left in the commit-time lists would show); a call
# that failed left them unchanged in autocommit too; and the session still
# runs an idem_execute() in the transaction (when it may write) and after
# it.  A call that succeeds in a READ ONLY transaction changes nothing (idem
# writes its rows without the executor, which would refuse), and the role
# with no grants changes no row of another role.  A violation is listed
# with its call, its mode and its error.
#
# All calls go through one psql session (one backend: what a failed call
# leaves in the session's caches meets the next call).  IDEM_FUZZ_CALLS and
# IDEM_FUZZ_SEED size a longer run by hand.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# (set but empty is unset)
my $seed = length($ENV{IDEM_FUZZ_SEED} // '') ? $ENV{IDEM_FUZZ_SEED} : 1;
my $ncalls = $ENV{IDEM_FUZZ_CALLS} || 1500;
# fixtures are made again every so many calls: a drop or a completion
# drawn by the sweep would leave the rest of it nothing to reach
my $epoch_len = 150;

# the documented SQLSTATEs: the first cell of each row of doc/api.md's table
my %documented;
{
	open my $fh, '<', "$FindBin::RealBin/../../doc/api.md" or die "doc/api.md: $!";
	my $in = 0;
	while (<$fh>)
	{
		if (/^## /) { $in = /^## SQLSTATEs/; next; }
		next unless $in && /^\| ([^|]*)\|/;
		my $cell = $1;
		$documented{$_} = 1 for ($cell =~ /`([0-9A-Z]{5})`/g);
	}
	close $fh;
}
ok(scalar(keys %documented) > 30, 'SQLSTATE table of doc/api.md read ('
	  . scalar(keys %documented) . ' codes)');

my $node = idem_node('sweep');
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'idem'
idem.purge_interval = 86400
idem.audit = 'executions'
max_locks_per_transaction = 256
});
$node->start;
idem_setup_db($node, 'postgres');
my $pgmajor = $node->safe_psql('postgres', 'SHOW server_version_num') / 10000;

# fixtures; fuzz_* objects are the sweep's, run as postgres (SECURITY
# DEFINER), so a role with no grants reaches them too
$node->safe_psql(
	'postgres', q{
-- fuzz_nobody is granted nothing, ever: the sweep grants to fuzz_grantee
CREATE ROLE fuzz_nobody;
CREATE ROLE fuzz_grantee;
CREATE TYPE fuzz_comp AS (a int, b text[]);
CREATE TYPE fuzz_enum AS ENUM ('a', 'b');
CREATE DOMAIN fuzz_dom AS int CHECK (VALUE > 0);
CREATE ROLE fuzz_gone;
CREATE TABLE fuzz_gone_oid AS SELECT 'fuzz_gone'::regrole::oid AS o;
DROP ROLE fuzz_gone;
GRANT SELECT ON fuzz_gone_oid TO PUBLIC;
SELECT idem_queue_create('q1', producers => '{postgres}', workers => '{postgres}');
SELECT idem_execute('k1', 'SELECT 1');

-- every row of idem's tables, hashed; a change shows as another value.
-- With others_only, the rows fuzz_nobody may change (its own) left out.
CREATE FUNCTION fuzz_snap(others_only boolean DEFAULT false) RETURNS text
LANGUAGE sql SECURITY DEFINER AS $$
SELECT concat_ws('/',
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.keys t
	  WHERE NOT others_only OR owner <> 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.runs t
	  WHERE NOT others_only OR owner <> 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.run_attempts t
	  WHERE NOT others_only OR owner <> 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.run_signals t
	  WHERE NOT others_only OR owner <> 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.outbox t
	  WHERE NOT others_only OR owner <> 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.queues t),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.outbox_topics t),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM idem.audit t
	  WHERE NOT others_only OR owner IS DISTINCT FROM 'fuzz_nobody'::regrole),
	(SELECT count(*) || ':' || coalesce(sum(hashtext(t::text)), 0) FROM biz t))
$$;

-- the session still works: a call that writes, and what it returns
CREATE FUNCTION fuzz_probe(n int) RETURNS boolean LANGUAGE sql AS $$
SELECT idem_execute('fuzz-probe:' || n, 'SELECT $1::int AS v', n) = jsonb_build_object(
	'rows', jsonb_build_array(jsonb_build_object('v', n)), 'command', 'SELECT', 'rowcount', 1)
$$;

-- whether idem's tables are as fuzz_snap() said (b), and whether the
-- session runs a call (t, or its SQLSTATE; rolled back), as 'same|probe'
CREATE FUNCTION fuzz_check(b text, n int, probe boolean) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
	same boolean := fuzz_snap() = b;
	ok text := '-';
BEGIN
	IF probe THEN
		BEGIN
			ok := CASE WHEN fuzz_probe(n) THEN 't' ELSE 'f' END;
			RAISE EXCEPTION USING ERRCODE = 'FZ000';
		EXCEPTION
			WHEN SQLSTATE 'FZ000' THEN NULL;
			WHEN OTHERS THEN ok := SQLSTATE;
		END;
	END IF;
	RETURN CASE WHEN same THEN 't' ELSE 'f' END || '|' || ok;
END $$;

-- a call caught by an exception block: its SQLSTATE, or 00000
CREATE FUNCTION fuzz_try(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
	EXECUTE q;
	RETURN '00000';
EXCEPTION WHEN OTHERS THEN
	GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE;
	RETURN st;
END $$;

-- the run's lease token; a run released since is claimed again first
-- where a claim can be (not for fuzz_nobody, which changes no other
-- role's rows)
CREATE FUNCTION fuzz_run_token(r text) RETURNS uuid LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
	IF current_setting('role') <> 'fuzz_nobody'
	   AND current_setting('transaction_isolation') = 'read committed'
	   AND NOT current_setting('transaction_read_only')::boolean
	   AND EXISTS (SELECT FROM idem.runs WHERE run_id = r AND owner = 'postgres'::regrole
	                  AND queue_state = 'ready' AND due_at <= now()) THEN
		PERFORM idem_run_claim('q1', 1000, '1 hour');
	END IF;
	RETURN (SELECT lease_token FROM idem.runs WHERE run_id = r AND owner = 'postgres'::regrole);
END $$;
CREATE FUNCTION fuzz_event(k text) RETURNS uuid LANGUAGE sql STABLE SECURITY DEFINER AS $$
SELECT event_id FROM idem.outbox WHERE key = k $$;
CREATE FUNCTION fuzz_event_token(k text) RETURNS uuid LANGUAGE sql STABLE SECURITY DEFINER AS $$
SELECT lease_token FROM idem.outbox WHERE key = k $$;

-- what each epoch's calls reach: topics and the queue (made again if a
-- call dropped them), runs declared, undeclared, queued and claimed,
-- completed, and an event claimed
CREATE FUNCTION fuzz_refresh(e int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
	-- the last epoch's rows go, to keep fuzz_snap() quick
	DELETE FROM idem.run_signals;
	DELETE FROM idem.run_attempts;
	DELETE FROM idem.runs;
	DELETE FROM idem.outbox;
	DELETE FROM idem.keys WHERE key <> 'k1';
	DELETE FROM idem.audit;
	DELETE FROM biz;
	IF NOT EXISTS (SELECT FROM idem.outbox_topics WHERE topic = 'orders') THEN
		PERFORM idem_outbox_create_topic('orders');
	END IF;
	IF NOT EXISTS (SELECT FROM idem.outbox_topics WHERE topic = 'workflow') THEN
		PERFORM idem_outbox_create_topic('workflow');
	END IF;
	IF NOT EXISTS (SELECT FROM idem.queues WHERE queue = 'q1') THEN
		PERFORM idem_queue_create('q1', producers => '{postgres}', workers => '{postgres}');
	END IF;
	PERFORM idem_run_begin('r1_' || e, ARRAY['a', 'b', 'c'], '{"n": 1}');
	PERFORM idem_run_begin('r2_' || e);
	PERFORM idem_run_begin('rd_' || e, ARRAY['a']);
	PERFORM idem_step('rd_' || e, 'a', 'SELECT 1');
	PERFORM idem_run_begin('rq_' || e, ARRAY['a', 'b'], queue => 'q1');
	PERFORM idem_run_claim('q1', 1000, '1 hour');
	PERFORM set_config('idem.outbox_topic', 'orders', true);
	PERFORM idem_execute('ev_' || e, 'SELECT 1');
	PERFORM set_config('idem.outbox_topic', '', true);
	PERFORM idem_outbox_claim('orders', 1000, '1 hour');
	-- a dead event, for idem_outbox_requeue()
	PERFORM set_config('idem.outbox_topic', 'workflow', true);
	PERFORM idem_execute('dead_' || e, 'SELECT 1');
	PERFORM set_config('idem.outbox_topic', '', true);
	PERFORM set_config('idem.outbox_max_attempts', '1', true);
	PERFORM idem_outbox_fail(event_id, lease_token, 'dead')
	   FROM idem_outbox_claim('workflow', 1000, '1 hour') WHERE key = 'dead_' || e;
	PERFORM set_config('idem.outbox_max_attempts', '10', true);
END $$;
GRANT EXECUTE ON FUNCTION fuzz_probe(int), fuzz_try(text), fuzz_check(text, int, boolean) TO PUBLIC;
});

my $gone = $node->safe_psql('postgres', 'SELECT o FROM fuzz_gone_oid');

# the extension's functions and procedures, with their input arguments
my @procs;
for my $line (
	query_list(
		$node, 'postgres', q{
SELECT n.nspname, p.proname, p.prokind, p.proretset, p.prorettype::regtype,
       p.pronargdefaults, p.provariadic <> 0,
       (SELECT string_agg(format_type(t, NULL), ',' ORDER BY i)
          FROM unnest(p.proargtypes) WITH ORDINALITY u(t, i)),
       coalesce(array_to_string(p.proargnames, ',', ''), ''),
       coalesce(array_to_string(p.proargmodes, ',', ''), '')
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
 ORDER BY p.oid::regprocedure::text})
  )
{
	my ($nsp, $name, $kind, $retset, $rettype, $ndef, $variadic, $types, $names, $modes) =
	  split /\|/, $line, -1;
	my @types = $types eq '' ? () : split /,/, $types;
	# proargnames covers the output arguments too, proargmodes says which
	my @allnames = $names eq '' ? () : split /,/, $names, -1;
	my @modes = $modes eq '' ? () : split /,/, $modes;
	my @names = map { $allnames[$_] }
	  grep { !@modes || $modes[$_] =~ /^[ibv]$/ } 0 .. $#allnames;
	# a function taking internal cannot be called from SQL at all
	next if grep { $_ eq 'internal' } @types;
	push @procs,
	  {
		name => ($nsp eq 'idem' ? "idem.$name" : $name),
		kind => $kind,
		rows => ($retset eq 't' || $rettype eq 'record'),
		ndef => $ndef,
		variadic => ($variadic eq 't'),
		types => \@types,
		names => [ map { $names[$_] // "arg$_" } 0 .. $#types ],
	  };
}
my @views = query_list(
	$node, 'postgres', q{
SELECT c.oid::regclass FROM pg_class c
  JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid
   AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
 WHERE c.relkind = 'v' ORDER BY 1::text});
ok(@procs > 60 && @views >= 6,
	'the extension has ' . scalar(@procs) . ' functions and procedures and ' . scalar(@views) . ' views');

# --- pools: [SQL expression, SQLSTATEs a business statement may add] ---

my @sql_pool = (
	[q{'SELECT 1'}], [q{'SELECT $1'}], [q{'SELECT $1, $2'}],
	[q{'SELECT $1::int AS v'}, qw(22P02 42846 22003)],
	[q{'INSERT INTO biz (key, client, n) VALUES (''x'', 1, 1) RETURNING id'}, qw(42501)],
	[q{'UPDATE biz SET n = n WHERE false'}, qw(42501)],
	[q{'WITH d AS (DELETE FROM biz WHERE false RETURNING 1) SELECT * FROM d'}, qw(42501)],
	[q{'MERGE INTO biz b USING (SELECT 0 AS id) s ON b.id = s.id WHEN MATCHED THEN DO NOTHING'}, qw(42501)],
	[q{'SELECT * FROM biz FOR UPDATE'}, qw(42501)],
	[q{'TABLE biz'}, qw(42501)], [q{'VALUES (1)'}], [q{'SELECT 1 UNION SELECT 2'}],
	[q{''}], [q{' '}], [q{';'}], [q{'-- only a comment'}], [q{'/* unterminated'}],
	[q{'SELECT ''unterminated'}], [q{'SELEC 1'}], [q{'SELECT 1; SELECT 2'}], [q{'SELECT 1;;'}],
	[q{'VACUUM'}], [q{'ANALYZE biz'}], [q{'CREATE TABLE fuzz_t ()'}], [q{'DROP TABLE biz'}],
	[q{'BEGIN'}], [q{'COMMIT'}], [q{'ROLLBACK'}], [q{'SAVEPOINT a'}], [q{'RELEASE a'}],
	[q{'PREPARE TRANSACTION ''x'''}], [q{'SELECT $99'}], [q{'SELECT $2'}],
	[q{'SELECT $0'}], [q{'SELECT $2147483648'}], [q{'SELECT 1 INTO fuzz_t'}],
	[q{'COPY biz TO STDOUT'}], [q{'SET search_path = x'}], [q{'RESET ALL'}], [q{'DISCARD ALL'}],
	[q{'SHOW search_path'}], [q{'LOCK biz'}], [q{'LISTEN x'}], [q{'NOTIFY x'}],
	[q{'PREPARE p AS SELECT 1'}], [q{'EXECUTE p'}], [q{'EXPLAIN SELECT 1'}],
	[q{'DO $$BEGIN END$$'}], [q{'CALL idem_purge_all()'}], [q{'CHECKPOINT'}],
	[q{'SELECT set_config(''TimeZone'', ''UTC'', true)'}],
	[q{'SELECT set_config(''idem.ttl'', ''1'', true)'}],
	[q{'SELECT * FROM fuzz_nosuch'}, qw(42P01)], [q{'SELECT 1/0'}, qw(22012)],
	[q{'SELECT 1 AS a, 2 AS a'}],
	[q{'SELECT repeat(''x'', 2000000) AS big'}],
	[q{'SELECT ''$1'', $1 -- $2'}], [q{'SELECT $1 + $1'}, qw(42883 42725 22P02 22003)],
	[q{repeat('SELECT 1 UNION ALL ', 200) || 'SELECT 1'}],
	[q{'SELECT ''' || repeat('x', 100000) || ''' AS s'}],
	[q{'SELECT idem_execute(''k1'', ''SELECT 1'')'}],
	[q{'SELECT idem_execute(''fuzz-nested'', ''SELECT 2'')'}],
	[q{'SELECT idem_run_begin(''fuzz-nested'')'}],
	[q{'SELECT idem_run_claim(''q1'')'}],
	[q{'SELECT idem_outbox_claim(''orders'')'}],
	[q{'SELECT idem_queue_drop(''q1'', true)'}],
	[q{E'SELECT 1\u00e9\x01'}], [q{'SELECT ''\u0000'''}],
);

my @text_pool = (
	q{NULL::text}, q{''}, q{' '}, q{'a'}, q{repeat('x', 255)}, q{repeat('x', 256)},
	q{repeat('x', 10000)}, q{repeat('é', 127)}, q{repeat('é', 128)}, q{E'\x01\x02\t\n\r\x1f\x7f'},
	q{'\u0000'}, q{'\ud800\udc00'}, q{E'\u00e9\u2028'}, q{'a b'}, q{'%s %n'}, q{'"quoted"'},
	q{'x''); DROP TABLE biz; --'}, q{'{}'}, q{'null'}, q{'00000'}, q{'ID422'}, q{'XX000'},
	q{'4000'}, q{'400011'}, q{'id422'}, q{repeat('x', 70000)},
);
my @int_pool =
  (q{NULL::int}, 0, -1, 1, 2, 1000, 1001, 10000, 10001, 2147483647, q{(-2147483647 - 1)});
my @interval_pool = (
	q{NULL::interval}, q{'0'}, q{'-1 s'}, q{'1 microsecond'}, q{'1 ms'}, q{'-1 microsecond'},
	q{'30 s'}, q{'1 hour 1 s'}, q{'366 days'}, q{'367 days'}, q{'24855 days'}, q{'24856 days'},
	q{'1 mon'}, q{'-1 mon'}, q{'1000000 years'}, q{'178000000 years'}, q{'-178000000 years'},
	q{'2147483647 days'}, q{'-2147483648 days'}, q{'1 day -86401 s'},
	($pgmajor >= 17 ? (q{'infinity'::interval}, q{'-infinity'::interval}) : ()),
);
my @ts_pool = (
	q{NULL::timestamptz}, q{'infinity'::timestamptz}, q{'-infinity'::timestamptz}, q{now()},
	q{now() + '366 days'}, q{now() + '367 days'}, q{now() - '10 years'::interval},
	q{'4713-01-01 BC'::timestamptz}, q{'294276-12-31 23:59:59'::timestamptz}, q{'epoch'::timestamptz},
);
my @bool_pool = (q{NULL::boolean}, 'true', 'false');
my $zero_uuid = q{'00000000-0000-0000-0000-000000000000'::uuid};
my @uuid_pool = (q{NULL::uuid}, $zero_uuid, q{'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid});
my $deep_arr = q{(repeat('[', 10000) || repeat(']', 10000))::jsonb};
my $deep_obj = q{(repeat('{"a":', 10000) || '1' || repeat('}', 10000))::jsonb};
my @jsonb_pool = (
	q{NULL::jsonb}, q{'null'::jsonb}, q{'1'::jsonb}, q{'"s"'::jsonb}, q{'true'::jsonb},
	q{'[]'::jsonb}, q{'{}'::jsonb}, q{'[1, "a", null, {}]'::jsonb},
	q{'{"a": {"b": [1, {"c": null}]}, "": ""}'::jsonb}, $deep_arr, $deep_obj,
	q{jsonb_build_object('big', repeat('x', 2000000))},
	q{(SELECT jsonb_agg(i) FROM generate_series(1, 100000) i)},
	q{to_jsonb('\ud800'::text)}, q{'1e1000'::jsonb}, q{'-0'::jsonb},
);
my @text_arr_pool = (
	q{NULL::text[]}, q{'{}'::text[]}, q{'{a}'::text[]}, q{'{a,a}'::text[]}, q{'{a,NULL}'::text[]},
	q{'{NULL}'::text[]}, q{'{""}'::text[]}, q{'{{a,b},{c,d}}'::text[]}, q{'[0:1]={a,b}'::text[]},
	q{(SELECT array_agg('s' || i) FROM generate_series(1, 1001) i)},
	q{(SELECT array_agg(i::text) FROM generate_series(1, 70000) i)},
	q{ARRAY[repeat('x', 256)]},
);
my @uuid_arr_pool = (
	q{NULL::uuid[]}, q{'{}'::uuid[]}, q{'{NULL}'::uuid[]}, "ARRAY[$zero_uuid, $zero_uuid]",
	"ARRAY[[$zero_uuid], [$zero_uuid]]", "array_fill($zero_uuid, ARRAY[10001])",
	"ARRAY[$zero_uuid]",
);
my @role_pool = (
	q{NULL::regrole}, q{'postgres'::regrole}, q{'fuzz_grantee'::regrole}, q{0::oid::regrole},
	qq{$gone\::oid::regrole}, q{4294967295::oid::regrole}, q{'pg_monitor'::regrole},
);
my @role_arr_pool = (
	q{NULL::regrole[]}, q{'{}'::regrole[]}, q{'{postgres}'::regrole[]}, q{'{postgres,postgres}'::regrole[]},
	q{ARRAY[NULL::regrole]}, q{ARRAY[0::oid::regrole]}, qq{ARRAY[$gone\::oid::regrole]},
	q{ARRAY[['postgres'::regrole], ['fuzz_grantee'::regrole]]}, q{'{fuzz_grantee}'::regrole[]},
);
my @regclass_pool =
  (q{NULL::regclass}, q{'biz'::regclass}, q{0::oid::regclass}, q{'pg_class'::regclass}, q{'idem.keys'::regclass});
# arguments of "any" and anyelement
my @any_pool = (
	q{NULL::int}, q{NULL::text}, '1', q{'x'::text}, q{1.5::numeric}, q{'NaN'::float8},
	q{ARRAY[1, 2]}, q{'{{1,2},{3,4}}'::int[]}, q{'{}'::int[]}, q{ROW(1, 'a')}, q{'{"a": 1}'::jsonb},
	$deep_arr, q{repeat('x', 10000)}, q{'infinity'::timestamptz}, q{$zero_uuid},
	q{'x'::idem_untyped}, q{'\x00'::bytea}, q{'fuzz_nobody'::regrole}, q{E'\x01'::"char"},
	q{'postgres=r/postgres'::aclitem}, q{pg_sleep(0)}, q{'{[1,2)}'::int4multirange},
	q{'1 2'::int2vector}, q{'<a/>'::xml}, q{ROW(1, '{}')::fuzz_comp}, q{'b'::fuzz_enum},
	q{1::fuzz_dom}, q{'1 day'::interval},
);
my @variadic_pool = (
	q{VARIADIC NULL::text[]}, q{VARIADIC '{}'::text[]}, q{VARIADIC ARRAY[1, 2]},
	q{VARIADIC ARRAY[[1, 2], [3, 4]]}, q{VARIADIC ARRAY[NULL::int]},
	q{VARIADIC (SELECT array_agg(i) FROM generate_series(1, 70000) i)},
	q{VARIADIC '[5:6]={a,b}'::text[]},
);
my @untyped_pool = (q{'1'}, q{'abc'}, q{NULL}, q{''}, q{'{}'}, q{repeat('x', 10000)::idem_untyped});
my @untyped_variadic_pool = (
	q{VARIADIC ARRAY['1', 'x']::idem_untyped[]}, q{VARIADIC '{}'::idem_untyped[]},
	q{VARIADIC NULL::idem_untyped[]}, q{VARIADIC '{{1,2},{3,4}}'::idem_untyped[]},
	q{VARIADIC ARRAY[NULL]::idem_untyped[]},
);

my %type_pool = (
	'text' => \@text_pool,
	'integer' => \@int_pool,
	'interval' => \@interval_pool,
	'timestamp with time zone' => \@ts_pool,
	'boolean' => \@bool_pool,
	'uuid' => \@uuid_pool,
	'jsonb' => \@jsonb_pool,
	'text[]' => \@text_arr_pool,
	'uuid[]' => \@uuid_arr_pool,
	'regrole' => \@role_pool,
	'regrole[]' => \@role_arr_pool,
	'regclass' => \@regclass_pool,
	'"any"' => \@any_pool,
	'anyelement' => \@any_pool,
	'idem_untyped[]' => \@untyped_pool,
	'idem_untyped' => [ q{NULL::idem_untyped}, q{'x'::idem_untyped}, q{''::idem_untyped} ],
	'cstring' => [ q{NULL::cstring}, q{'x'::cstring}, q{''::cstring} ],
);

# a value of each type that passes, for the arguments of a systematic
# call other than its hostile one
my %benign = (
	'text' => q{'a'}, 'integer' => 1, 'interval' => q{'30 s'}, 'boolean' => 'false',
	'timestamp with time zone' => q{now()}, 'uuid' => $zero_uuid, 'jsonb' => q{'{}'::jsonb},
	'text[]' => q{'{a}'::text[]}, 'uuid[]' => "ARRAY[$zero_uuid]", 'regrole' => q{'postgres'::regrole},
	'regrole[]' => q{'{postgres}'::regrole[]}, 'regclass' => q{'biz'::regclass}, '"any"' => '1',
	'anyelement' => '1', 'cstring' => q{'x'::cstring}, 'idem_untyped' => q{'x'::idem_untyped},
);

# names the fixtures hold, per parameter name ($e: the epoch)
sub name_pool
{
	my ($param, $e) = @_;
	my %p = (
		key => [ q{'k1'}, q{'k2'}, "'ev_$e'", "'fuzz-probe:1'", q{'idem.run:r1_1'} ],
		run_id => [ "'r1_$e'", "'r2_$e'", "'rq_$e'", "'rd_$e'", q{'nosuch'} ],
		step => [ q{'a'}, q{'b'}, q{'c'}, q{'zz'} ],
		topic => [ q{'orders'}, q{'workflow'}, q{'nosuch'} ],
		queue => [ q{'q1'}, q{'nosuch'} ],
		lease_token => [ "fuzz_run_token('rq_$e')", "fuzz_event_token('ev_$e')" ],
		event_id => [ "fuzz_event('ev_$e')" ],
		event_ids => [ "ARRAY[fuzz_event('ev_$e')]", "ARRAY[fuzz_event('ev_$e'), fuzz_event('ev_$e')]" ],
		lease_tokens => [ "ARRAY[fuzz_event_token('ev_$e')]", "ARRAY[fuzz_event_token('ev_$e'), NULL]" ],
		privilege => [ map { "'$_'" } qw(publish consume produce work signal bogus) ],
		jitter => [ q{'full'}, q{'equal'}, q{'none'}, q{'bogus'} ],
		role => [ q{'postgres'::regrole}, q{'fuzz_grantee'::regrole} ],
		owner => [ q{'postgres'::regrole}, q{'fuzz_nobody'::regrole} ],
		consumer => [ q{'w1'} ],
		worker => [ q{'w1'} ],
		reason => [ q{'oops'} ],
		error => [ q{'oops'} ],
		result => [ q{'{"ok": 1}'::jsonb} ],
		complete_result => [ q{'{"ok": 1}'::jsonb} ],
		payload => [ q{'{"ok": 1}'::jsonb} ],
		input => [ q{'{"n": 1}'::jsonb} ],
		steps => [ q{'{a,b,c}'::text[]}, q{'{a,b}'::text[]} ],
		sqlstate => [ q{'40001'}, q{'ID422'}, q{'XX000'}, q{'abcde'} ],
		args => [ q{'{}'::text[]}, q{'{1}'::text[]}, q{'{1,2}'::text[]} ],
		distributed_table => [ q{'biz'::regclass} ],
		lease => [ q{'30 s'} ],
		wait => [ q{'1 ms'} ],
		timeout => [ q{'1 ms'} ],
		event => [ q{'a'}, q{'b'} ],
		complete_step => [ q{'a'} ],
		start_step => [ q{'a'}, q{'b'} ],
		outbox_topic => [ q{'orders'}, q{'nosuch'} ],
	);
	return $p{$param};
}

# arguments that make a call succeed (E: the epoch), where a name alone
# does not: the run, step and lease token a call reaches together; the
# deep paths are taken only when every other argument passes
my %template = (
	idem_step => { run_id => q{'r1_E'}, step => q{'a'}, sql => q{'SELECT 1'} },
	idem_step_complete => { run_id => q{'r1_E'}, step => q{'a'}, lease_token => 'NULL::uuid' },
	idem_step_start => { run_id => q{'rq_E'}, step => q{'a'}, lease_token => q{fuzz_run_token('rq_E')} },
	idem_step_fail => { run_id => q{'rq_E'}, step => q{'a'}, lease_token => q{fuzz_run_token('rq_E')},
		retry_after => q{'1 s'} },
	idem_run_await => { run_id => q{'rq_E'}, event => q{'b'}, lease_token => q{fuzz_run_token('rq_E')},
		timeout => q{'1 s'} },
	idem_run_signal => { run_id => q{'rq_E'}, event => q{'b'}, owner => 'NULL::regrole' },
	idem_run_sleep => { run_id => q{'rq_E'}, lease_token => q{fuzz_run_token('rq_E')},
		until => q{now() + '1 min'} },
	idem_run_extend => { run_id => q{'rq_E'}, lease_token => q{fuzz_run_token('rq_E')} },
	idem_run_release => { run_id => q{'rq_E'}, lease_token => q{fuzz_run_token('rq_E')},
		retry_after => 'NULL::interval' },
	idem_run_complete => { run_id => q{'rd_E'}, owner => 'NULL::regrole' },
	idem_run_fail => { run_id => q{'r1_E'}, owner => 'NULL::regrole' },
	idem_run_cancel => { run_id => q{'r2_E'}, owner => 'NULL::regrole' },
	idem_call => { key => q{'kc_E'}, sql => q{'SELECT $1'}, args => q{'{1}'::text[]},
		map { $_ => 'NULL' } qw(outbox_topic ttl wait run_id step lease_token complete_step
		  complete_result start_step) },
	idem_outbox_ack => { event_id => q{fuzz_event('ev_E')}, lease_token => q{fuzz_event_token('ev_E')} },
	idem_outbox_fail => { event_id => q{fuzz_event('ev_E')}, lease_token => q{fuzz_event_token('ev_E')},
		retry_after => 'NULL::interval' },
	idem_outbox_extend => { event_id => q{fuzz_event('ev_E')}, lease_token => q{fuzz_event_token('ev_E')} },
	idem_outbox_release => { event_id => q{fuzz_event('ev_E')}, lease_token => q{fuzz_event_token('ev_E')} },
	idem_outbox_requeue => { event_id => q{fuzz_event('dead_E')} },
	idem_outbox_ack_batch => { event_ids => q{ARRAY[fuzz_event('ev_E')]},
		lease_tokens => q{ARRAY[fuzz_event_token('ev_E')]} },
	idem_outbox_grant => { topic => q{'workflow'}, role => q{'fuzz_grantee'::regrole}, privilege => q{'consume'} },
	idem_outbox_revoke => { topic => q{'workflow'}, role => q{'fuzz_grantee'::regrole}, privilege => q{'consume'} },
	idem_queue_grant => { queue => q{'q1'}, role => q{'fuzz_grantee'::regrole}, privilege => q{'signal'} },
	idem_queue_revoke => { queue => q{'q1'}, role => q{'fuzz_grantee'::regrole}, privilege => q{'signal'} },
	idem_run_claim => { queue => q{'q1'}, max_runs => 1, lease => q{'30 s'}, worker => q{'w1'},
		wait => 'NULL::interval' },
	idem_run_begin => { run_id => q{'rb_E'}, queue => 'NULL', map { $_ => 'NULL' }
		  qw(max_attempts backoff_base backoff_cap jitter) },
);

sub template_value
{
	my ($p, $name, $e) = @_;
	my $v = $template{ $p->{name} } && $template{ $p->{name} }{$name};
	$v =~ s/_E'/_$e'/g if defined $v;
	return $v;
}

# a wait of up to an hour that is valid would hold the sweep for it:
# these parameters get only waits that end at once or are refused
my %bounded_wait = map { $_ => 1 } qw(wait timeout);

srand($seed);
sub pick { my ($l) = @_; return $l->[ int(rand(@$l)) ]; }

# one argument: a fixture's name half of the time when the parameter has
# one, else a value of its type
sub arg_value
{
	my ($p, $i, $e, $hostile) = @_;
	my ($type, $name) = ($p->{types}[$i], $p->{names}[$i]);
	# idem_call's wait is a boolean, the claims' an interval
	my $names = $type eq 'boolean' ? undef : name_pool($name, $e);
	$names = [ q{'SELECT 1'}, q{'SELECT $1'} ] if $name eq 'sql';
	my $good = template_value($p, $name, $e);
	if (defined $hostile)
	{
		if (!$hostile)
		{
			return [$good] if defined $good;
			return [ $names->[0] ] if $names;
			return [ $benign{$type} ] if exists $benign{$type};
		}
	}
	else
	{
		return [$good] if defined $good && rand() < 0.5;
		return pick(\@sql_pool) if $name eq 'sql';
		return [ pick($names) ] if $names && rand() < 0.5;
	}
	return pick(\@sql_pool) if $name eq 'sql';
	my $pool = $type_pool{$type} or die "no pool for type $type of $p->{name}";
	my $v = pick($pool);
	if ($bounded_wait{$name} && $type eq 'interval')
	{
		$v = pick([ q{NULL::interval}, q{'0'}, q{'-1 s'}, q{'1 ms'}, q{'1 hour 1 s'}, q{'1000000 years'},
			($pgmajor >= 17 ? (q{'infinity'::interval}, q{'-infinity'::interval}) : ()) ]);
	}
	return [$v];
}

# the call's SQL and the SQLSTATEs its business statement may add
sub render_call
{
	my ($p, $e, $hostile_arg) = @_;
	my @t = @{ $p->{types} };
	my $nfixed = $p->{variadic} ? $#t : scalar(@t);
	# trailing defaulted arguments left out now and then
	my $n = $nfixed;
	$n -= int(rand($p->{ndef} + 1))
	  if !$p->{variadic} && !defined $hostile_arg && $p->{ndef} > 0 && rand() < 0.3;
	# (idem_outbox_wait's default timeout would hold the sweep 30 s)
	$n++ while $n < $nfixed && grep { $bounded_wait{$_} } @{ $p->{names} }[ $n .. $nfixed - 1 ];
	my (@args, @extra);
	for my $i (0 .. $n - 1)
	{
		my $v = arg_value($p, $i, $e,
			defined $hostile_arg ? ($i == $hostile_arg ? 1 : 0) : undef);
		push @args, $v->[0];
		push @extra, @{$v}[ 1 .. $#$v ];
	}
	if ($p->{variadic})
	{
		my $untyped = $t[-1] eq 'idem_untyped[]';
		if (rand() < 0.3)
		{
			push @args, pick($untyped ? \@untyped_variadic_pool : \@variadic_pool);
		}
		else
		{
			# the untyped overloads are reached by unknown literals only
			# (idem_key has no overload without arguments)
			my $k = $untyped || $nfixed == 0 ? 1 + int(rand(3)) : int(rand(4));
			push @args, pick($untyped ? \@untyped_pool : \@any_pool) for 1 .. $k;
		}
	}
	my $call = "$p->{name}(" . join(', ', @args) . ')';
	# now and then twice in one statement (the second call sees the
	# first's effects under the same snapshot)
	my $sql =
		$p->{kind} eq 'p' ? "CALL $call"
	  : rand() < 0.1 ? "SELECT $call IS NULL FROM generate_series(1, 2)"
	  : $p->{rows} ? "SELECT count(*) FROM $call AS x"
	  : "SELECT $call IS NULL";
	return ($sql, \@extra);
}

# --- the script ---

my @modes = qw(auto auto auto rr ser ro subabort plpgsql);
# settings that change what a call does, some of them refused
my @settings = (
	[qw(idem.key_owner fuzz_nobody)], [qw(idem.key_owner pg_monitor)], [qw(idem.key_owner fuzz_nosuch)],
	[qw(idem.outbox_topic orders)], [qw(idem.outbox_topic nosuch)],
	[ 'idem.cache_errors', '22, 42, 23, P0001' ], [qw(idem.cache_errors XX)],
	[qw(idem.lease_token 00000000-0000-0000-0000-000000000000)], [qw(idem.lease_token garbage)],
	[qw(idem.ttl 1)], [qw(idem.ttl 2147483647)], [qw(idem.wait off)], [qw(idem.durable_replay on)],
	[qw(idem.statement_cache_size 1)], [qw(idem.outbox_notify on)],
);
my @calls;
my @systematic =
  map { my $p = $_; map { ([ $p, $_ ]) x ($_ < 0 ? 1 : 2) } -1 .. $#{ $p->{types} } } @procs;
# Statements are joined (\;) where a call's outcome allows it: round trips
# are most of the sweep's time.  Each call's last statement also takes the
# snapshot of idem's tables the next call starts from (b, and bo without
# fuzz_nobody's own rows).
my $script = q{
\set QUIET on
SET statement_timeout = '20s';
SET client_min_messages = warning;
};
my $epoch = 0;
for my $i (0 .. $ncalls - 1)
{
	if ($i % $epoch_len == 0)
	{
		$epoch++;
		$script .= "SELECT fuzz_refresh($epoch) \\; SELECT fuzz_snap() AS b, fuzz_snap(true) AS bo \\gset\n";
	}
	my ($sql, $extra);
	# views are swept too, in every mode
	if (rand() < 0.03)
	{
		($sql, $extra) = ("SELECT count(*) FROM " . pick(\@views), []);
	}
	else
	{
		# first every function with each argument in turn the hostile one
		# (the others a fixture's name where the parameter has one), then
		# every argument drawn at random
		if (@systematic)
		{
			my ($p, $k) = @{ shift @systematic };
			($sql, $extra) = render_call($p, $epoch, $k);
		}
		else
		{
			($sql, $extra) = render_call(pick(\@procs), $epoch);
		}
	}
	my $mode = pick(\@modes);
	my $nobody = rand() < 0.2;
	my $set = rand() < 0.15 ? pick(\@settings) : undef;
	push @calls, { sql => $sql, extra => $extra, mode => $mode, nobody => $nobody, set => $set,
		fn => ($sql =~ /(idem[\w.]*)\(/ ? $1 : undef) };
	$script .= "\\warn \@\@$i\n\\unset st\n\\unset c1\n\\unset c2\n\\unset ro\n\\unset others\n";
	# a refused value must not abort the transaction before the call
	my $setting = $set ? "SELECT fuzz_try(\$fz\$SET LOCAL $set->[0] = '$set->[1]'\$fz\$)" : undef;
	my $others = "fuzz_snap(true) = :'bo' AS others";
	# (a probe in the transaction would still run under the setting)
	my $probe = $mode eq 'ro' || $set ? 'false' : 'true';
	my $last = "SELECT fuzz_check(:'b', $i, true) AS c2, fuzz_snap() AS b, fuzz_snap(true) AS bo \\gset\n";
	my $last_others = "SELECT $others, " . substr($last, length('SELECT '));
	if ($mode eq 'auto')
	{
		# the call alone: a procedure refused in a transaction block would
		# be refused in a string of several statements too
		$script .= "SET ROLE fuzz_nobody;\n" if $nobody;
		$script .= "SET $set->[0] = '$set->[1]';\n" if $set;
		$script .= "$sql \\g /dev/null\n\\set st :SQLSTATE\n";
		$script .= "RESET $set->[0] \\; " if $set;
		$script .= $nobody ? "RESET ROLE \\; $last_others" : $last;
		$script .= "\\set c1 -|-\n";
	}
	else
	{
		my $begin = {
			rr => 'BEGIN ISOLATION LEVEL REPEATABLE READ',
			ser => 'BEGIN ISOLATION LEVEL SERIALIZABLE',
			ro => 'BEGIN READ ONLY',
			subabort => 'BEGIN',
			plpgsql => 'BEGIN',
		}->{$mode};
		$script .= $begin;
		$script .= " \\; SET LOCAL ROLE fuzz_nobody" if $nobody;
		$script .= " \\; $setting" if $set;
		# a subtransaction that failed before the call
		$script .= " \\; SELECT fuzz_try('SELECT 1/0')" if $mode eq 'subabort';
		if ($mode eq 'plpgsql')
		{
			$script .= " \\g /dev/null\n";
			$script .= "SELECT fuzz_try(\$fz\$$sql\$fz\$) AS st"
			  . ($nobody ? ", $others" : '') . ", fuzz_check(:'b', $i, $probe) AS c1 \\gset\n";
		}
		else
		{
			$script .= " \\; SAVEPOINT s \\g /dev/null\n$sql \\g /dev/null\n\\set st :SQLSTATE\n";
			# what a call that succeeded changed: nothing in a read-only
			# transaction (idem writes its rows without the executor, which
			# would refuse), nothing but its own rows as fuzz_nobody
			if ($mode eq 'ro' || $nobody)
			{
				$script .= "\\if :ERROR\n\\else\nSELECT ";
				$script .= join(', ', ($mode eq 'ro' ? "fuzz_snap() = :'b' AS ro" : ()), ($nobody ? $others : ()));
				$script .= " \\gset\n\\endif\n";
			}
			$script .= "ROLLBACK TO SAVEPOINT s \\; SELECT fuzz_check(:'b', $i, $probe) AS c1 \\gset\n";
		}
		# COMMIT runs what the call left in the commit-time lists
		$script .= "COMMIT \\; $last";
	}
	$script .= "\\set cst :SQLSTATE\n";
	$script .= "\\echo \@\@|$i|:st|:c1|:cst|:c2|:ro|:others\n";
}

my $t0 = time;
my ($stdout, $stderr) = ('', '');
$node->psql('postgres', $script, stdout => \$stdout, stderr => \$stderr,
	on_error_stop => 0, timeout => $PostgreSQL::Test::Utils::timeout_default);
my $elapsed = time - $t0;

# each call's errors and warnings, from the \warn markers
my %err;
my $cur;
for (split /\n/, $stderr)
{
	if (/^\@\@(\d+)$/) { $cur = $1; next; }
	$err{ $cur // 'setup' } .= "$_\n";
}

my (@violations, %codes, $ok_calls, $err_calls, %succeeded);
my %seen;
for (split /\n/, $stdout)
{
	next unless /^\@\@\|/;
	my (undef, $i, $st, $same1, $probe1, $cst, $same2, $probe2, $ro, $others) = split /\|/, $_, -1;
	# (a variable no query set is echoed as its name)
	$_ = '?' for grep { !defined || /^:/ } ($same1, $probe1, $cst, $same2, $probe2, $ro, $others);
	$seen{$i} = 1;
	my $c = $calls[$i];
	my @why;
	my $failed = $st ne '00000';
	$failed ? $err_calls++ : $ok_calls++;
	$succeeded{ $c->{fn} } += !$failed if $c->{fn};
	$codes{$st}++;
	if ($failed)
	{
		my %allowed = (%documented, map { $_ => 1 } @{ $c->{extra} });
		push @why, "SQLSTATE $st not documented" unless $allowed{$st};
		push @why, "internal or system error $st" if $st =~ /^(XX|58)/;
	}
	if ($c->{mode} ne 'auto')
	{
		push @why, "tables changed in the transaction after the rollback to the savepoint"
		  if $same1 ne 't' && !($c->{mode} eq 'plpgsql' && !$failed);
		push @why, "the session could not run a call in the transaction ($probe1)"
		  if $c->{mode} ne 'ro' && !$c->{set} && $probe1 ne 't';
		push @why, "tables changed after COMMIT"
		  if $same2 ne 't' && !($c->{mode} eq 'plpgsql' && !$failed);
	}
	elsif ($failed)
	{
		push @why, "tables changed" if $same2 ne 't';
	}
	push @why, ($c->{mode} eq 'auto' ? 'the check after the call' : 'COMMIT or the check after it')
	  . " failed ($cst)" if $cst ne '00000';
	push @why, "the session could not run a call after it ($probe2)" if $probe2 ne 't';
	push @why, "a call in a read-only transaction changed idem's tables"
	  if $c->{mode} eq 'ro' && !$failed && $ro ne 't';
	push @why, "fuzz_nobody changed rows that are not its own"
	  if $c->{nobody} && $others ne 't' && !($failed && $others eq '?');
	my $e = $err{$i} // '';
	push @why, 'a leak warning' if $e =~ /WARNING:.*(leak|not closed|still referenced)/;
	push @violations, "call $i [$c->{mode}" . ($c->{nobody} ? ', as fuzz_nobody' : '')
	  . ($c->{set} ? ", $c->{set}[0] = '$c->{set}[1]'" : '') . "]: "
	  . join('; ', @why) . "\n  $c->{sql}\n  " . join("\n  ", split /\n/, $e)
	  if @why;
}
my @unseen = grep { !$seen{$_} } 0 .. $#calls;
push @violations, "calls without a result (the session ended?): " . scalar(@unseen) . " from call $unseen[0]\n  "
  . ($err{ $unseen[0] } // '') if @unseen;
push @violations, "the connection was lost:\n" . join("\n", grep { /server closed|connection to server|not connected/ } split /\n/, $stderr)
  if $stderr =~ /server closed the connection|connection to server was lost|not connected/;

note sprintf('%d calls (seed %d) in %d s: %d succeeded, %d failed; SQLSTATEs: %s',
	scalar(@calls), $seed, $elapsed, $ok_calls // 0, $err_calls // 0,
	join(' ', map { "$_:$codes{$_}" } sort keys %codes));
note 'never succeeded: '
  . join(' ', sort grep { !$succeeded{$_} } keys %succeeded);
is(scalar(@violations), 0, 'every call kept the promise')
  or diag(join("\n", @violations[ 0 .. ($#violations > 40 ? 40 : $#violations) ]));

is($node->safe_psql('postgres', 'SELECT 1'), '1', 'the server is up');
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* was terminated/, 'no backend crashed');

$node->stop;
done_testing();
