<?php
// PHP's pgsql extension: pg_query_params sends parameters untyped; a PHP
// float as its text
$SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
$CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)';
$c = pg_connect(sprintf('host=%s port=%s dbname=%s user=%s', getenv('PGHOST'), getenv('PGPORT'),
    getenv('PGDATABASE'), getenv('PGUSER')));
$mode = $argv[1];
foreach (array_slice($argv, 2) as $key) {
    $r = pg_fetch_assoc(pg_query_params($c, $CALL, [$key, $SQL, $key, 25.00]));
    printf("result\t%s\t%s\t%s\n", $key, $r['replayed'] === 't' ? 'true' : 'false', $r['response']);
    if ($mode !== 'retry') continue;
    // the SQLSTATE of an error comes with its result: send, then read it
    pg_send_query_params($c, $CALL, [$key, $SQL, $key, 26.00]);
    $res = pg_get_result($c);
    $state = pg_result_error_field($res, PGSQL_DIAG_SQLSTATE);
    printf("mismatch\t%s\t%s\n", $key, $state === null || $state === false ? 'none' : $state);
}
