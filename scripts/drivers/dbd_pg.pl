# DBD::Pg: placeholders are sent untyped; a Perl number as its text
use strict;
use warnings;
use DBI;

my $SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
my $dbh = DBI->connect("dbi:Pg:", undef, undef,
	{ AutoCommit => 1, RaiseError => 1, PrintError => 0,
	  pg_server_prepare => ($ENV{VIA_BOUNCER} // '') eq '1' ? 0 : 1 });
my $sth = $dbh->prepare('SELECT replayed, response::text FROM idem_execute_ex(?, ?, ?, ?)');
my ($mode, @keys) = @ARGV;
$| = 1;
for my $key (@keys) {
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
