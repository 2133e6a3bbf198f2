"""idem from Python: psycopg 3 helpers for idempotent business writes.

A small helper, not a framework.  ``execute`` and ``step`` run inside the
application's own transaction (the caller commits); ``retry`` re-runs a whole
transaction function for exactly the errors ``idem_retry_advice`` says to
retry; ``consume`` is an outbox consumer loop.

Conventions that keep every client's retry the same request:

- every argument is sent as a string (``None`` stays NULL), and the
  statement's own types decide (``Decimal('25.00')`` is sent as ``'25.00'``);
- responses are parsed with ``Decimal`` for JSON numbers, so 25.00 stays 25.00;
- per-call options go into the call itself, never into a session ``SET``
  that would leak to the next client of a pooled (PgBouncer) connection;
- nothing needs a named prepared statement: connect with
  ``prepare_threshold=None`` behind PgBouncer in transaction mode.
"""

import datetime
import decimal
import json
import random
import time
from typing import Any, Callable, NamedTuple, Optional

import psycopg

__all__ = [
    "Result", "execute", "step", "retry", "retry_advice", "to_arg",
    "IdemError", "KeyReused", "InProgress", "NestedKey", "RunNotFound",
    "StepUndeclared", "RunNotRunning", "OutOfSequence", "CachedError",
    "consume", "RetryAfter",
]


class Result(NamedTuple):
    rows: list
    rowcount: int
    replayed: bool
    first_executed_at: Optional[datetime.datetime]


class IdemError(Exception):
    """An error raised by idem (SQLSTATE class ID) or a cached business error."""

    sqlstate: str = ""

    def __init__(self, message, sqlstate=None, detail=None, hint=None):
        super().__init__(message)
        if sqlstate:
            self.sqlstate = sqlstate
        self.message = message
        self.detail = detail
        self.hint = hint


class KeyReused(IdemError):
    """ID422: the key was already used for a different request."""
    sqlstate = "ID422"


class InProgress(IdemError):
    """ID409: the key is held by a concurrent transaction (idem.wait off)."""
    sqlstate = "ID409"


class NestedKey(IdemError):
    """ID508: a business statement called idem with its own key."""
    sqlstate = "ID508"


class RunNotFound(IdemError):
    """ID404: the run does not exist for the current role."""
    sqlstate = "ID404"


class StepUndeclared(IdemError):
    """ID400: a step name the run did not declare."""
    sqlstate = "ID400"


class RunNotRunning(IdemError):
    """ID423: the run is failed or completed."""
    sqlstate = "ID423"


class OutOfSequence(IdemError):
    """ID425: earlier declared steps have not all completed."""
    sqlstate = "ID425"


class CachedError(IdemError):
    """The key's recorded outcome is a business error (idem.cache_errors).

    Raised on the execution that recorded it and on every replay; the
    transaction that recorded it must still commit to keep it."""

    def __init__(self, error: dict, replayed: bool):
        super().__init__(error.get("message"), error.get("sqlstate"),
                         error.get("detail"), error.get("hint"))
        self.replayed = replayed


_BY_SQLSTATE = {c.sqlstate: c for c in (KeyReused, InProgress, NestedKey,
                                         RunNotFound, StepUndeclared,
                                         RunNotRunning, OutOfSequence)}


def to_arg(value: Any) -> Optional[str]:
    """The string idem receives for a Python value (None stays NULL)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    if isinstance(value, float):
        # repr is the shortest text that reads back as the same float
        return repr(value)
    return str(value)


def _ttl(ttl):
    if ttl is None:
        return None
    if isinstance(ttl, datetime.timedelta):
        return f"{ttl.total_seconds()} seconds"
    if isinstance(ttl, (int, float)):
        return f"{ttl} seconds"
    return str(ttl)


def _wait(wait):
    return None if wait is None else bool(wait)


def _translate(exc: psycopg.Error) -> Exception:
    cls = _BY_SQLSTATE.get(getattr(exc, "sqlstate", None) or "")
    if cls is None:
        return exc
    diag = exc.diag
    err = cls(diag.message_primary or str(exc), cls.sqlstate,
              diag.message_detail, diag.message_hint)
    err.__cause__ = exc
    return err


_CALL = ("SELECT response::text, replayed, first_executed_at FROM idem_call("
         "key => %s, sql => %s, args => %s::text[], outbox_topic => %s,"
         " ttl => %s::interval, wait => %s, run_id => %s, step => %s)")


def _call(conn, key, run_id, step_name, sql, args, outbox_topic, ttl, wait):
    params = (key, sql, [to_arg(a) for a in args], outbox_topic, _ttl(ttl),
              _wait(wait), run_id, step_name)
    try:
        with conn.cursor() as cur:
            cur.execute(_CALL, params)
            text, replayed, first = cur.fetchone()
    except psycopg.Error as e:
        err = _translate(e)
        if err is e:
            raise
        raise err from e
    response = json.loads(text, parse_float=decimal.Decimal)
    if "error" in response and "command" not in response:
        raise CachedError(response["error"], replayed)
    return Result(response["rows"], response["rowcount"], replayed, first)


def execute(conn: psycopg.Connection, key: str, sql: str, *args,
            outbox_topic: Optional[str] = None, ttl=None,
            wait: Optional[bool] = None) -> Result:
    """Run ``sql`` once for ``key`` in the connection's current transaction.

    Returns (rows, rowcount, replayed, first_executed_at).  Options apply to
    this call only; None means the session's setting (idem.outbox_topic,
    idem.ttl, idem.wait)."""
    return _call(conn, key, None, None, sql, args, outbox_topic, ttl, wait)


def step(conn: psycopg.Connection, run_id: str, step: str, sql: str, *args,
         outbox_topic: Optional[str] = None, wait: Optional[bool] = None) -> Result:
    """Run one step of a workflow run (see idem_run_begin) in the current
    transaction; a completed step replays."""
    return _call(conn, None, run_id, step, sql, args, outbox_topic, None, wait)


_advice_cache: dict = {}


def retry_advice(conn: psycopg.Connection, sqlstate: str) -> str:
    """idem_retry_advice(sqlstate): 'retry', 'retry_later' or 'never'."""
    if sqlstate not in _advice_cache:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT idem_retry_advice(%s)", (sqlstate,))
            _advice_cache[sqlstate] = cur.fetchone()[0]
    return _advice_cache[sqlstate]


def _sqlstate(exc: BaseException, conn) -> Optional[str]:
    state = getattr(exc, "sqlstate", None)
    if state:
        return state
    if isinstance(exc, psycopg.OperationalError) and (conn is None or conn.closed or conn.broken):
        # the connection went away without an error message: class 08
        return "08006"
    return None


def retry(connect: Callable[[], psycopg.Connection],
          fn: Callable[[psycopg.Connection], Any], *,
          attempts: int = 8, base: float = 0.05, cap: float = 5.0,
          conn: Optional[psycopg.Connection] = None,
          on_retry: Optional[Callable[[BaseException, float], None]] = None,
          sleep: Callable[[float], None] = time.sleep):
    """Run ``fn(conn)`` in a transaction; on an error that
    idem_retry_advice says to retry, roll back and run all of it again.

    Backoff is exponential with full jitter: before retry n (from 0) it
    sleeps uniform(0, min(cap, base * 2**n)), and for 'retry_later' advice
    from the doubled base.  A lost connection (class 08, 57P01...) is
    replaced by ``connect()``.  Errors advised 'never' (and errors with no
    SQLSTATE) are raised at once, as idem's typed exceptions where they
    have one.  Returns (fn's result, the connection in use)."""
    for attempt in range(attempts):
        if conn is None or conn.closed or conn.broken:
            conn = connect()
        try:
            with conn.transaction():
                return fn(conn), conn
        except (psycopg.Error, IdemError) as e:
            state = _sqlstate(e.__cause__ if isinstance(e, IdemError) and
                              e.__cause__ is not None else e, conn)
            if isinstance(e, CachedError) or state is None or attempt == attempts - 1:
                raise
            if conn.closed or conn.broken:
                conn = connect()
            advice = retry_advice(conn, state)
            if advice == "never":
                raise
            shift = attempt + (1 if advice == "retry_later" else 0)
            delay = random.uniform(0, min(cap, base * (2 ** shift)))
            if on_retry:
                on_retry(e, delay)
            sleep(delay)
    raise AssertionError("unreachable")


class RetryAfter(Exception):
    """Raised by an outbox handler: the downstream asked to be called again
    no earlier than ``seconds`` from now (its Retry-After)."""

    def __init__(self, seconds: float, message: str = "retry after"):
        super().__init__(message)
        self.seconds = seconds


def consume(connect: Callable[[], psycopg.Connection], topic: str,
            handler: Callable[[dict], None], *, max_events: int = 10,
            lease: float = 30, consumer: Optional[str] = None,
            idle: float = 1.0, stop=None) -> int:
    """Outbox consumer loop (the delivery API of issue 10: idem_outbox_claim,
    idem_outbox_ack, idem_outbox_fail, LISTEN idem_outbox).

    Claims up to ``max_events`` due events of ``topic`` under a lease, calls
    ``handler(event)`` for each outside any transaction, acks it, or fails it
    with the handler's RetryAfter (or the error's text, leaving the backoff
    to the server).  Sleeps on LISTEN idem_outbox when nothing is due, waking
    at least every ``idle`` seconds to look at ``stop`` (a
    threading.Event-like object; SIGTERM/SIGINT set it when none is given).
    LISTEN needs a session: connect directly, not through a transaction
    pooler.  Returns the number of events acknowledged.

    Not tested on branch clients: the delivery API is not on main yet."""
    import select
    import signal
    import threading

    if stop is None:
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    conn = connect()
    conn.autocommit = True
    conn.execute("LISTEN idem_outbox")
    acked = 0
    while not stop.is_set():
        events = conn.execute(
            "SELECT event_id, key, topic, payload::text, run_id, step, attempt, lease_token"
            " FROM idem_outbox_claim(%s, max_events => %s, lease => %s::interval,"
            " consumer => %s)", (topic, max_events, f"{lease} seconds", consumer)).fetchall()
        for event_id, key, top, payload, run_id, step_name, attempt, token in events:
            if stop.is_set():
                break   # the rest come back when their lease ends
            event = {"event_id": event_id, "key": key, "topic": top, "run_id": run_id,
                     "step": step_name, "attempt": attempt,
                     "payload": json.loads(payload, parse_float=decimal.Decimal)}
            try:
                handler(event)
            except RetryAfter as e:
                conn.execute("SELECT idem_outbox_fail(%s, %s, %s, %s::interval)",
                             (event_id, token, str(e), f"{e.seconds} seconds"))
            except Exception as e:  # the handler's failure is the event's, not the loop's
                conn.execute("SELECT idem_outbox_fail(%s, %s, %s)", (event_id, token, repr(e)))
            else:
                conn.execute("SELECT idem_outbox_ack(%s, %s)", (event_id, token))
                acked += 1
        if not events:
            # a NOTIFY makes the socket readable; the next claim reads it
            select.select([conn.fileno()], [], [], idle)
    conn.close()
    return acked
