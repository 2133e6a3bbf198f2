"""idem from Python: psycopg 3 helpers for idempotent business writes.

A small helper, not a framework.  ``execute`` and ``step`` run inside the
application's own transaction (the caller commits), ``aexecute`` and
``astep`` likewise on an asyncio connection; ``retry`` re-runs a whole
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

import contextlib
import datetime
import decimal
import json
import logging
import random
import time
from typing import Any, Callable, NamedTuple, Optional

import psycopg

__all__ = [
    "Result", "execute", "step", "aexecute", "astep", "retry", "retry_advice", "to_arg",
    "IdemError", "KeyReused", "InProgress", "NestedKey", "RunNotFound",
    "StepUndeclared", "RunNotRunning", "OutOfSequence", "EventNotFound",
    "LeaseLost", "CachedError", "dumps", "loads",
    "consume", "RetryAfter", "Workflow", "Worker", "AsyncWorker",
]

_WORKFLOW_NAMES = ("Workflow", "Worker", "AsyncWorker", "Context", "AsyncContext", "Started")


def __getattr__(name):
    # the workflow layer (idem_workflow.py) is built on this module and
    # loaded on first use, so that either module may be imported first
    if name in _WORKFLOW_NAMES:
        import idem_workflow
        return getattr(idem_workflow, name)
    raise AttributeError(f"module 'idem_client' has no attribute {name!r}")


class Result(NamedTuple):
    rows: list
    rowcount: int
    replayed: bool
    first_executed_at: Optional[datetime.datetime]


class IdemError(psycopg.DatabaseError):
    """An error raised by idem (SQLSTATE class ID) or a cached business error.

    A ``psycopg.DatabaseError``: ``except psycopg.Error`` catches it, and
    ``.sqlstate`` and ``.diag`` (message_primary, message_detail,
    message_hint...) are the server's, as on psycopg's own errors; the
    error psycopg raised is kept as ``__cause__``.  ``message``, ``detail``
    and ``hint`` are shortcuts to the diag fields."""

    __module__ = "idem_client"

    def __init__(self, message, sqlstate=None, detail=None, hint=None, *, info=None):
        if info is None:
            # no server report behind it (a cached error, a client check):
            # a diag made of the fields given, as psycopg does for pickling
            F = psycopg.pq.DiagnosticField
            info = {f: (v.encode() if v is not None else None) for f, v in (
                (F.SQLSTATE, sqlstate or self.sqlstate), (F.MESSAGE_PRIMARY, message),
                (F.MESSAGE_DETAIL, detail), (F.MESSAGE_HINT, hint),
                (F.SEVERITY, "ERROR"), (F.SEVERITY_NONLOCALIZED, "ERROR"))}
        super().__init__(message, info=info)
        if sqlstate:
            self.sqlstate = sqlstate

    @property
    def message(self):
        return self.diag.message_primary

    @property
    def detail(self):
        return self.diag.message_detail

    @property
    def hint(self):
        return self.diag.message_hint


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
    """ID423: the run is failed, completed or cancelled."""
    sqlstate = "ID423"


class OutOfSequence(IdemError):
    """ID425: earlier declared steps have not all completed."""
    sqlstate = "ID425"


class EventNotFound(IdemError):
    """IDE04: the outbox event does not exist (never written, or delivered
    and purged); not a run's ID404."""
    sqlstate = "IDE04"


class LeaseLost(IdemError):
    """ID412: the lease token no longer holds the run (or the outbox event):
    another worker took it over after the lease expired.  The call changed
    nothing; stop working on it."""
    sqlstate = "ID412"


class CachedError(IdemError):
    """The key's recorded outcome is a business error (idem.cache_errors).

    Raised on the execution that recorded it and on every replay; the
    transaction that recorded it must still commit to keep it.  Its
    ``sqlstate`` and ``diag`` are the recorded error's."""

    def __init__(self, error: dict, replayed: bool):
        super().__init__(error.get("message"), error.get("sqlstate"),
                         error.get("detail"), error.get("hint"))
        self.replayed = replayed


_BY_SQLSTATE = {c.sqlstate: c for c in (KeyReused, InProgress, NestedKey,
                                         RunNotFound, StepUndeclared,
                                         RunNotRunning, OutOfSequence,
                                         EventNotFound, LeaseLost)}


# what json.dumps writes for a str, without its layers of calls
_json_str = json.encoder.encode_basestring_ascii


def _json_key(k) -> str:
    """A dict key that is no str as json.dumps writes it (True as "true",
    None as "null", 1.5 as "1.5"), a Decimal as its number; any other
    refused as json.dumps refuses it, rather than written as its str(): a
    tuple's "(1, 2)" read back as a different key."""
    if k is True or k is False or k is None:
        return json.dumps(k)
    if isinstance(k, (int, float)):
        return json.dumps(k, allow_nan=False)   # int's or float's repr; NaN has no number
    if isinstance(k, decimal.Decimal) and k.is_finite():
        return str(k)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(k).__name__}")


def _json(o, out):
    if type(o) is str:
        out.append(_json_str(o))
    elif isinstance(o, decimal.Decimal):
        if not o.is_finite():
            raise ValueError(f"{o} has no JSON number")
        out.append(str(o))      # 25.00, 1E+3, -1.5E-9: all JSON numbers
    elif isinstance(o, dict):
        out.append("{")
        for i, (k, v) in enumerate(o.items()):
            if i:
                out.append(", ")
            out.append(_json_str(k if isinstance(k, str) else _json_key(k)))
            out.append(": ")
            _json(v, out)
        out.append("}")
    elif isinstance(o, (list, tuple)):
        out.append("[")
        for i, v in enumerate(o):
            if i:
                out.append(", ")
            _json(v, out)
        out.append("]")
    elif isinstance(o, (datetime.datetime, datetime.date, datetime.time)):
        out.append(json.dumps(o.isoformat()))
    else:
        # NaN and the infinities have no JSON number: json.dumps would write
        # NaN, which the server's json input refuses
        out.append(json.dumps(o, allow_nan=False))


def dumps(value: Any) -> str:
    """json.dumps for the values the helpers return: a Decimal is written as
    the exact JSON number it was read from (``Decimal('25.00')`` as
    ``25.00``), dates and times as ISO 8601 strings; ``loads`` reads the
    text back as equal values.  (json.dumps raises "Object of type Decimal
    is not JSON serializable", and its ``default=str`` would make the
    number a string.)"""
    out: list = []
    _json(value, out)
    return "".join(out)


# one decoder for every call (json.loads with an argument makes one per
# call: half of its time on a step's small response)
_decoder = json.JSONDecoder(parse_float=decimal.Decimal)


def _int(text: str):
    try:
        return int(text)
    except ValueError:
        # more digits than int() reads (sys.get_int_max_str_digits)
        return decimal.Decimal(text)


# for a text with such an integer: a numeric column or a run's input may
# hold one, and a ValueError from the worker's claim ended the worker
_big_decoder = json.JSONDecoder(parse_float=decimal.Decimal, parse_int=_int)


def loads(text: str) -> Any:
    """json.loads keeping JSON numbers with a fraction or exponent exact,
    as Decimal (integers stay int, but for one longer than int() reads,
    4300 digits by default: a Decimal)."""
    if not isinstance(text, str):
        text = text.decode(json.detect_encoding(text), "surrogatepass")   # as json.loads
    try:
        return _decoder.decode(text)
    except json.JSONDecodeError:
        raise
    except ValueError:
        return _big_decoder.decode(text)


def to_arg(value: Any) -> Optional[str]:
    """The string idem receives for a Python value (None stays NULL)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return dumps(value)
    if isinstance(value, float):
        # repr is the shortest text that reads back as the same float
        return repr(value)
    return str(value)


_MICROSECOND = decimal.Decimal("0.000001")


def _ttl(ttl):
    """An interval's text for seconds (a number or a timedelta) or for an
    interval's own text."""
    if ttl is None:
        return None
    if isinstance(ttl, datetime.timedelta):
        ttl = ttl.total_seconds()
    if isinstance(ttl, float) and ttl == ttl and abs(ttl) != float("inf"):
        # without the exponent that repr writes below 1e-4 and interval input
        # refuses (1e-07), rounded up to the interval's microsecond: a
        # Retry-After comes back no sooner than asked
        ttl = decimal.Decimal(repr(ttl)).quantize(_MICROSECOND, rounding=decimal.ROUND_CEILING)
        return f"{ttl:f} seconds"
    if isinstance(ttl, (int, float)):
        return f"{ttl} seconds"
    return str(ttl)


def _wait(wait):
    return None if wait is None else bool(wait)


def _translate(exc: psycopg.Error) -> Exception:
    """psycopg's error for one of idem's SQLSTATEs as idem's class, with
    the same server report (diag) and the original as __cause__."""
    cls = _BY_SQLSTATE.get(getattr(exc, "sqlstate", None) or "")
    if cls is None:
        return exc
    if exc.pgresult is not None:
        err = cls(str(exc), info=exc.pgresult)
    else:
        d = exc.diag
        err = cls(d.message_primary or str(exc), cls.sqlstate, d.message_detail, d.message_hint)
    err.__cause__ = exc
    return err


# What a call costs the client is mostly psycopg's own work per parameter
# and per result column (Debian's psycopg 3 is the pure-Python
# implementation: about 80 us of CPU for a bare SELECT 1 here, more than
# the server spends on a replay).  So a call sends only the options it
# sets, its arguments as one text[] literal, and reads one text column:
# replayed, first_executed_at in microseconds since the epoch and the
# response, joined by U+001F, which JSON text cannot contain unescaped.
_SEP = "\x1f"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_OPTIONS = ("outbox_topic", "ttl", "wait", "run_id", "step", "lease_token", "complete_step",
            "complete_result", "start_step")
_OPTION_SQL = {"outbox_topic": "outbox_topic => %s", "ttl": "ttl => %s::interval",
               "wait": "wait => %s::boolean", "run_id": "run_id => %s", "step": "step => %s",
               "lease_token": "lease_token => %s::uuid", "complete_step": "complete_step => %s",
               "complete_result": "complete_result => %s::jsonb", "start_step": "start_step => %s"}
_calls: dict = {}


def _call_sql(present):
    """The statement for the options present (a tuple of names), cached;
    with start_step, the started step's key and attempt as two more
    columns (a key may hold any character, U+001F too)."""
    text = _calls.get(present)
    if text is None:
        text = _calls[present] = (
            "SELECT concat_ws(chr(31), replayed::text,"
            " (extract(epoch FROM first_executed_at) * 1000000)::int8::text, response::text)"
            + (", started_key, started_attempt" if "start_step" in present else "")
            + " FROM idem_call(%s, %s, %s::text[]"
            + "".join(", " + _OPTION_SQL[o] for o in present) + ")")
    return text


def _array_literal(values):
    """A text[] literal: each element quoted and escaped, None as NULL."""
    out = []
    for v in values:
        v = to_arg(v)
        if v is None:
            out.append("NULL")
        else:
            out.append('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(out) + "}"


def _literal(value) -> str:
    """value as an SQL literal: None as NULL, anything else as to_arg's
    text in an E'' string, its backslashes and quotes doubled (so it reads
    the same whatever standard_conforming_strings says), and of no type
    until the statement gives it one, as a parameter's text is."""
    if value is None:
        return "NULL"
    v = value if type(value) is str else to_arg(value)
    if "\x00" in v:
        # what psycopg says of a parameter's NUL, rather than a truncated
        # statement
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return "E'" + v.replace("\\", "\\\\").replace("'", "''") + "'"


def _inline(sql: str, params) -> str:
    """sql (a statement of the helpers', whose only % are its %s
    placeholders) with params written in as literals."""
    return sql % tuple(map(_literal, params))


def _statement(cur, sql: str, params):
    """A workflow worker's statement on cur: execute's query, params and
    prepare.  On a connection that prepares nothing (prepare_threshold
    None, as behind PgBouncer in transaction mode) the values are written
    in: a statement without parameters takes the simple query protocol,
    which spares psycopg (pure Python) its work per parameter and the
    server the extended protocol's messages.  A connection that prepares
    keeps the parameters, so that each statement's text stays the same and
    the server plans it once."""
    if cur.connection.prepare_threshold is None:
        return _inline(sql, params), None, False
    return sql, params, None


def _execute(cur, sql: str, params):
    """cur.execute of _statement's; returns cur."""
    query, params, prepare = _statement(cur, sql, params)
    return cur.execute(query, params, prepare=prepare)


async def _aexecute(cur, sql: str, params):
    """_execute on an AsyncCursor."""
    query, params, prepare = _statement(cur, sql, params)
    return await cur.execute(query, params, prepare=prepare)


def _call_query(key, run_id, step_name, sql, args, outbox_topic, ttl, wait, lease_token, fold):
    """The idem_call statement and its parameters; fold: a worker's
    complete_step, complete_result (JSON text) and start_step, those not
    None."""
    values = (outbox_topic, _ttl(ttl), _wait(wait), run_id, step_name, lease_token) + (
        (fold.get("complete_step"), fold.get("complete_result"), fold.get("start_step"))
        if fold else (None, None, None))     # in _OPTIONS' order
    present = tuple(o for o, v in zip(_OPTIONS, values) if v is not None)
    return _call_sql(present), [key, sql, _array_literal(args)] + [v for v in values
                                                                    if v is not None]


# The helpers' own connections (a worker's, a consumer's) speak UTF8,
# whatever connect() asked for: a connection of a narrower client_encoding
# (LATIN1) cannot read a run, a key or an event that holds a character
# beyond it (the server refuses to convert the row: a claim that fails for
# good), and on a SQL_ASCII one (a SQL_ASCII database's default) psycopg
# reads text as bytes, not knowing their encoding, and writes a statement's
# text as ASCII.  A SQL_ASCII database stores UTF-8 as it comes.  On the
# caller's connections the texts of the helpers' rows are decoded as UTF-8
# (_texts).
_UTF8 = "SET client_encoding TO 'UTF8'"


def _not_utf8(conn) -> bool:
    """conn's client_encoding is not UTF8."""
    return conn.info.encoding != "utf-8"


def _texts(row):
    """row with its bytes (texts read on a SQL_ASCII connection) decoded as
    UTF-8, which is what the helpers write."""
    return [v.decode() if isinstance(v, bytes) else v for v in row]


def _call_result(out, fold):
    """The Result of idem_call's row; for a worker's call (fold not None)
    (Result, the started step's (key, attempt) or None, the response as
    the run records it)."""
    if type(out[0]) is bytes:
        out = _texts(out)
    replayed, micros, text = out[0].split(_SEP, 2)
    first = _EPOCH + datetime.timedelta(microseconds=int(micros))
    response = loads(text)
    if "error" in response and "command" not in response:
        raise CachedError(response["error"], replayed == "true")
    result = Result(response["rows"], response["rowcount"], replayed == "true", first)
    if fold is None:
        return result
    return result, ((out[1], out[2]) if fold.get("start_step") is not None else None), response


def _call(conn, key, run_id, step_name, sql, args, outbox_topic, ttl, wait, lease_token=None,
          fold=None):
    """idem_call on conn, or on the cursor conn (a workflow worker's, kept
    for its connection: the statement _statement's)."""
    query, params = _call_query(key, run_id, step_name, sql, args, outbox_topic, ttl, wait,
                                lease_token, fold)
    try:
        if isinstance(conn, psycopg.Cursor):
            out = _execute(conn, query, params).fetchone()
        else:
            with conn.cursor() as cur:
                cur.execute(query, params)
                out = cur.fetchone()
    except psycopg.Error as e:
        err = _translate(e)
        if err is e:
            raise
        raise err from e
    return _call_result(out, fold)


async def _acall(conn, key, run_id, step_name, sql, args, outbox_topic, ttl, wait,
                 lease_token=None, fold=None):
    """_call on an AsyncConnection, or on an AsyncCursor of one."""
    query, params = _call_query(key, run_id, step_name, sql, args, outbox_topic, ttl, wait,
                                lease_token, fold)
    if isinstance(conn, psycopg.AsyncCursor):
        cur, (query, params, prepare) = conn, _statement(conn, query, params)
    else:
        cur, prepare = conn.cursor(), None
    try:
        await cur.execute(query, params, prepare=prepare)
        out = await cur.fetchone()
    except psycopg.Error as e:
        err = _translate(e)
        if err is e:
            raise
        raise err from e
    finally:
        if cur is not conn:
            await cur.close()
    return _call_result(out, fold)


def execute(conn: psycopg.Connection, key: str, sql: str, *args,
            outbox_topic: Optional[str] = None, ttl=None,
            wait: Optional[bool] = None) -> Result:
    """Run ``sql`` once for ``key`` in the connection's current transaction.

    Returns (rows, rowcount, replayed, first_executed_at).  Options apply to
    this call only; None means the session's setting (idem.outbox_topic,
    idem.ttl, idem.wait)."""
    return _call(conn, key, None, None, sql, args, outbox_topic, ttl, wait)


def step(conn: psycopg.Connection, run_id: str, step: str, sql: str, *args,
         outbox_topic: Optional[str] = None, wait: Optional[bool] = None,
         lease_token: Optional[str] = None) -> Result:
    """Run one step of a workflow run (see idem_run_begin) in the current
    transaction; a completed step replays.  A run on a queue needs the
    ``lease_token`` of its claim (else LeaseLost, ID412)."""
    return _call(conn, None, run_id, step, sql, args, outbox_topic, None, wait, lease_token)


async def aexecute(conn: psycopg.AsyncConnection, key: str, sql: str, *args,
                   outbox_topic: Optional[str] = None, ttl=None,
                   wait: Optional[bool] = None) -> Result:
    """``execute`` on an asyncio connection (psycopg.AsyncConnection)."""
    return await _acall(conn, key, None, None, sql, args, outbox_topic, ttl, wait)


async def astep(conn: psycopg.AsyncConnection, run_id: str, step: str, sql: str, *args,
                outbox_topic: Optional[str] = None, wait: Optional[bool] = None,
                lease_token: Optional[str] = None) -> Result:
    """``step`` on an asyncio connection (psycopg.AsyncConnection)."""
    return await _acall(conn, None, run_id, step, sql, args, outbox_topic, None, wait,
                        lease_token)


_advice_cache: dict = {}


def retry_advice(conn: psycopg.Connection, sqlstate: str) -> str:
    """idem_retry_advice(sqlstate): 'retry', 'retry_later' or 'never'."""
    if sqlstate not in _advice_cache:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT idem_retry_advice(%s)", (sqlstate,))
            # (bytes on a SQL_ASCII connection: b"never" was no "never", and
            # retry() ran again what is never to be retried)
            _advice_cache[sqlstate] = _texts(cur.fetchone())[0]
    return _advice_cache[sqlstate]


async def _aretry_advice(conn: psycopg.AsyncConnection, sqlstate: str) -> str:
    """retry_advice on an AsyncConnection (the same cache)."""
    if sqlstate not in _advice_cache:
        async with conn.transaction():
            cur = await conn.execute("SELECT idem_retry_advice(%s)", (sqlstate,))
            _advice_cache[sqlstate] = _texts(await cur.fetchone())[0]
    return _advice_cache[sqlstate]


# What a worker's or a consumer's loop does after its claim raised e (the
# Node helpers follow the same rule): 'reconnect' where the session is gone
# (class 08, 57P: the server restarted, our backend was terminated; a
# connection psycopg could not open, which reports no SQLSTATE), or it
# reached a read-only server (25006: a standby, as after a failover before
# the address moves to the new primary; idem_retry_advice says never for a
# statement there, but another connection may reach the primary); else
# idem_retry_advice's answer, asked on conn: 'retry' or 'retry_later'
# (claim again after the backoff), or 'never' (no grant, the queue or topic
# dropped, a bad argument: retrying cannot cure it).  None where e has no
# SQLSTATE (not the database's error) or no advice can be had: with no
# connection to ask on (a statement setting a new one up failed), only a
# full server (class 53) is retried.  'never' and None: the loop raises e.
def _claim_state(e: BaseException, conn) -> tuple:
    """(e's SQLSTATE, the advice known without asking, or None)."""
    state = _sqlstate(e, conn)
    if state is None:
        return None, None
    if (state[:2] == "08" or state[:3] == "57P" or state == "25006"
            or (conn is not None and (conn.closed or conn.broken))):
        return state, "reconnect"
    if conn is None:
        return state, ("retry_later" if state[:2] == "53" else None)
    return state, None


def _claim_advice(e: BaseException, conn: Optional[psycopg.Connection]) -> Optional[str]:
    state, advice = _claim_state(e, conn)
    if advice is not None or conn is None or state is None:
        return advice
    try:
        return retry_advice(conn, state)
    except psycopg.OperationalError:
        return "reconnect"      # lost while asking
    except psycopg.Error:
        return None


async def _aclaim_advice(e: BaseException, conn: Optional[psycopg.AsyncConnection]) -> Optional[str]:
    """_claim_advice on an AsyncConnection."""
    state, advice = _claim_state(e, conn)
    if advice is not None or conn is None or state is None:
        return advice
    try:
        return await _aretry_advice(conn, state)
    except psycopg.OperationalError:
        return "reconnect"
    except psycopg.Error:
        return None


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
    """Raised by an outbox handler or a workflow step: the downstream asked
    to be called again no earlier than ``seconds`` from now.  ``seconds``
    may be a number, a timedelta or an HTTP Retry-After header's value
    (delay seconds or an HTTP date; anything else raises ValueError);
    None means "later", at the server's backoff.  A negative delay, NaN or
    a date past is "now"; one beyond the server's
    idem.outbox_max_retry_after (infinity, a date in 2099) is as late as
    it allows."""

    def __init__(self, seconds=None, message: str = "retry after"):
        super().__init__(message)
        self.seconds = _retry_after_seconds(seconds)


# Longer than any server accepts: RETRY_AFTER caps it at the server's
# idem.outbox_max_retry_after, so a far Retry-After (a year, a date in 2099,
# infinity) is "as late as allowed", never a refused failure.
_RETRY_AFTER_MAX_S = 1e9

# the retry_after argument of idem_outbox_fail / idem_step_fail
RETRY_AFTER = ("LEAST(%s::interval,"
               " pg_catalog.current_setting('idem.outbox_max_retry_after')::interval)")


def _encodings(conn) -> tuple:
    """The Python encodings a text sent on conn must fit: the connection's
    (psycopg's) and, unless it is SQL_ASCII (which converts nothing), the
    database's, into which the server converts it; an encoding Python does
    not know is taken as ascii."""
    if conn is None:
        return ("utf-8",)
    from psycopg import _encodings as names
    server = conn.info.parameter_status("server_encoding") or "SQL_ASCII"
    if server == "SQL_ASCII":
        return (conn.info.encoding,)
    try:
        server = names.pg2pyenc(server.encode())
    except Exception:
        server = "ascii"
    return (conn.info.encoding, server)


def _encodable(text: str, conn=None) -> str:
    """text as conn can send and its database can hold (_encodings): a
    character they cannot written as its Python escape (U+1F600 as
    \\U0001f600 on a LATIN1 connection or into a LATIN1 database, a lone
    surrogate as \\udc80 on any), and a NUL, which no text value holds, as
    \\x00.  Sent as it was, psycopg refuses it (UnicodeEncodeError, or a
    DataError for the NUL) or the server does (22021, 22P05)."""
    text = text.replace("\x00", "\\x00")
    for encoding in _encodings(conn):
        text = text.encode(encoding, "backslashreplace").decode(encoding)
    return text


def _failure_text(e: BaseException, conn=None) -> str:
    """What a handler's or a step's exception is recorded as (last_error):
    a RetryAfter's message, anything else's type and message, made
    _encodable on the connection that records it: the report of a failure
    failed with what it could not send, and the run (or the event) waited
    out its lease."""
    try:
        text = str(e)
    except Exception:
        text = object.__repr__(e)
    if not isinstance(e, RetryAfter):
        text = f"{type(e).__name__}: {text}"
    return _encodable(text, conn)


def _retry_after_seconds(value) -> float:
    if value is None or value == "" or value == b"":
        return 0.0
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, decimal.Decimal) and value.is_nan():
        return 0.0              # float() refuses a signaling NaN
    if isinstance(value, (int, float, decimal.Decimal)):
        try:
            seconds = float(value)
        except OverflowError:   # an int past float's range: as late as allowed
            seconds = float("inf")
    else:
        # a header's raw bytes (HTTP header values are ISO-8859-1), not str()'s "b'120'"
        text = (value.decode("latin-1") if isinstance(value, (bytes, bytearray))
                else str(value)).strip()
        try:
            seconds = float(text)
        except ValueError:
            import email.utils
            when = email.utils.parsedate_to_datetime(text)   # ValueError if neither
            if when.tzinfo is None:
                when = when.replace(tzinfo=datetime.timezone.utc)
            seconds = (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    if seconds != seconds:      # NaN
        return 0.0
    return min(max(0.0, seconds), _RETRY_AFTER_MAX_S)


_log = logging.getLogger("idem_client")

# An event's last error is at most 64 kB (idem_outbox_fail refuses more:
# 22001, and consume() raised it); a character is at most 4 bytes in any
# server encoding.
_EVENT_ERROR_MAX = 16384

_CLAIM = ("SELECT event_id, key, topic, payload::text, run_id, step, attempt, lease_token,"
          " created_at, lease_until FROM idem_outbox_claim(%s, max_events => %s,"
          " lease => %s::interval, consumer => %s)")
# wakeup="wait": a claim that finds nothing looks again, in the same
# statement, at each commit of the topic and every 200 ms, until it leases
# some or wait has passed
_CLAIM_WAIT = _CLAIM[:-1] + ", wait => %s::interval)"

# ack or fail under a lease another consumer has taken over (ID412), or of
# an event already delivered: kept as delivered (ID410, with
# idem.outbox_keep_delivered) or deleted by its ack (IDE04, the default).
# The event is someone else's now.
_LOST_LEASE = ("ID412", "ID410", "IDE04")


# A claim needs READ COMMITTED (0A000 in a transaction of a snapshot's
# isolation): where a role's or the database's default isolation is
# REPEATABLE READ or SERIALIZABLE, a worker's claims, and a consumer's
# claims that wait, run in a READ COMMITTED transaction block of their own.  Setting the session's
# default instead would leak to other clients' transactions behind a
# transaction pooler, which keeps such a SET on the server session.
_ISOLATION = "SHOW default_transaction_isolation"


def _claims_in_block(conn: psycopg.Connection) -> bool:
    """Whether conn's claims must run in a transaction block of their own
    (its isolation, READ COMMITTED, set on conn for them)."""
    if _texts(conn.execute(_ISOLATION).fetchone())[0] == "read committed":
        return False
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    return True


async def _aclaims_in_block(conn: psycopg.AsyncConnection) -> bool:
    """_claims_in_block on an AsyncConnection."""
    cur = await conn.execute(_ISOLATION)
    if _texts(await cur.fetchone())[0] == "read committed":
        return False
    await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
    return True


def consume(connect: Callable[[], psycopg.Connection], topic: str,
            handler: Callable[[dict], None], *, max_events: int = 10,
            lease: float = 30, consumer: Optional[str] = None,
            idle: float = 5.0, stop=None, wakeup: str = "notify") -> int:
    """Outbox consumer loop: claim, handler, ack or fail; between claims
    LISTEN on the topic's channel, idem_outbox_channel(topic)
    (``wakeup="notify"``: the role needs EXECUTE on it), or claims that
    wait (``"wait"``).

    Claims up to ``max_events`` due events of ``topic`` under a ``lease``
    (seconds), calls ``handler(event)`` for each outside any transaction,
    then acks it; if the handler raises ``RetryAfter(s)`` the event fails
    with retry_after s, any other exception fails it with its text (its
    first 16,384 characters, what the database's encoding cannot hold
    escaped: _encodable) and the server's backoff.  ``event`` is a dict: event_id, key, topic, run_id,
    step, attempt (1 on the first delivery), payload (JSON numbers as
    Decimal), created_at, lease_until.  Deduplicate on the receiving side
    by ``key``: a consumer that dies after its handler ran and before the
    ack delivers that event again after the lease.

    When nothing is due it waits for a NOTIFY of ``topic``, and claims
    anyway every ``idle`` seconds (expired leases and prepared transactions
    send no NOTIFY).  With ``wakeup="wait"`` each claim is
    ``idem_outbox_claim(..., wait => idle)`` instead: one that finds nothing
    waits, in the same statement, until an event of ``topic`` commits
    (whether or not producers send NOTIFY: idem.outbox_notify off; without
    idem in shared_preload_libraries the server polls instead) or ``idle``
    seconds pass (at most 3600), claiming what became due meanwhile.  It
    needs READ COMMITTED: where the session's default isolation is higher,
    each such claim is a READ COMMITTED transaction block of its own.  It
    holds a server connection and a snapshot while it
    waits; a stop cancels the waiting claim, which then leases nothing.
    ``stop`` is a threading.Event-like object; without
    one, SIGTERM and SIGINT stop the loop (main thread only).  Stopping
    lets the running handler finish and report; the rest of the batch is
    handed back (idem_outbox_release: due now, attempt not counted).  A lost lease (ID412) or an
    event already delivered (ID410, or IDE04 once its ack deleted it) is logged and skipped; a lost
    connection is replaced by ``connect()``.  An error of a claim is
    retried or raised by the workers' rule (_claim_advice): a transient one
    (idem_retry_advice) or a standby's 25006 is claimed again after a
    backoff; one that retrying cannot cure (no grant, the topic dropped)
    ends the loop: consume() raises it.

    LISTEN needs a session of its own: with ``wakeup="notify"``,
    ``connect`` must reach the server directly, not through a transaction
    pooler (PgBouncer in transaction mode would hand the LISTEN and the
    claims to different server sessions).  ``wakeup="wait"`` issues no
    LISTEN, and a claim and its wait are one statement, so one server
    session: ``connect`` may go through PgBouncer in transaction mode.
    The connection is set to client_encoding UTF8 if it is not (a narrower
    one cannot read an event holding a character beyond it).
    Returns the number of events acknowledged."""
    import select
    import signal
    import threading

    if wakeup not in ("notify", "wait"):
        raise ValueError(f"wakeup must be 'notify' or 'wait', not {wakeup!r}")
    restore = []
    if stop is None:
        stop = threading.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                restore.append((sig, signal.signal(sig, lambda *_: stop.set())))
    woke = []        # our topic's NOTIFYs read by psycopg during a query
    channel = []     # our topic's channel, once asked for
    conn = None
    in_block = False     # conn's claims in a transaction block: _claims_in_block
    acked = 0
    down = 0         # connection attempts failed in a row

    def open_conn():
        nonlocal in_block
        c = connect()
        c.autocommit = True
        if _not_utf8(c):
            c.execute(_UTF8)
        if wakeup == "wait":
            in_block = _claims_in_block(c)
        if wakeup == "notify":
            if not channel:
                channel.append(c.execute("SELECT idem_outbox_channel(%s)",
                                         (topic,)).fetchone()[0])
            c.add_notify_handler(lambda n: n.channel == channel[0] and woke.append(n))
            c.execute(f'LISTEN "{channel[0]}"')   # [a-z0-9_], from the server
        return c

    def claim():
        """One claim; in wait mode with its wait (``idle``), which a stop
        cancels (the protocol's cancel request, as conn.cancel() sends):
        the 57014 that follows is the stop, not an error, and nothing was
        leased."""
        params = (topic, max_events, f"{lease} seconds", consumer)
        if wakeup != "wait":
            return conn.execute(_CLAIM, params).fetchall()
        # made here, in the connection's thread; PQcancel itself is
        # thread-safe
        canceller = conn.pgconn.get_cancel()
        done = threading.Event()

        def watch():
            sent = None
            # a stop set from a signal or another thread is seen within
            # 0.1 s; a cancel that reached the server before the statement
            # did is lost, so it is sent again each second until the claim ends
            while not done.wait(0.1):
                if stop.is_set() and (sent is None or time.monotonic() - sent >= 1):
                    sent = time.monotonic()
                    try:
                        canceller.cancel()
                    except psycopg.OperationalError as e:
                        _log.warning("idem consumer: cancelling the wait failed: %s", e)
        watcher = threading.Thread(target=watch, name="idem-consume-cancel", daemon=True)
        watcher.start()
        try:
            with conn.transaction() if in_block else contextlib.nullcontext():
                return conn.execute(_CLAIM_WAIT,
                                    params + (f"{min(idle, 3600)} seconds",)).fetchall()
        except psycopg.errors.QueryCanceled as e:
            # (an OperationalError too, but the session is fine)
            if not stop.is_set():
                # statement_timeout or someone else's cancel: claim again
                _log.warning("idem consumer: wait cancelled: %s", e)
            return []
        finally:
            done.set()
            watcher.join()

    def pause(seconds):
        """Sleep up to ``seconds``, waking for our topic's NOTIFY or stop."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and not woke:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            # short slices: a stop set from a signal or another thread is
            # seen within 0.2 s however long the idle timeout
            if conn is None:
                time.sleep(min(left, 0.2))
                continue
            ready, _, _ = select.select([conn.fileno()], [], [], min(left, 0.2))
            if ready:
                try:
                    conn.pgconn.consume_input()
                except psycopg.OperationalError as e:
                    # the session ended (terminated, server restart): the
                    # next claim reconnects
                    _log.warning("idem consumer: connection lost while waiting: %s", e)
                    close()
                    return
                while (n := conn.pgconn.notifies()) is not None:
                    if n.relname.decode() == channel[0]:
                        woke.append(n)

    def report(sql, params, event):
        """Run an ack or fail (params: a tuple, or a function of the
        connection that sends it); True if it held.  A lost connection is
        replaced and the report sent again: the token is not tied to the
        session, and an ack that lands spares the receiver a duplicate."""
        nonlocal conn
        for again in (False, True):
            try:
                if conn is None:
                    conn = open_conn()
                return conn.execute(sql, params(conn) if callable(params) else params).fetchone()
            except psycopg.OperationalError as e:
                close()
                if again:
                    _log.warning("idem consumer: event %s not reported (%s); it comes back"
                                 " after its lease", event["key"], e)
                    return None
                _log.warning("idem consumer: connection lost while reporting event %s,"
                             " reconnecting", event["key"])
            except psycopg.Error as e:
                if getattr(e, "sqlstate", None) in _LOST_LEASE:
                    _log.warning("idem consumer: event %s (attempt %s) not reported, %s: %s",
                                 event["key"], event["attempt"], e.sqlstate,
                                 e.diag.message_primary)
                    return None
                raise

    def close():
        nonlocal conn
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        conn = None

    try:
        while not stop.is_set():
            woke.clear()
            try:
                if conn is None:
                    conn = open_conn()
                rows = claim()
                down = 0
            except psycopg.Error as e:
                # as a worker's claim (_claim_advice); events a lost claim
                # leased come back after their lease
                advice = _claim_advice(e, conn)
                if advice not in ("reconnect", "retry", "retry_later"):
                    _log.error("idem consumer: claim failed (%s); stopping", str(e).strip())
                    raise
                # a new connection also for a transient error: its set-up
                # (LISTEN, the claims' isolation) may be what failed
                close()
                down += 1
                # 'retry_later' (a lock, a full server) from the doubled base
                delay = min(5.0, 0.1 * 2 ** min(down + (advice == "retry_later"), 6))
                _log.warning("idem consumer: %s; %s in %.1f s", str(e).strip(),
                             "reconnecting" if advice == "reconnect" else "claiming again", delay)
                pause(delay)
                continue
            for i, (event_id, key, top, payload, run_id, step_name, attempt, token,
                    created_at, lease_until) in enumerate(rows):
                if stop.is_set():
                    # hand the rest back: due now for any consumer, their
                    # attempt not counted (one not reported comes back
                    # after its lease)
                    for rest in rows[i:]:
                        report("SELECT idem_outbox_release(%s, %s)", (rest[0], rest[7]),
                               {"key": rest[1], "attempt": rest[6]})
                    break
                event = {"event_id": event_id, "key": key, "topic": top, "run_id": run_id,
                         "step": step_name, "attempt": attempt, "created_at": created_at,
                         "lease_until": lease_until}
                try:
                    event["payload"] = loads(payload)
                    handler(event)
                except RetryAfter as e:
                    report("SELECT idem_outbox_fail(%s, %s, %s, " + RETRY_AFTER + ")",
                           lambda c: (event_id, token, _failure_text(e, c)[:_EVENT_ERROR_MAX],
                                      _ttl(e.seconds)), event)
                except Exception as e:  # the handler's failure is the event's, not the loop's
                    r = report("SELECT idem_outbox_fail(%s, %s, %s)",
                               lambda c: (event_id, token,
                                          _failure_text(e, c)[:_EVENT_ERROR_MAX]),
                               event)
                    if r is not None and r[0] is None:
                        _log.error("idem consumer: event %s is dead after attempt %s: %s",
                                   key, attempt, e)
                else:
                    if report("SELECT idem_outbox_ack(%s, %s)", (event_id, token), event):
                        acked += 1
            if not rows and wakeup == "notify":
                pause(idle)
    finally:
        close()
        for sig, old in restore:
            signal.signal(sig, old)
    return acked
