
# Copyright (c) 2026, idem authors

# idem needs no shared_preload_libraries, and behaves the same with it.
# The ceilings that only an administrator sets (idem.max_ttl,
# idem.max_response_size, idem.statement_cache_memory) take effect from
# ALTER SYSTEM both ways: loaded at server start, or loaded by a backend's
# first call, when the setting was still a placeholder in the
# configuration.  A session's own SET of an idem.* parameter is refused
# either way: at SET once the library is loaded, by the call that loads it
# before.  Keys are per role and the ttl counts from commit either way.

use strict;
use warnings FATAL => 'all';

use FindBin;
use lib "$FindBin::RealBin/../perl";

use IdemTAP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

for my $preload (0, 1)
{
	my $label = $preload ? 'preloaded' : 'loaded on first call';
	my $node = idem_node($preload ? 'preload' : 'nopreload');
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idem'") if $preload;
	$node->start;
	idem_setup_db($node, 'postgres');
	$node->safe_psql('postgres', q{
CREATE ROLE alice; CREATE ROLE bob;
GRANT INSERT, SELECT ON biz TO alice, bob;
GRANT USAGE ON SEQUENCE biz_id_seq TO alice, bob;
-- ALTER SYSTEM only accepts a parameter the session knows
LOAD 'idem';
ALTER SYSTEM SET idem.max_ttl = '2d';
ALTER SYSTEM SET idem.max_response_size = '4kB';
});
	$node->reload;

	is($node->safe_psql('postgres', 'SHOW idem.max_ttl'),
		'2d', "$label: idem.max_ttl comes from ALTER SYSTEM");

	my ($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE alice;\nSET idem.ttl = '3d';\n"
		  . "SELECT idem_execute('k', 'SELECT 1 AS one');");
	like($err, qr/ERROR:  22023: idem.ttl exceeds idem.max_ttl/,
		"$label: a ttl above the administrator's ceiling is refused");
	# Before the library is loaded a role can set the placeholder, but the
	# call that loads idem fails with the SET's error (PostgreSQL itself
	# only warns and drops the value); loaded, the SET itself is refused.
	# Either way the ceiling holds.
	($ret, $out, $err) = $node->psql('postgres',
		"\\set ON_ERROR_STOP 0\n\\set VERBOSITY verbose\nSET ROLE alice;\nSET idem.max_ttl = '10d';\n"
		  . "SET idem.ttl = '3d';\nSELECT idem_execute('k', 'SELECT 1 AS one');\n"
		  . "SELECT idem_execute('k', 'SELECT 1 AS one');");
	like($err, qr/ERROR:  22023: idem.ttl exceeds idem.max_ttl/,
		"$label: a role cannot raise idem.max_ttl for itself");
	like($err,
		qr/ERROR:  42501: permission denied to set parameter "idem.max_ttl"/,
		"$label: and is told so with an error");
	# idem.ttl = 0: 22023 at SET once loaded, from the loading call before;
	# the call runs nothing
	($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET idem.ttl = 0;\n"
		  . "SELECT idem_execute('ttl0', 'SELECT 1 AS one');");
	like($err,
		qr/ERROR:  22023: 0 s is outside the valid range for parameter "idem.ttl"/,
		"$label: idem.ttl = 0 is refused with 22023");
	is($node->safe_psql('postgres', "SELECT count(*) FROM idem.keys WHERE key = 'ttl0'"),
		'0', "$label: and nothing was executed under it");
	($ret, $out, $err) = $node->psql('postgres',
		"\\set VERBOSITY verbose\nSET ROLE alice;\n"
		  . "SELECT idem_execute('big', 'SELECT repeat(''x'', 8000) AS x');");
	like($err, qr/ERROR:  54000:/,
		"$label: idem.max_response_size from ALTER SYSTEM bounds a response");

	# keys per role, and the ttl counted from commit
	my $call = "SELECT replayed FROM idem_execute_ex('pay-1', "
	  . "'INSERT INTO biz (key, client, n) VALUES (\$1, 0, 1) RETURNING key', 'pay-1');";
	is($node->safe_psql('postgres', "SET ROLE alice;\n$call"),
		'f', "$label: alice executes pay-1");
	is($node->safe_psql('postgres', "SET ROLE bob;\n$call"),
		'f', "$label: bob's pay-1 is his own key");
	is($node->safe_psql('postgres', "SET ROLE alice;\n$call"),
		't', "$label: alice replays hers");
	$node->safe_psql('postgres',
		"BEGIN;\nSET ROLE alice;\nSET LOCAL idem.ttl = 1;\n"
		  . "SELECT idem_execute('late', 'SELECT 1 AS one');\n"
		  . "SELECT pg_sleep(1.5);\nCOMMIT;");
	is( $node->safe_psql('postgres',
			"SET ROLE alice;\nSELECT replayed FROM idem_execute_ex('late', 'SELECT 1 AS one');"),
		't', "$label: a call committed after its ttl still replays");

	# outbox delivery: publish, claim, ack; a role's placeholder cannot
	# turn off the CDC messages an administrator turned on
	$node->safe_psql('postgres', q{
SELECT idem_outbox_create_topic('pay', publishers => '{alice}', consumers => '{bob}');
GRANT EXECUTE ON FUNCTION idem_outbox_claim(text, integer, interval, text, interval),
	idem_outbox_ack(uuid, uuid) TO bob;
LOAD 'idem';
ALTER SYSTEM SET idem.outbox_logical_message = on;
});
	$node->reload;
	($ret, $out, $err) = $node->psql('postgres',
		"\\set ON_ERROR_STOP 0\n\\set VERBOSITY verbose\nSET ROLE alice;\nSET idem.outbox_logical_message = off;\n"
		  . "SET idem.outbox_topic = 'pay';\nSELECT idem_execute('ev-1', 'SELECT 1 AS one') ->> 'command';\n"
		  . "SELECT idem_execute('ev-1', 'SELECT 1 AS one') ->> 'command';\n"
		  . "SHOW idem.outbox_logical_message;");
	# loaded, the SET fails and both calls run (the second replays); not
	# yet loaded, the SET's error fails the call that loads the library
	is($out, $preload ? "SELECT\nSELECT\non" : "SELECT\non",
		"$label: alice publishes; the CDC setting stays on");
	like($err,
		qr/ERROR:  42501: permission denied to set parameter "idem.outbox_logical_message"/,
		"$label: and her SET is refused with an error");
	is( $node->safe_psql('postgres',
			"SELECT owner || ' ' || state FROM idem.outbox WHERE key = 'ev-1'"),
		'alice pending', "$label: the event, produced by alice");
	is( $node->safe_psql('postgres',
			"SET ROLE bob;\nSELECT count(idem_outbox_ack(event_id, lease_token)) FROM idem_outbox_claim('pay');"),
		'1', "$label: bob claims and acknowledges the event");
	is( $node->safe_psql('postgres',
			"SELECT count(*) FROM idem.outbox WHERE key = 'ev-1'"),
		'0', "$label: delivered (the ack deleted it)");

	$node->stop;
}

done_testing();
