# DBD::Pg: placeholders are sent untyped; a Perl number as its text; for
# idem_call an array reference (an array literal), the ttl as a string (no
# interval type) and 1 or 0 bound as SQL_BOOLEAN
use strict;
use warnings;
use DBI qw(:sql_types);

my $SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
my $dbh = DBI->connect("dbi:Pg:", undef, undef,
	{ AutoCommit => 1, RaiseError => 1, PrintError => 0,
	  pg_server_prepare => ($ENV{VIA_BOUNCER} // '') eq '1' ? 0 : 1 });
my $sth = $dbh->prepare('SELECT replayed, response::text FROM idem_execute_ex(?, ?, ?, ?)');
my $idem_call = $dbh->prepare('SELECT replayed, response::text FROM idem_call(?, ?, ?, '
	. 'outbox_topic => ?, ttl => ?, wait => ?)');
sub idem_call {
	my ($key, $wait) = @_;
	$idem_call->bind_param(6, $wait, SQL_BOOLEAN);
	$idem_call->execute($key, $SQL, [$key, '25.00'], 'matrix', '2 days 3 hours', $wait);
	my @row = $idem_call->fetchrow_array;
	$idem_call->finish;
	return @row;
}
my ($mode, @keys) = @ARGV;
$| = 1;
for my $key (@keys) {
	if ($mode eq 'call') {
		for (1 .. 2) {
			my ($replayed, $response) = idem_call($key, 1);
			printf "call\t%s\t%s\t%s\n", $key, $replayed ? 'true' : 'false', $response;
		}
		next;
	}
	if ($mode eq 'busy') {
		if (eval { idem_call($key, 0); 1 }) {
			print "busy\t$key\tnone\n";
		} else {
			print "busy\t$key\t", $dbh->state, "\n";
		}
		next;
	}
	$sth->execute($key, $SQL, $key, 25.00);
	my ($replayed, $response) = $sth->fetchrow_array;
	printf "result\t%s\t%s\t%s\n", $key, $replayed ? 'true' : 'false', $response;
	next unless $mode eq 'retry';
	if (eval { $sth->execute($key, $SQL, $key, 26.00); 1 }) {
		print "mismatch\t$key\tnone\n";
	} else {
		print "mismatch\t$key\t", $dbh->state, "\n";
	}
}
$dbh->disconnect;
