'use strict';
// The drivers table's postgres.js row (npm `postgres`, a devDependency):
// the plain driver call without casts, directly (named prepared
// statements, its default) and through PgBouncer (prepare: false), and the
// parameter types it declares in its Parse messages, read off the wire by
// a loopback proxy.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const postgres = require('postgres');
const pg = require('pg');
const idem = require('../idem.js');
const { start } = require('./cluster.js');

let env;
before(async () => { env = await start(); });
after(async () => { await env.stop(); });

// Forwards to the server's TCP port and records each Parse message the
// client sends: { name, query, types } (types: the declared OIDs, 0 = untyped).
function parseSniffer(port) {
  const parses = [];
  const server = net.createServer((client) => {
    const upstream = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let started = false;
    client.on('data', (d) => {
      upstream.write(d);
      buf = Buffer.concat([buf, d]);
      for (;;) {
        if (!started) { // the startup packet has no type byte
          if (buf.length < 4 || buf.length < buf.readInt32BE(0)) break;
          buf = buf.subarray(buf.readInt32BE(0));
          started = true;
          continue;
        }
        if (buf.length < 5 || buf.length < 1 + buf.readInt32BE(1)) break;
        const len = buf.readInt32BE(1);
        if (buf[0] === 0x50) { // 'P'
          const body = buf.subarray(5, 1 + len);
          const nameEnd = body.indexOf(0);
          const queryEnd = body.indexOf(0, nameEnd + 1);
          const n = body.readInt16BE(queryEnd + 1);
          const types = [];
          for (let i = 0; i < n; i++) types.push(body.readInt32BE(queryEnd + 3 + 4 * i));
          parses.push({ name: body.toString('utf8', 0, nameEnd),
            query: body.toString('utf8', nameEnd + 1, queryEnd), types });
        }
        buf = buf.subarray(1 + len);
      }
    });
    upstream.on('data', (d) => client.write(d));
    const end = () => { client.destroy(); upstream.destroy(); };
    client.on('close', end); upstream.on('close', end);
    client.on('error', end); upstream.on('error', end);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () =>
    resolve({ port: server.address().port, parses, close: () => server.close() })));
}

// the tagged template, as applications write it; it sends CALL
const call = (sql, key, stmt, a, b) => sql`SELECT idem_execute(${key}, ${stmt}, ${a}, ${b})::text AS r`;
const CALL = 'SELECT idem_execute($1, $2, $3, $4)::text AS r';
let tableNo = 0;
async function freshTable() {
  const t = `pgjs_refunds_${++tableNo}`;
  await env.admin.query(`CREATE TABLE ${t} (id serial PRIMARY KEY, return_id text, amount numeric)`);
  return t;
}
const ins = (t) => `INSERT INTO ${t} (return_id, amount) VALUES ($1, $2) RETURNING id, amount`;
const count = async (t) => Number((await env.admin.query(`SELECT count(*) AS n FROM ${t}`)).rows[0].n);

describe('postgres.js', () => {
  it('calls idem_execute($1, $2, $3, $4) without casts, declaring every parameter untyped', async () => {
    const t = await freshTable();
    const sniff = await parseSniffer(env.targets.direct.port);
    const sql = postgres({ host: '127.0.0.1', port: sniff.port, user: 'postgres',
      database: env.targets.direct.database, max: 1, onnotice: () => {} });
    try {
      const [first] = await call(sql, `${t}:1`, ins(t), 'inv-1', '25.00');
      assert.match(first.r, /"amount": 25\.00/);
      // a JS number is untyped too: sent as the text '25.5'
      await call(sql, `${t}:2`, ins(t), 'inv-2', 25.5);
      const calls = sniff.parses.filter((p) => p.query === CALL);
      assert.ok(calls.length >= 1);
      for (const p of calls) assert.deepEqual(p.types, [0, 0, 0, 0]);
      assert.notEqual(calls[0].name, ''); // its default: a named prepared statement
    } finally {
      await sql.end();
      sniff.close();
    }
    // the same requests as the node-postgres helper's: replays
    const c = new pg.Client(env.targets.direct);
    await c.connect();
    const r1 = await idem.execute(c, `${t}:1`, ins(t), ['inv-1', '25.00']);
    const r2 = await idem.execute(c, `${t}:2`, ins(t), ['inv-2', '25.5']);
    await c.end();
    assert.equal(r1.replayed, true);
    assert.equal(r2.replayed, true);
    assert.equal(await count(t), 2);
  });

  it('works through PgBouncer in transaction mode with prepare: false', async () => {
    const t = await freshTable();
    const sql = postgres({ ...env.targets.pgbouncer, username: 'postgres', prepare: false, max: 2,
      onnotice: () => {} });
    try {
      for (let i = 0; i < 3; i++) { // more than once: a named statement would fail on another server session
        const [row] = await call(sql, `${t}:1`, ins(t), 'inv-1', '25.00');
        assert.match(row.r, /"amount": 25\.00/);
      }
    } finally {
      await sql.end();
    }
    assert.equal(await count(t), 1);
  });
});
