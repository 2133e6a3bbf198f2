"""Workflows on idem's runs on queues: define the steps, run workers.

    from idem_client import Workflow, Worker, RetryAfter

    returns = Workflow("returns", steps=["check", "label", "refund", "notify"])

    @returns.step("check")
    def check(ctx):
        return ctx.execute("UPDATE inventory SET qty = qty - 1 WHERE sku = $1 RETURNING qty",
                           ctx.input["sku"])

    @returns.external("label", max_attempts=8)
    def label(ctx):
        r = carrier.create_label(idempotency_key=ctx.key)
        if r.status in (429, 503):
            raise RetryAfter(r.headers.get("Retry-After"))
        return r.json()

    returns.start(conn, "returns:acme:ret-4471", input={"sku": "sku-1"})   # then commit
    Worker(connect, [returns], concurrency=4).run()

Everything a run is lives in the database (idem_run_claim, the fenced
idem_call, idem_step_start/complete/fail, idem_run_extend/release): a worker
keeps nothing that another worker would need, so any worker, killed at any
point, is replaced by any other after its lease.

- A database step (``@wf.step``) is one round trip: ``ctx.execute(sql,
  *args)`` is ``idem_call`` with the run, the step and the claim's lease
  token, in a transaction of its own that records the step with its
  business write (and its outbox event, ``outbox_topic``).  A step whose
  function writes nothing records its return value (idem_step_complete).
- An external step (``@wf.external``) is idem_step_start (committed: the
  attempt is on record before the call), the function, which calls out with
  ``ctx.key`` as the provider's idempotency key, then idem_step_complete
  with its return value.  A resumed step gets the same key and the next
  ``ctx.attempt``.
- Next to a database step, those two ride on its idem_call: the start of an
  external step that follows it (start_step: committed with the step, so
  still before the call), and the result of an external step before it
  (complete_step, complete_result: committed with the step, or, if the
  step's statement fails, alone before the failure is recorded).  A worker
  killed in between leaves the external step started and not completed:
  its retry calls out again under the same key, as after any crash between
  the call and its completion.
- A step that raises fails with idem_step_fail: ``RetryAfter(s)`` no
  earlier than s seconds, any other exception with its type and message
  (its first 2000 characters, what the database's encoding cannot hold
  escaped), after the runtime's backoff; after the run's last attempt the
  run is ``failed``.  An external step's result the database refuses fails
  that step.  An error whose SQLSTATE idem_retry_advice calls transient
  (40001, 40P01...) goes the same way: the runtime's backoff is the retry.
  A database step whose function raises after its statement committed is
  completed (it cannot fail): the exception is logged.
- ``LeaseLost`` (ID412: the lease expired and another worker took the run)
  or a run no longer running (ID423, cancelled) ends the work on that run
  at once: nothing more is called for it.
- A claim takes runs for the free executors and, while runs are fast,
  a few ahead (``prefetch``): one claim for several runs.
- The worker extends the leases of its runs every lease/3 seconds while
  their steps run (a slow external call keeps its run); SIGTERM or SIGINT
  (or ``stop``) drains: no more claims, running steps finish, their runs
  are handed back (idem_run_release: due at once, the attempt not counted).
  A run whose next step the worker has no function for (a rolling deploy)
  is handed back the same way, due after ``unknown_step_delay`` seconds.
  A step raising a BaseException that is no Exception (SystemExit,
  KeyboardInterrupt, CancelledError) drains it too, and run() raises it.
- A claim's error is retried or stops the worker by idem_retry_advice
  (Node's worker does the same): a connection that could not be opened or
  is gone, or a standby (25006), is replaced; 'retry' and 'retry_later'
  claim again after a backoff; 'never' (no grant, the queue dropped, a bad
  argument), or no SQLSTATE, drains the worker and run() raises the error.
- Every call is one statement in autocommit, so workers work through
  PgBouncer in transaction mode (connect with prepare_threshold=None
  before PgBouncer 1.21).  On a connection that prepares nothing the
  worker writes its statements' values in as literals (_idem._statement).
"""

import asyncio
import contextlib
import inspect
import json
import logging
import os
import random
import signal
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional

import psycopg

import idem_client as _idem

__all__ = ["Workflow", "Worker", "AsyncWorker", "Context", "AsyncContext", "Started"]

_log = logging.getLogger("idem_client.workflow")

# a claimed run as one JSON array, parsed with Decimal numbers: one column
# for psycopg to read instead of nine (a text[] among them)
_CLAIM = ("SELECT json_build_array(run_id, next_step, lease_token, input, steps, attempt,"
          " results, started_step, started_attempts)::text"
          " FROM idem_run_claim(%s, max_runs => %s, lease => %s::interval, worker => %s,"
          " wait => %s::interval)")
# the run is over for this worker: someone else holds it, or it is not running
_STOP_STATES = ("ID412", "ID423", "ID404")
# a run claimed ahead of a free executor should start within this (s)
_AHEAD_WAIT = 0.1

# One cursor per worker connection, for every statement the worker sends:
# a new cursor per statement (what conn.execute makes) starts its type
# adaptation afresh, a sizeable share of psycopg's cost per statement.
_cursors: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    cur = _cursors.get(conn)
    if cur is None or cur.closed:
        cur = _cursors[conn] = conn.cursor()
    return cur


class Started(NamedTuple):
    status: str
    next_step: Optional[str]
    created: bool


class _Step(NamedTuple):
    name: str
    fn: Callable
    external: bool
    outbox_topic: Optional[str]
    max_attempts: Optional[int]


class Workflow:
    """A named sequence of steps, run on the queue ``queue`` (default: the
    workflow's name).  Decorate one function per step with ``step`` or
    ``external``; ``start`` enqueues a run."""

    def __init__(self, name: str, steps: List[str], *, queue: Optional[str] = None,
                 max_attempts: Optional[int] = None):
        if not steps or len(set(steps)) != len(steps):
            raise ValueError("steps must be a non-empty list of distinct names")
        self.name = name
        self.steps = list(steps)
        self.queue = queue or name
        self.max_attempts = max_attempts
        self._steps: Dict[str, _Step] = {}

    def _add(self, name, fn, external, outbox_topic, max_attempts):
        if name not in self.steps:
            raise ValueError(f"step {name!r} is not one of {self.name}'s steps {self.steps}")
        if name in self._steps:
            raise ValueError(f"step {name!r} of {self.name} is defined twice")
        self._steps[name] = _Step(name, fn, external, outbox_topic, max_attempts)
        return fn

    def step(self, name: str, *, outbox_topic: Optional[str] = None):
        """A database step: the function calls ``ctx.execute(sql, *args)``
        once (one round trip, the step's record and its business write in
        one transaction); with ``outbox_topic`` its rows are published."""
        return lambda fn: self._add(name, fn, False, outbox_topic, None)

    def external(self, name: str, *, max_attempts: Optional[int] = None):
        """A step that calls out of the database: the attempt is recorded
        before the call, the function's return value (JSON) after it.
        ``max_attempts`` raises the run's attempt limit to at least that
        (the runtime's policy is the run's, one limit for all its steps)."""
        return lambda fn: self._add(name, fn, True, None, max_attempts)

    def run_max_attempts(self) -> Optional[int]:
        """The run's max_attempts: the workflow's, raised to the largest
        max_attempts of its external steps; None: the queue's."""
        limits = [s.max_attempts for s in self._steps.values() if s.max_attempts]
        if self.max_attempts:
            limits.append(self.max_attempts)
        return max(limits) if limits else None

    _BEGIN = ("SELECT status, next_step, created FROM idem_run_begin(%s, steps => %s,"
              " input => %s::jsonb, queue => %s, max_attempts => %s,"
              " backoff_base => %s::interval, backoff_cap => %s::interval, jitter => %s)")

    def _begin_params(self, run_id, input, backoff_base, backoff_cap, jitter):
        return (run_id, self.steps, None if input is None else _idem.dumps(input), self.queue,
                self.run_max_attempts(), _idem._ttl(backoff_base), _idem._ttl(backoff_cap),
                jitter)

    def start(self, conn: psycopg.Connection, run_id: str, *, input: Any = None,
              backoff_base=None, backoff_cap=None, jitter: Optional[str] = None) -> Started:
        """Enqueue run ``run_id`` with ``input`` (JSON; Decimals stay exact)
        in the connection's transaction: it is claimable once that commits
        (autocommit: at once), so a run can be enqueued atomically with the
        business write that asks for it.  Idempotent: the same run id and
        input return the run (``created`` false); another input is
        KeyReused (ID422)."""
        try:
            row = conn.execute(self._BEGIN, self._begin_params(
                run_id, input, backoff_base, backoff_cap, jitter)).fetchone()
        except psycopg.Error as e:
            raise _translated(e)
        return Started(*_idem._texts(row))

    async def astart(self, conn: psycopg.AsyncConnection, run_id: str, *, input: Any = None,
                     backoff_base=None, backoff_cap=None,
                     jitter: Optional[str] = None) -> Started:
        """``start`` on an asyncio connection."""
        try:
            cur = await conn.execute(self._BEGIN, self._begin_params(
                run_id, input, backoff_base, backoff_cap, jitter))
            row = await cur.fetchone()
        except psycopg.Error as e:
            raise _translated(e)
        return Started(*_idem._texts(row))

    def create_queue(self, conn: psycopg.Connection, *, producers=(), workers=(),
                     concurrency: Optional[int] = None, max_attempts: int = 5,
                     backoff_base="1 s", backoff_cap="1 h", jitter: str = "full"):
        """idem_queue_create for this workflow's queue (an administrator's
        call), in the connection's transaction."""
        conn.execute("SELECT idem_queue_create(%s, producers => %s::regrole[],"
                     " workers => %s::regrole[], concurrency => %s, max_attempts => %s,"
                     " backoff_base => %s::interval, backoff_cap => %s::interval, jitter => %s)",
                     (self.queue, list(producers), list(workers), concurrency, max_attempts,
                      _idem._ttl(backoff_base), _idem._ttl(backoff_cap), jitter))


def _translated(e: psycopg.Error) -> Exception:
    err = _idem._translate(e)
    if err is not e:
        err.__cause__ = e
    return err


class Context:
    """What a step function gets: ``input`` (the run's), ``results`` (the
    recorded results of the completed steps, by name: a database step's is
    its response, {"rows", "rowcount", "command"}), ``attempt`` (of this
    step, 1 first), ``key`` (the step's key: an external call's idempotency
    key), ``run_id``, ``step``, ``worker``; ``execute`` for a database
    step's one statement; ``conn``, an autocommit connection for reads."""

    def __init__(self, run_id, step, input, results, attempt, token, conn, worker, spec, key=None,
                 fold=None):
        self.run_id = run_id
        self.step = step
        self.input = input
        self.results = results
        self.attempt = attempt
        self.lease_token = token
        self.conn = conn
        self.worker = worker
        self._spec = spec
        self._key = key
        self._response = None
        # the worker's bookkeeping that rides on execute's idem_call, and
        # the step it started
        self._fold = fold
        self._started = None

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = self.conn.execute("SELECT idem_step_key(%s, %s)",
                                          (self.run_id, self.step)).fetchone()[0]
        return self._key

    def _call_args(self, sql, args):
        if self._spec.external:
            raise RuntimeError(f"step {self.step!r} is external: it calls out, it does not"
                               " execute SQL (make the write a step of its own)")
        if self._response is not None:
            raise RuntimeError(f"step {self.step!r} already executed its statement: a database"
                               " step is one statement (a CTE or a function can do more)")
        return (_cursor(self.conn), None, self.run_id, self.step, sql, args,
                self._spec.outbox_topic, None, None, self.lease_token, self._fold)

    def _executed(self, r) -> _idem.Result:
        # the whole response, as a resumed run reads it in its results
        r, self._started, self._response = r
        return r

    def execute(self, sql: str, *args) -> _idem.Result:
        """The step's business write, fenced by the lease: one idem_call
        that records the step and commits (a completed step replays)."""
        return self._executed(_idem._call(*self._call_args(sql, args)))


class AsyncContext(Context):
    """An AsyncWorker's Context: ``await ctx.execute(sql, *args)``, and
    ``conn`` is a psycopg.AsyncConnection.  A database step's ``key`` is
    ``await ctx.step_key()`` (an external step's is ``ctx.key``)."""

    @property
    def key(self) -> str:
        if self._key is None:
            raise RuntimeError("a database step's key is read with await ctx.step_key()"
                               " in an AsyncWorker")
        return self._key

    async def step_key(self) -> str:
        if self._key is None:
            cur = await self.conn.execute("SELECT idem_step_key(%s, %s)",
                                          (self.run_id, self.step))
            self._key = (await cur.fetchone())[0]
        return self._key

    async def execute(self, sql: str, *args) -> _idem.Result:
        """The step's business write, fenced by the lease: one idem_call
        that records the step and commits (a completed step replays)."""
        return self._executed(await _idem._acall(*self._call_args(sql, args)))


class _Progress:
    """What a worker holds between two steps of a run, none of it needed by
    another worker: the result of an external step not yet recorded (it is
    recorded with the next step, or before any other call), and the
    external step that the previous step's call started (its key and
    attempt)."""

    __slots__ = ("pending", "started")

    def __init__(self):
        self.pending = None     # (step, result as JSON text)
        self.started = None     # (step, key, attempt)


class _Claimed(NamedTuple):
    wf: Workflow
    run_id: str
    input: Any
    steps: List[str]
    next_step: str
    attempt: int
    token: str
    results: dict
    started_step: Optional[str]
    started_attempts: Optional[int]


class _Sql(NamedTuple):
    """A statement one run's steps send: the driver runs it on the run's
    connection and sends back its first row."""
    sql: str
    params: tuple


class _Interrupted(Exception):
    """Thrown into a run whose step raised a BaseException that is no
    Exception (SystemExit, KeyboardInterrupt, asyncio.CancelledError): the
    run is handed back and the worker stops; run() raises the original."""


class _OnConn:
    """The ctx of a _Fn for the run's connection (the driver sets ``conn``):
    a step's exception to record on it."""
    __slots__ = ("error", "conn")

    def __init__(self, error: Exception):
        self.error = error
        self.conn = None


def _failure_text(ctx: _OnConn) -> str:
    return _idem._failure_text(ctx.error, ctx.conn)


class _Fn(NamedTuple):
    """A step function for the driver to call with its context, on the
    run's connection; it sends back the return value (awaited, if it is a
    coroutine's)."""
    fn: Callable
    ctx: Context


class _Runs:
    """What Worker (threads) and AsyncWorker (asyncio) share: the runs held
    and the claims' pace, and how one run's steps go, written once as a
    generator of what to send and call (_Sql, _Fn), which each worker's
    driver does on the run's connection, throwing back into it what they
    raised (with ``_idem_broken`` set when the connection broke)."""

    _context = Context

    def __init__(self, connect, workflows, concurrency, lease, poll, name, stop, prefetch,
                 unknown_step_delay):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch < 0:
            raise ValueError("prefetch must be at least 0")
        if not 0 <= unknown_step_delay <= 86400:
            raise ValueError("unknown_step_delay must be between 0 and 86400 seconds")
        self.unknown_step_delay = unknown_step_delay
        self.connect = connect
        self.workflows = list(workflows)
        self.by_queue = {wf.queue: wf for wf in self.workflows}
        if len(self.by_queue) != len(self.workflows):
            # a claim of the queue cannot tell whose run it took
            raise ValueError("one workflow per queue: two of the workflows run on the same queue")
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease = lease
        self.poll = poll
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._own_stop = stop is None
        self.stop = stop
        self.stats = {"claimed": 0, "steps": 0, "completed": 0, "failed_steps": 0,
                      "lost": 0, "released": 0}
        # the runs held: claimed, waiting in _work or running
        self._active: Dict[str, dict] = {}    # run_id -> {"token", "lost"}
        self._work: List[_Claimed] = []
        self._claims_over = False
        self._interrupt: Optional[BaseException] = None  # what run() raises once drained
        self._run_time: Optional[float] = None          # a run's, moving average (s)

    def _count(self, what, n=1):
        with self._lock:
            self.stats[what] += n

    # -- claims ------------------------------------------------------------

    def _claim_params(self, queues, i, q, want, got):
        # only the last queue's claim waits (in the server) for due runs
        wait = f"{self.poll} seconds" if i == len(queues) - 1 and not got else None
        return (q, want, f"{self.lease} seconds", self.name, wait)

    # -- a claim's error: _idem._claim_advice's rule ------------------------

    def _claim_failed(self, e: BaseException, advice: Optional[str], down: int) -> float:
        """The seconds to wait before the next claim after a claim raised e
        (the down-th error in a row), with _idem._claim_advice's advice.
        Raises e where retrying cannot help: advice 'never' (no grant, the
        queue dropped, a bad argument) or none (no SQLSTATE: not the
        database's error)."""
        if advice not in ("reconnect", "retry", "retry_later"):
            _log.error("idem worker %s: claim failed (%s); stopping", self.name, str(e).strip())
            raise e
        _log.warning("idem worker %s: claim failed (%s); %s", self.name, str(e).strip(),
                     "reconnecting" if advice == "reconnect" else "claiming again")
        # 'retry_later' (a lock, a full server, a cancel) from the doubled base
        return min(2.0, 0.05 * 2 ** min(down + (advice == "retry_later"), 6))

    def _claimed(self, q, row) -> _Claimed:
        r = _idem.loads(row[0])
        return _Claimed(self.by_queue[q], r[0], r[3], r[4], r[1], r[5], r[2], r[6] or {}, r[7],
                        r[8])

    _FAIL = "SELECT idem_step_fail(%s, %s, %s::uuid, %s)"

    def _unreadable(self, row, e: Exception, conn):
        """A claimed row that does not parse (an input nested deeper than
        the decoder's recursion limit: RecursionError): its first values,
        the run id, its next step and the lease token, for the step to fail
        with e on conn (it raised out of run(), at each claim of the run);
        None if they do not parse either."""
        _log.error("idem worker %s: a claimed run cannot be read: %s", self.name,
                   _idem._failure_text(e))
        dec, text, i, head = json.JSONDecoder(), row[0], 1, []
        try:
            for _ in range(3):
                value, i = dec.raw_decode(text, i)
                head.append(value)
                i += 2          # json_build_array's ", "
        except ValueError:
            return None
        return tuple(head) + (_idem._failure_text(e, conn)[:2000],)

    def _claimable(self) -> Optional[int]:
        """How many runs a claim would take now, or None when it should wait
        (under self._lock).  One claim for several runs costs the server and
        the worker about what one run costs: claim when `ahead` runs can be
        taken at once, or when no claimed run is left for a free executor."""
        ahead = self._ahead()
        free = self.concurrency + ahead - len(self._active)
        if free < max(ahead, 1) and (free <= 0 or self._work):
            return None
        return free

    def _ahead(self) -> int:
        """Runs to claim beyond the free executors (under self._lock): up to
        prefetch, as many as start within _AHEAD_WAIT at the pace of the
        recent runs; none before a run has ended.  A claimed run waits
        under its lease (the heartbeat extends it), out of other workers'
        reach, and a killed worker's runs come back only when their leases
        end, an attempt counted: so only fast runs are claimed ahead."""
        t = self._run_time
        if not self.prefetch or t is None:
            return 0
        return min(self.prefetch, int(_AHEAD_WAIT * self.concurrency / max(t, 1e-6)))

    def _note(self, c: _Claimed):
        """c is held (under self._lock)."""
        self.stats["claimed"] += 1
        self._active[c.run_id] = {"token": c.token, "lost": False}
        self._work.append(c)

    def _ended(self, c: _Claimed, took: float) -> bool:
        """c's work ended after took seconds (under self._lock); whether a
        claim is to be made now."""
        self._active.pop(c.run_id, None)
        t = self._run_time
        self._run_time = took if t is None else 0.8 * t + 0.2 * took
        return self._claimable() is not None

    # -- heartbeats --------------------------------------------------------

    _EXTEND = "SELECT idem_run_extend(%s, %s::uuid, %s::interval)"

    def _held(self):
        with self._lock:
            return [(r, a["token"]) for r, a in self._active.items() if not a["lost"]]

    def _extend_refused(self, run_id, token, e: psycopg.Error):
        if e.sqlstate in _STOP_STATES:
            # taken over, or finished: the executor sees it on its next call
            with self._lock:
                if run_id in self._active and self._active[run_id]["token"] == token:
                    self._active[run_id]["lost"] = True
        else:
            _log.warning("idem worker %s: heartbeat of %s failed: %s", self.name, run_id, e)

    # -- one run -----------------------------------------------------------

    def _lost(self, run_id):
        with self._lock:
            a = self._active.get(run_id)
            return a is None or a["lost"]

    def _run(self, c: _Claimed):
        """Run c's steps from its next one."""
        results = dict(c.results)
        attempt = c.attempt
        start = c.steps.index(c.next_step) if c.next_step in c.steps else len(c.steps)
        p = _Progress()
        for name in c.steps[start:]:
            if self._lost(c.run_id):
                self._count("lost")
                return
            if self.stop.is_set():
                yield from self._release(c, p)
                return
            spec = c.wf._steps.get(name)
            if spec is None:
                # a worker of an older (or newer) deploy: the step is some
                # other worker's to run, so hand the run back for a while
                # without using up its attempts
                reason = f"worker {self.name} has no function for step {name!r} of workflow {c.wf.name}"
                _log.warning("idem worker %s: run %s: %s", self.name, c.run_id, reason)
                yield from self._release(c, p, self.unknown_step_delay, reason)
                return
            try:
                results[name] = yield from self._step(c, spec, results, attempt, p)
                self._count("steps")
                attempt = 1     # a completed step starts the count again
            except psycopg.OperationalError as e:
                if not getattr(e, "_idem_broken", False):
                    # a server error on a live session (40001 and 40P01 are
                    # OperationalErrors too): the step's failure
                    yield from self._failed(c, name, e, p)
                    return
                # the connection broke: whether the step committed is the
                # database's to say; hand the run back so that a worker
                # claims it at once and learns
                _log.warning("idem worker %s: run %s step %s: %s", self.name, c.run_id, name,
                             str(e).strip())
                yield from self._release(c, p)
                return
            except _Interrupted:
                yield from self._release(c, p)
                return
            except Exception as e:
                yield from self._failed(c, name, e, p)
                return
        self._count("completed")

    def _failed(self, c: _Claimed, name, e: Exception, p: _Progress):
        """A step raised e: fenced (another worker has the run, or it is
        not running any more) stops here; anything else fails the step."""
        state = getattr(e, "sqlstate", None)
        if state in _STOP_STATES:
            _log.info("idem worker %s: run %s step %s stopped: %s %s", self.name, c.run_id,
                      name, state, e)
            self._count("lost")
            return
        yield from self._fail(c, name, e, p)

    @staticmethod
    def _next_spec(c: _Claimed, name) -> Optional[_Step]:
        i = c.steps.index(name) + 1
        return c.wf._steps.get(c.steps[i]) if i < len(c.steps) else None

    def _step(self, c: _Claimed, spec: _Step, results, attempt, p: _Progress):
        if not spec.external:
            # the previous external step's result and the next external
            # step's start ride on this step's idem_call
            fold = {}
            if p.pending is not None:
                fold["complete_step"], fold["complete_result"] = p.pending
            nxt = self._next_spec(c, spec.name)
            if nxt is not None and nxt.external:
                fold["start_step"] = nxt.name
            ctx = self._context(c.run_id, spec.name, c.input, results, attempt, c.token, None,
                                self.name, spec, fold=fold)
            try:
                value = yield _Fn(spec.fn, ctx)
            except Exception as e:
                if ctx._response is None or isinstance(e, _Interrupted):
                    raise
                # the step's call committed: the step is completed, which
                # cannot fail (idem_step_fail refuses it, and the run sat
                # under its lease until it expired, an attempt counted)
                _log.warning("idem worker %s: run %s step %s raised after its statement"
                             " committed (the step is completed): %s", self.name, c.run_id,
                             spec.name, _idem._failure_text(e))
            finally:
                if ctx._response is not None:
                    # the call committed the neighbours' records too, even
                    # if the function raised after it
                    p.pending = None
                    if ctx._started is not None:
                        p.started = (fold["start_step"],) + tuple(ctx._started)
            if ctx._response is not None:
                return ctx._response
            # a step that wrote nothing: its return value is its result
            yield from self._flush(c, p)
            return (yield from self._complete(c, spec.name, value))
        yield from self._flush(c, p)
        started, p.started = p.started, None
        if started is not None and started[0] == spec.name and started[2] is not None:
            key, n = started[1], started[2]
        else:
            key, n, completed, result = yield _Sql(
                "SELECT step_key, attempt, completed, result::text"
                " FROM idem_step_start(%s, %s, %s::uuid)", (c.run_id, spec.name, c.token))
            if completed:
                return _loads(result)
        ctx = self._context(c.run_id, spec.name, c.input, results, n, c.token, None, self.name,
                            spec, key=key)
        value = yield _Fn(spec.fn, ctx)
        nxt = self._next_spec(c, spec.name)
        if nxt is not None and not nxt.external:
            # recorded with the next step (or before whatever comes instead)
            text = _idem.dumps({} if value is None else value)
            p.pending = (spec.name, text)
            return _loads(text)
        return (yield from self._complete(c, spec.name, value))

    def _flush(self, c: _Claimed, p: _Progress):
        """Record the external step's result held for the next step's call."""
        if p.pending is not None:
            name, text = p.pending
            yield from self._complete(c, name, text=text)
            # held until recorded: a failure that follows records it first,
            # or fails its step when the server refuses it (_fail)
            p.pending = None

    def _complete(self, c, name, value=None, text=None):
        if text is None:
            text = _idem.dumps({} if value is None else value)
        try:
            # the run's results it returns are not read: psycopg's jsonb
            # loader is json.loads, whose int() refuses an integer of more
            # than 4300 digits after the step committed
            yield _Sql("SELECT 1 FROM idem_step_complete(%s, %s, %s::jsonb,"
                       " lease_token => %s::uuid)", (c.run_id, name, text, c.token))
        except psycopg.Error as e:
            raise _translated(e)
        # the result as the database holds it (and a resumed run reads it)
        return _loads(text)

    def _fail(self, c: _Claimed, name, e: Exception, p: _Progress):
        self._count("failed_steps")
        try:
            if p.pending is not None:
                held = p.pending[0]
                try:
                    # the external step before it completed, whatever this one did
                    yield from self._flush(c, p)
                except psycopg.Error as fe:
                    if isinstance(fe, psycopg.OperationalError) or fe.sqlstate in _STOP_STATES:
                        raise
                    # its result refused (a character the database cannot
                    # hold: this step's call failed with it too): that step
                    # fails with it, or the run waited out its lease
                    name, e = held, fe
            after = _idem._ttl(e.seconds) if isinstance(e, _idem.RetryAfter) else None
            # the text as the run's connection can send it
            text = (yield _Fn(_failure_text, _OnConn(e))).strip()
            if after is None:
                row = yield _Sql("SELECT idem_step_fail(%s, %s, %s::uuid, %s)",
                                 (c.run_id, name, c.token, text[:2000]))
            else:
                row = yield _Sql("SELECT idem_step_fail(%s, %s, %s::uuid, %s, "
                                 + _idem.RETRY_AFTER + ")",
                                 (c.run_id, name, c.token, text[:2000], after))
            if row[0] is None:
                _log.error("idem worker %s: run %s failed at step %s: %s", self.name, c.run_id,
                           name, text)
            else:
                _log.info("idem worker %s: run %s step %s failed (%s), due again at %s",
                          self.name, c.run_id, name, text, row[0])
        except psycopg.OperationalError:
            pass        # the connection broke: the run is back after its lease
        except psycopg.Error as fe:
            if fe.sqlstate not in _STOP_STATES:
                _log.warning("idem worker %s: could not fail run %s step %s: %s", self.name,
                             c.run_id, name, fe)

    def _release(self, c: _Claimed, p: _Progress, delay: float = 0, reason: Optional[str] = None):
        try:
            yield from self._flush(c, p)
            yield _Sql("SELECT idem_run_release(%s, %s::uuid, %s::interval, %s)",
                       (c.run_id, c.token, _idem._ttl(delay) if delay else None,
                        reason[:2000] if reason else None))
            self._count("released")
        except psycopg.OperationalError:
            pass        # back after its lease
        except psycopg.Error as e:
            if e.sqlstate not in _STOP_STATES:
                _log.warning("idem worker %s: could not release run %s: %s", self.name,
                             c.run_id, e)

    @staticmethod
    def _usable(conn):
        return conn is not None and not conn.closed     # (broken is closed too)

    @staticmethod
    def _ask(run, sent, thrown):
        """The generator run's next ask, given what the last one returned
        (sent) or raised (thrown); None once the run is over."""
        try:
            return run.send(sent) if thrown is None else run.throw(thrown)
        except StopIteration:
            return None

    def _interrupted(self, e: BaseException) -> Exception:
        """A step (or the driver) raised e, a BaseException that is no
        Exception: stop (drain), and keep e for run() to raise; what to
        throw into the run."""
        with self._lock:
            if self._interrupt is None:
                self._interrupt = e
        self.stop.set()
        return _Interrupted(repr(e))

    def _raised(self, e: Exception, conn) -> Exception:
        """e, raised while doing an ask on conn, to throw into the run:
        marked when the connection broke, which the driver opens again for
        the next ask (closing a broken one frees nothing the server holds)."""
        if not self._usable(conn):
            e._idem_broken = True
        return e


class Worker(_Runs):
    """Claims runs of the workflows' queues and runs their steps,
    ``concurrency`` runs at a time (threads, one connection each, plus one
    for claims and one for heartbeats).  ``connect()`` returns a new
    psycopg connection (made autocommit here, and its client_encoding UTF8:
    a narrower one cannot read a run that holds a character beyond it).
    ``run()`` returns when stopped: by ``stop`` (a threading.Event) set, or
    without one by SIGTERM/SIGINT (run() in the main thread); it raises a
    claim's error that retrying cannot cure (idem_retry_advice 'never':
    no grant, the queue dropped), once drained.

    ``prefetch``: a claim also takes up to this many runs beyond the free
    executors, as many as the recent runs' pace says will start within
    0.1 s (none while runs are slower than that), so that one claim serves
    several runs and the next run is in hand when one ends.  They wait
    under their lease, which the heartbeat extends, and count against a
    queue's concurrency cap; a killed worker's come back, like its running
    ones, when their leases end, an attempt counted.  0: claim only for
    free executors.

    ``unknown_step_delay``: a run whose next step this worker has no
    function for (a rolling deploy: another version's worker has it) is
    handed back, due after this many seconds, its attempt not counted and
    the reason in idem_runs.last_error, rather than failed."""

    def __init__(self, connect: Callable[[], psycopg.Connection], workflows: List[Workflow], *,
                 concurrency: int = 4, lease: float = 30, poll: float = 1.0,
                 name: Optional[str] = None, stop: Optional[threading.Event] = None,
                 prefetch: int = 4, unknown_step_delay: float = 30):
        super().__init__(connect, workflows, concurrency, lease, poll, name,
                         stop or threading.Event(), prefetch, unknown_step_delay)
        self._lock = threading.Lock()
        self._have_work = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)    # a run held ended

    # -- connections -------------------------------------------------------

    def _open(self):
        c = self.connect()
        c.autocommit = True
        if _idem._not_utf8(c):
            c.execute(_idem._UTF8)
        return c

    @staticmethod
    def _close(c):
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _drive(self, conn, run):
        """Do what the generator run asks, on conn (opened again when it is
        not usable); returns the connection to keep."""
        sent = thrown = None
        while (ask := self._ask(run, sent, thrown)) is not None:
            sent = thrown = None
            try:
                if not self._usable(conn):
                    self._close(conn)
                    conn = self._open()
                if type(ask) is _Sql:
                    sent = _idem._execute(_cursor(conn), ask.sql, ask.params).fetchone()
                else:
                    ask.ctx.conn = conn
                    sent = ask.fn(ask.ctx)
            except Exception as e:
                thrown = self._raised(e, conn)
            except BaseException as e:
                # the connection may be mid-statement: the next ask opens another
                self._close(conn)
                thrown = self._interrupted(e)
        return conn

    # -- the loop ----------------------------------------------------------

    def run(self) -> dict:
        """Claim and run until stopped; returns counts (claimed, steps,
        completed, failed_steps, lost, released)."""
        restore = []
        if self._own_stop and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore.append((sig, signal.signal(sig, lambda *_: self.stop.set())))
        threads = [threading.Thread(target=self._executor, name=f"idem-worker-{i}", daemon=True)
                   for i in range(self.concurrency)]
        threads.append(threading.Thread(target=self._heartbeat, name="idem-heartbeat",
                                        daemon=True))
        for t in threads:
            t.start()
        try:
            self._claim_loop()
        finally:
            self.stop.set()
            with self._have_work:
                # a run claimed as the stop came is still run (and released)
                self._claims_over = True
                self._have_work.notify_all()
            for t in threads:
                t.join()
            for sig, old in restore:
                signal.signal(sig, old)
        if self._interrupt is not None:
            raise self._interrupt
        return dict(self.stats)

    def _claim_loop(self):
        conn = None
        in_block = False
        down = 0
        queues = list(self.by_queue)
        while not self.stop.is_set():
            with self._lock:
                free = self._claimable()
                if free is None:
                    self._room.wait(0.2)
                    continue
            got = 0
            try:
                if conn is None:
                    conn = self._open()
                    in_block = _idem._claims_in_block(conn)
                random.shuffle(queues)
                for i, q in enumerate(queues):
                    if free - got <= 0:
                        break
                    params = self._claim_params(queues, i, q, free - got, got)
                    with conn.transaction() if in_block else contextlib.nullcontext():
                        rows = _idem._execute(_cursor(conn), _CLAIM, params).fetchall()
                    for r in rows:
                        try:
                            c = self._claimed(q, r)
                        except Exception as e:
                            if (fail := self._unreadable(r, e, conn)) is not None:
                                self._count("failed_steps")
                                _idem._execute(_cursor(conn), self._FAIL, fail)
                            continue
                        self._hand_over(c)
                    got += len(rows)
                down = 0
            except psycopg.Error as e:
                # runs a lost claim took and we did not hear about come back
                # after their lease
                advice = _idem._claim_advice(e, conn)
                down += 1
                try:
                    delay = self._claim_failed(e, advice, down)
                except BaseException:
                    self._close(conn)
                    raise
                # a new connection also for a transient error: its set-up
                # (the claims' isolation) may be what failed
                self._close(conn)
                conn = None
                self.stop.wait(delay)
        self._close(conn)

    def _hand_over(self, c: _Claimed):
        with self._have_work:
            self._note(c)
            self._have_work.notify()

    def _executor(self):
        conn = None
        while True:
            with self._have_work:
                while not self._work and not self._claims_over:
                    self._have_work.wait(0.5)
                if not self._work:
                    break       # stopped and no claim can come any more
                c = self._work.pop(0)
            began = time.monotonic()
            try:
                conn = self._drive(conn, self._run(c))
            except Exception:
                # what a run's driving raised (its failure could not be
                # recorded, a bug): the run comes back after its lease, and
                # the executor goes on, or its next runs would be held for ever
                _log.exception("idem worker %s: run %s abandoned", self.name, c.run_id)
                self._close(conn)
                conn = None
            finally:
                with self._lock:
                    # the claim loop wakes only when it has a claim to make:
                    # a thread switch per run ended is a cost of its own
                    if self._ended(c, time.monotonic() - began):
                        self._room.notify()
        self._close(conn)

    def _heartbeat(self):
        conn = None
        every = max(self.lease / 3.0, 0.05)
        while not (self.stop.is_set() and not self._active):
            if self.stop.is_set():
                time.sleep(min(every, 0.1))     # draining: runs finish their steps
            else:
                self.stop.wait(every)
            for run_id, token in self._held():
                try:
                    if conn is None:
                        conn = self._open()
                    _idem._execute(_cursor(conn), self._EXTEND,
                                   (run_id, token, f"{self.lease} seconds"))
                except psycopg.OperationalError:
                    self._close(conn)
                    conn = None
                    break
                except psycopg.Error as e:
                    self._extend_refused(run_id, token, e)
        self._close(conn)


class AsyncWorker(_Runs):
    """Worker for asyncio: ``await AsyncWorker(connect, [workflows]).run()``
    runs ``concurrency`` runs at a time as tasks of the running loop, one
    psycopg.AsyncConnection each (plus one for claims and one for
    heartbeats), made autocommit (and UTF8) here.  ``connect()`` returns a new
    AsyncConnection (or an awaitable of one, as
    ``psycopg.AsyncConnection.connect(...)`` does).  Step functions are
    ``async def`` (a plain function that returns a value works too, and
    blocks the loop while it runs) and get an AsyncContext:
    ``await ctx.execute(sql, *args)``.  ``run()`` returns when ``stop`` (an
    asyncio.Event) is set, or without one on SIGTERM/SIGINT (in the main
    thread); the drain and everything else are Worker's."""

    _context = AsyncContext

    def __init__(self, connect: Callable, workflows: List[Workflow], *, concurrency: int = 4,
                 lease: float = 30, poll: float = 1.0, name: Optional[str] = None,
                 stop: Optional[asyncio.Event] = None, prefetch: int = 4,
                 unknown_step_delay: float = 30):
        super().__init__(connect, workflows, concurrency, lease, poll, name,
                         stop or asyncio.Event(), prefetch, unknown_step_delay)
        # one thread: the state needs no lock
        self._lock = contextlib.nullcontext()
        self._have_work = asyncio.Event()
        self._room = asyncio.Event()

    async def _open(self):
        c = self.connect()
        if inspect.isawaitable(c):
            c = await c
        await c.set_autocommit(True)
        if _idem._not_utf8(c):
            await c.execute(_idem._UTF8)
        return c

    @staticmethod
    async def _close(c):
        if c is not None:
            try:
                await c.close()
            except Exception:
                pass

    async def _drive(self, conn, run):
        """Worker._drive, awaiting the statements and the step functions."""
        sent = thrown = None
        while (ask := self._ask(run, sent, thrown)) is not None:
            sent = thrown = None
            try:
                if not self._usable(conn):
                    await self._close(conn)
                    conn = await self._open()
                if type(ask) is _Sql:
                    cur = _cursor(conn)
                    await _idem._aexecute(cur, ask.sql, ask.params)
                    sent = await cur.fetchone()
                else:
                    ask.ctx.conn = conn
                    sent = ask.fn(ask.ctx)
                    if inspect.isawaitable(sent):
                        sent = await sent
            except Exception as e:
                thrown = self._raised(e, conn)
            except BaseException as e:
                # the connection may be mid-statement: the next ask opens another
                await self._close(conn)
                thrown = self._interrupted(e)
        return conn

    async def _pause(self, event: asyncio.Event, seconds: float):
        """Until event is set, at most seconds."""
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def run(self) -> dict:
        """Claim and run until stopped; returns Worker.run()'s counts."""
        loop = asyncio.get_running_loop()
        signals = []
        if self._own_stop and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self.stop.set)
                    signals.append(sig)
                except (NotImplementedError, RuntimeError):
                    pass
        tasks = [asyncio.create_task(self._executor()) for _ in range(self.concurrency)]
        tasks.append(asyncio.create_task(self._heartbeat()))
        try:
            await self._claim_loop()
        finally:
            self.stop.set()
            # a run claimed as the stop came is still run (and released)
            self._claims_over = True
            self._have_work.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for sig in signals:
                loop.remove_signal_handler(sig)
        if self._interrupt is not None:
            raise self._interrupt
        return dict(self.stats)

    async def _claim_loop(self):
        conn = None
        in_block = False
        down = 0
        queues = list(self.by_queue)
        while not self.stop.is_set():
            free = self._claimable()
            if free is None:
                self._room.clear()
                await self._pause(self._room, 0.2)
                continue
            got = 0
            try:
                if conn is None:
                    conn = await self._open()
                    in_block = await _idem._aclaims_in_block(conn)
                random.shuffle(queues)
                for i, q in enumerate(queues):
                    if free - got <= 0:
                        break
                    cur = _cursor(conn)
                    params = self._claim_params(queues, i, q, free - got, got)
                    async with conn.transaction() if in_block else contextlib.nullcontext():
                        await _idem._aexecute(cur, _CLAIM, params)
                        rows = await cur.fetchall()
                    for r in rows:
                        try:
                            c = self._claimed(q, r)
                        except Exception as e:
                            if (fail := self._unreadable(r, e, conn)) is not None:
                                self._count("failed_steps")
                                await _idem._aexecute(_cursor(conn), self._FAIL, fail)
                            continue
                        self._hand_over(c)
                    got += len(rows)
                down = 0
            except psycopg.Error as e:
                # as Worker's
                advice = await _idem._aclaim_advice(e, conn)
                down += 1
                try:
                    delay = self._claim_failed(e, advice, down)
                except BaseException:
                    await self._close(conn)
                    raise
                await self._close(conn)      # as Worker's: also for a transient error
                conn = None
                await self._pause(self.stop, delay)
        await self._close(conn)

    def _hand_over(self, c: _Claimed):
        self._note(c)
        self._have_work.set()

    async def _executor(self):
        conn = None
        loop = asyncio.get_running_loop()
        while True:
            while not self._work and not self._claims_over:
                self._have_work.clear()
                await self._have_work.wait()
            if not self._work:
                break       # stopped and no claim can come any more
            c = self._work.pop(0)
            began = loop.time()
            try:
                conn = await self._drive(conn, self._run(c))
            except Exception:
                # as Worker's: the run comes back after its lease
                _log.exception("idem worker %s: run %s abandoned", self.name, c.run_id)
                await self._close(conn)
                conn = None
            finally:
                if self._ended(c, loop.time() - began):
                    self._room.set()
        await self._close(conn)

    async def _heartbeat(self):
        conn = None
        every = max(self.lease / 3.0, 0.05)
        while not (self.stop.is_set() and not self._active):
            if self.stop.is_set():
                await asyncio.sleep(min(every, 0.1))    # draining: runs finish their steps
            else:
                await self._pause(self.stop, every)
            for run_id, token in self._held():
                try:
                    if conn is None:
                        conn = await self._open()
                    await _idem._aexecute(_cursor(conn), self._EXTEND,
                                          (run_id, token, f"{self.lease} seconds"))
                except psycopg.OperationalError:
                    await self._close(conn)
                    conn = None
                    break
                except psycopg.Error as e:
                    self._extend_refused(run_id, token, e)
        await self._close(conn)


def _loads(text):
    return None if text is None else _idem.loads(text)
