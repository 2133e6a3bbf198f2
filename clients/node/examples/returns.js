// A returns workflow with idem-client (clients/README.md shows this file;
// test/examples.test.js and test/doc/run.py run it).  Connects through the
// PG* environment variables; needs a queue 'returns' and the tables
// inventory and refunds.
const pg = require('pg');
const { Workflow, Worker, RetryAfter } = require('idem'); // clients/node on NODE_PATH; installed: 'idem-client'

const connect = async () => { const c = new pg.Client(); await c.connect(); return c; }; // PGHOST, PGDATABASE...
const labels = new Map(); // a carrier that deduplicates by key
const busy = [true];
async function createLabel({ idempotencyKey }) {
  if (busy.pop()) return null; // its first answer: 503, Retry-After: 1
  if (!labels.has(idempotencyKey)) labels.set(idempotencyKey, { label_id: `LB-${labels.size + 1}` });
  return labels.get(idempotencyKey);
}

const returns = new Workflow('returns', { steps: ['check', 'label', 'refund', 'notify'] })
  .step('check', (ctx) => ctx.execute( // ctx.input, ctx.results, ctx.attempt, ctx.key
    'UPDATE inventory SET qty = qty + 1 WHERE sku = $1 RETURNING qty', [ctx.input.sku]))
  .external('label', async (ctx) => {
    const r = await createLabel({ idempotencyKey: ctx.key });
    if (r === null) throw new RetryAfter('1'); // the run comes back in 1 s, never sooner
    return r;
  }, { maxAttempts: 8 })
  .step('refund', (ctx) => ctx.execute(
    'INSERT INTO refunds (return_id, amount, label_id) VALUES ($1, $2, $3) RETURNING amount',
    [ctx.input.return_id, ctx.input.amount, ctx.results.label.label_id]), { outboxTopic: 'refunds' })
  // writes nothing: its return value is recorded; numerics arrive as strings ('25.00')
  .step('notify', (ctx) => ({ to: ctx.input.customer, refund: ctx.results.refund.rows[0].amount }));

async function main() {
  const client = await connect();
  await returns.start(client, 'returns:acme:ret-4471',
    { input: { return_id: 'ret-4471', sku: 'sku-1', amount: '25.00', customer: 'cust-17' } });
  const stop = new AbortController(); // or no signal: SIGTERM/SIGINT drain the worker
  const worker = new Worker(connect, [returns], { concurrency: 4, lease: 30, signal: stop.signal }).run();
  const status = async () => (await client.query(
    "SELECT status FROM idem_runs WHERE run_id = 'returns:acme:ret-4471'")).rows[0].status;
  while (await status() !== 'completed') await new Promise((r) => setTimeout(r, 100));
  stop.abort();
  await worker;
  for (const r of (await client.query("SELECT step, state FROM idem_run_steps('returns:acme:ret-4471')")).rows) {
    console.log(r.step, r.state);
  }
  console.log((await client.query("SELECT outcome FROM idem_run_attempts WHERE run_id = 'returns:acme:ret-4471'" +
    ' ORDER BY claim')).rows.map((r) => r.outcome).join(' '));
  const qty = (await client.query("SELECT qty FROM inventory WHERE sku = 'sku-1'")).rows[0].qty;
  const refunds = (await client.query('SELECT amount, label_id FROM refunds')).rows;
  console.log(qty, JSON.stringify(refunds));
  await client.end();
}
main();
