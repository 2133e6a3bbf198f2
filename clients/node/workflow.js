'use strict';
// Workflows on idem's runs on queues, from Node: define the steps, run
// workers (the Python helper's Workflow and Worker, with Promises).
//
//   const returns = new Workflow('returns', { steps: ['check', 'label', 'refund', 'notify'] });
//   returns.step('check', (ctx) => ctx.execute('UPDATE stock ... WHERE sku = $1', [ctx.input.sku]));
//   returns.external('label', async (ctx) => carrier.label({ idempotencyKey: ctx.key }), { maxAttempts: 8 });
//   await returns.start(client, 'returns:acme:ret-4471', { input: { sku: 'sku-1' } });
//   await new Worker(connect, [returns], { concurrency: 4 }).run();
//
// Everything lives in the database (idem_run_claim, the fenced idem_call,
// idem_step_start/complete/fail, idem_run_extend/release); a worker killed
// at any point is replaced by any other after its lease.  A database step
// is one idem_call carrying the claim's lease token (its own transaction:
// the step's record, its business write and its outbox event commit
// together); a step that writes nothing records its return value.  An
// external step is idem_step_start (the attempt committed before the call),
// the function (ctx.key is the provider's idempotency key), then
// idem_step_complete; next to a database step, both ride on its idem_call
// (start_step: the start of the external step after it, committed with it,
// still before the call; complete_step/complete_result: the result of the
// external step before it, committed with it, or alone before a failure of
// its statement is recorded).  A step that throws fails with idem_step_fail
// (RetryAfter: no earlier than its seconds; anything else: its message, the
// runtime's backoff; the run fails after its last attempt).  LeaseLost
// (ID412) or a run no longer running (ID423) ends the work on that run.
// A claim takes runs for the free executors and, while runs are fast, a few
// ahead (prefetch): one claim for several runs.
// Leases are extended every lease/3 s while steps run; stop (an AbortSignal,
// or SIGTERM/SIGINT without one) drains: no more claims, running steps
// finish, their runs are released.  A claim's error is retried or stops
// the worker by idem_retry_advice, as in the Python workers (claimAdvice):
// run() rejects with one that retrying cannot cure, once drained.
// Every call is one statement outside
// any transaction block: PgBouncer in transaction mode works.
const os = require('node:os');

let idem; // ./idem.js, which loads this file at its end
const lib = () => idem || (idem = require('./idem.js'));

const CLAIM = 'SELECT run_id, input::text AS input, steps, next_step, attempt, lease_token::text AS token,' +
  ' results::text AS results FROM idem_run_claim($1, max_runs => $2::integer, lease => $3::interval,' +
  ' worker => $4, wait => $5::interval)';
const STOP_STATES = new Set(['ID412', 'ID423', 'ID404']);
// a run claimed ahead of a free executor should start within this (s)
const AHEAD_WAIT = 0.1;
const seconds = (s) => lib().interval(s);

class Workflow {
  constructor(name, { steps, queue = null, maxAttempts = null } = {}) {
    if (!Array.isArray(steps) || steps.length === 0 || new Set(steps).size !== steps.length) {
      throw new TypeError('steps must be a non-empty array of distinct names');
    }
    this.name = name;
    this.steps = [...steps];
    this.queue = queue || name;
    this.maxAttempts = maxAttempts;
    this.defs = new Map();
  }

  #add(name, fn, external, outboxTopic, maxAttempts) {
    if (!this.steps.includes(name)) throw new TypeError(`step ${name} is not one of ${this.name}'s steps`);
    if (this.defs.has(name)) throw new TypeError(`step ${name} of ${this.name} is defined twice`);
    this.defs.set(name, { name, fn, external, outboxTopic, maxAttempts });
    return this;
  }

  // A database step: fn(ctx) calls ctx.execute(sql, args) once.
  step(name, fn, { outboxTopic = null } = {}) { return this.#add(name, fn, false, outboxTopic, null); }

  // A step that calls out; maxAttempts raises the run's attempt limit to at
  // least that (the runtime's policy is the run's).
  external(name, fn, { maxAttempts = null } = {}) { return this.#add(name, fn, true, null, maxAttempts); }

  runMaxAttempts() {
    const limits = [...this.defs.values()].map((d) => d.maxAttempts).filter(Boolean);
    if (this.maxAttempts) limits.push(this.maxAttempts);
    return limits.length ? Math.max(...limits) : null;
  }

  // Enqueue a run in the client's transaction (or at once outside one);
  // idempotent per run id and input.  Resolves to { status, nextStep, created }.
  async start(client, runId, { input = null, backoffBase = null, backoffCap = null, jitter = null } = {}) {
    try {
      const r = await client.query('SELECT status, next_step, created FROM idem_run_begin($1, steps => $2::text[],' +
        ' input => $3::jsonb, queue => $4, max_attempts => $5::integer, backoff_base => $6::interval,' +
        ' backoff_cap => $7::interval, jitter => $8)',
      [runId, this.steps, input === null || input === undefined ? null : lib().toJson(input), this.queue, this.runMaxAttempts(),
        seconds(backoffBase), seconds(backoffCap), jitter]);
      const row = r.rows[0];
      return { status: row.status, nextStep: row.next_step, created: row.created };
    } catch (e) {
      throw lib().translate(e);
    }
  }

  // idem_queue_create for this workflow's queue (an administrator's call).
  async createQueue(client, { producers = [], workers = [], concurrency = null, maxAttempts = 5,
    backoffBase = '1 s', backoffCap = '1 h', jitter = 'full' } = {}) {
    await client.query('SELECT idem_queue_create($1, producers => $2::regrole[], workers => $3::regrole[],' +
      ' concurrency => $4::integer, max_attempts => $5::integer, backoff_base => $6::interval,' +
      ' backoff_cap => $7::interval, jitter => $8)',
    [this.queue, producers, workers, concurrency, maxAttempts, seconds(backoffBase), seconds(backoffCap), jitter]);
  }
}

// What a step function gets.
class Context {
  constructor(fields) { Object.assign(this, fields); this.response = null; }

  // The step key (an external call's idempotency key).
  async stepKey() {
    if (this.key) return this.key;
    const r = await this.client.query('SELECT idem_step_key($1, $2) AS k', [this.runId, this.step]);
    this.key = r.rows[0].k;
    return this.key;
  }

  // The database step's one statement, fenced by the lease.
  async execute(sql, args = []) {
    if (this.def.external) throw new Error(`step ${this.step} is external: it does not execute SQL`);
    if (this.response) throw new Error(`step ${this.step} already executed its statement`);
    const r = await lib().step(this.client, this.runId, this.step, sql, args,
      { outboxTopic: this.def.outboxTopic, leaseToken: this.leaseToken, ...this.fold, keepResponse: true });
    this.started = r.started || null;
    // the result the next steps see: the response a resumed run reads back (its command too)
    this.response = r.response;
    delete r.started;
    delete r.response;
    return r;
  }
}

class Worker {
  constructor(connect, workflows, { concurrency = 4, lease = 30, poll = 1, name = null, signal = null,
    log = console, prefetch = 4, unknownStepDelay = 30 } = {}) {
    if (!(concurrency >= 1)) throw new TypeError('concurrency must be at least 1');
    if (!(prefetch >= 0)) throw new TypeError('prefetch must be at least 0');
    if (!(unknownStepDelay >= 0 && unknownStepDelay <= 86400)) throw new RangeError('unknownStepDelay must be between 0 and 86400 seconds');
    this.unknownStepDelay = unknownStepDelay;
    this.connect = connect;
    this.byQueue = new Map(workflows.map((w) => [w.queue, w]));
    // a claim of the queue cannot tell whose run it took
    if (this.byQueue.size !== workflows.length) throw new TypeError('one workflow per queue: two of the workflows run on the same queue');
    this.concurrency = concurrency;
    this.prefetch = prefetch;
    this.runTime = null; // a run's, moving average (s)
    this.lease = lease;
    this.poll = poll;
    this.name = name || `${os.hostname()}:${process.pid}`;
    this.signal = signal;
    this.log = log;
    this.stats = { claimed: 0, steps: 0, completed: 0, failedSteps: 0, lost: 0, released: 0 };
    this.active = new Map(); // runId -> { token, lost }
    this.stopped = false;
  }

  async #open() {
    const c = await this.connect();
    c.on('error', () => {}); // a terminated session: seen by its next query
    try {
      await lib().speakUtf8(c);
    } catch (e) {
      c.end().catch(() => {});
      throw e;
    }
    return c;
  }

  static #broken(err) {
    const s = lib().sqlstateOf(err);
    return s !== null && /^(08|57P)/.test(s);
  }

  // Claim and run until stopped; resolves to the counts, or rejects, once
  // drained, with a claim's error that retrying cannot cure (claimAdvice).
  async run() {
    // the claimer waiting for a claim to make: its wake-up
    let room = null;
    const wakeClaimer = () => { const w = room; room = null; if (w) w(); };
    const stop = () => { this.stopped = true; wakeClaimer(); };
    const signals = [];
    if (this.signal) {
      if (this.signal.aborted) return { ...this.stats };
      this.signal.addEventListener('abort', stop, { once: true });
    } else {
      for (const sig of ['SIGTERM', 'SIGINT']) { process.on(sig, stop); signals.push(sig); }
    }
    const queue = [];
    const idle = []; // the executors waiting for a claimed run: their wake-ups
    // Whatever can end a wait wakes it, so the waits need no timers and
    // nothing wakes up only to look: a claimed run wakes an idle executor,
    // the end of the claims every executor; a stop, or a run's end that
    // leaves a claim to make, the claimer.  The claimer waiting
    // with runs queued is woken by the end of one of them, not when the
    // queue drains: by then the claim would take fewer runs.  One event
    // loop: nothing comes between a waiter's check and its wait.
    const roomMade = () => { if (room && this.#claimable(queue.length) !== null) wakeClaimer(); };
    const slots = [];
    let claimer = null;
    let beat = null;
    const every = Math.max(this.lease / 3, 0.05) * 1000;
    let beatClient = null;
    const heartbeat = async () => {
      for (const [runId, a] of this.active) {
        if (a.lost) continue;
        try {
          if (!beatClient) beatClient = await this.#open();
          await beatClient.query('SELECT idem_run_extend($1, $2::uuid, $3::interval)', [runId, a.token, `${this.lease} seconds`]);
        } catch (e) {
          if (STOP_STATES.has(e.code)) a.lost = true;
          else { if (beatClient) beatClient.end().catch(() => {}); beatClient = null; return; }
        }
      }
    };
    let beating = false;
    let failed = null; // a claim's error that retrying cannot help: run() rejects with it
    beat = setInterval(() => {
      if (beating) return;
      beating = true;
      heartbeat().finally(() => { beating = false; });
    }, every);
    try {
      // executors: each with its client, taking claimed runs in turn
      for (let i = 0; i < this.concurrency; i++) {
        slots.push((async () => {
          let client = null;
          for (;;) {
            while (queue.length === 0 && !(this.stopped && claimer === 'done')) {
              await new Promise((resolve) => idle.push(resolve));
            }
            if (queue.length === 0) break;
            const c = queue.shift();
            const began = performance.now();
            try {
              client = await this.#runOne(client, c);
            } finally {
              this.active.delete(c.runId);
              const took = (performance.now() - began) / 1000;
              this.runTime = this.runTime === null ? took : 0.8 * this.runTime + 0.2 * took;
              roomMade();
            }
          }
          if (client) await client.end().catch(() => {});
        })());
      }
      let client = null;
      let inBlock = false;
      let down = 0;
      const queues = [...this.byQueue.keys()];
      while (!this.stopped) {
        const free = this.#claimable(queue.length);
        if (free === null) {
          await new Promise((resolve) => { room = resolve; });
          continue;
        }
        let got = 0;
        try {
          if (!client) {
            client = await this.#open();
            inBlock = await lib().claimsInBlock(client);
          }
          for (const [i, q] of queues.entries()) {
            if (free - got <= 0 || this.stopped) break;
            const wait = i === queues.length - 1 && got === 0 ? `${this.poll} seconds` : null;
            const params = [q, free - got, `${this.lease} seconds`, this.name, wait];
            const r = await lib().readCommitted(client, inBlock, CLAIM, params);
            for (const row of r.rows) {
              this.stats.claimed++;
              let c;
              try {
                c = { wf: this.byQueue.get(q), runId: row.run_id, input: row.input === null ? null : lib().parseExact(row.input),
                  steps: row.steps, nextStep: row.next_step, attempt: row.attempt, token: row.token,
                  results: row.results === null ? {} : lib().parseExact(row.results) };
              } catch (e) {
                // an input nested deeper than the parser's stack (begun in SQL):
                // the step fails with it; the claim failed, and the rest of its runs
                // waited for their leases, at each claim of the run
                this.log.error(`idem worker ${this.name}: run ${row.run_id} cannot be read: ${lib().failureText(e)}`);
                this.stats.failedSteps++;
                await client.query('SELECT idem_step_fail($1, $2, $3::uuid, $4)',
                  [row.run_id, row.next_step, row.token, lib().failureText(e, client, 2000)]);
                continue;
              }
              this.active.set(c.runId, { token: c.token, lost: false });
              queue.push(c);
              const w = idle.shift();
              if (w) w();
            }
            got += r.rows.length;
          }
          down = 0;
        } catch (e) {
          // runs a lost claim took and we did not hear about come back after their lease
          const advice = await claimAdvice(e, client);
          down++;
          if (advice !== 'reconnect' && advice !== 'retry' && advice !== 'retry_later') {
            this.log.error(`idem worker ${this.name}: claim failed (${e.message}); stopping`);
            failed = e;
            this.stopped = true;
            break;
          }
          this.log.warn(`idem worker ${this.name}: claim failed (${e.message}); ` +
            (advice === 'reconnect' ? 'reconnecting' : 'claiming again'));
          // a new client also for a transient error: its set-up (the claims'
          // isolation) may be what failed
          if (client) client.end().catch(() => {});
          client = null;
          // 'retry_later' (a lock, a full server, a cancel) from the doubled base
          const shift = Math.min(down + (advice === 'retry_later' ? 1 : 0), 6);
          await new Promise((r) => setTimeout(r, Math.min(2000, 50 * 2 ** shift)));
        }
      }
      if (client) await client.end().catch(() => {});
      claimer = 'done';
      for (const w of idle.splice(0)) w();
      await Promise.all(slots);
    } finally {
      clearInterval(beat);
      if (beatClient) await beatClient.end().catch(() => {});
      if (this.signal) this.signal.removeEventListener('abort', stop);
      for (const sig of signals) process.removeListener(sig, stop);
    }
    if (failed) throw failed;
    return { ...this.stats };
  }

  // How many runs a claim would take now, or null when it should wait.
  // One claim for several runs costs the server and the worker about what
  // one run costs: claim when `ahead` runs can be taken at once, or when no
  // claimed run is left for a free executor.
  #claimable(queued) {
    const ahead = this.#ahead();
    const free = this.concurrency + ahead - this.active.size;
    return free < Math.max(ahead, 1) && (free <= 0 || queued > 0) ? null : free;
  }

  // Runs to claim beyond the free executors: up to prefetch, as many as
  // start within AHEAD_WAIT at the pace of the recent runs; none before a
  // run has ended.  A claimed run waits under its lease (the heartbeat
  // extends it), out of other workers' reach, and a killed worker's come
  // back only when their leases end, an attempt counted: so only fast runs
  // are claimed ahead.
  #ahead() {
    if (!this.prefetch || this.runTime === null) return 0;
    return Math.min(this.prefetch, Math.floor(AHEAD_WAIT * this.concurrency / Math.max(this.runTime, 1e-6)));
  }

  #lost(runId) {
    const a = this.active.get(runId);
    return !a || a.lost;
  }

  async #runOne(client, c) {
    const results = { ...c.results };
    let attempt = c.attempt;
    const start = c.steps.indexOf(c.nextStep);
    // held between two steps: an external step's result recorded with the
    // next step's call (pending), the external step the last call started
    const p = { pending: null, started: null };
    for (const name of c.steps.slice(start < 0 ? c.steps.length : start)) {
      if (this.#lost(c.runId)) { this.stats.lost++; return client; }
      if (this.stopped) return this.#release(client, c, p);
      const def = c.wf.defs.get(name);
      if (!def) {
        // a worker of an older (or newer) deploy: the step is some other
        // worker's to run, so hand the run back for a while without using
        // up its attempts
        const reason = `worker ${this.name} has no function for step '${name}' of workflow ${c.wf.name}`;
        this.log.warn?.(`idem worker ${this.name}: run ${c.runId}: ${reason}`);
        return this.#release(client, c, p, this.unknownStepDelay, reason);
      }
      try {
        if (!client) client = await this.#open();
        results[name] = await this.#step(client, c, def, results, attempt, p);
        this.stats.steps++;
        attempt = 1; // a completed step starts the count again
      } catch (e) {
        // (a step may throw anything, null and undefined too)
        if (STOP_STATES.has(e?.code)) { this.stats.lost++; return client; }
        if (Worker.#broken(e)) {
          // whether the step committed is the database's to say: hand the run back
          if (client) client.end().catch(() => {});
          return this.#release(null, c, p);
        }
        return this.#fail(client, c, name, e, p);
      }
    }
    this.stats.completed++;
    return client;
  }

  static #next(c, name) {
    const i = c.steps.indexOf(name) + 1;
    return i < c.steps.length ? c.wf.defs.get(c.steps[i]) : undefined;
  }

  async #step(client, c, def, results, attempt, p) {
    const ctx = new Context({ runId: c.runId, step: def.name, input: c.input, results, attempt,
      leaseToken: c.token, client, worker: this.name, def, key: null, fold: null });
    const next = Worker.#next(c, def.name);
    if (!def.external) {
      // the previous external step's result and the next one's start ride on this step's call
      const fold = {};
      if (p.pending) [fold.completeStep, fold.completeResult] = p.pending;
      if (next && next.external) fold.startStep = next.name;
      ctx.fold = fold;
      let value;
      try {
        value = await def.fn(ctx);
      } catch (e) {
        if (!ctx.response) throw e;
        // the step's call committed: the step is completed, which cannot fail
        // (idem_step_fail refuses it, and the run sat under its lease until it
        // expired, an attempt counted)
        this.log.warn(`idem worker ${this.name}: run ${c.runId} step ${def.name} threw after its statement committed (the step is completed): ${lib().failureText(e)}`);
      } finally {
        // the call committed the neighbours' records too, even if fn threw after it
        if (ctx.response) {
          p.pending = null;
          if (ctx.started) p.started = { step: fold.startStep, ...ctx.started };
        }
      }
      if (ctx.response) return ctx.response;
      await this.#flush(client, c, p);
      return this.#complete(client, c, def.name, value);
    }
    await this.#flush(client, c, p);
    const started = p.started;
    p.started = null;
    if (started && started.step === def.name && started.attempt !== null) {
      ctx.key = started.key;
      ctx.attempt = started.attempt;
    } else {
      const r = await client.query('SELECT step_key, attempt, completed, result::text AS result' +
        ' FROM idem_step_start($1, $2, $3::uuid)', [c.runId, def.name, c.token]);
      const row = r.rows[0];
      if (row.completed) return lib().parseExact(row.result);
      ctx.key = row.step_key;
      ctx.attempt = row.attempt;
    }
    const value = await def.fn(ctx);
    if (next && !next.external) {
      // recorded with the next step (or before whatever comes instead)
      const text = lib().toJson(value === undefined || value === null ? {} : value);
      p.pending = [def.name, text];
      return lib().parseExact(text);
    }
    return this.#complete(client, c, def.name, value);
  }

  // Record the external step's result held for the next step's call.
  async #flush(client, c, p) {
    if (!p || !p.pending) return;
    const [name, text] = p.pending;
    await this.#complete(client, c, name, undefined, text);
    // held until recorded: a failure that follows records it first, or
    // fails its step when the server refuses it (#fail)
    p.pending = null;
  }

  async #complete(client, c, name, value, text) {
    if (text === undefined) text = lib().toJson(value === undefined || value === null ? {} : value);
    await client.query('SELECT idem_step_complete($1, $2, $3::jsonb, lease_token => $4::uuid)', [c.runId, name, text, c.token]);
    return lib().parseExact(text);
  }

  async #fail(client, c, name, err, p) {
    const RetryAfter = lib().RetryAfter;
    this.stats.failedSteps++;
    try {
      if (!client) client = await this.#open();
      if (p && p.pending) {
        const held = p.pending[0];
        try {
          // the external step before it completed, whatever this one did
          await this.#flush(client, c, p);
        } catch (e) {
          if (Worker.#broken(e) || STOP_STATES.has(e.code)) throw e;
          // its result refused (a character the database cannot hold: this
          // step's call failed with it too): that step fails with it, or
          // the run waited out its lease
          [name, err] = [held, e];
        }
      }
      const after = err instanceof RetryAfter ? lib().interval(err.seconds) : null;
      const text = lib().failureText(err, client, 2000);
      const r = after === null
        ? await client.query('SELECT idem_step_fail($1, $2, $3::uuid, $4) AS due',
          [c.runId, name, c.token, text])
        : await client.query(`SELECT idem_step_fail($1, $2, $3::uuid, $4, ${lib().RETRY_AFTER(5)}) AS due`,
          [c.runId, name, c.token, text, after]);
      if (r.rows[0].due === null) this.log.error(`idem worker ${this.name}: run ${c.runId} failed at step ${name}: ${text}`);
    } catch (e) {
      if (!STOP_STATES.has(e.code)) {
        this.log.warn(`idem worker ${this.name}: could not fail run ${c.runId} step ${name}: ${e.message}`);
        if (client) client.end().catch(() => {});
        return null;
      }
    }
    return client;
  }

  async #release(client, c, p, delay = 0, reason = null) {
    try {
      if (!client) client = await this.#open();
      await this.#flush(client, c, p);
      await client.query('SELECT idem_run_release($1, $2::uuid, make_interval(secs => $3), $4)',
        [c.runId, c.token, delay, reason === null ? null : lib().failureText(reason, client, 2000)]);
      this.stats.released++;
    } catch (e) {
      if (!STOP_STATES.has(e.code)) {
        if (client) client.end().catch(() => {});
        return null;
      }
    }
    return client;
  }
}

// What a worker's or a consumer's loop does after its claim threw err (the
// Python helpers follow the same rule, idem_client._claim_advice):
// 'reconnect' where the session is gone (class 08, 57P: the server
// restarted, our backend was terminated; broken: the caller saw it end), or
// it reached a read-only server (25006: a standby, as after a failover
// before the address moves to the new primary; idem_retry_advice says
// never for a statement there, but another connection may reach the
// primary); else idem_retry_advice's answer, asked on client: 'retry' or
// 'retry_later' (claim again after the backoff), or 'never' (no grant, the
// queue or topic dropped, a bad argument: retrying cannot cure it).  null
// where err has no SQLSTATE (not the database's error) or no advice can be
// had: with no client to ask on (opening one failed: a login refused, a
// statement setting it up failed), only a full server (class 53) is
// retried.  'never' and null: the loop throws err.
async function claimAdvice(err, client, broken = false) {
  const state = lib().sqlstateOf(err);
  if (state === null) return null;
  if (broken || /^(08|57P)/.test(state) || state === '25006') return 'reconnect';
  if (!client) return state.startsWith('53') ? 'retry_later' : null;
  try {
    return await lib().retryAdvice(client, state);
  } catch (e) {
    const s = lib().sqlstateOf(e);
    return s !== null && /^(08|57P)/.test(s) ? 'reconnect' : null; // lost while asking; else no advice
  }
}

module.exports = { Workflow, Worker, Context, claimAdvice };
