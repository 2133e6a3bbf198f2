// node-postgres: every parameter is sent untyped; a JS number as its text,
// an array as an array literal, a boolean as "true"; no interval type to
// send, so the ttl is a string
const { Client } = require('pg');
const SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
const CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)';
const IDEM_CALL = 'SELECT replayed, response::text AS response FROM idem_call($1, $2, $3, '
  + 'outbox_topic => $4, ttl => $5, wait => $6)';

(async () => {
  const client = new Client();
  await client.connect();
  const idemCall = async (key, wait) =>
    (await client.query(IDEM_CALL, [key, SQL, [key, '25.00'], 'matrix', '2 days 3 hours', wait])).rows[0];
  const [mode, ...keys] = process.argv.slice(2);
  for (const key of keys) {
    if (mode === 'call') {
      for (let i = 0; i < 2; i++) {
        const r = await idemCall(key, true);
        console.log(`call\t${key}\t${r.replayed}\t${r.response}`);
      }
      continue;
    }
    if (mode === 'busy') {
      try {
        await idemCall(key, false);
        console.log(`busy\t${key}\tnone`);
      } catch (e) {
        console.log(`busy\t${key}\t${e.code}`);
      }
      continue;
    }
    const r = (await client.query(CALL, [key, SQL, key, 25])).rows[0];
    console.log(`result\t${key}\t${r.replayed}\t${r.response}`);
    if (mode === 'retry') {
      try {
        await client.query(CALL, [key, SQL, key, 26]);
        console.log(`mismatch\t${key}\tnone`);
      } catch (e) {
        console.log(`mismatch\t${key}\t${e.code}`);
      }
    }
  }
  await client.end();
})().catch((e) => { console.error(e); process.exit(1); });
