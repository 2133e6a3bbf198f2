'use strict';
// idem from Node: node-postgres (pg) helpers for idempotent business writes.
//
// A small helper, not a framework.  execute() and step() run inside the
// application's transaction (the caller commits); retry() re-runs a whole
// transaction function for exactly the errors idem_retry_advice says to
// retry.  Every argument is sent as a string (null stays NULL) and typed by
// the statement; per-call options go into idem_call itself, never into a
// session SET that would leak through a pooler; queries are unnamed, so
// PgBouncer in transaction mode works as it is.
//
// JSON numbers in responses are kept exact the way pg keeps numeric
// columns: a number with a fraction or exponent, or beyond 2^53, comes
// back as the string the server wrote ('25.00'); small integers as numbers.

// node-postgres' conventions: a server error is an Error with .code (the
// SQLSTATE), .severity, .detail, .hint, .position, .where, .schema, .table,
// .column, .constraint...  idem's errors keep all of them (copied from the
// driver's error, which stays as .cause) and add .sqlstate, the same as .code.
const PG_FIELDS = ['severity', 'position', 'internalPosition', 'internalQuery', 'where', 'schema',
  'table', 'column', 'dataType', 'constraint', 'file', 'line', 'routine'];
class IdemError extends Error {
  constructor(message, { sqlstate, detail, hint, cause } = {}) {
    super(message, cause ? { cause } : undefined);
    this.name = this.constructor.name;
    this.sqlstate = sqlstate || this.constructor.sqlstate;
    this.code = this.sqlstate;
    this.detail = detail;
    this.hint = hint;
    for (const f of PG_FIELDS) if (cause && cause[f] !== undefined) this[f] = cause[f];
    if (this.severity === undefined) this.severity = 'ERROR';
  }
}
const kinds = {
  KeyReused: 'ID422', // the key was used for a different request
  InProgress: 'ID409', // the key is held by a concurrent transaction (wait off)
  NestedKey: 'ID508', // a business statement called idem with its own key
  RunNotFound: 'ID404', // no such run for the current role
  StepUndeclared: 'ID400', // a step name the run did not declare
  RunNotRunning: 'ID423', // the run is failed or completed
  OutOfSequence: 'ID425', // earlier declared steps have not all completed
  EventNotFound: 'IDE04', // no such outbox event (never written, or purged)
  LeaseLost: 'ID412', // the lease token no longer holds the run or event: stop working on it
};
const errors = { IdemError };
const bySqlstate = {};
for (const [name, sqlstate] of Object.entries(kinds)) {
  const cls = { [name]: class extends IdemError {} }[name];
  cls.sqlstate = sqlstate;
  errors[name] = bySqlstate[sqlstate] = cls;
}

// The key's recorded outcome is a business error (idem.cache_errors):
// thrown on the execution that recorded it and on every replay.
class CachedError extends IdemError {
  constructor(error, replayed) {
    super(error.message, error);
    this.replayed = replayed;
  }
}
errors.CachedError = CachedError;

// a JSON number, matched where the parse is (sticky), however long: a
// numeric may have thousands of digits
const NUMBER = /-?\d+(\.\d+)?([eE][+-]?\d+)?/y;

function parseExact(text) {
  let i = 0;
  const ws = () => { while (' \t\n\r'.includes(text[i])) i++; };
  function value() {
    ws();
    const c = text[i];
    if (c === '{') {
      const o = {};
      i++; ws();
      if (text[i] === '}') { i++; return o; }
      for (;;) {
        ws();
        const k = string();
        ws(); i++; // ':'
        o[k] = value();
        ws();
        if (text[i++] === '}') return o;
      }
    }
    if (c === '[') {
      const a = [];
      i++; ws();
      if (text[i] === ']') { i++; return a; }
      for (;;) {
        a.push(value());
        ws();
        if (text[i++] === ']') return a;
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, i)) { i += word.length; return v; }
    }
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (!m) throw new SyntaxError(`bad JSON at ${i}`);
    i += m[0].length;
    const n = Number(m[0]);
    return !m[1] && !m[2] && Number.isSafeInteger(n) ? n : m[0];
  }
  function string() {
    const start = i;
    i++;
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  }
  return value();
}

function toArg(v) {
  if (v === null || v === undefined) return null;
  if (typeof v === 'string') return v;
  if (v instanceof Date) return v.toISOString();
  if (typeof v === 'object') return toJson(v);
  return String(v);
}

// The JSON text of a value: JSON.stringify's, with a BigInt as the exact
// number it is (JSON.stringify throws on one), read back as parseExact
// reads numbers, and NaN and the infinities refused (RangeError).  A
// workflow's input and results are written with it: a string is a JSON
// string there, not toArg's text.
// NaN and the infinities have no JSON number: JSON.stringify writes null,
// a value changed silently (Python's dumps refuses them too).
// A Map or a Set has no JSON of its own either: JSON.stringify writes {},
// its entries lost (Python's dumps refuses a set).
function finite(key, x) {
  if (typeof x === 'number' && !Number.isFinite(x)) throw new RangeError(`${x} has no JSON number`);
  if (x instanceof Map || x instanceof Set) {
    throw new TypeError(`a ${x.constructor.name} has no JSON value: convert it (e.g. Object.fromEntries, Array.from)`);
  }
  return x;
}

function toJson(v) {
  if (typeof v === 'bigint') return v.toString();
  try {
    return JSON.stringify(v, finite);
  } catch (e) {
    if (!(e instanceof TypeError) || !/BigInt/.test(e.message)) throw e;
  }
  if (typeof v.toJSON === 'function') return toJson(v.toJSON());
  if (Array.isArray(v)) return `[${v.map((x) => toJson(x) ?? 'null').join(',')}]`;
  const members = [];
  for (const [k, x] of Object.entries(v)) {
    const t = toJson(x);
    if (t !== undefined) members.push(`${JSON.stringify(k)}:${t}`);
  }
  return `{${members.join(',')}}`;
}

// An interval's text for seconds (a number; anything else is taken as an
// interval's own text): fixed-point, as interval input refuses the exponent
// JavaScript writes below 1e-6 (1e-7), rounded up to the interval's
// microsecond, so that a Retry-After comes back no sooner than asked.
function interval(s) {
  if (s === null || s === undefined) return null;
  if (typeof s !== 'number') return s;
  if (!Number.isFinite(s)) return `${s} seconds`;
  let t = s.toFixed(6);
  if (Number(t) < s) t = (Number(t) + 1e-6).toFixed(6);
  return `${t} seconds`;
}

function translate(err) {
  const cls = err && bySqlstate[err.code];
  return cls ? new cls(err.message, { detail: err.detail, hint: err.hint, cause: err }) : err;
}

const CALL = 'SELECT response::text AS response, replayed, first_executed_at, started_key,' +
  ' started_attempt FROM idem_call(' +
  'key => $1, sql => $2, args => $3::text[], outbox_topic => $4, ttl => $5::interval,' +
  ' wait => $6::boolean, run_id => $7, step => $8, lease_token => $9::uuid,' +
  ' complete_step => $10, complete_result => $11::jsonb, start_step => $12)';

async function call(client, key, runId, stepName, sql, args, opts) {
  const ttl = interval(opts.ttl);
  const wait = opts.wait === undefined || opts.wait === null ? null : String(Boolean(opts.wait));
  let res;
  try {
    res = await client.query(CALL, [key, sql, args.map(toArg), opts.outboxTopic ?? null,
      ttl ?? null, wait, runId, stepName, opts.leaseToken ?? null, opts.completeStep ?? null,
      opts.completeResult ?? null, opts.startStep ?? null]);
  } catch (e) {
    throw translate(e);
  }
  const row = res.rows[0];
  const response = parseExact(row.response);
  if (response.error && !response.command) throw new CachedError(response.error, row.replayed);
  const out = { rows: response.rows, rowcount: response.rowcount, replayed: row.replayed,
    firstExecutedAt: row.first_executed_at };
  // a worker's start_step: the started step's key and attempt (null: it had completed)
  if (opts.startStep) out.started = { key: row.started_key, attempt: row.started_attempt };
  // a worker's step: the whole response, as the run records it
  if (opts.keepResponse) out.response = response;
  return out;
}

// Run sql once for key in the client's current transaction.
// opts: { outboxTopic, ttl (seconds or an interval string), wait }, for this call only.
function execute(client, key, sql, args = [], opts = {}) {
  return call(client, key, null, null, sql, args, opts);
}

// Run one step of a workflow run (idem_run_begin) in the current transaction;
// a run on a queue needs opts.leaseToken, its claim's (else LeaseLost, ID412).
function step(client, runId, stepName, sql, args = [], opts = {}) {
  return call(client, null, runId, stepName, sql, args, opts);
}

const adviceCache = new Map();
async function retryAdvice(client, sqlstate) {
  if (!adviceCache.has(sqlstate)) {
    const r = await client.query('SELECT idem_retry_advice($1) AS a', [sqlstate]);
    adviceCache.set(sqlstate, r.rows[0].a);
  }
  return adviceCache.get(sqlstate);
}

function sqlstateOf(err) {
  const e = err instanceof IdemError && err.cause ? err.cause : err;
  // a server's error has a severity; a socket's code (EPIPE) is no SQLSTATE
  if (e && e.severity && typeof e.code === 'string') return e.code;
  // the connection went away without an error message: class 08
  if (e && (e.syscall || /Connection terminated|not queryable/i.test(e.message))) return '08006';
  return null;
}

// Run fn(client) between BEGIN and COMMIT; on an error idem_retry_advice
// says to retry, roll back and run all of it again, after
// uniform(0, min(cap, base * 2^n)) seconds (from the doubled base for
// 'retry_later').  A broken connection is replaced by connect().  Returns
// { result, client }.
async function retry(connect, fn, { attempts = 8, base = 0.05, cap = 5, client = null,
  onRetry = null, sleep = (s) => new Promise((r) => setTimeout(r, s * 1000)) } = {}) {
  for (let attempt = 0; ; attempt++) {
    let broken = false;
    if (!client) {
      client = await connect();
      client.on('error', () => {}); // a terminated backend: seen by the next query
    }
    try {
      await client.query('BEGIN');
      const result = await fn(client);
      await client.query('COMMIT');
      return { result, client };
    } catch (err) {
      const state = sqlstateOf(err);
      try { await client.query('ROLLBACK'); } catch (e) { broken = true; }
      if (err instanceof CachedError || state === null || attempt === attempts - 1) throw err;
      if (broken) {
        client.end().catch(() => {});
        client = await connect();
        client.on('error', () => {});
      }
      const advice = await retryAdvice(client, state);
      if (advice === 'never') throw err;
      const shift = attempt + (advice === 'retry_later' ? 1 : 0);
      const delay = Math.random() * Math.min(cap, base * 2 ** shift);
      if (onRetry) onRetry(err, delay);
      await sleep(delay);
    }
  }
}

// Thrown by an outbox handler or a workflow step: the downstream asked to
// be called again no earlier than `seconds` from now.  seconds may be a
// number or an HTTP Retry-After value (delay seconds or an HTTP date);
// null or undefined: later, at the server's backoff.
class RetryAfter extends Error {
  constructor(seconds, message = 'retry after') {
    super(message);
    this.name = 'RetryAfter';
    this.seconds = retryAfterSeconds(seconds);
  }
}
// The database encoding (server_encoding) of each client the helpers
// opened, read by speakUtf8.
const serverEncodings = new WeakMap();

// A claim needs READ COMMITTED (0A000 in a transaction of a snapshot's
// isolation): where a role's or the database's default isolation is
// REPEATABLE READ or SERIALIZABLE, a worker's claims, and a consumer's
// claims that wait, run in a READ COMMITTED transaction block of their own.
// Setting the session's default instead would leak to other clients'
// transactions behind a transaction pooler, which keeps such a SET on the
// server session.
async function claimsInBlock(client) {
  const r = await client.query('SHOW default_transaction_isolation');
  return r.rows[0].default_transaction_isolation !== 'read committed';
}

// client.query(sql, params), in a READ COMMITTED transaction block of its
// own if inBlock (claimsInBlock's answer for client)
async function readCommitted(client, inBlock, sql, params) {
  if (!inBlock) return client.query(sql, params);
  await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
  try {
    const r = await client.query(sql, params);
    await client.query('COMMIT');
    return r;
  } catch (e) {
    await client.query('ROLLBACK').catch(() => {});
    throw e;
  }
}

// node-postgres writes and reads UTF-8 only, and asks for UTF8 at connect;
// a client_encoding that connect() set otherwise made the server read each
// text as that encoding (café stored as cafÃ©).  Set back to UTF8, in the
// round trip that reads the database's encoding for failureText.
async function speakUtf8(client) {
  const r = await client.query("SET client_encoding TO 'UTF8'; SELECT current_setting('server_encoding') AS e");
  serverEncodings.set(client, r[1].rows[0].e);
}

// A character as Python's backslash escape: \xe9, \u20ac, \U0001f600.
const escapeChar = (ch) => {
  const cp = ch.codePointAt(0);
  const [tag, width] = cp < 0x100 ? ['x', 2] : cp < 0x10000 ? ['u', 4] : ['U', 8];
  return `\\${tag}${cp.toString(16).padStart(width, '0')}`;
};

// text as the database of client (a client speakUtf8 saw; none: UTF8) can
// hold it: a NUL, which no text value holds, and a lone surrogate (which
// node-postgres would send as U+FFFD) always escaped; in a LATIN1 database
// a character beyond U+00FF, in one of any other encoding but UTF8 and
// SQL_ASCII (which converts nothing) any non-ASCII one, as Node encodes no
// other.  Sent as it was, the server refused to convert it (22P05).
function encodable(text, client) {
  const enc = client ? serverEncodings.get(client) || 'UTF8' : 'UTF8';
  text = text.replace(/\0/g, '\\x00').replace(/[\uD800-\uDFFF]/gu, escapeChar);
  if (enc === 'UTF8' || enc === 'SQL_ASCII') return text;
  const max = enc === 'LATIN1' ? 0xff : 0x7f;
  return text.replace(/[^\0-\x7f]/gu, (ch) => (ch.codePointAt(0) <= max ? ch : escapeChar(ch)));
}

// What a handler's or a step's throw is recorded as (last_error): a
// RetryAfter's message, an Error's name and message, anything else (a
// string, undefined) as text; made encodable on the client that records
// it: the report of a failure failed with what the database cannot hold.
function failureText(err, client, max = Infinity) {
  let text;
  try {
    text = err instanceof RetryAfter ? err.message : err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  } catch (e) {
    text = Object.prototype.toString.call(err); // no string of its own: Object.create(null)
  }
  text = encodable(text, client);
  if (text.length <= max) return text;
  // cut between two characters: half a surrogate pair would reach the server
  // as U+FFFD
  const end = text.charCodeAt(max - 1) >= 0xd800 && text.charCodeAt(max - 1) <= 0xdbff ? max - 1 : max;
  return text.slice(0, end);
}

// Longer than any server accepts: RETRY_AFTER caps it at the server's
// idem.outbox_max_retry_after, so a far Retry-After (a year, a date in 2099,
// Infinity) is "as late as allowed", never a refused failure.
const RETRY_AFTER_MAX_S = 1e9;
// the retry_after argument of idem_outbox_fail / idem_step_fail, parameter n
const RETRY_AFTER = (n) =>
  `LEAST($${n}::interval, pg_catalog.current_setting('idem.outbox_max_retry_after')::interval)`;

// A text is a number as Python's float() reads it (a decimal, inf, nan), not
// as Number() does: '0x10' is no delay of 16 seconds but no Retry-After at
// all, as in the Python helper.
const DECIMAL = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;
function retryAfterSeconds(v) {
  if (v === null || v === undefined || v === '') return 0;
  let n;
  if (typeof v === 'number' || typeof v === 'bigint') n = Number(v);
  else {
    const text = String(v).trim();
    if (DECIMAL.test(text)) n = Number(text);
    else if (/^[+-]?inf(inity)?$/i.test(text)) n = text.startsWith('-') ? -Infinity : Infinity;
    else if (/^[+-]?nan$/i.test(text)) n = NaN;
    else {
      const when = Date.parse(text);
      if (Number.isNaN(when)) throw new TypeError(`not a Retry-After value: ${v}`);
      n = (when - Date.now()) / 1000;
    }
  }
  if (Number.isNaN(n)) return 0; // as a negative delay: now
  return Math.min(Math.max(0, n), RETRY_AFTER_MAX_S);
}

const CLAIM = 'SELECT event_id, key, topic, payload::text AS payload, run_id, step, attempt,' +
  ' lease_token, created_at, lease_until FROM idem_outbox_claim($1, max_events => $2::integer,' +
  ' lease => $3::interval, consumer => $4)';
// wakeup 'wait': a claim that finds nothing looks again, in the same
// statement, at each commit of the topic and every 200 ms, until it leases
// some or wait has passed
const CLAIM_WAIT = `${CLAIM.slice(0, -1)}, wait => $5::interval)`;
// ack or fail under a lease another consumer took over (ID412), or of an
// event already delivered: kept as delivered (ID410, with
// idem.outbox_keep_delivered) or deleted by its ack (IDE04, the default).
// The event is someone else's now.
const LOST_LEASE = new Set(['ID412', 'ID410', 'IDE04']);
// An event's last error is at most 64 kB (idem_outbox_fail refuses more:
// 22001, and consume() rejected with it); a UTF-16 code unit is at most 3
// bytes in UTF-8, 4 in any server encoding.
const EVENT_ERROR_MAX = 16384;

// The protocol's CancelRequest for the statement client is running (what
// pg's own Client#cancel sends), on a connection of its own to the same
// host and port; through PgBouncer it reaches the server session running
// the statement.  Like libpq's PQcancel it then waits for the other end
// to close (PgBouncer 1.18 dies, "bad client state", when the requester
// closes first); resolves then, with the socket's error if there was one.
function cancelRequest(client) {
  const net = require('node:net');
  return new Promise((resolve) => {
    const where = typeof client.host === 'string' && client.host.startsWith('/')
      ? { path: `${client.host}/.s.PGSQL.${client.port}` }
      : { host: client.host || 'localhost', port: client.port || 5432 };
    const s = net.connect({ ...where, allowHalfOpen: true }, () => {
      const b = Buffer.alloc(16);
      b.writeInt32BE(16, 0);
      b.writeInt32BE(80877102, 4); // the cancel request code
      b.writeInt32BE(client.processID, 8);
      b.writeInt32BE(client.secretKey, 12);
      s.write(b);
    });
    let failed = null;
    const timer = setTimeout(() => s.destroy(new Error('no answer to the cancel request')), 10000);
    s.on('error', (e) => { failed = e; });
    s.on('end', () => s.destroy());
    s.on('close', () => { clearTimeout(timer); resolve(failed); });
    s.resume();
  });
}

// Outbox consumer loop: claim, handler, ack or fail; between claims LISTEN
// on the topic's channel, idem_outbox_channel(topic) (wakeup 'notify': the
// role needs EXECUTE on it), or claims that wait (wakeup 'wait').
//
// Claims up to maxEvents due events of topic under a lease (seconds),
// awaits handler(event) for each outside any transaction, then acks it; a
// handler throwing RetryAfter(s) fails the event with retry_after s, any
// other error fails it with its message and the server's backoff.  event:
// { eventId, key, topic, runId, step, attempt, payload (exact numbers as in
// execute()), createdAt, leaseUntil }.  Deduplicate on the receiving side by
// key: a consumer that dies after its handler ran and before the ack
// delivers that event again after the lease.
//
// When nothing is due it waits for a NOTIFY of topic, and claims anyway
// every `idle` seconds (expired leases and prepared transactions send no
// NOTIFY).  With wakeup: 'wait' each claim is idem_outbox_claim(...,
// wait => idle) instead: one that finds nothing waits, in the same
// statement, until an event of topic commits (whether or not producers
// send NOTIFY: idem.outbox_notify off; without idem in
// shared_preload_libraries the server polls instead) or idle seconds pass
// (at most 3600), claiming what became due meanwhile.  It needs READ
// COMMITTED (the session's default isolation; else 0A000), and holds a server
// connection and a snapshot while it waits; a stop cancels the waiting
// claim, which then leases nothing.  Stop it with opts.signal (an
// AbortSignal); without one, SIGTERM and SIGINT stop it (the listeners are
// removed on return).
// Stopping lets the running handler finish and report; the rest of the
// batch is handed back (idem_outbox_release: due now, attempt not counted).  A lost lease
// (ID412) or an event already delivered (ID410, or IDE04 once its ack
// deleted it) is logged and skipped; a
// lost connection is replaced by connect().  An error of a claim is retried
// or thrown by the workers' rule (claimAdvice in workflow.js): a transient
// one (idem_retry_advice) or a standby's 25006 is claimed again after a
// backoff; one that retrying cannot cure (no grant, the topic dropped) ends
// the loop: consume() rejects with it.
//
// LISTEN needs a session of its own: with wakeup 'notify', connect() must
// return a pg.Client straight to the server, not through a transaction
// pooler.  wakeup 'wait' issues no LISTEN, and a claim and its wait are
// one statement, so one server session: connect() may go through PgBouncer
// in transaction mode.  Resolves to the number of events
// acknowledged.
async function consume(connect, topic, handler, { maxEvents = 10, lease = 30, consumer = null,
  idle = 5, signal = null, log = console, wakeup = 'notify' } = {}) {
  if (wakeup !== 'notify' && wakeup !== 'wait') {
    throw new TypeError(`wakeup must be 'notify' or 'wait', not ${JSON.stringify(wakeup)}`);
  }
  let stopped = false;
  let wake = null; // resolves the current wait
  let woke = false; // a NOTIFY of our topic arrived since the last claim
  let waiting = null; // { client, timer }: a claim with a wait running
  // A stop cancels a running claim with a wait.  A cancel that reaches the
  // server before the statement does is lost, so it is sent again each
  // second until the claim ends.
  const cancelWait = () => {
    const w = waiting;
    if (!w || w.timer) return;
    const send = () => cancelRequest(w.client).then((e) => {
      if (e) log.warn(`idem consumer: cancelling the wait failed: ${e.message}`);
    });
    send();
    w.timer = setInterval(send, 1000);
  };
  const stop = () => { stopped = true; if (wake) wake(); cancelWait(); };
  const signals = [];
  if (signal) {
    if (signal.aborted) return 0;
    signal.addEventListener('abort', stop, { once: true });
  } else {
    for (const sig of ['SIGTERM', 'SIGINT']) {
      process.on(sig, stop);
      signals.push(sig);
    }
  }
  let client = null;
  let inBlock = false; // the client's claims in a transaction block: claimsInBlock
  let broken = false;
  let acked = 0;
  let down = 0; // connection attempts failed in a row
  let channel = null; // the topic's NOTIFY channel, once asked for

  const open = async () => {
    const c = await connect();
    broken = false;
    try {
      await speakUtf8(c);
    } catch (e) {
      c.end().catch(() => {});
      throw e;
    }
    // a terminated backend or a server restart: seen here, acted on by the
    // next query or wait
    const lost = () => { if (c === client) { broken = true; if (wake) wake(); } };
    c.on('error', lost);
    c.on('end', lost);
    c.on('notification', (n) => {
      if (channel !== null && n.channel === channel) {
        woke = true;
        if (wake) wake();
      }
    });
    client = c;
    if (wakeup === 'wait') inBlock = await claimsInBlock(c);
    if (wakeup === 'notify') {
      if (channel === null) {
        channel = (await c.query('SELECT idem_outbox_channel($1) AS c', [topic])).rows[0].c;
      }
      await c.query(`LISTEN "${channel.replace(/"/g, '""')}"`);
    }
  };
  const close = () => {
    if (client) client.end().catch(() => {});
    client = null;
  };
  const connectionLost = (err) => {
    const state = sqlstateOf(err);
    return broken || (state !== null && /^(08|57P)/.test(state));
  };
  const pause = (seconds) => new Promise((resolve) => {
    if (stopped || woke || broken) { resolve(); return; }
    const timer = setTimeout(() => { wake = null; resolve(); }, seconds * 1000);
    wake = () => { clearTimeout(timer); wake = null; resolve(); };
  });
  // One claim; in wait mode with its wait (idle), which a stop cancels: the
  // 57014 that follows is the stop, not an error, and nothing was leased.
  const claim = async () => {
    const params = [topic, maxEvents, `${lease} seconds`, consumer];
    if (wakeup !== 'wait') return (await client.query(CLAIM, params)).rows;
    if (stopped) return [];
    const w = waiting = { client, timer: null };
    try {
      return (await readCommitted(client, inBlock, CLAIM_WAIT, [...params, `${Math.min(idle, 3600)} seconds`])).rows;
    } catch (err) {
      if (err.code === '57014') {
        // statement_timeout or someone else's cancel: claim again
        if (!stopped) log.warn(`idem consumer: wait cancelled: ${err.message}`);
        return [];
      }
      throw err;
    } finally {
      if (w.timer) clearInterval(w.timer);
      waiting = null;
    }
  };
  // An ack or fail (params: an array, or a function of the client that
  // sends it); true if it held.  A lost connection is replaced and the
  // report sent again: the token is not tied to the session, and an ack
  // that lands spares the receiver a duplicate.
  const report = async (sql, params, event) => {
    for (const again of [false, true]) {
      try {
        if (!client || broken) { close(); await open(); }
        return (await client.query(sql, typeof params === 'function' ? params(client) : params)).rows[0];
      } catch (err) {
        if (LOST_LEASE.has(err.code)) {
          log.warn(`idem consumer: event ${event.key} (attempt ${event.attempt}) not reported,` +
            ` ${err.code}: ${err.message}`);
          return null;
        }
        // a stop's cancel of the claim that arrived after it returned
        // events: the release it hit is sent again
        if (err.code === '57014' && stopped && !again) continue;
        if (!connectionLost(err)) throw err;
        close();
        if (again) {
          log.warn(`idem consumer: event ${event.key} not reported (${err.message});` +
            ' it comes back after its lease');
          return null;
        }
      }
    }
    return null;
  };

  try {
    while (!stopped) {
      woke = false;
      let rows;
      try {
        if (!client || broken) { close(); await open(); }
        rows = await claim();
        down = 0;
      } catch (err) {
        // as a worker's claim (claimAdvice); events a lost claim leased come
        // back after their lease
        const advice = await require('./workflow.js').claimAdvice(err, client, broken);
        if (advice !== 'reconnect' && advice !== 'retry' && advice !== 'retry_later') {
          log.error(`idem consumer: claim failed (${err.message}); stopping`);
          throw err;
        }
        // a new client also for a transient error: its set-up (LISTEN, the
        // claims' isolation) may be what failed
        close();
        down++;
        // 'retry_later' (a lock, a full server) from the doubled base
        const delay = Math.min(5, 0.1 * 2 ** Math.min(down + (advice === 'retry_later' ? 1 : 0), 6));
        log.warn(`idem consumer: ${err.message}; ${advice === 'reconnect' ? 'reconnecting' : 'claiming again'} in ${delay} s`);
        broken = false;
        await pause(delay);
        continue;
      }
      for (const [i, r] of rows.entries()) {
        if (stopped) {
          // hand the rest back: due now for any consumer, their attempt not
          // counted (one not reported comes back after its lease)
          for (const rest of rows.slice(i)) {
            await report('SELECT idem_outbox_release($1, $2)', [rest.event_id, rest.lease_token],
              { key: rest.key, attempt: rest.attempt });
          }
          break;
        }
        const event = { eventId: r.event_id, key: r.key, topic: r.topic, runId: r.run_id,
          step: r.step, attempt: r.attempt, createdAt: r.created_at, leaseUntil: r.lease_until };
        let failed = false;
        let failure;
        try {
          // a payload that does not parse (nested deeper than the parser's
          // stack) is the event's failure, not the loop's
          event.payload = parseExact(r.payload);
          await handler(event);
        } catch (err) {
          failed = true;
          failure = err;
        }
        if (!failed) {
          if (await report('SELECT idem_outbox_ack($1, $2)', [r.event_id, r.lease_token], event)) acked++;
        } else if (failure instanceof RetryAfter) {
          await report(`SELECT idem_outbox_fail($1, $2, $3, ${RETRY_AFTER(4)})`,
            (c) => [r.event_id, r.lease_token, failureText(failure, c, EVENT_ERROR_MAX), interval(failure.seconds)], event);
        } else {
          // a thrown non-Error (a string, undefined) is still the event's failure
          let text;
          const due = await report('SELECT idem_outbox_fail($1, $2, $3) AS due',
            (c) => [r.event_id, r.lease_token, text = failureText(failure, c, EVENT_ERROR_MAX)], event);
          if (due && due.due === null) {
            log.error(`idem consumer: event ${event.key} is dead after attempt ${event.attempt}: ${text}`);
          }
        }
      }
      if (rows.length === 0 && wakeup === 'notify') await pause(idle);
    }
  } finally {
    close();
    if (signal) signal.removeEventListener('abort', stop);
    for (const sig of signals) process.removeListener(sig, stop);
  }
  return acked;
}

const { KeyReused, InProgress, NestedKey, RunNotFound, StepUndeclared, RunNotRunning, OutOfSequence,
  EventNotFound, LeaseLost } = errors;
// listed one by one so that ES modules can import them by name
module.exports = { execute, step, retry, retryAdvice, consume, RetryAfter, RETRY_AFTER, sqlstateOf, parseExact,
  toArg, toJson, interval, failureText, speakUtf8, claimsInBlock, readCommitted, translate, IdemError, KeyReused, InProgress, NestedKey, RunNotFound, StepUndeclared,
  RunNotRunning, OutOfSequence, EventNotFound, LeaseLost, CachedError };
// the workflow layer (workflow.js) is built on the above
const workflow = require('./workflow.js');
module.exports.Workflow = workflow.Workflow;
module.exports.Worker = workflow.Worker;
module.exports.Context = workflow.Context;
