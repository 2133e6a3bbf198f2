<?php
// PHP's pgsql extension: pg_query_params sends parameters untyped; a PHP
// float as its text.  For idem_call: no array parameters (ARRAY[$3, $4] in
// the statement), no interval type (the ttl is a string), and a PHP bool
// is sent as "1" or "", which is no boolean (22P02): wait is sent as 't'/'f'
$SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
$CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)';
$c = pg_connect(sprintf('host=%s port=%s dbname=%s user=%s', getenv('PGHOST'), getenv('PGPORT'),
    getenv('PGDATABASE'), getenv('PGUSER')));
$IDEM_CALL = 'SELECT replayed, response::text AS response FROM idem_call($1, $2, ARRAY[$3, $4], '
    . 'outbox_topic => $5, ttl => $6, wait => $7)';
// sends the call; the SQLSTATE of an error comes with its result
function idem_call($c, $IDEM_CALL, $SQL, $key, bool $wait) {
    pg_send_query_params($c, $IDEM_CALL, [$key, $SQL, $key, '25.00', 'matrix', '2 days 3 hours', $wait ? 't' : 'f']);
    return pg_get_result($c);
}
$mode = $argv[1];
foreach (array_slice($argv, 2) as $key) {
    if ($mode === 'call') {
        for ($i = 0; $i < 2; $i++) {
            $r = pg_fetch_assoc(idem_call($c, $IDEM_CALL, $SQL, $key, true));
            printf("call\t%s\t%s\t%s\n", $key, $r['replayed'] === 't' ? 'true' : 'false', $r['response']);
        }
        continue;
    }
    if ($mode === 'busy') {
        $state = pg_result_error_field(idem_call($c, $IDEM_CALL, $SQL, $key, false), PGSQL_DIAG_SQLSTATE);
        printf("busy\t%s\t%s\n", $key, $state === null || $state === false ? 'none' : $state);
        continue;
    }
    $r = pg_fetch_assoc(pg_query_params($c, $CALL, [$key, $SQL, $key, 25.00]));
    printf("result\t%s\t%s\t%s\n", $key, $r['replayed'] === 't' ? 'true' : 'false', $r['response']);
    if ($mode !== 'retry') continue;
    // the SQLSTATE of an error comes with its result: send, then read it
    pg_send_query_params($c, $CALL, [$key, $SQL, $key, 26.00]);
    $res = pg_get_result($c);
    $state = pg_result_error_field($res, PGSQL_DIAG_SQLSTATE);
    printf("mismatch\t%s\t%s\n", $key, $state === null || $state === false ? 'none' : $state);
}
