'use strict';
// The outbox consumer loop, idem.consume(), against a real server.  With
// wakeup 'notify' the consumer connects directly: LISTEN needs a session of
// its own, which PgBouncer in transaction mode does not give; with wakeup
// 'wait' (claims that wait, the cluster preloads idem) it also runs
// through PgBouncer.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const pg = require('pg');
const idem = require('../idem.js');
const { start } = require('./cluster.js');
const { claimFaults, OPTIONS } = require('./claim-fault.js');

let env;
const running = []; // every loop's AbortController: a failed test's loop is stopped at the end
before(async () => { env = await start(); });
after(async () => { for (const ac of running) ac.abort(); await env.stop(); });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(pred, what, timeout = 10000) {
  const deadline = Date.now() + timeout;
  while (!(await pred())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}
// consume()'s log: the tests look for its warnings
let warnings = [];
const quiet = { warn: (m) => warnings.push(m), error: (m) => warnings.push(m) };

let topicNo = 0;
async function freshTopic() {
  const t = `node_t_${++topicNo}`;
  await env.admin.query('SELECT idem_outbox_create_topic($1)', [t]);
  return t;
}
async function publish(topic, ...keys) {
  return publishWith(env.targets.direct, topic, ...keys);
}
// publish() with the producer's NOTIFY off (idem.outbox_notify)
async function publishQuiet(topic, ...keys) {
  return publishWith({ ...env.targets.direct, options: '-c idem.outbox_notify=off' }, topic, ...keys);
}
async function publishWith(config, topic, ...keys) {
  const c = new pg.Client(config);
  await c.connect();
  for (const k of keys) {
    await c.query('BEGIN');
    await idem.execute(c, `${topic}:${k}`, 'SELECT $1::text AS who, $2::numeric AS amount',
      [k, '25.00'], { outboxTopic: topic });
    await c.query('COMMIT');
  }
  await c.end();
}
async function events(topic) {
  const r = await env.admin.query('SELECT * FROM idem_outbox_events WHERE topic = $1', [topic]);
  return Object.fromEntries(r.rows.map((row) => [row.key.split(':')[1], row]));
}
const serverNow = async () => (await env.admin.query('SELECT clock_timestamp() AS t')).rows[0].t;
const connectTo = (config) => async () => { const c = new pg.Client(config); await c.connect(); return c; };

// consume() running in this process, stopped by an AbortController
function loop(topic, handler = () => {}, opts = {}, config = env.targets.direct) {
  const ac = new AbortController();
  running.push(ac);
  const seen = [];
  const done = idem.consume(connectTo(config), topic, async (e) => { seen.push(e); await handler(e); },
    { signal: ac.signal, log: quiet, ...opts });
  return {
    seen,
    done,
    abort: () => ac.abort(),
    keys: () => seen.map((e) => e.key.split(':')[1]),
    async finish() {
      ac.abort();
      let timer;
      const late = new Promise((resolve, reject) => {
        timer = setTimeout(() => reject(new Error('consume() did not return after abort')), 5000);
      });
      try {
        return await Promise.race([done, late]);
      } finally {
        clearTimeout(timer);
      }
    },
  };
}
async function waitUntilSleeping() {
  await until(async () => Number((await env.admin.query(
    "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'idle'" +
    " AND query LIKE '%idem_outbox_claim%' AND pid <> pg_backend_pid()")).rows[0].n) > 0,
  "the consumer's claim");
}
// a claim with a wait, as pg_stat_activity shows its query
const WAITING_CLAIM = "query LIKE '%idem_outbox_claim(%wait =>%' AND pid <> pg_backend_pid()";
// sessions running a claim with a wait (waiting: wait_event_type Extension)
async function waitingCount({ sleeping = false } = {}) {
  return Number((await env.admin.query(
    "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active'" +
    (sleeping ? " AND wait_event_type = 'Extension'" : '') + ` AND ${WAITING_CLAIM}`)).rows[0].n);
}
const waitUntilWaiting = () => until(async () => (await waitingCount({ sleeping: true })) > 0,
  "the consumer's waiting claim");

describe('consume', () => {
  // idem_retry_advice's retry (40001, class 72) and a standby (25006: reconnect)
  for (const wakeup of ['notify', 'wait']) for (const sqlstate of ['40001', '72000', '25006']) {
    it(`a transient claim error (${sqlstate}, ${wakeup}) is retried: the loop goes on and delivers`, async () => {
      // each stopped the loop
      const t = await freshTopic();
      const name = `ct_${sqlstate}_${wakeup}`;
      const claims = await claimFaults(env.admin, name, sqlstate, 3);
      await publish(t, 'a');
      const l = loop(t, () => {}, { consumer: name, idle: 0.2, wakeup }, { ...env.targets.direct, options: OPTIONS });
      let over = false;
      l.done.finally(() => { over = true; }).catch(() => {});
      await until(async () => over || l.seen.length === 1, 'the delivery', 20000);
      assert.equal(over, false, 'consume() stopped');
      assert.equal(await l.finish(), 1);
      assert.deepEqual(l.keys(), ['a']);
      assert.ok((await claims()) > 3);
    });
  }

  // idem_retry_advice's never
  for (const sqlstate of ['42501', '22023', '54000', '55000']) {
    it(`a permanent claim error (${sqlstate}) stops the loop: consume() rejects with it`, async () => {
      const t = await freshTopic();
      const name = `cp_${sqlstate}`;
      const claims = await claimFaults(env.admin, name, sqlstate, 1000);
      await publish(t, 'a');
      const l = loop(t, () => {}, { consumer: name, idle: 0.2 }, { ...env.targets.direct, options: OPTIONS });
      const timer = setTimeout(() => l.abort(), 10000);
      await assert.rejects(l.done, (e) => e.code === sqlstate);
      clearTimeout(timer);
      assert.equal(await claims(), 1);
      assert.deepEqual(l.seen, []);
      assert.equal((await events(t)).a.state, 'pending');
    });
  }

  it('delivers and acks', async () => {
    const t = await freshTopic();
    await publish(t, 'a', 'b', 'c');
    const l = loop(t, undefined, { maxEvents: 2 });
    await until(() => l.seen.length === 3, 'three deliveries');
    assert.equal(await l.finish(), 3);
    assert.deepEqual(l.keys().sort(), ['a', 'b', 'c']);
    assert.equal(l.seen[0].attempt, 1);
    assert.equal(l.seen[0].payload.rows[0].amount, '25.00'); // exact, as execute() returns it
    const ev = await events(t);
    assert.deepEqual(Object.values(ev).map((r) => r.state), ['delivered', 'delivered', 'delivered']);
  });

  // Retry-After decides, attempt 1's backoff window being 1 s: exactly 20 s;
  // one later than idem.outbox_max_retry_after (1 day) allows is as late as
  // allowed (it was refused, and the failure lost)
  for (const [retryAfter, seconds] of [[20, 20], [Infinity, 86400]]) {
    it(`fails with the Retry-After of a RetryAfter (${retryAfter})`, async () => {
      const t = await freshTopic();
      await publish(t, 'a');
      const before = await serverNow();
      const l = loop(t, () => { throw new idem.RetryAfter(retryAfter, 'mailer 429'); });
      await until(async () => (await events(t)).a.last_error !== null, 'the failure');
      const afterT = await serverNow();
      assert.equal(await l.finish(), 0);
      const row = (await events(t)).a;
      assert.equal(row.state, 'pending');
      assert.equal(row.last_error, 'mailer 429');
      assert.ok(row.next_attempt_at - before >= seconds * 1000 &&
        row.next_attempt_at - afterT <= seconds * 1000);
    });
  }

  it('fails with a Retry-After below 1e-6 s (written 1e-7, which interval input refused)', async () => {
    const t = await freshTopic();
    await publish(t, 'a');
    const before = await serverNow();
    const l = loop(t, () => { throw new idem.RetryAfter(1e-7, 'mailer 429'); });
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    assert.equal(await l.finish(), 0);
    const row = (await events(t)).a;
    assert.equal(row.state, 'pending');
    assert.equal(row.last_error, 'mailer 429');
    assert.ok(row.next_attempt_at >= before);
  });

  it("leaves any other error's retry to the server's backoff", async () => {
    const t = await freshTopic();
    await publish(t, 'a');
    // jitter off and a long base: the window end is exact and far from 0
    const config = { ...env.targets.direct, options: '-c idem.outbox_jitter=off -c idem.outbox_backoff_base=45s' };
    const before = await serverNow();
    const l = loop(t, () => { throw new TypeError('mailer down'); }, {}, config);
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    const afterT = await serverNow();
    assert.equal(await l.finish(), 0);
    const row = (await events(t)).a;
    assert.equal(row.last_error, 'TypeError: mailer down');
    assert.ok(row.next_attempt_at - before >= 45000 && row.next_attempt_at - afterT <= 45000);
  });

  it('fails the event when the handler throws something that is not an Error', async () => {
    const t = await freshTopic();
    await publish(t, 'a');
    const l = loop(t, () => { throw 'mailer down'; }); // eslint-disable-line no-throw-literal
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    assert.equal(await l.finish(), 0);
    const row = (await events(t)).a;
    assert.equal(row.state, 'pending');
    assert.equal(row.last_error, 'mailer down');
  });

  it('fails the event when the handler throws a NUL in its message (escaped: the fail was refused)', async () => {
    const t = await freshTopic();
    await publish(t, 'a');
    const l = loop(t, () => { throw new Error('bad \0 byte'); });
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    assert.equal(await l.finish(), 0);
    assert.equal((await events(t)).a.last_error, 'Error: bad \\x00 byte');
  });

  it('fails the event with the first 16384 characters of a longer message (the fail was refused)', async () => {
    // 22001: an event's error is at most 64 kB, and consume() rejected
    const t = await freshTopic();
    await publish(t, 'a');
    const l = loop(t, () => { throw new Error('x'.repeat(70000)); });
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    assert.equal(await l.finish(), 0);
    assert.equal((await events(t)).a.last_error, `Error: ${'x'.repeat(70000)}`.slice(0, 16384));
  });

  it('fails the event with what a LATIN1 database cannot hold escaped; the loop goes on', async () => {
    // the server refused to convert the emoji (22P05) and consume() rejected
    const config = { ...env.targets.direct, database: 'idemlatin1' };
    if ((await env.admin.query("SELECT 1 FROM pg_database WHERE datname = 'idemlatin1'")).rows.length === 0) {
      await env.admin.query("CREATE DATABASE idemlatin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
    }
    const t = await freshTopic();
    const a = new pg.Client(config);
    await a.connect();
    await a.query('CREATE EXTENSION IF NOT EXISTS idem');
    await a.query('SELECT idem_outbox_create_topic($1)', [t]);
    await idem.execute(a, `${t}:a`, 'SELECT 1 AS one', [], { outboxTopic: t });
    const l = loop(t, () => { throw new Error('caf\u00e9 \u{1f600}'); }, {}, config);
    const lastError = async () => (await a.query('SELECT last_error FROM idem_outbox_events WHERE topic = $1', [t])).rows[0].last_error;
    await until(async () => (await lastError()) !== null, 'the failure');
    assert.equal(await l.finish(), 0);
    assert.equal(await lastError(), 'Error: caf\u00e9 \\U0001f600');
    await a.end();
  });

  it('a client_encoding that connect() set does not change the failure text', async () => {
    // node-postgres writes UTF-8: on a client set to LATIN1 the server read
    // café as cafÃ©
    const t = await freshTopic();
    await publish(t, 'a');
    const ac = new AbortController();
    running.push(ac);
    const done = idem.consume(async () => {
      const c = new pg.Client(env.targets.direct);
      await c.connect();
      await c.query("SET client_encoding TO 'LATIN1'");
      return c;
    }, t, () => { throw new Error('caf\u00e9 \u{1f600}'); }, { signal: ac.signal, log: quiet });
    await until(async () => (await events(t)).a.last_error !== null, 'the failure');
    ac.abort();
    assert.equal(await done, 0);
    assert.equal((await events(t)).a.last_error, 'Error: caf\u00e9 \u{1f600}');
  });

  it('fails an event whose payload is nested deeper than the parser reads; the loop goes on', async () => {
    // its RangeError rejected consume()
    const t = await freshTopic();
    const c = new pg.Client(env.targets.direct);
    await c.connect();
    await c.query('BEGIN');
    // (execute would parse the response)
    await c.query("SELECT 1 FROM idem_call($1, $2, '{}', outbox_topic => $3)",
      [`${t}:deep`, "SELECT (repeat('[', 5000) || repeat(']', 5000))::jsonb AS deep", t]);
    await c.query('COMMIT');
    await c.end();
    await publish(t, 'b');
    const l = loop(t);
    await until(async () => (await events(t)).deep.last_error !== null && l.seen.length === 1, 'the failure and the other delivery');
    assert.equal(await l.finish(), 1);
    assert.match((await events(t)).deep.last_error, /RangeError/);
  });

  it('stops a long idle wait at once on abort', async () => {
    const t = await freshTopic();
    const l = loop(t, undefined, { idle: 60 });
    await waitUntilSleeping();
    const t0 = Date.now();
    assert.equal(await l.finish(), 0);
    assert.ok(Date.now() - t0 < 1000);
  });

  it('wakes up on NOTIFY', async () => {
    const t = await freshTopic();
    const l = loop(t, undefined, { idle: 60 });
    await waitUntilSleeping();
    const t0 = Date.now();
    await publish(t, 'a');
    await until(() => l.seen.length === 1, 'the delivery', 5000);
    assert.ok(Date.now() - t0 < 3000); // not the 60 s idle poll
    assert.equal(await l.finish(), 1);
  });

  it('replaces a lost connection', async () => {
    const t = await freshTopic();
    const l = loop(t, undefined, { idle: 60 });
    await waitUntilSleeping();
    await env.admin.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity" +
      " WHERE query LIKE '%idem_outbox_claim%' AND pid <> pg_backend_pid()");
    await sleep(500);
    await waitUntilSleeping(); // a new session, listening again
    await publish(t, 'a');
    await until(() => l.seen.length === 1, 'the delivery after reconnecting', 5000);
    assert.equal(await l.finish(), 1);
  });

  for (const [outcome, wakeup] of [['ack', 'notify'], ['fail', 'notify'], ['ack', 'wait'], ['fail', 'wait']]) {
    it(`skips a ${outcome} fenced by a takeover (ID412), wakeup ${wakeup}`, async () => {
      const t = await freshTopic();
      await publish(t, 'slow');
      warnings = [];
      let started; const startedP = new Promise((r) => { started = r; });
      let taken; const takenP = new Promise((r) => { taken = r; });
      const l = loop(t, async (e) => {
        if (!e.key.endsWith('slow')) return;
        started();
        await takenP;
        if (outcome === 'fail') throw new Error('late failure');
      }, { lease: 1, idle: 60, wakeup });
      await startedP;
      await sleep(1200);
      const stolen = await env.admin.query("SELECT key FROM idem_outbox_claim($1, 10, '30 s', 'thief')", [t]);
      assert.deepEqual(stolen.rows, [{ key: `${t}:slow` }]);
      taken();
      await publish(t, 'next');
      await until(() => l.keys().includes('next'), 'the next event after the fenced one');
      assert.equal(await l.finish(), 1);
      const row = (await events(t)).slow;
      assert.equal(row.state, 'leased');
      assert.equal(row.lease_holder, 'thief');
      assert.equal(row.last_error, null);
      assert.ok(warnings.some((w) => w.includes('ID412')), warnings.join('\n'));
    });
  }

  // each consumer's log in a folder of its own, removed when the file's tests end
  const logDirs = [];
  after(() => { for (const d of logDirs) fs.rmSync(d, { recursive: true, force: true }); });
  const logFile = () => {
    logDirs.push(fs.mkdtempSync(path.join(os.tmpdir(), 'idem-consumer.')));
    return path.join(logDirs[logDirs.length - 1], 'log');
  };
  const lines = (f) => (fs.existsSync(f) ? fs.readFileSync(f, 'utf8').split('\n').slice(0, -1) : []);
  function proc(topic, log, { lease = 2, handlerMs = 0, killAfter = 0, wakeup = 'notify' } = {}) {
    const p = spawn(process.execPath, [path.join(__dirname, '..', 'fixtures', 'outbox-consumer.js'),
      JSON.stringify(env.targets.direct), topic, log, String(lease), String(handlerMs), String(killAfter),
      wakeup],
    { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    p.stdout.on('data', (d) => { out += d; });
    const exited = new Promise((r) => p.on('exit', (code, sig) => r({ code, sig, out: () => out.trim() })));
    return { p, exited };
  }

  for (const wakeup of ['notify', 'wait']) {
  it(`finishes the running delivery on SIGTERM and exits 0; the rest are released (wakeup ${wakeup})`, async () => {
    const t = await freshTopic();
    await publish(t, 'a', 'b', 'c', 'd');
    const log = logFile();
    const { p, exited } = proc(t, log, { handlerMs: 1000, wakeup });
    await until(() => lines(log).length === 1, 'the first delivery');
    p.kill('SIGTERM'); // inside the first handler
    const { code, out } = await exited;
    assert.equal(code, 0);
    await until(() => out() !== '', 'output');
    assert.equal(out(), '1');
    assert.equal(lines(log).length, 1);
    const ev = await events(t);
    const done = Object.keys(ev).filter((k) => ev[k].state === 'delivered');
    assert.deepEqual(done, [lines(log)[0].split(' ')[0].split(':')[1]]);
    const rest = Object.keys(ev).filter((k) => !done.includes(k)).sort();
    // the rest of the batch was handed back (idem_outbox_release): due now,
    // the claim's attempt not counted, so anyone takes it at once as the
    // first attempt
    assert.ok(rest.every((k) => ev[k].state === 'pending' && ev[k].attempts === 0));
    const l = loop(t, undefined, { idle: 60, wakeup });
    await until(() => l.seen.length === 3, 'the rest, released');
    assert.equal(await l.finish(), 3);
    assert.deepEqual(l.keys().sort(), rest);
    assert.ok(l.seen.every((e) => e.attempt === 1));
  });
  }

  it('redelivers after a SIGKILL between handler and ack; the receiver dedupes by key', async () => {
    const t = await freshTopic();
    await publish(t, 'a', 'b', 'c');
    const log = logFile();
    const { exited } = proc(t, log, { killAfter: 2 });
    const { sig } = await exited;
    assert.equal(sig, 'SIGKILL');
    const first = lines(log).map((l) => l.split(' '));
    assert.equal(first.length, 2);
    const killedKey = first[1][0];
    assert.deepEqual(Object.values(await events(t)).map((r) => r.state).sort(), ['delivered', 'leased', 'leased']);
    // the receiver keeps one effect per key however many attempts reach it
    const effects = new Map(first.map(([k, a]) => [k, Number(a)]));
    const l = loop(t, (e) => {
      fs.appendFileSync(log, `${e.key} ${e.attempt}\n`);
      if (!effects.has(e.key)) effects.set(e.key, e.attempt);
    }, { idle: 0.2 });
    await until(() => l.seen.length === 2, 'redelivery after the lease');
    assert.equal(await l.finish(), 2);
    const attempts = lines(log).map((x) => x.split(' ')).filter(([k]) => k === killedKey).map(([, a]) => a);
    assert.deepEqual(attempts, ['1', '2']);
    assert.equal(effects.size, 3);
    assert.ok(Object.values(await events(t)).every((r) => r.state === 'delivered'));
  });

  for (const wakeup of ['notify', 'wait']) {
  it(`exits at once on SIGTERM while idle (wakeup ${wakeup}: a 60 s LISTEN or waiting claim)`, async () => {
    const t = await freshTopic();
    const log = logFile();
    const { p, exited } = proc(t, log, { wakeup });
    await (wakeup === 'wait' ? waitUntilWaiting() : waitUntilSleeping());
    const t0 = Date.now();
    p.kill('SIGTERM');
    const { code, out } = await exited;
    assert.equal(code, 0);
    assert.ok(Date.now() - t0 < 2000);
    await until(() => out() !== '', 'output');
    assert.equal(out(), '0');
  });
  }
});

// wakeup 'wait': claims that wait (idem_outbox_claim(..., wait => idle))
// instead of LISTEN, producers without NOTIFY
describe('consume, wakeup wait', () => {
  it('delivers a commit at once with the producers\' NOTIFY off', async () => {
    const t = await freshTopic();
    const heard = [];
    const listener = new pg.Client(env.targets.direct);
    await listener.connect();
    listener.on('notification', (n) => heard.push(n));
    const ch = (await listener.query('SELECT idem_outbox_channel($1) AS c', [t])).rows[0].c;
    await listener.query(`LISTEN "${ch}"`);
    try {
      const l = loop(t, undefined, { idle: 60, wakeup: 'wait' });
      await waitUntilWaiting();
      const t0 = Date.now();
      await publishQuiet(t, 'a');
      await until(() => l.seen.length === 1, 'the delivery', 5000);
      assert.ok(Date.now() - t0 < 3000); // woken by the commit, not the 60 s timeout
      await waitUntilWaiting(); // waiting again, for the next one
      await publishQuiet(t, 'b');
      await until(() => l.seen.length === 2, 'the second delivery', 5000);
      assert.ok(Date.now() - t0 < 6000);
      assert.equal(await l.finish(), 2);
      assert.equal((await events(t)).b.state, 'delivered');
      await listener.query('SELECT 1'); // reads what has arrived
      assert.deepEqual(heard, []); // no NOTIFY was sent
    } finally {
      await listener.end();
    }
  });

  it('claims and waits in one statement (what a transaction pooler needs)', async () => {
    // no commit can fall between an empty claim and a wait on another
    // server session: the statement that waits is the claim itself
    const t = await freshTopic();
    const app = 'idem-claimwait';
    const l = loop(t, undefined, { idle: 60, wakeup: 'wait' },
      { ...env.targets.direct, application_name: app, options: '-c log_statement=all' });
    const idling = async () => (await env.admin.query(
      'SELECT pid, query FROM pg_stat_activity WHERE application_name = $1' +
      " AND state = 'active' AND wait_event_type = 'Extension'", [app])).rows;
    await until(async () => (await idling()).length > 0, "the consumer's session to wait");
    const [{ pid, query }, ...more] = await idling();
    assert.equal(more.length, 0);
    assert.match(query, /idem_outbox_claim\(.*wait =>/);
    await publishQuiet(t, 'a');
    await until(() => l.seen.length === 1, 'the delivery', 5000);
    await until(async () => (await idling()).length > 0, "the consumer's session to wait again");
    assert.deepEqual(await idling(), [{ pid, query }]); // the same session, claiming with a wait again
    assert.equal(await l.finish(), 1);
    // every statement the consumer sent (log_statement=all on its session)
    const sent = fs.readFileSync(env.log, 'utf8').split('\n').filter((line) =>
      line.includes(`[${pid}] LOG:  execute `) || line.includes(`[${pid}] LOG:  statement: `));
    const claims = sent.filter((line) => line.includes('idem_outbox_claim('));
    assert.ok(claims.length >= 2 && claims.every((line) => line.includes('wait =>')), sent.join('\n'));
    assert.deepEqual(sent.filter((line) => line.includes('idem_outbox_wait')), []);
  });

  for (const isolation of ['repeatable read', 'serializable']) {
    it(`delivers and stops at a default isolation of ${isolation} (each waiting claim a READ COMMITTED block)`, async () => {
      // a claim with a wait is refused (0A000) at a snapshot's isolation:
      // the loop claimed nothing, again and again
      const t = await freshTopic();
      const options = `-c default_transaction_isolation=${isolation.replace(' ', '\\ ')}`;
      const l = loop(t, undefined, { idle: 60, wakeup: 'wait' }, { ...env.targets.direct, options });
      await waitUntilWaiting();
      await publishQuiet(t, 'a');
      await until(() => l.seen.length === 1, 'the delivery', 5000);
      await waitUntilWaiting();
      const t0 = Date.now();
      assert.equal(await l.finish(), 1);
      assert.ok(Date.now() - t0 < 3000);
      assert.equal((await events(t)).a.state, 'delivered');
    });
  }

  it('stops a 60 s wait at once on abort (the cancel)', async () => {
    const t = await freshTopic();
    const l = loop(t, undefined, { idle: 60, wakeup: 'wait' });
    await waitUntilWaiting();
    const t0 = Date.now();
    assert.equal(await l.finish(), 0); // resolved, not rejected
    assert.ok(Date.now() - t0 < 3000);
    await until(async () => (await waitingCount()) === 0, "the server's wait to end", 2000);
  });

  for (const db of ['pgbouncer', 'idemone']) {
    it(`delivers through PgBouncer in transaction mode (${db}) and stops through it`, async () => {
      // idemone: a pool of one server connection, which the wait holds
      const config = db === 'idemone' ? env.pooledOne : env.targets.pgbouncer;
      const t = await freshTopic();
      const l = loop(t, undefined, { idle: 60, wakeup: 'wait' }, config);
      for (const [n, k] of ['a', 'b', 'c'].entries()) {
        await waitUntilWaiting();
        const t0 = Date.now();
        await publishQuiet(t, k);
        await until(() => l.seen.length === n + 1, `delivery ${n + 1}`, 5000);
        assert.ok(Date.now() - t0 < 3000);
      }
      await waitUntilWaiting();
      const t0 = Date.now();
      assert.equal(await l.finish(), 3); // the abort's cancel goes through PgBouncer too
      assert.ok(Date.now() - t0 < 3000);
      assert.deepEqual(l.keys().sort(), ['a', 'b', 'c']);
      assert.ok(Object.values(await events(t)).every((r) => r.state === 'delivered'));
      // PgBouncer outlived the cancel (1.18 dies if the canceller closes first)
      const c = new pg.Client(config);
      await c.connect();
      assert.equal((await c.query('SELECT 1 AS one')).rows[0].one, 1);
      await c.end();
    });
  }

  it('replaces a lost connection', async () => {
    const t = await freshTopic();
    const l = loop(t, undefined, { idle: 60, wakeup: 'wait' });
    await waitUntilWaiting();
    await env.admin.query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity' +
      ` WHERE state = 'active' AND ${WAITING_CLAIM}`);
    await sleep(500);
    await waitUntilWaiting(); // a new session, waiting again
    await publishQuiet(t, 'a');
    await until(() => l.seen.length === 1, 'the delivery after reconnecting', 5000);
    assert.equal(await l.finish(), 1);
  });

  it('waits without idem preloaded: the claim polls, and an event published meanwhile is delivered', async () => {
    const plain = await start({ preload: false, pooler: false });
    try {
      await plain.admin.query("SELECT idem_outbox_create_topic('plain')");
      const l = loop('plain', undefined, { idle: 60, wakeup: 'wait' }, plain.targets.direct);
      await until(async () => Number((await plain.admin.query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'active'" +
        ` AND wait_event_type = 'Extension' AND ${WAITING_CLAIM}`)).rows[0].n) > 0,
      "the consumer's waiting claim");
      await publishWith(plain.targets.direct, 'plain', 'a');
      await until(() => l.seen.length === 1, 'the delivery during the wait', 10000);
      assert.equal(await l.finish(), 1);
    } finally {
      await plain.stop();
    }
  });
});
