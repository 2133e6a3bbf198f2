<?php
// PDO (pdo_pgsql): server-side prepared statements, parameters untyped; a
// PHP float as its text.  For idem_call: PDO binds no arrays (ARRAY[?, ?]
// in the statement) and has no interval type (the ttl is a string); wait
// is a PHP bool bound with PDO::PARAM_BOOL
$SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
$dsn = sprintf('pgsql:host=%s;port=%s;dbname=%s', getenv('PGHOST'), getenv('PGPORT'), getenv('PGDATABASE'));
$db = new PDO($dsn, getenv('PGUSER'), null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
    PDO::ATTR_EMULATE_PREPARES => getenv('VIA_BOUNCER') === '1']);
$st = $db->prepare('SELECT replayed, response::text AS response FROM idem_execute_ex(?, ?, ?, ?)');
$call = $db->prepare('SELECT replayed, response::text AS response FROM idem_call(?, ?, ARRAY[?, ?], '
    . 'outbox_topic => ?, ttl => ?, wait => ?)');
function idem_call($call, $SQL, $key, $wait) {
    foreach ([$key, $SQL, $key, '25.00', 'matrix', '2 days 3 hours'] as $i => $v)
        $call->bindValue($i + 1, $v, PDO::PARAM_STR);
    $call->bindValue(7, $wait, PDO::PARAM_BOOL);
    $call->execute();
    $r = $call->fetch(PDO::FETCH_ASSOC);
    $call->closeCursor();
    return $r;
}
$mode = $argv[1];
foreach (array_slice($argv, 2) as $key) {
    if ($mode === 'call') {
        for ($i = 0; $i < 2; $i++) {
            $r = idem_call($call, $SQL, $key, true);
            printf("call\t%s\t%s\t%s\n", $key, $r['replayed'] ? 'true' : 'false', $r['response']);
        }
        continue;
    }
    if ($mode === 'busy') {
        try {
            idem_call($call, $SQL, $key, false);
            printf("busy\t%s\tnone\n", $key);
        } catch (PDOException $e) {
            printf("busy\t%s\t%s\n", $key, $e->errorInfo[0]);
        }
        continue;
    }
    $st->execute([$key, $SQL, $key, 25.00]);
    $r = $st->fetch(PDO::FETCH_ASSOC);
    $st->closeCursor();
    printf("result\t%s\t%s\t%s\n", $key, $r['replayed'] ? 'true' : 'false', $r['response']);
    if ($mode !== 'retry') continue;
    try {
        $st->execute([$key, $SQL, $key, 26.00]);
        printf("mismatch\t%s\tnone\n", $key);
    } catch (PDOException $e) {
        printf("mismatch\t%s\t%s\n", $key, $e->errorInfo[0]);
    }
}
