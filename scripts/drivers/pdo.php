<?php
// PDO (pdo_pgsql): server-side prepared statements, parameters untyped; a
// PHP float as its text
$SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
$dsn = sprintf('pgsql:host=%s;port=%s;dbname=%s', getenv('PGHOST'), getenv('PGPORT'), getenv('PGDATABASE'));
$db = new PDO($dsn, getenv('PGUSER'), null, [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
    PDO::ATTR_EMULATE_PREPARES => getenv('VIA_BOUNCER') === '1']);
$st = $db->prepare('SELECT replayed, response::text AS response FROM idem_execute_ex(?, ?, ?, ?)');
$mode = $argv[1];
foreach (array_slice($argv, 2) as $key) {
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
