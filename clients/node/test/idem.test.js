'use strict';
// The node helper against a real server, directly and through PgBouncer in
// transaction mode (every test runs against both targets).
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const pg = require('pg');
const idem = require('../idem.js');
const { start } = require('./cluster.js');

let env;
before(async () => { env = await start(); });
after(async () => { await env.stop(); });

let tableNo = 0;
async function freshTable() {
  const t = `node_refunds_${++tableNo}`;
  await env.admin.query(`CREATE TABLE ${t} (id serial PRIMARY KEY, return_id text UNIQUE, amount numeric NOT NULL)`);
  return t;
}
const ins = (t) => `INSERT INTO ${t} (return_id, amount) VALUES ($1, $2) RETURNING id, return_id, amount`;
const count = async (t) => Number((await env.admin.query(`SELECT count(*) AS n FROM ${t}`)).rows[0].n);

async function tx(client, fn) {
  await client.query('BEGIN');
  try {
    const r = await fn();
    await client.query('COMMIT');
    return r;
  } catch (e) {
    await client.query('ROLLBACK');
    throw e;
  }
}

for (const target of ['direct', 'pgbouncer']) {
  describe(target, () => {
    const clients = [];
    const connect = async () => {
      const c = new pg.Client(env.targets[target]);
      await c.connect();
      clients.push(c);
      return c;
    };
    after(async () => { for (const c of clients) await c.end().catch(() => {}); });

    it('calls idem_execute($1, $2, $3, $4) without casts', async () => {
      const t = await freshTable();
      const c = await connect();
      const r = await c.query('SELECT idem_execute($1, $2, $3, $4)::text AS r', [`${t}:raw`, ins(t), 'inv-1', '25.00']);
      assert.match(r.rows[0].r, /"amount": 25\.00/);
      assert.equal(await count(t), 1);
    });

    it('executes, then replays, with numerics exact', async () => {
      const t = await freshTable();
      const c = await connect();
      const first = await tx(c, () => idem.execute(c, `${t}:1`, ins(t), ['inv-1', '25.00']));
      assert.equal(first.replayed, false);
      assert.equal(first.rowcount, 1);
      assert.equal(first.rows[0].amount, '25.00');
      assert.equal(typeof first.rows[0].id, 'number');
      const again = await tx(c, () => idem.execute(c, `${t}:1`, ins(t), ['inv-1', '25.00']));
      assert.equal(again.replayed, true);
      assert.deepEqual(again.rows, first.rows);
      assert.equal(again.firstExecutedAt.getTime(), first.firstExecutedAt.getTime());
      assert.equal(await count(t), 1);
    });

    it('returns numerics of any length exact', async () => {
      // a number was read from its first 400 characters only: the rest was
      // taken for more values (an array's) or failed the parse
      const c = await connect();
      const big = `1${'0'.repeat(5000)}`;
      const frac = `0.${'3'.repeat(600)}`;
      const r = await tx(c, () => idem.execute(c, `long:${target}`, 'SELECT $1::numeric AS n, v FROM (VALUES ($2::numeric)) AS t (v)', [big, frac]));
      assert.deepEqual(r.rows, [{ n: big, v: frac }]);
      assert.deepEqual(idem.parseExact(`[${big}.5, 1]`), [`${big}.5`, 1]);
    });

    it('raises KeyReused for another request under the key', async () => {
      const t = await freshTable();
      const c = await connect();
      await tx(c, () => idem.execute(c, `${t}:1`, ins(t), ['inv-1', '25.00']));
      await assert.rejects(tx(c, () => idem.execute(c, `${t}:1`, ins(t), ['inv-1', '26.00'])),
        (e) => e instanceof idem.KeyReused && e.sqlstate === 'ID422' && /Retry advice: never/.test(e.hint) &&
          // node-postgres' conventions: .code is the SQLSTATE, the server's fields are kept
          e.code === 'ID422' && e.severity === 'ERROR' && e.cause.code === 'ID422' &&
          typeof e.routine === 'string' && e.routine === e.cause.routine && e.message === e.cause.message);
      assert.equal(await count(t), 1);
    });

    it('raises EventNotFound (IDE04) for a missing outbox event, RunNotFound (ID404) for a missing run', async () => {
      const t = await freshTable();
      const c = await connect();
      await assert.rejects(tx(c, () => idem.execute(c, `${t}:ack`,
        "SELECT idem_outbox_ack('00000000-0000-4000-8000-000000000000', '00000000-0000-4000-8000-000000000001') AS acked")),
      (e) => e instanceof idem.EventNotFound && !(e instanceof idem.RunNotFound) && e.sqlstate === 'IDE04');
      await assert.rejects(tx(c, () => idem.step(c, `${t}:no-run`, 'a', 'SELECT 1')),
        (e) => e instanceof idem.RunNotFound && !(e instanceof idem.EventNotFound) && e.sqlstate === 'ID404');
    });

    it('raises InProgress with wait off, and sequencing errors for steps', async () => {
      const t = await freshTable();
      const holder = await connect();
      const other = await connect();
      await holder.query('BEGIN');
      await idem.execute(holder, `${t}:busy`, ins(t), ['inv-1', '1.00']);
      await assert.rejects(tx(other, () => idem.execute(other, `${t}:busy`, ins(t), ['inv-1', '1.00'], { wait: false })),
        idem.InProgress);
      await holder.query('COMMIT');

      const run = `${t}:run`;
      await other.query("SELECT idem_run_begin($1, ARRAY['refund', 'notify'])", [run]);
      await assert.rejects(tx(other, () => idem.step(other, run, 'notify', 'SELECT 1 AS sent')), idem.OutOfSequence);
      await assert.rejects(tx(other, () => idem.step(other, run, 'label', 'SELECT 1')), idem.StepUndeclared);
      await assert.rejects(tx(other, () => idem.step(other, `${run}-nope`, 'refund', 'SELECT 1')), idem.RunNotFound);
      const r = await tx(other, () => idem.step(other, run, 'refund', ins(t), ['ret-1', '9.90']));
      assert.equal(r.replayed, false);
      assert.equal(r.rows[0].amount, '9.90');
      assert.equal((await tx(other, () => idem.step(other, run, 'refund', ins(t), ['ret-1', '9.90']))).replayed, true);
      await other.query("SELECT idem_run_fail($1, 'carrier down')", [run]);
      await assert.rejects(tx(other, () => idem.step(other, run, 'notify', 'SELECT 1 AS sent')), idem.RunNotRunning);
    });

    it('applies options to the call only', async () => {
      const t = await freshTable();
      const c = await connect();
      await tx(c, async () => {
        await idem.execute(c, `${t}:o1`, ins(t), ['inv-1', '1.00'], { outboxTopic: 'refunds', ttl: 7200 });
        const s = await c.query("SELECT current_setting('idem.outbox_topic') AS s");
        assert.equal(s.rows[0].s, '');
        await idem.execute(c, `${t}:o2`, ins(t), ['inv-2', '2.00']);
      });
      const ob = await env.admin.query('SELECT key, topic FROM idem.outbox WHERE key LIKE $1', [`${t}:%`]);
      assert.deepEqual(ob.rows, [{ key: `${t}:o1`, topic: 'refunds' }]);
      const ttl = await env.admin.query('SELECT extract(epoch FROM expires_at - created_at)::int AS s FROM idem.keys WHERE key = $1', [`${t}:o1`]);
      assert.ok(ttl.rows[0].s > 7100 && ttl.rows[0].s < 7300);
    });

    it('throws CachedError on execution and replay', async () => {
      const t = await freshTable();
      const c = await connect();
      await env.admin.query(`INSERT INTO ${t} (return_id, amount) VALUES ('taken', 1)`);
      for (const replay of [false, true]) {
        await tx(c, async () => {
          await c.query("SELECT set_config('idem.cache_errors', '23', true)");
          await assert.rejects(idem.execute(c, `${t}:dup`, ins(t), ['taken', '5.00']),
            (e) => e instanceof idem.CachedError && e.sqlstate === '23505' && e.replayed === replay);
        });
      }
    });

    it('retries a transaction whose connection was killed, executing once', async () => {
      const t = await freshTable();
      const seen = [];
      let retries = 0;
      const { result, client } = await idem.retry(connect, async (c) => {
        const r = await idem.execute(c, `${t}:crash`, ins(t), ['inv-1', '3.00']);
        seen.push(r.replayed);
        if (seen.length === 1) {
          const pid = (await c.query('SELECT pg_backend_pid() AS p')).rows[0].p;
          await env.admin.query('SELECT pg_terminate_backend($1, 10000)', [pid]); // waits until it is gone
          await c.query('SELECT 1');
        }
        return r;
      }, { base: 0.01, onRetry: () => retries++ });
      assert.deepEqual(seen, [false, false]);
      assert.equal(retries, 1);
      assert.equal(result.replayed, false);
      assert.ok(clients.includes(client));
      assert.equal(await count(t), 1);
    });

    it('retries a serialization failure and replays', async () => {
      const t = await freshTable();
      const run = `${t}:rr`;
      await env.admin.query("SELECT idem_run_begin($1, ARRAY['refund'])", [run]);
      const other = await connect();
      let n = 0;
      const { result } = await idem.retry(connect, async (c) => {
        await c.query('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ');
        await c.query('SELECT 1');
        if (n++ === 0) await tx(other, () => idem.step(other, run, 'refund', ins(t), ['ret-1', '4.00']));
        return idem.step(c, run, 'refund', ins(t), ['ret-1', '4.00']);
      }, { base: 0.01 });
      assert.equal(n, 2);
      assert.equal(result.replayed, true);
      assert.equal(await count(t), 1);
    });

    it('does not retry what the advice says never to retry', async () => {
      const t = await freshTable();
      let n = 0;
      await assert.rejects(idem.retry(connect, async (c) => {
        n++;
        return idem.execute(c, `${t}:bad`, 'SELECT $1::int AS v', ['x']);
      }, { base: 0.01 }), (e) => e.code === '22P02');
      assert.equal(n, 1);
    });
  });
}

describe('pgbouncer session', () => {
  it('keeps per-call options out of the shared server session', async () => {
    const t = await freshTable();
    const a = new pg.Client(env.pooledOne);
    const b = new pg.Client(env.pooledOne);
    await a.connect();
    await b.connect();
    try {
      const pid = (await a.query('SELECT pg_backend_pid() AS p')).rows[0].p;
      await tx(a, () => idem.execute(a, `${t}:leak`, ins(t), ['inv-1', '1.00'],
        { outboxTopic: 'refunds', wait: false, ttl: 3600 }));
      assert.equal((await b.query('SELECT pg_backend_pid() AS p')).rows[0].p, pid);
      const s = await b.query("SELECT current_setting('idem.outbox_topic') AS t, current_setting('idem.wait') AS w, current_setting('idem.ttl') AS l");
      assert.deepEqual(s.rows[0], { t: '', w: 'on', l: '1d' });
      // a session SET does leak: the check can see one
      await a.query("SET idem.outbox_topic = 'leaked'");
      assert.equal((await b.query("SELECT current_setting('idem.outbox_topic') AS t")).rows[0].t, 'leaked');
      await b.query('RESET idem.outbox_topic');
    } finally {
      await a.end();
      await b.end();
    }
  });
});

describe('toJson', () => {
  it('refuses NaN and the infinities, which JSON.stringify wrote as null', () => {
    // a step's result or a jsonb argument changed silently
    for (const bad of [NaN, Infinity, -Infinity]) {
      assert.throws(() => idem.toJson({ rate: bad }), RangeError);
      assert.throws(() => idem.toJson([1, bad]), RangeError);
      assert.throws(() => idem.toJson({ big: 1n, rate: bad }), RangeError);
      assert.throws(() => idem.toArg({ rate: bad }), RangeError);
    }
    assert.equal(idem.toJson({ a: 1.5, b: [2n, null], d: new Date(0) }),
      '{"a":1.5,"b":[2,null],"d":"1970-01-01T00:00:00.000Z"}');
    assert.equal(idem.toArg(NaN), 'NaN'); // a numeric NaN, as it was
  });
  it('refuses a Map or a Set, which JSON.stringify wrote as {}', () => {
    for (const bad of [new Map([['a', 1]]), new Set([1])]) {
      assert.throws(() => idem.toJson({ got: bad }), TypeError);
      assert.throws(() => idem.toJson([bad]), TypeError);
      assert.throws(() => idem.toJson({ big: 1n, got: bad }), TypeError);
      assert.throws(() => idem.toArg(bad), TypeError);
    }
  });
});

describe('RetryAfter', () => {
  it('reads a number, a delay in seconds or an HTTP date, as the Python helper does', () => {
    assert.equal(new idem.RetryAfter(20).seconds, 20);
    assert.equal(new idem.RetryAfter(' 1.5 ').seconds, 1.5);
    assert.equal(new idem.RetryAfter('1e2').seconds, 100);
    assert.equal(new idem.RetryAfter(NaN).seconds, 0);   // Python: now, not an error
    assert.equal(new idem.RetryAfter('nan').seconds, 0);
    assert.equal(new idem.RetryAfter(-5).seconds, 0);
    assert.equal(new idem.RetryAfter('inf').seconds, 1e9);
    const later = new idem.RetryAfter(new Date(Date.now() + 60000).toUTCString()).seconds;
    assert.ok(later > 55 && later <= 60, String(later));
    for (const bad of ['0x10', '0b11', '1_000x', 'soon']) {
      assert.throws(() => new idem.RetryAfter(bad), TypeError, bad); // Number('0x10') was 16
    }
  });
});

describe('failureText', () => {
  it('cuts a long text between characters, never inside a surrogate pair', () => {
    // 'Error: ' and 1990 letters are 1997 units; the second emoji spans 1999-2000
    const text = idem.failureText(new Error('x'.repeat(1990) + '\u{1F600}'.repeat(20)), undefined, 2000);
    assert.equal(text.length, 1999);
    assert.ok(text.endsWith('x\u{1F600}'), JSON.stringify(text.slice(-4)));
    assert.equal(idem.failureText(new Error('short'), undefined, 2000), 'Error: short');
  });
});

describe('sqlstate of an error', () => {
  it('reads a server error, and treats a socket error as a lost connection', async () => {
    // EPIPE looks like a SQLSTATE (five capitals) but is not one
    const epipe = Object.assign(new Error('write EPIPE'), { code: 'EPIPE', errno: -32, syscall: 'write' });
    assert.equal(idem.sqlstateOf(epipe), '08006');
    assert.equal(idem.sqlstateOf(Object.assign(new Error('x'), { code: '40001', severity: 'ERROR' })), '40001');
    assert.equal(idem.sqlstateOf(new Error('Connection terminated unexpectedly')), '08006');
    assert.equal(idem.sqlstateOf(new TypeError('a bug')), null);
  });
});
