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
  throw new idem.RetryAfter(20, 'carrier 503');
}
void use;
