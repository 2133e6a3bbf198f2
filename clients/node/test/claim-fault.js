'use strict';
// idem_run_claim and idem_outbox_claim shadowed by search_path (the Python
// tests' claim_fault.sql): a worker's or a consumer's claims raise a
// server's error of a chosen SQLSTATE.
const fs = require('node:fs');
const path = require('node:path');

const CLAIM_FAULT = fs.readFileSync(path.join(__dirname, '..', '..', 'python', 'tests', 'claim_fault.sql'), 'utf8');
// the connect option that puts the shadows first
const OPTIONS = '-c search_path=claimfault,public';

// The claims of the worker or consumer named raise sqlstate `times` times;
// resolves to a function: its claims so far.
async function claimFaults(admin, name, sqlstate, times) {
  await admin.query(CLAIM_FAULT);
  const seq = `claimfault.calls_${name}`;
  await admin.query(`DROP SEQUENCE IF EXISTS ${seq}; CREATE SEQUENCE ${seq}`);
  await admin.query('INSERT INTO claimfault.plan VALUES ($1, $2, $3, $4) ON CONFLICT (worker) DO UPDATE' +
    ' SET sqlstate = excluded.sqlstate, times = excluded.times, calls = excluded.calls', [name, sqlstate, times, seq]);
  return async () => {
    const r = (await admin.query(`SELECT last_value::int AS n, is_called FROM ${seq}`)).rows[0];
    return r.is_called ? r.n : 0;
  };
}

module.exports = { claimFaults, OPTIONS };
