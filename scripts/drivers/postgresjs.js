// postgres.js: parameters are declared untyped (OID 0), JS numbers too; for
// idem_call a JS array, a boolean, and the ttl as a string (no interval
// type to send)
const postgres = require('postgres');
const SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';

(async () => {
  const sql = postgres({ prepare: process.env.VIA_BOUNCER !== '1', max: 1 });
  const call = (key, amount) =>
    sql`SELECT replayed, response::text AS response FROM idem_execute_ex(${key}, ${SQL}, ${key}, ${amount})`;
  const idemCall = (key, wait) =>
    sql`SELECT replayed, response::text AS response FROM idem_call(${key}, ${SQL}, ${[key, '25.00']},
          outbox_topic => ${'matrix'}, ttl => ${'2 days 3 hours'}, wait => ${wait})`;
  const [mode, ...keys] = process.argv.slice(2);
  for (const key of keys) {
    if (mode === 'call') {
      for (let i = 0; i < 2; i++) {
        const [r] = await idemCall(key, true);
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
    const [r] = await call(key, 25);
    console.log(`result\t${key}\t${r.replayed}\t${r.response}`);
    if (mode === 'retry') {
      try {
        await call(key, 26);
        console.log(`mismatch\t${key}\tnone`);
      } catch (e) {
        console.log(`mismatch\t${key}\t${e.code}`);
      }
    }
  }
  await sql.end();
})().catch((e) => { console.error(e); process.exit(1); });
