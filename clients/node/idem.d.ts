// TypeScript declarations for idem.js (idem from Node: node-postgres helpers
// and workflow workers).  Numerics in responses: a JSON number with a
// fraction or exponent, or beyond 2^53, is the string the server wrote
// ('25.00'); a smaller integer is a number (see parseExact).

/** What the helpers need of a node-postgres Client (pg.Client, a pool's client). */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[]; rowCount: number | null }>;
}
/** A connected client the helpers may close (end) and listen on. */
export interface Client extends Queryable {
  end(): Promise<void>;
  on(event: string, listener: (...args: any[]) => void): unknown;
}
type ClientBase = Queryable;

/** A JSON value as idem hands it out: exact numerics as strings. */
export type Json = string | number | boolean | null | Json[] | { [key: string]: Json };

/** What a statement argument may be: sent as text, null stays NULL. */
export type Arg = string | number | bigint | boolean | Date | null | undefined | object;

export interface Result {
  rows: Array<Record<string, Json>>;
  rowcount: number;
  replayed: boolean;
  firstExecutedAt: Date;
  /** with startStep: the started step's key, and its attempt (null: it had completed) */
  started?: { key: string; attempt: number | null };
}

export interface CallOptions {
  outboxTopic?: string | null;
  /** a queued run's step: the claim's lease token */
  leaseToken?: string | null;
  /** a step's call also records this external step's result (JSON text) first */
  completeStep?: string | null;
  completeResult?: string | null;
  /** a step's call also starts this external step (idem_step_start) last */
  startStep?: string | null;
  /** seconds, or an interval string ('2 hours') */
  ttl?: number | string | null;
  wait?: boolean | null;
}

/** Run sql once for key in the client's current transaction. */
export function execute(client: ClientBase, key: string, sql: string, args?: Arg[],
  opts?: CallOptions): Promise<Result>;
/** Run one step of a workflow run in the client's current transaction. */
export function step(client: ClientBase, runId: string, stepName: string, sql: string, args?: Arg[],
  opts?: Omit<CallOptions, 'ttl'>): Promise<Result>;

export interface RetryOptions {
  attempts?: number;
  base?: number;
  cap?: number;
  client?: ClientBase | null;
  onRetry?: ((err: unknown, delay: number) => void) | null;
  sleep?: (seconds: number) => Promise<void>;
}
/** BEGIN; fn(client); COMMIT, run again for errors idem_retry_advice says to retry. */
export function retry<T>(connect: () => Promise<Client>, fn: (client: Client) => Promise<T>,
  opts?: RetryOptions): Promise<{ result: T; client: Client }>;
/** idem_retry_advice(sqlstate), asked once per SQLSTATE. */
export function retryAdvice(client: ClientBase, sqlstate: string): Promise<'retry' | 'retry_later' | 'never'>;
/** The SQLSTATE of an error ('08006' for a lost connection), or null. */
export function sqlstateOf(err: unknown): string | null;
/** JSON.parse keeping numerics exact: fractions, exponents and integers beyond 2^53 as strings. */
export function parseExact(text: string): Json;
/** A driver's error for one of idem's SQLSTATEs as idem's class (else the error itself). */
export function translate(err: unknown): unknown;
/** The text a value is sent as (null and undefined stay NULL). */
export function toArg(value: Arg): string | null;
/** An interval's text for seconds (fixed-point, rounded up to the microsecond); a string is returned as it is. */
export function interval(seconds: number | string | null | undefined): string | null;
/** What a handler's or a step's throw is recorded as on client (one speakUtf8 saw; none: a UTF8
 * database): a NUL, a lone surrogate and what the database's encoding cannot hold written as
 * Python's escapes (\x00, \udc80, \U0001f600); at most max UTF-16 units, cut between characters. */
export function failureText(err: unknown, client?: Queryable, max?: number): string;
/** Sets client's client_encoding back to UTF8 (node-postgres writes and reads UTF-8 only) and
 * reads its database's encoding for failureText: the worker and consume do it on every client
 * they open. */
export function speakUtf8(client: Queryable): Promise<void>;
/** Whether client's claims must run in a READ COMMITTED transaction block of their own: its
 * session's default isolation (a role's or the database's setting) is REPEATABLE READ or
 * SERIALIZABLE, at which idem_run_claim, and idem_outbox_claim with a wait, are refused (0A000).
 * The worker and consume's wait mode ask once per client they open. */
export function claimsInBlock(client: Queryable): Promise<boolean>;
/** client.query(sql, params), in a READ COMMITTED transaction block of its own if inBlock. */
export function readCommitted(client: Queryable, inBlock: boolean, sql: string, params?: unknown[]): Promise<any>;
/** The JSON text of a value (a BigInt as its exact number; NaN and the infinities are a RangeError, a Map or a Set a TypeError), as a workflow's input and results are written. */
export function toJson(value: unknown): string | undefined;

export interface OutboxEvent {
  eventId: string;
  key: string;
  topic: string;
  runId: string | null;
  step: string | null;
  attempt: number;
  createdAt: Date;
  leaseUntil: Date;
  payload: Json;
}
export interface ConsumeOptions {
  maxEvents?: number;
  lease?: number;
  consumer?: string | null;
  idle?: number;
  signal?: AbortSignal | null;
  log?: Pick<Console, 'warn' | 'error'>;
  wakeup?: 'notify' | 'wait';
}
/** Outbox consumer loop; resolves to the number of events acknowledged, or rejects with a claim's error that retrying cannot cure (idem_retry_advice 'never': no grant, the topic dropped). */
export function consume(connect: () => Promise<Client>, topic: string,
  handler: (event: OutboxEvent) => unknown | Promise<unknown>, opts?: ConsumeOptions): Promise<number>;

/** Thrown by a handler or an external step: call again no earlier than `seconds` from now. */
export class RetryAfter extends Error {
  constructor(seconds: number | string | null | undefined, message?: string);
  seconds: number;
}

/**
 * The SQL of a retry_after argument, parameter $n, capped at the server's
 * idem.outbox_max_retry_after: what the consumer loop and the worker pass
 * to idem_outbox_fail / idem_step_fail for a RetryAfter.
 */
export function RETRY_AFTER(n: number): string;

export interface ErrorFields {
  sqlstate?: string;
  detail?: string;
  hint?: string;
  cause?: unknown;
}
/** An error of idem: node-postgres' fields (.code is the SQLSTATE) and .sqlstate. */
export class IdemError extends Error {
  constructor(message: string, fields?: ErrorFields);
  static sqlstate: string | undefined;
  sqlstate: string;
  code: string;
  severity: string;
  detail?: string;
  hint?: string;
  where?: string;
  schema?: string;
  table?: string;
  column?: string;
  constraint?: string;
}
export class KeyReused extends IdemError {}
export class InProgress extends IdemError {}
export class NestedKey extends IdemError {}
export class RunNotFound extends IdemError {}
export class StepUndeclared extends IdemError {}
export class RunNotRunning extends IdemError {}
export class OutOfSequence extends IdemError {}
export class EventNotFound extends IdemError {}
export class LeaseLost extends IdemError {}
/** The key's recorded outcome is a business error (idem.cache_errors). */
export class CachedError extends IdemError {
  constructor(error: { message: string; sqlstate?: string; detail?: string; hint?: string }, replayed: boolean);
  replayed: boolean;
}

// --- workflows on runs on queues ---------------------------------------------

/** What a step function gets. */
export class Context {
  runId: string;
  step: string;
  /** the run's input (exact numerics as strings) */
  input: Json;
  /** recorded results of the completed steps, by name (a database step's: { rows, rowcount, command }) */
  results: Record<string, Json>;
  /** this step's attempt, 1 first */
  attempt: number;
  /** an external step's key (its provider's idempotency key); null in a database step until stepKey() */
  key: string | null;
  leaseToken: string;
  worker: string;
  /** the worker's client, for reads outside the step */
  client: Client;
  /** the step key (for a database step, asked of the server once) */
  stepKey(): Promise<string>;
  /** a database step's one statement, fenced by the lease */
  execute(sql: string, args?: Arg[]): Promise<Result>;
}

export type StepFn = (ctx: Context) => unknown | Promise<unknown>;

export interface StartOptions {
  input?: unknown;
  backoffBase?: number | string | null;
  backoffCap?: number | string | null;
  jitter?: 'full' | 'equal' | 'none' | null;
}

export class Workflow {
  constructor(name: string, opts: { steps: string[]; queue?: string | null; maxAttempts?: number | null });
  readonly name: string;
  readonly steps: string[];
  readonly queue: string;
  /** a database step: fn calls ctx.execute once; with outboxTopic its rows are published */
  step(name: string, fn: StepFn, opts?: { outboxTopic?: string | null }): this;
  /** a step that calls out: recorded before the call, its return value after */
  external(name: string, fn: StepFn, opts?: { maxAttempts?: number | null }): this;
  runMaxAttempts(): number | null;
  /** enqueue a run (in the client's transaction, if one is open); idempotent per run id and input */
  start(client: Queryable, runId: string, opts?: StartOptions): Promise<{ status: string; nextStep: string | null; created: boolean }>;
  createQueue(client: Queryable, opts?: { producers?: string[]; workers?: string[]; concurrency?: number | null;
    maxAttempts?: number; backoffBase?: number | string; backoffCap?: number | string; jitter?: 'full' | 'equal' | 'none' }): Promise<void>;
}

export interface WorkerOptions {
  concurrency?: number;
  /** seconds; extended every lease/3 while a step runs */
  lease?: number;
  /** seconds a claim waits in the server for due runs */
  poll?: number;
  name?: string | null;
  /** stops the worker (drain); without it SIGTERM and SIGINT do */
  signal?: AbortSignal | null;
  log?: Pick<Console, 'warn' | 'error'>;
  /** runs a claim takes beyond the free executors while runs are fast (those that start within 0.1 s at the recent pace); default 4, 0: only for free executors */
  prefetch?: number;
  /** seconds before a run whose next step this worker has no function for (a rolling deploy) is due again: handed back, its attempt not counted, the reason in last_error; default 30 */
  unknownStepDelay?: number;
}
export interface WorkerStats {
  claimed: number;
  steps: number;
  completed: number;
  failedSteps: number;
  lost: number;
  released: number;
}
export class Worker {
  constructor(connect: () => Promise<Client>, workflows: Workflow[], opts?: WorkerOptions);
  readonly name: string;
  stats: WorkerStats;
  /** claim and run until stopped; rejects, once drained, with a claim's error that retrying cannot cure (idem_retry_advice 'never': no grant, the queue dropped, a bad argument) */
  run(): Promise<WorkerStats>;
}
