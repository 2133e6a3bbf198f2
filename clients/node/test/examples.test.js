'use strict';
// The workflow example of clients/README.md is examples/returns.js: the
// README shows that file as it is (checked here), and it runs as written.
const { it, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { start } = require('./cluster.js');

const top = path.join(__dirname, '..', '..');
let env;
before(async () => { env = await start({ pooler: false }); });
after(async () => { await env.stop(); });

it('clients/README.md shows examples/returns.js as it is', () => {
  const text = fs.readFileSync(path.join(top, 'README.md'), 'utf8');
  const m = /From `node\/examples\/returns\.js`[\s\S]*?\n```js\n([\s\S]*?)```/.exec(text);
  assert.ok(m, 'no js block for node/examples/returns.js');
  assert.equal(m[1], fs.readFileSync(path.join(top, 'node', 'examples', 'returns.js'), 'utf8'));
});

it('the Node example runs as written', async () => {
  // the setup the README shows before the example
  const text = fs.readFileSync(path.join(top, 'README.md'), 'utf8');
  // (the test cluster has the topic already)
  await env.admin.query(/From `python\/examples\/returns\.py` needs[\s\S]*?\n```sql\n([\s\S]*?)```/.exec(text)[1]
    .replace("SELECT idem_outbox_create_topic('refunds');", ''));
  const d = env.targets.direct;
  const out = execFileSync(process.execPath, [path.join(top, 'node', 'examples', 'returns.js')],
    { env: { ...process.env, PGHOST: d.host, PGPORT: String(d.port), PGUSER: d.user, PGDATABASE: d.database,
      NODE_PATH: `${path.join(top, 'node')}:${path.join(top, 'node', 'node_modules')}` },
      encoding: 'utf8', timeout: 60000 });
  assert.deepEqual(out.trim().split('\n'), ['check completed', 'label completed', 'refund completed',
    'notify completed', 'step_failed completed', '4 [{"amount":"25.00","label_id":"LB-1"}]']);
  const notify = (await env.admin.query("SELECT response::text AS r FROM idem_run_steps('returns:acme:ret-4471') WHERE step = 'notify'")).rows[0].r;
  assert.equal(notify, '{"to": "cust-17", "refund": "25.00"}');
});
