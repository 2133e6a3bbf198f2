'use strict';
// Workflow and Worker on the runs on queues, directly and through PgBouncer
// in transaction mode: runs complete with each effect once, RetryAfter and
// exceptions go through the runtime's policy, a taken-over run stops its
// holder, and worker processes SIGKILLed at random leave every effect
// exactly once and every attempt on record.
const { describe, it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const pg = require('pg');
const idem = require('idem-client');
const { SCHEMA, make, carrier } = require('../fixtures/returns-workflow.js');
const { start } = require('./cluster.js');
const faults = require('./claim-fault.js');

let env;
before(async () => { env = await start(); await env.admin.query(SCHEMA); });
after(async () => { await env.stop(); });

let queueNo = 0;
async function freshQueue() {
  const q = `nodeq${++queueNo}`;
  await env.admin.query("SELECT idem_queue_create($1, max_attempts => 3, backoff_base => '50 ms'," +
    " backoff_cap => '200 ms', jitter => 'none')", [q]);
  await env.admin.query('INSERT INTO wf_stock VALUES ($1, 0)', [q]);
  return q;
}
const one = async (sql, args = []) => (await env.admin.query(sql, args)).rows[0];
const statuses = async (q) => Object.fromEntries((await env.admin.query(
  'SELECT status, count(*)::int AS n FROM idem_runs WHERE queue = $1 GROUP BY status', [q])).rows.map((r) => [r.status, r.n]));
async function until(cond, seconds, what) {
  const deadline = Date.now() + seconds * 1000;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function startRuns(connect, wf, q, n) {
  const c = await connect();
  for (let i = 0; i < n; i++) {
    const s = await wf.start(c, `${q}:ret-${i}`, { input: { sku: q, amount: '25.00', customer: `c${i}` } });
    assert.equal(s.created, true);
  }
  assert.equal((await wf.start(c, `${q}:ret-0`, { input: { sku: q, amount: '25.00', customer: 'c0' } })).created, false);
  await assert.rejects(wf.start(c, `${q}:ret-0`, { input: { sku: q, amount: '26.00' } }),
    (e) => e instanceof idem.KeyReused && e.code === 'ID422');
  await c.end();
}

async function checkExactlyOnce(q, n, car) {
  assert.deepEqual(await statuses(q), { completed: n });
  assert.equal((await one('SELECT on_hand FROM wf_stock WHERE sku = $1', [q])).on_hand, n);
  const refunds = (await env.admin.query("SELECT run_id, amount::text AS amount, label_id FROM wf_refunds WHERE run_id LIKE $1 || ':%'", [q])).rows;
  assert.equal(refunds.length, n);
  assert.equal(new Set(refunds.map((r) => r.run_id)).size, n);
  assert.deepEqual([...new Set(refunds.map((r) => r.amount))], ['25.00']);
  const mine = [...car.labels.entries()].filter(([k]) => k.includes(q));
  assert.equal(mine.length, n);
  assert.deepEqual(refunds.map((r) => r.label_id).sort(), mine.map(([, v]) => v.label_id).sort());
  assert.equal(Number((await one("SELECT count(*) AS n FROM idem.outbox WHERE run_id LIKE $1 || ':%'", [q])).n), n);
  assert.equal(Number((await one("SELECT count(*) AS n FROM idem_run_attempts WHERE run_id LIKE $1 || ':%' AND outcome IS NULL", [q])).n), 0);
}

// connect, with the text of every query the client sends appended to sent
function countingConnect(connect, sent) {
  return async () => {
    const cl = await connect();
    const query = cl.query.bind(cl);
    cl.query = (text, ...rest) => { if (typeof text === 'string') sent.push(text); return query(text, ...rest); };
    return cl;
  };
}

describe('Worker', () => {
  it('refuses two workflows on one queue (the second took the first\'s place)', () => {
    const a = new idem.Workflow('returns', { steps: ['a'] });
    const b = new idem.Workflow('returns2', { steps: ['b'], queue: 'returns' });
    assert.throws(() => new idem.Worker(async () => null, [a, b]), /one workflow per queue/);
  });
});

for (const target of ['direct', 'pgbouncer']) {
  describe(target, () => {
    const connect = async () => { const c = new pg.Client(env.targets[target]); await c.connect(); return c; };

    it('runs complete with each effect once', async () => {
      const q = await freshQueue();
      const car = await carrier().listen();
      const wf = make(car.url, q);
      await startRuns(connect, wf, q, 8);
      const ac = new AbortController();
      const worker = new idem.Worker(connect, [wf], { concurrency: 3, lease: 5, poll: 0.2, signal: ac.signal });
      const done = worker.run();
      await until(async () => (await statuses(q)).completed === 8, 60, '8 completed runs');
      ac.abort();
      const stats = await done;
      car.close();
      await checkExactlyOnce(q, 8, car);
      assert.equal(stats.completed, 8);
      assert.equal(stats.steps, 32);
      const notify = await one("SELECT response::text AS r FROM idem_run_steps($1) WHERE step = 'notify'", [`${q}:ret-2`]);
      assert.deepEqual(idem.parseExact(notify.r), { to: 'c2', amount: '25.00' });
    });

    it('a step the worker has no function for waits for a worker that has it (a rolling deploy)', async () => {
      const q = await freshQueue();
      const calls = [];
      const make2 = (withB) => {
        const wf = new idem.Workflow(q, { steps: ['a', 'b'], maxAttempts: 1 });
        wf.step('a', (ctx) => { calls.push('a'); return { a: ctx.input.id }; });
        if (withB) wf.step('b', (ctx) => { calls.push('b'); return { b: ctx.results.a.a }; });
        return wf;
      };
      const runId = `${q}:deploy`;
      const c = await connect();
      await make2(false).start(c, runId, { input: { id: 7 } });
      await c.end();
      const quiet = { warn() {}, error() {} };
      const ac = new AbortController();
      const old = new idem.Worker(connect, [make2(false)], { concurrency: 1, lease: 5, poll: 0.1, name: 'old',
        unknownStepDelay: 0.3, signal: ac.signal, log: quiet }).run();
      const released = async () => Number((await one("SELECT count(*) AS n FROM idem_run_attempts WHERE run_id = $1 AND outcome = 'released'", [runId])).n);
      await until(async () => (await released()) >= 3, 20, 'the old worker handing the run back three times');
      ac.abort();
      const stats = await old;
      assert.ok(stats.released >= 3);
      assert.equal(stats.failedSteps, 0);
      const row = await one('SELECT status, attempt, next_step, last_error FROM idem_runs WHERE run_id = $1', [runId]);
      assert.deepEqual(row, { status: 'running', attempt: 1, next_step: 'b',
        last_error: `worker old has no function for step 'b' of workflow ${q}` });
      // handed back for a while, not at once
      const gap = await one("SELECT extract(epoch FROM min(c2.claimed_at - c1.ended_at))::float8 AS s FROM idem_run_attempts c1" +
        " JOIN idem_run_attempts c2 ON c2.run_id = c1.run_id AND c2.claim = c1.claim + 1 WHERE c1.run_id = $1 AND c1.outcome = 'released'", [runId]);
      assert.ok(gap.s >= 0.3, `claims ${gap.s} s apart`);
      assert.throws(() => new idem.Worker(connect, [make2(true)], { unknownStepDelay: -1 }), RangeError);
      const ac2 = new AbortController();
      const w2 = new idem.Worker(connect, [make2(true)], { concurrency: 1, lease: 5, poll: 0.1, name: 'new', signal: ac2.signal, log: quiet }).run();
      await until(async () => (await statuses(q)).completed === 1, 20, 'the completed run');
      ac2.abort();
      await w2;
      assert.deepEqual(calls, ['a', 'b']);
      assert.deepEqual((await one("SELECT response FROM idem_run_steps($1) WHERE step = 'b'", [runId])).response, { b: 7 });
    });

    if (target === 'direct') for (const isolation of ['repeatable read', 'serializable']) {
      it(`a default isolation of ${isolation}: claims in a READ COMMITTED block of their own, steps at the default`, async () => {
        // a claim is refused (0A000) at a snapshot's isolation; the claimer
        // retried it forever and claimed nothing
        const q = await freshQueue();
        const wf = new idem.Workflow(q, { steps: ['check', 'label'] });
        wf.step('check', (ctx) => ctx.execute('UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1' +
          " RETURNING on_hand, current_setting('transaction_isolation') AS isolation", [q]));
        wf.external('label', (ctx) => ({ label: ctx.key }));
        const runId = `${q}:iso`;
        const options = `-c default_transaction_isolation=${isolation.replace(' ', '\\ ')}`;
        const connectIso = async () => { const c = new pg.Client({ ...env.targets[target], options }); await c.connect(); return c; };
        const c = await connect();
        await wf.start(c, runId, { input: {} });
        await c.end();
        const ac = new AbortController();
        const w = new idem.Worker(connectIso, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal,
          log: { warn() {}, error() {} } }).run();
        await until(async () => (await statuses(q)).completed === 1, 20, 'the completed run');
        ac.abort();
        await w;
        assert.equal((await one('SELECT on_hand FROM wf_stock WHERE sku = $1', [q])).on_hand, 1);
        assert.deepEqual((await one("SELECT response FROM idem_run_steps($1) WHERE step = 'check'", [runId])).response.rows,
          [{ on_hand: 1, isolation }]);
        assert.equal(Number((await one('SELECT count(*) AS n FROM idem_run_attempts WHERE run_id = $1', [runId])).n), 1);
      });
    }

    if (target === 'direct') {
      // the claims of worker raise sqlstate `times` times: its claims so far, and its connect
      async function claimFaults(worker, sqlstate, times) {
        const claims = await faults.claimFaults(env.admin, worker, sqlstate, times);
        const faulty = async () => {
          const c = new pg.Client({ ...env.targets[target], options: faults.OPTIONS });
          await c.connect();
          return c;
        };
        return { claims, faulty };
      }
      const quiet = { warn() {}, error() {} };

      // idem_retry_advice's retry (40001, class 72) and a standby (25006: reconnect)
      for (const sqlstate of ['40001', '72000', '25006']) {
        it(`a transient claim error (${sqlstate}) is retried: the worker goes on`, async () => {
          const q = await freshQueue();
          const name = `t_${q}_${sqlstate}`;
          const { claims, faulty } = await claimFaults(name, sqlstate, 3);
          const wf = new idem.Workflow(q, { steps: ['a'] });
          wf.step('a', (ctx) => ({ ok: ctx.input.id }));
          const c = await connect();
          await wf.start(c, `${q}:t`, { input: { id: 1 } });
          await c.end();
          const ac = new AbortController();
          let over = false;
          const w = new idem.Worker(faulty, [wf], { concurrency: 1, lease: 5, poll: 0.1, name, signal: ac.signal, log: quiet })
            .run().finally(() => { over = true; });
          await until(async () => over || (await statuses(q)).completed === 1, 20, 'the completed run');
          assert.equal(over, false, 'the worker stopped');
          ac.abort();
          await w;
          assert.deepEqual(await statuses(q), { completed: 1 });
          assert.ok((await claims()) > 3);
        });
      }

      // idem_retry_advice's never: no grant, a bad argument, a feature
      // refused, a limit; the claimer retried each for ever
      for (const sqlstate of ['42501', '22023', '0A000', '54000', '55000']) {
        it(`a permanent claim error (${sqlstate}) stops the worker: run() rejects with it`, async () => {
          const q = await freshQueue();
          const name = `p_${q}_${sqlstate}`;
          const { claims, faulty } = await claimFaults(name, sqlstate, 1000);
          const wf = new idem.Workflow(q, { steps: ['a'] });
          wf.step('a', () => ({ ok: 1 }));
          const c = await connect();
          await wf.start(c, `${q}:p`, { input: {} });
          await c.end();
          const ac = new AbortController();
          const w = new idem.Worker(faulty, [wf], { concurrency: 1, lease: 5, poll: 0.1, name, signal: ac.signal, log: quiet }).run();
          const timer = setTimeout(() => ac.abort(), 10000);
          await assert.rejects(w, (e) => e.code === sqlstate);
          clearTimeout(timer);
          assert.equal(await claims(), 1);
          assert.deepEqual(await statuses(q), { running: 1 });
        });
      }

      it('a worker of a queue dropped (42704) stops: run() rejects with it', async () => {
        const q = await freshQueue();
        const wf = new idem.Workflow(`${q}_gone`, { steps: ['a'] });
        wf.step('a', () => ({}));
        const ac = new AbortController();
        const timer = setTimeout(() => ac.abort(), 10000);
        await assert.rejects(new idem.Worker(connect, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: quiet }).run(),
          (e) => e.code === '42704');
        clearTimeout(timer);
      });
    }

    it('RetryAfter comes back no sooner; an exception fails the run after its last attempt', async () => {
      const q = await freshQueue();
      const car = await carrier({ busy: 1, retryAfter: '1' }).listen();
      const wf = make(car.url, q);
      await startRuns(connect, wf, q, 1);
      const bq = await freshQueue(); // one workflow per queue
      const bad = new idem.Workflow(bq, { steps: ['boom'], maxAttempts: 2 });
      const seen = [];
      bad.step('boom', (ctx) => { seen.push(ctx.attempt); throw new TypeError(`bad ${ctx.input.id}`); });
      const c = await connect();
      await bad.start(c, `${bq}:bad`, { input: { id: 7 } });
      await c.end();
      const ac = new AbortController();
      const w1 = new idem.Worker(connect, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => car.log.some(([, o]) => o === '503'), 10, 'a 503');
      car.busy = 0;
      const t503 = Date.now();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [`${q}:ret-0`])).status === 'completed', 20, 'the completed run');
      assert.ok(Date.now() - t503 >= 900, 'not before the Retry-After');
      ac.abort();
      await w1;
      car.close();
      assert.deepEqual(car.log.map(([, o]) => o), ['503', 'created']);
      assert.equal(seen.length, 0);
      const outcomes = (await env.admin.query('SELECT outcome, error FROM idem_run_attempts WHERE run_id = $1 ORDER BY claim', [`${q}:ret-0`])).rows;
      assert.deepEqual(outcomes, [{ outcome: 'step_failed', error: 'carrier 503' }, { outcome: 'completed', error: null }]);
      const ac2 = new AbortController();
      const w2 = new idem.Worker(connect, [bad], { concurrency: 1, lease: 5, poll: 0.1, signal: ac2.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [`${bq}:bad`])).status === 'failed', 20, 'the failed run');
      ac2.abort();
      await w2;
      assert.deepEqual(seen, [1, 2]);
      assert.equal((await one('SELECT last_error FROM idem_runs WHERE run_id = $1', [`${bq}:bad`])).last_error, 'TypeError: bad 7');
    });

    it('external steps ride on the database steps\' calls; a failed one still completes the label', async () => {
      // the label's start commits with the check and its result with the
      // refund (idem_call's start_step, complete_step); a refund whose
      // statement fails leaves the label completed (recorded alone first),
      // so the retry does not call out again
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['check', 'label', 'refund', 'notify'] });
      const seen = { keys: [] };
      const refunds = [];
      wf.step('check', (ctx) => ctx.execute('UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand', [ctx.input.sku]))
        .external('label', async (ctx) => {
          seen.started = await one('SELECT started_step, started_count FROM idem.runs WHERE run_id = $1', [ctx.runId]);
          seen.keys.push([ctx.key, ctx.attempt]);
          return { label_id: 'LBL-1' };
        })
        .step('refund', (ctx) => {
          refunds.push(ctx.attempt);
          const x = refunds.length === 1 ? '1 / 0' : '1';
          return ctx.execute(`INSERT INTO wf_refunds (run_id, amount, label_id) VALUES ($1, 25, $2) RETURNING ${x} AS x`,
            [ctx.runId, ctx.results.label.label_id]);
        }, { outboxTopic: 'refunds' })
        .step('notify', (ctx) => ({ to: ctx.input.sku }));
      const run = `${q}:fold`;
      const c = await connect();
      await wf.start(c, run, { input: { sku: q } });
      await c.end();
      const sent = [];
      const counting = countingConnect(connect, sent);
      const ac = new AbortController();
      const w = new idem.Worker(counting, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [run])).status === 'completed', 20, 'the completed run');
      ac.abort();
      await w;
      assert.deepEqual(seen.started, { started_step: 'label', started_count: 1 });
      const key = (await one("SELECT idem_step_key($1, 'label') AS k", [run])).k;
      assert.deepEqual(seen.keys, [[key, 1]]);
      assert.deepEqual(refunds, [1, 2]);
      const steps = (await env.admin.query('SELECT step, state, response::text AS r FROM idem_run_steps($1)', [run])).rows;
      assert.deepEqual(steps.map((s) => [s.step, s.state]), wf.steps.map((s) => [s, 'completed']));
      assert.deepEqual(idem.parseExact(steps[1].r), { label_id: 'LBL-1' });
      assert.equal(Number((await one('SELECT count(*) AS n FROM wf_refunds WHERE run_id = $1', [run])).n), 1);
      const outcomes = (await env.admin.query('SELECT outcome FROM idem_run_attempts WHERE run_id = $1 ORDER BY claim', [run])).rows;
      assert.deepEqual(outcomes.map((o) => o.outcome), ['step_failed', 'completed']);
      // the statements: no idem_step_start; idem_step_complete for the label
      // alone before the refund's failure, and for notify; the refund's first
      // call carried the label's result, its second had none to carry
      const mine = sent.filter((t) => !t.includes('idem_run_claim') && !t.includes('idem_run_extend'));
      assert.equal(mine.filter((t) => t.includes('idem_step_start')).length, 0);
      assert.equal(mine.filter((t) => t.includes('idem_step_complete')).length, 2);
      assert.equal(mine.filter((t) => t.includes('idem_call')).length, 3);
    });

    it('input and results are JSON as written, and read back on resume as first seen', async () => {
      // a string, a Date, a BigInt: toArg's text was no JSON (a string, a
      // Date: the jsonb cast refused it) or threw (a BigInt in an object);
      // a database step's response lacked its command before the resume
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['db', 'str', 'date', 'big', 'none', 'look'] });
      const seen = {};
      wf.step('db', (ctx) => ctx.execute('SELECT $1::numeric AS amount', ['25.00']))
        .external('str', async () => 'a plain string')
        .external('date', async () => new Date(Date.UTC(2026, 0, 2)))
        .external('big', async () => ({ big: 10n ** 30n, small: 7n, list: [1n] }))
        .external('none', async () => undefined)
        .external('look', async (ctx) => {
          seen[ctx.attempt] = { input: ctx.input, results: { ...ctx.results } };
          if (ctx.attempt === 1) throw new idem.RetryAfter(0.05); // claimed again, results read back
          return null;
        });
      const run = `${q}:values`;
      const c = await connect();
      await wf.start(c, run, { input: 'plain input' });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [run])).status === 'completed', 20, 'the completed run');
      ac.abort();
      await w;
      assert.deepEqual(Object.keys(seen), ['1', '2']);
      assert.deepEqual(seen[1], seen[2]);
      assert.deepEqual(seen[2], { input: 'plain input', results: { db: { rows: [{ amount: '25.00' }], rowcount: 1, command: 'SELECT' }, str: 'a plain string', date: '2026-01-02T00:00:00.000Z',
        big: { big: '1000000000000000000000000000000', small: 7, list: [1] }, none: {} } });
    });

    it('a step throwing null or undefined fails, the worker goes on', async () => {
      // reading the thrown value's code threw in the worker: an unhandled
      // rejection, which ends the process
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a'] });
      wf.external('a', async (ctx) => {
        if (ctx.attempt === 1) throw ctx.runId.endsWith(':null') ? null : undefined;
        return {};
      });
      const c = await connect();
      for (const r of ['null', 'undefined']) await wf.start(c, `${q}:${r}`, { input: {} });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await statuses(q)).completed === 2, 20, 'the completed runs');
      ac.abort();
      await w;
      const errors = (await env.admin.query("SELECT run_id, error FROM idem_run_attempts WHERE run_id LIKE $1 || ':%' AND outcome = 'step_failed' ORDER BY run_id", [q])).rows;
      assert.deepEqual(errors.map((r) => r.error), ['null', 'undefined']);
    });

    it('a Retry-After below 1e-6 s fails the step (written 1e-7, which interval input refused)', async () => {
      // the failure was lost and the run came back only after its lease
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['label'] });
      wf.external('label', async (ctx) => {
        if (ctx.attempt === 1) throw new idem.RetryAfter(1e-7, 'carrier 503');
        return {};
      });
      const run = `${q}:tiny`;
      const c = await connect();
      await wf.start(c, run, { input: {} });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 30, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [run])).status === 'completed', 10, 'the completed run');
      ac.abort();
      await w;
      assert.deepEqual((await env.admin.query('SELECT outcome, error FROM idem_run_attempts WHERE run_id = $1 ORDER BY claim', [run])).rows,
        [{ outcome: 'step_failed', error: 'carrier 503' }, { outcome: 'completed', error: null }]);
    });

    it('a step throwing a NUL in its message or an object with no string fails, the worker goes on', async () => {
      // the NUL's failure was refused (lost until the lease ended);
      // String(Object.create(null)) threw in the executor: an unhandled
      // rejection, which ends the process
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a'] });
      wf.external('a', async (ctx) => {
        if (ctx.attempt === 1) throw ctx.runId.endsWith(':nul') ? new Error('bad \0 byte') : Object.create(null);
        return {};
      });
      const c = await connect();
      for (const r of ['nul', 'bare']) await wf.start(c, `${q}:${r}`, { input: {} });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 30, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await statuses(q)).completed === 2, 10, 'the completed runs');
      ac.abort();
      await w;
      const errors = (await env.admin.query("SELECT error FROM idem_run_attempts WHERE run_id LIKE $1 || ':%' AND outcome = 'step_failed' ORDER BY run_id", [q])).rows;
      assert.deepEqual(errors.map((r) => r.error), ['[object Object]', 'Error: bad \\x00 byte']);
    });

    it('a client_encoding that connect() set changes no value, and an emoji failure is recorded', async () => {
      // node-postgres writes UTF-8: on a client set to LATIN1 the server read
      // café as cafÃ©, in the input, the result and the failure alike
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a'] });
      wf.external('a', async (ctx) => {
        if (ctx.attempt === 1) throw new Error('caf\u00e9 \u{1f600}');
        return { v: ctx.input.v };
      });
      const latin1 = async () => { const c = await connect(); await c.query("SET client_encoding TO 'LATIN1'"); return c; };
      const run = `${q}:latin1`;
      const c = await connect();
      await wf.start(c, run, { input: { v: 'caf\u00e9' } });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(latin1, [wf], { concurrency: 1, lease: 30, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => (await statuses(q)).completed === 1, 10, 'the completed run');
      ac.abort();
      await w;
      assert.deepEqual((await env.admin.query('SELECT error FROM idem_run_attempts WHERE run_id = $1 AND outcome = $2', [run, 'step_failed'])).rows,
        [{ error: 'Error: caf\u00e9 \u{1f600}' }]);
      assert.equal((await one('SELECT response::text AS r FROM idem_run_steps($1)', [run])).r, '{"v": "caf\u00e9"}');
    });

    if (target === 'direct') {
      // a LATIN1 database of the cluster with idem, a fresh queue in it, and
      // a client of it
      const latin1Queue = async (maxAttempts) => {
        const dsn = { ...env.targets.direct, database: 'idemlatin1' };
        if ((await env.admin.query("SELECT 1 FROM pg_database WHERE datname = 'idemlatin1'")).rows.length === 0) {
          await env.admin.query("CREATE DATABASE idemlatin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
        }
        const connect1 = async () => { const c = new pg.Client(dsn); await c.connect(); return c; };
        const a = await connect1();
        await a.query('CREATE EXTENSION IF NOT EXISTS idem');
        const q = `nodel1q${++queueNo}`;
        await a.query("SELECT idem_queue_create($1, max_attempts => $2::integer, backoff_base => '50 ms', jitter => 'none')", [q, maxAttempts]);
        return { a, q, connect1 };
      };

      it('a step throwing what a LATIN1 database cannot hold fails, the character escaped', async () => {
        // the server refused to convert the emoji (22P05): the failure was
        // not recorded and the run waited out its lease
        const { a, q, connect1 } = await latin1Queue(3);
        const wf = new idem.Workflow(q, { steps: ['a'] });
        wf.external('a', async (ctx) => {
          if (ctx.attempt === 1) throw new Error('caf\u00e9 \u{1f600}');
          return {};
        });
        const run = `${q}:r1`;
        await wf.start(a, run, { input: {} });
        const ac = new AbortController();
        const w = new idem.Worker(connect1, [wf], { concurrency: 1, lease: 60, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
        try {
          await until(async () => (await a.query('SELECT status FROM idem_runs WHERE run_id = $1', [run])).rows[0].status === 'completed', 10, 'the completed run');
        } finally {
          ac.abort();
          await w;
        }
        assert.deepEqual((await a.query('SELECT error FROM idem_run_attempts WHERE run_id = $1 AND outcome = $2', [run, 'step_failed'])).rows,
          [{ error: 'Error: caf\u00e9 \\U0001f600' }]);
        await a.end();
      });

      for (const next of ['a statement', 'a value']) it(`an external result a LATIN1 database cannot hold fails that step (next: ${next})`, async () => {
        // held for the next step's call, it was refused with it and again as
        // the failure's first statement (or, before a step that writes
        // nothing, dropped from the hold, and that step's failure refused as
        // out of sequence): the failure was not recorded, and the run waited
        // out its lease at every attempt
        const { a, q, connect1 } = await latin1Queue(2);
        const wf = new idem.Workflow(q, { steps: ['quote', 'pay'] });
        wf.external('quote', async () => ({ note: 'caf\u00e9 \u{1f600}' }))
          .step('pay', async (ctx) => (next === 'a value' ? { paid: true }
            : ctx.execute('SELECT $1::text AS note', [ctx.results.quote.note])));
        const run = `${q}:r1`;
        await wf.start(a, run, { input: {} });
        const ac = new AbortController();
        const w = new idem.Worker(connect1, [wf], { concurrency: 1, lease: 60, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
        try {
          await until(async () => (await a.query('SELECT status FROM idem_runs WHERE run_id = $1', [run])).rows[0].status === 'failed', 10, 'the failed run');
        } finally {
          ac.abort();
          await w;
        }
        const rows = (await a.query('SELECT outcome, step, error FROM idem_run_attempts WHERE run_id = $1 ORDER BY claim', [run])).rows;
        assert.deepEqual(rows.map((r) => [r.outcome, r.step]), [['step_failed', 'quote'], ['failed', 'quote']]);
        assert.ok(rows.every((r) => /LATIN1/.test(r.error)), JSON.stringify(rows));
        await a.end();
      });
    }

    it('a step that throws after its call does not record its neighbour again', async () => {
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['label', 'refund'] });
      wf.external('label', async () => ({ label_id: 'LBL-1' }))
        .step('refund', async (ctx) => {
          await ctx.execute('INSERT INTO wf_refunds (run_id, amount, label_id) VALUES ($1, 25, $2)',
            [ctx.runId, ctx.results.label.label_id]);
          throw new Error('after the call');
        });
      const run = `${q}:late`;
      const c = await connect();
      await wf.start(c, run, { input: {} });
      await c.end();
      const sent = [];
      const counting = countingConnect(connect, sent);
      const ac = new AbortController();
      const w = new idem.Worker(counting, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {}, info() {} } }).run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [run])).status === 'completed', 20, 'the completed run');
      await new Promise((r) => setTimeout(r, 300));
      ac.abort();
      await w;
      assert.equal(sent.filter((t) => t.includes('idem_step_complete')).length, 0);
      const steps = (await env.admin.query('SELECT step, attempts FROM idem_run_steps($1)', [run])).rows;
      assert.deepEqual(steps.map((s) => [s.step, s.attempts]), [['label', 1], ['refund', 1]]);
    });

    it('a step that throws after its statement committed is completed; the run goes on', async () => {
      // idem_step_fail was refused (a completed step cannot fail) and the run
      // sat under its lease until it expired, an attempt counted
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a', 'b'] });
      wf.step('a', async (ctx) => {
        await ctx.execute('UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1', [q]);
        throw new Error('after the call');
      }).step('b', (ctx) => ({ b: ctx.results.a.rowcount }));
      const run = `${q}:after`;
      const c = await connect();
      await wf.start(c, run, { input: {} });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 30, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } });
      const done = w.run();
      await until(async () => (await one('SELECT status FROM idem_runs WHERE run_id = $1', [run])).status === 'completed', 10, 'the completed run');
      ac.abort();
      const stats = await done;
      assert.equal(stats.completed, 1);
      assert.equal(stats.failedSteps, 0);
      assert.deepEqual((await env.admin.query('SELECT outcome FROM idem_run_attempts WHERE run_id = $1', [run])).rows.map((r) => r.outcome), ['completed']);
      assert.equal((await one('SELECT on_hand FROM wf_stock WHERE sku = $1', [q])).on_hand, 1);
    });

    it('a run nested deeper than the parser reads fails its step; the worker goes on', async () => {
      // its RangeError failed the claim: the run and the others of that claim
      // waited for their leases, at each claim of the run
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a'] });
      wf.external('a', async () => ({}));
      await env.admin.query("SELECT idem_run_begin($1, steps => ARRAY['a'], queue => $2," +
        " input => (repeat('[', 5000) || repeat(']', 5000))::jsonb)", [`${q}:deep`, q]);
      const c = await connect();
      await wf.start(c, `${q}:plain`, { input: {} });
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 2, lease: 30, poll: 0.1, signal: ac.signal, log: { warn() {}, error() {} } }).run();
      await until(async () => { const s = await statuses(q); return s.failed === 1 && s.completed === 1; }, 10, 'the deep run failed, the other completed');
      ac.abort();
      assert.equal((await w).completed, 1);
      assert.match((await one('SELECT last_error FROM idem_runs WHERE run_id = $1', [`${q}:deep`])).last_error, /RangeError/);
    });

    it('a taken-over run stops its holder: fenced, nothing executed, no next step', async () => {
      const q = await freshQueue();
      const wf = new idem.Workflow(q, { steps: ['a', 'b'] });
      const calls = [];
      let taken = null;
      wf.step('a', async (ctx) => {
        calls.push('a');
        await env.admin.query("UPDATE idem.runs SET due_at = now() - interval '1 s' WHERE run_id = $1", [ctx.runId]);
        taken = (await env.admin.query("SELECT run_id, attempt FROM idem_run_claim($1, worker => 'thief', lease => '1 h')", [q])).rows;
        return ctx.execute('UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1', [q]);
      }).step('b', () => { calls.push('b'); return {}; });
      const c = await connect();
      await wf.start(c, `${q}:t`);
      await c.end();
      const ac = new AbortController();
      const w = new idem.Worker(connect, [wf], { concurrency: 1, lease: 5, poll: 0.1, signal: ac.signal, name: 'old' });
      const done = w.run();
      await until(async () => w.stats.lost === 1, 10, 'the holder to see the takeover');
      ac.abort();
      const stats = await done;
      assert.deepEqual(taken, [{ run_id: `${q}:t`, attempt: 2 }]);
      assert.deepEqual(calls, ['a']);
      assert.equal(stats.steps, 0);
      assert.equal((await one('SELECT on_hand FROM wf_stock WHERE sku = $1', [q])).on_hand, 0);
      assert.deepEqual((await env.admin.query('SELECT outcome FROM idem_run_attempts WHERE run_id = $1 ORDER BY claim', [`${q}:t`])).rows.map((r) => r.outcome),
        ['lease_expired', null]);
    });

    it('worker processes SIGKILLed at random: each effect once, every attempt on record', async () => {
      const q = await freshQueue();
      const car = await carrier({ busy: 0.2, delay: 300, retryAfter: '0' }).listen();
      const wf = make(car.url, q);
      // enough runs that the six kills (each waiting for a worker with work
      // in hand) come before the last run completes, on a fast machine too
      const n = 40;
      await startRuns(connect, wf, q, n);
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-nodewf.'));
      const log = path.join(dir, 'claims');
      const procs = [];
      const names = [];
      const exits = new Map();
      const spawnWorker = (slot) => {
        const name = `w${slot}-${names.length}`;
        names.push(name);
        const p = spawn(process.execPath, [path.join(__dirname, '..', 'fixtures', 'workflow-worker.js'),
          JSON.stringify(env.targets[target]), car.url, q, name, log], { stdio: 'inherit' });
        exits.set(p, new Promise((r) => p.on('exit', (code, sig) => r(code ?? sig))));
        procs[slot] = { p, name };
      };
      const claimed = (name) => fs.existsSync(log) && fs.readFileSync(log, 'utf8').split('\n').some((l) => l.split(' ')[2] === name);
      for (let s = 0; s < 3; s++) spawnWorker(s);
      let kills = 0;
      const deadline = Date.now() + 120000;
      while (((await statuses(q)).completed || 0) < n) {
        assert.ok(Date.now() < deadline, `not done: ${JSON.stringify(await statuses(q))}`);
        await new Promise((r) => setTimeout(r, 100 + Math.random() * 400));
        const slot = Math.floor(Math.random() * 3);
        if (kills < 6 && claimed(procs[slot].name)) {
          procs[slot].p.kill('SIGKILL');
          await exits.get(procs[slot].p);
          kills++;
          spawnWorker(slot);
        }
      }
      const ready = (name) => fs.readFileSync(log, 'utf8').split('\n').includes(`ready ${name}`);
      try {
        await until(async () => procs.every(({ name }) => ready(name)), 30, 'the workers to be up');
        for (const { p } of procs) p.kill('SIGTERM');
        for (const { p } of procs) assert.equal(await exits.get(p), 0);
      } finally {
        for (const { p } of procs) p.kill('SIGKILL');
        car.close();
      }
      await checkExactlyOnce(q, n, car);
      assert.equal(kills, 6);
      const logged = new Set(fs.readFileSync(log, 'utf8').split('\n').filter((l) => l.startsWith('claim ')).map((l) => l.split(' ').slice(1, 3).join(' ')));
      const recorded = new Set((await env.admin.query("SELECT run_id || ' ' || worker AS k FROM idem_run_attempts WHERE run_id LIKE $1 || ':%'", [q])).rows.map((r) => r.k));
      for (const k of logged) assert.ok(recorded.has(k), `claim ${k} not on record`);
      const expired = Number((await one("SELECT count(*) AS n FROM idem_run_attempts WHERE run_id LIKE $1 || ':%' AND outcome = 'lease_expired'", [q])).n);
      assert.ok(expired >= kills, `${expired} expired attempts for ${kills} kills`);
      fs.rmSync(dir, { recursive: true, force: true });
    });
  });
}
