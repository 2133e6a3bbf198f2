// postgres.js: parameters are declared untyped (OID 0), JS numbers too
const postgres = require('postgres');
const SQL = 'INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount';

(async () => {
  const sql = postgres({ prepare: process.env.VIA_BOUNCER !== '1', max: 1 });
  const call = (key, amount) =>
    sql`SELECT replayed, response::text AS response FROM idem_execute_ex(${key}, ${SQL}, ${key}, ${amount})`;
  const [mode, ...keys] = process.argv.slice(2);
  for (const key of keys) {
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
