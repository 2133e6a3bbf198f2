// node-postgres: every parameter is sent untyped; a JS number as its text
const { Client } = require('pg');
const SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';
const CALL = 'SELECT replayed, response::text AS response FROM idem_execute_ex($1, $2, $3, $4)';

(async () => {
  const client = new Client();
  await client.connect();
  const [mode, ...keys] = process.argv.slice(2);
  for (const key of keys) {
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
