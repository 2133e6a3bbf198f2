// Compiled by test/package.test.js with tsc --noEmit --strict: the
// declarations in idem.d.ts describe the helper as it is used.  Lines
// marked @ts-expect-error must fail to compile (tsc reports an unused one).
import * as idem from 'idem-client';
import pg = require('pg');

declare const client: pg.Client;

async function use(): Promise<void> {
  const r: idem.Result = await idem.execute(client, 'refund:1', 'SELECT $1::numeric AS amount', ['25.00'],
    { outboxTopic: 'refunds', ttl: 7200 });
  const amount: idem.Json = r.rows[0].amount;
  const replayed: boolean = r.replayed;
  void amount; void replayed;
  const { result } = await idem.retry(async () => client, (c) => idem.step(c, 'run', 'a', 'SELECT 1'));
  const rows: number = result.rowcount;
  void rows;
  try {
    await idem.execute(client, 'k', 'SELECT 1');
  } catch (e) {
    if (e instanceof idem.KeyReused) {
      const code: string = e.code;
      const state: string = e.sqlstate;
      void code; void state;
    }
  }
  // @ts-expect-error: arguments are an array
  await idem.execute(client, 'k', 'SELECT $1', 'not an array');
  // @ts-expect-error: an unknown option
  await idem.execute(client, 'k', 'SELECT 1', [], { outbox_topic: 'refunds' });
  const returns = new idem.Workflow('returns', { steps: ['check', 'label'] })
    .step('check', (ctx) => ctx.execute('UPDATE stock SET n = n - 1 WHERE sku = $1', [ctx.input as string]))
    .external('label', async (ctx) => ({ key: ctx.key, attempt: ctx.attempt }), { maxAttempts: 8 });
  const started = await returns.start(client, 'returns:1', { input: { sku: 'a' } });
  const created: boolean = started.created;
  void created;
  const ac = new AbortController();
  const stats: idem.WorkerStats = await new idem.Worker(async () => client, [returns],
    { concurrency: 2, lease: 10, signal: ac.signal }).run();
  void stats.completed;
  // @ts-expect-error: steps are named in an options object
  new idem.Workflow('returns', ['check']);
  throw new idem.RetryAfter(20, 'carrier 503');
}
void use;
