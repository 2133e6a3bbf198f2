'use strict';
// Workflow benchmark from Node (issue 22): runs/s of the 4-step returns
// workflow with the Node Worker, next to the same steps written by hand with
// node-postgres; workflow_bench.py is the same benchmark from Python.
//
//   workflow  clients/node/workflow.js, Workflow + Worker: --procs worker
//             processes (default 4) of --concurrency executors each
//             (default 1): claims, heartbeats, fenced steps; the runs are
//             enqueued (idem_run_begin, one transaction) while the workers
//             poll, and the clock runs from the enqueue's commit until the
//             last run completed (its finished_at), as in workflow_bench.py
//   hand      what an application writes without a runtime, no recovery at
//             all: --procs processes of --concurrency connections each,
//             connection k of them taking orders k, k + procs * concurrency,
//             ...; per order UPDATE stock (autocommit), the label call,
//             INSERT the refund and its outbox row (one transaction), the
//             notify call
//
// 4 processes of concurrency 1 by default, as the Python benchmark's
// workers and both hand-written sides, so that the two benchmarks' ratios
// compare: one process of concurrency 4 puts the four executors' client
// work on one core and one event loop (--procs 1 --concurrency 4 measures
// that shape, the hand-written side then one process of 4 connections).
// The steps are those of workflow_bench.py; statements are unnamed on both
// sides (node-postgres' default; named ones would not work behind
// PgBouncer in transaction mode).  Each side's processes live through all
// the rounds, and a warm-up round, not counted, comes first.  Interleaved
// rounds; reports per round the runs/s of each side, the ratio
// workflow/hand and the load average, then the medians.
//
// --compare-client DIR adds a side to each round: the workflow run by
// DIR/clients/node/idem.js and workflow.js (e.g. an earlier commit's, from
// git show) against this tree's server, so that two workers are measured
// interleaved in one session; the two workflow sides swap places every
// round.  --cpu reports, per round and side, the CPU time per run of the
// client processes (each counts its own over the round) and of the server
// (the postmaster's reaped and live children, from /proc), and the
// server's commits per run.
//
// Usage, as the cluster user, idem installed in $PG_CONFIG, node_modules in
// clients/node (npm ci); bench/clients/run.sh --workflow-node does all that:
//   node workflow_bench.js [--runs 3000] [--rounds 3] [--procs 4] [--concurrency 1]
//                          [--prefetch N] [--cpu] [--compare-client DIR]
const { fork } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const top = path.join(__dirname, '..', '..');
const nodeDir = path.join(top, 'clients', 'node');
const pg = require('node:module').createRequire(path.join(nodeDir, 'idem.js'))('pg');

const STEPS = ['check', 'label', 'refund', 'notify'];
const labelCall = (key) => ({ label_id: `LBL-${key.slice(-12)}` });
const connector = (config) => async () => { const c = new pg.Client(config); await c.connect(); return c; };

function makeWorkflow(lib, queue) {
  return new lib.Workflow(queue, { steps: STEPS })
    .step('check', (ctx) => ctx.execute(
      'UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand', [ctx.input.sku]))
    .external('label', (ctx) => labelCall(ctx.key))
    .step('refund', (ctx) => ctx.execute(
      'INSERT INTO refunds (order_id, amount, label_id) VALUES ($1, $2, $3) RETURNING id',
      [ctx.input.order, ctx.input.amount, ctx.results.label.label_id]), { outboxTopic: 'refunds' })
    .step('notify', (ctx) => ({ to: ctx.input.customer }));
}

// -- the child processes --------------------------------------------------

// Each side's processes live through all the rounds, as a service's would:
// node compiles the hot code as it runs (a fresh process runs its first
// thousands of statements at several times the CPU).  A child answers each
// command of the parent, with its CPU time over the round at its end.

function workerChild({ config, concurrency, prefetch, clientDir }) {
  const lib = require(path.join(clientDir || top, 'clients', 'node', 'idem.js'));
  let running = null;
  process.on('message', async (m) => {
    if (m.cmd === 'start') {
      const ac = new AbortController();
      const opts = { concurrency, lease: 30, poll: 0.05, signal: ac.signal };
      if (prefetch !== null) opts.prefetch = prefetch;
      const cpu0 = process.cpuUsage();
      const worker = new lib.Worker(connector(config), [makeWorkflow(lib, m.queue)], opts);
      running = { ac, cpu0, done: worker.run() };
      process.send({ ready: true });
    } else if (m.cmd === 'stop') {
      running.ac.abort();
      await running.done;
      process.send({ cpu: process.cpuUsage(running.cpu0) });
    }
  });
}

// --concurrency connections a process, as many as a worker process has
// executors, each taking every (procs * concurrency)th order.
function handChild({ config, concurrency }) {
  let clients = [];
  const orders = async (c, runs, tag, first, stride) => {
    for (let i = first; i < runs; i += stride) {
      const order = `${tag}-${i}`;
      await c.query('UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand', [`sku-${i % 10}`]);
      const label = labelCall(order);
      await c.query('BEGIN');
      const id = (await c.query('INSERT INTO refunds (order_id, amount, label_id) VALUES ($1, $2, $3) RETURNING id',
        [order, '25.00', label.label_id])).rows[0].id;
      // the payload's amount a JSON number, as the Python side writes it
      await c.query("INSERT INTO hand_outbox (topic, payload) VALUES ('refunds', $1)",
        [`{"id": ${id}, "amount": 25.00}`]);
      await c.query('COMMIT');
      ({ to: `cust-${i}` }); // notify: no database
    }
  };
  process.on('message', async ({ cmd, tag, runs, procs, index }) => {
    // connections a round, as the workers' clients: their statistics reach
    // the server when they end
    if (cmd === 'connect') {
      clients = await Promise.all(Array.from({ length: concurrency }, () => connector(config)()));
      process.send({});
      return;
    }
    const cpu0 = process.cpuUsage();
    await Promise.all(clients.map((c, j) => orders(c, runs, tag, index * concurrency + j, procs * concurrency)));
    await Promise.all(clients.map((c) => c.end()));
    process.send({ cpu: process.cpuUsage(cpu0) });
  });
}

// Processes of one side: send(i, message) resolves to child i's answer.
function spawnSide(kind, args, n) {
  const procs = Array.from({ length: n }, () => fork(__filename, ['--child', kind, JSON.stringify(args)],
    { stdio: 'inherit' }));
  const send = (i, m) => new Promise((resolve) => { procs[i].once('message', resolve); procs[i].send(m); });
  const all = (f) => Promise.all(procs.map((_, i) => send(i, f(i))));
  // disconnected, a child has nothing left to wait for and ends
  return { all, end: () => procs.forEach((p) => p.disconnect()) };
}

// -- the parent -----------------------------------------------------------

const TICK = 100; // USER_HZ, what /proc/PID/stat counts in on Linux

// CPU seconds of the postmaster's children: those it reaped and those alive.
function serverCpu(pid) {
  const fields = (p) => fs.readFileSync(`/proc/${p}/stat`, 'utf8').split(')').pop().trim().split(/\s+/);
  const own = fields(pid);
  let total = Number(own[13]) + Number(own[14]);
  for (const p of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    let f;
    try { f = fields(p); } catch { continue; }
    if (Number(f[1]) === pid) total += Number(f[11]) + Number(f[12]);
  }
  return total / TICK;
}

async function snapshot(admin, pid) {
  const x = (await admin.query('SELECT xact_commit::bigint AS x FROM pg_stat_database' +
    ' WHERE datname = current_database()')).rows[0].x;
  return { server: serverCpu(pid), xacts: Number(x) };
}

// CPU per run: the children's own (seconds), the server's, and commits.
async function cpuPerRun(admin, pid, before, children, n) {
  await new Promise((r) => setTimeout(r, 1000)); // the backends' statistics reach the server
  const after = await snapshot(admin, pid);
  const client = children.reduce((s, { cpu }) => s + (cpu.user + cpu.system) / 1e6, 0);
  return { client: client / n, server: (after.server - before.server) / n, commits: (after.xacts - before.xacts) / n };
}

async function roundHand(o, env, side, tag) {
  await side.all(() => ({ cmd: 'connect' }));
  const before = o.cpu ? await snapshot(env.admin, env.pid) : null;
  const t0 = performance.now();
  const answers = await side.all((index) => ({ cmd: 'go', tag, runs: o.runs, procs: o.procs, index }));
  const rate = o.runs / ((performance.now() - t0) / 1000);
  return { rate, cpu: o.cpu ? await cpuPerRun(env.admin, env.pid, before, answers, o.runs) : null };
}

async function roundWorkflow(o, env, side, queue) {
  const { admin } = env;
  await admin.query('SELECT idem_queue_create($1)', [queue]);
  await side.all(() => ({ cmd: 'start', queue }));
  await new Promise((res) => setTimeout(res, 1000)); // the workers are up and polling an empty queue
  const wf = makeWorkflow(require(path.join(nodeDir, 'idem.js')), queue);
  await admin.query('BEGIN');
  for (let i = 0; i < o.runs; i++) {
    await wf.start(admin, `${queue}:${i}`,
      { input: { order: `${queue}-${i}`, sku: `sku-${i % 10}`, amount: '25.00', customer: `cust-${i}` } });
  }
  // the clock and the server's CPU count start as the runs become visible to
  // the workers: enqueueing is the producer's work, and the hand-written side
  // takes its orders from a counter
  const before = o.cpu ? await snapshot(admin, env.pid) : null;
  const t0 = (await admin.query('SELECT clock_timestamp() AS t')).rows[0].t;
  await admin.query('COMMIT');
  // the clock stops at the last run's completion as the server recorded it;
  // the polls only say when to look
  const count = async () => Number((await admin.query("SELECT count(*) AS n FROM idem_runs WHERE queue = $1 AND status = 'completed'",
    [queue])).rows[0].n);
  while (await count() < o.runs) await new Promise((res) => setTimeout(res, 100));
  const end = (await admin.query('SELECT max(finished_at) AS t FROM idem_runs WHERE queue = $1', [queue])).rows[0].t;
  const rate = o.runs / ((end - t0) / 1000);
  const answers = await side.all(() => ({ cmd: 'stop' }));
  return { rate, cpu: o.cpu ? await cpuPerRun(admin, env.pid, before, answers, o.runs) : null };
}

function options(argv) {
  const o = { runs: 3000, rounds: 3, procs: 4, concurrency: 1, prefetch: null, cpu: false, compareClient: null };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => { if (i + 1 >= argv.length) throw new Error(`${a} needs a value`); return argv[++i]; };
    if (a === '--cpu') o.cpu = true;
    else if (a === '--compare-client') o.compareClient = path.resolve(value());
    else if (['--runs', '--rounds', '--procs', '--concurrency', '--prefetch'].includes(a)) o[a.slice(2)] = Number(value());
    else throw new Error(`unknown argument ${a}`);
  }
  return o;
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const load = () => os.loadavg().map((x) => x.toFixed(2)).join(' ');

async function main() {
  const o = options(process.argv.slice(2));
  const say = (s) => console.log(s);
  const cluster = await require(path.join(nodeDir, 'test', 'cluster.js')).start({ pooler: false });
  try {
    const { admin } = cluster;
    const config = cluster.targets.direct;
    const data = path.join(path.dirname(cluster.log), 'data');
    const pid = Number(fs.readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
    await admin.query('ALTER SYSTEM SET synchronous_commit = off');
    await admin.query(`
      CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);
      INSERT INTO stock SELECT 'sku-' || g, 0 FROM generate_series(0, 9) g;
      CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL,
                            amount numeric NOT NULL, label_id text NOT NULL);
      CREATE TABLE hand_outbox (id bigserial PRIMARY KEY, topic text NOT NULL,
                                payload jsonb NOT NULL, created_at timestamptz DEFAULT now());`);
    await admin.query('SELECT pg_reload_conf()');
    const env = { admin, config, pid };
    say(`# start ${new Date().toISOString()} load ${load()}; node ${process.version}, ${o.procs} processes` +
      ` of concurrency ${o.concurrency}, ${o.runs} runs a round`);
    const worker = { config, concurrency: o.concurrency, prefetch: o.prefetch };
    const sides = { hand: spawnSide('hand', { config, concurrency: o.concurrency }, o.procs), workflow: spawnSide('worker', worker, o.procs) };
    if (o.compareClient) sides.compared = spawnSide('worker', { ...worker, clientDir: o.compareClient }, o.procs);
    const rates = { hand: [], workflow: [], compared: [] };
    const ratios = { workflow: [], compared: [] };
    const cpus = { hand: [], workflow: [], compared: [] };
    try {
      for (let r = 0; r <= o.rounds; r++) {
        // hand first, then the workflow sides, their order swapped every round
        const order = Object.keys(sides).filter((k) => k !== 'hand');
        if (r % 2) order.reverse();
        const got = { hand: await roundHand(o, env, sides.hand, `hand${r}`) };
        for (const k of order) got[k] = await roundWorkflow(o, env, sides[k], `bench${k}${r}`);
        const hand = got.hand.rate;
        say(`${r ? `round ${r}` : 'warm-up (not counted)'}: ${['hand', ...order].map((k) => `${k} ${got[k].rate.toFixed(0)} runs/s` +
          (k === 'hand' ? '' : ` (${(got[k].rate / hand).toFixed(2)}x)`)).join(', ')}; load ${load()}`);
        for (const k of ['hand', ...order]) {
          if (r && k !== 'hand') ratios[k].push(got[k].rate / hand);
          if (r) rates[k].push(got[k].rate);
          const c = got[k].cpu;
          if (r && c) cpus[k].push(c);
          if (c) {
            say(`  ${k.padEnd(8)} CPU per run: client ${(c.client * 1e6).toFixed(0)} us,` +
              ` server ${(c.server * 1e6).toFixed(0)} us; ${c.commits.toFixed(2)} commits per run`);
          }
        }
      }
    } finally {
      for (const side of Object.values(sides)) side.end();
    }
    say(`median over ${o.rounds} rounds of ${o.runs} runs, ${o.procs} processes of concurrency` +
      ` ${o.concurrency}, synchronous_commit off, unnamed statements: hand ${median(rates.hand).toFixed(0)} runs/s,` +
      ` workflow ${median(rates.workflow).toFixed(0)} runs/s, ratio ${median(ratios.workflow).toFixed(2)}` +
      ' (median of the rounds\' ratios)');
    if (o.compareClient) {
      say(`compared (${o.compareClient}): workflow ${median(rates.compared).toFixed(0)} runs/s,` +
        ` ratio ${median(ratios.compared).toFixed(2)}; this tree's worker / compared, median of the rounds:` +
        ` ${median(rates.workflow.map((w, i) => w / rates.compared[i])).toFixed(2)}`);
    }
    if (o.cpu) {
      const us = (xs) => `${(median(xs) * 1e6).toFixed(0)} us`;
      for (const k of Object.keys(sides)) {
        say(`median CPU per run, ${k}: client ${us(cpus[k].map((c) => c.client))},` +
          ` server ${us(cpus[k].map((c) => c.server))}`);
      }
      if (o.compareClient) {
        const total = (c) => c.client + c.server;
        say('this tree\'s worker / compared, medians of the rounds\' ratios: CPU per run, client' +
          ` ${median(cpus.workflow.map((c, i) => c.client / cpus.compared[i].client)).toFixed(2)},` +
          ` client and server ${median(cpus.workflow.map((c, i) => total(c) / total(cpus.compared[i]))).toFixed(2)}`);
      }
    }
    say(`# end ${new Date().toISOString()} load ${load()}`);
  } finally {
    await cluster.stop();
  }
}

module.exports = { makeWorkflow }; // worker_wakeups.js runs the same workflow
if (require.main === module && process.argv[2] === '--child') {
  (process.argv[3] === 'hand' ? handChild : workerChild)(JSON.parse(process.argv[4]));
} else if (require.main === module) {
  main().catch((e) => { console.error(e); process.exit(1); });
}
