'use strict';
// What a Node Worker process does besides its statements, counted rather
// than timed: the timers it creates per run while busy (concurrency 4, the
// runs enqueued beforehand) and while idle for 5 s (nothing to claim, poll
// 1 s), and the process's CPU time over each, for this tree's worker and
// for DIR/clients/node's (e.g. an earlier commit's idem.js and workflow.js),
// alternating (ABBA, after a warm-up round of each), in one process
// against one throwaway cluster.  The counts
// are exact; the CPU times move with the machine's load.
//
// Usage, as the cluster user, idem installed in $PG_CONFIG, node_modules in
// clients/node:
//   node worker_wakeups.js DIR [--runs 2000] [--rounds 2]
const ah = require('node:async_hooks');
const path = require('node:path');

const nodeDir = path.join(__dirname, '..', '..', 'clients', 'node');
const pg = require('node:module').createRequire(path.join(nodeDir, 'idem.js'))('pg');

let timers = 0;
ah.createHook({ init(id, type) { if (type === 'Timeout') timers += 1; } }).enable();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const cpuMs = (u) => (u.user + u.system) / 1000;
const { makeWorkflow } = require('./workflow_bench.js');

async function main() {
  const args = process.argv.slice(2);
  const opt = (name, d) => { const i = args.indexOf(name); return i < 0 ? d : Number(args[i + 1]); };
  const runs = opt('--runs', 2000);
  const rounds = opt('--rounds', 2);
  const libs = { 'this tree': require(path.join(nodeDir, 'idem.js')),
    compared: require(path.join(path.resolve(args[0]), 'clients', 'node', 'idem.js')) };
  const cluster = await require(path.join(nodeDir, 'test', 'cluster.js')).start({ pooler: false });
  const { admin } = cluster;
  const connect = async () => { const c = new pg.Client(cluster.targets.direct); await c.connect(); return c; };
  try {
    await admin.query(`CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);
      INSERT INTO stock SELECT 'sku-' || g, 0 FROM generate_series(0, 9) g;
      CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL, amount numeric NOT NULL,
                            label_id text NOT NULL)`);
    let n = 0;
    // a warm-up round of each first (node compiles the hot code as it runs)
    for (let r = -2; r < rounds * 2; r++) {
      const name = Object.keys(libs)[(r + 2 + ((r + 2) >> 1)) % 2]; // ABBA
      const lib = libs[name];
      const queue = `wakeups${n++}`;
      await admin.query('SELECT idem_queue_create($1)', [queue]);
      const wf = makeWorkflow(lib, queue);
      await admin.query('BEGIN');
      for (let i = 0; i < runs; i++) {
        await wf.start(admin, `${queue}:${i}`, { input: { order: `${queue}-${i}`, sku: `sku-${i % 10}`, amount: '25.00', customer: 'c' } });
      }
      await admin.query('COMMIT');
      const ac = new AbortController();
      const t0 = timers;
      const c0 = process.cpuUsage();
      const done = new lib.Worker(connect, [wf], { concurrency: 4, lease: 30, poll: 1, signal: ac.signal }).run();
      // the completions are watched on the server's side of the socket:
      // this loop creates no timer while it waits
      await admin.query(`DO $$ BEGIN
        WHILE (SELECT count(*) FROM idem_runs WHERE queue = '${queue}' AND status = 'completed') < ${runs}
        LOOP PERFORM pg_sleep(0.05); END LOOP; END $$`);
      const busyTimers = timers - t0;
      const busyCpu = cpuMs(process.cpuUsage(c0));
      const t1 = timers;
      const c1 = process.cpuUsage();
      await sleep(5000);
      const idleTimers = timers - t1 - 1; // not the sleep's own
      const idleCpu = cpuMs(process.cpuUsage(c1));
      ac.abort();
      await done;
      console.log(`${r < 0 ? 'warm-up: ' : ''}${name.padEnd(9)} busy: ${busyTimers} timers for ${runs} runs, CPU ${(busyCpu * 1000 / runs).toFixed(0)} us a run;` +
        ` idle 5 s: ${idleTimers} timers, CPU ${idleCpu.toFixed(1)} ms`);
    }
  } finally {
    await cluster.stop();
  }
}

main().catch((e) => { console.error(e); process.exit(1); });
