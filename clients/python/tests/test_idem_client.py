"""The Python helper against a real server, directly and through PgBouncer
in transaction mode (the dsn fixture runs each test both ways)."""

import asyncio
import datetime
import threading
from decimal import Decimal

import psycopg
import pytest

import idem_client as idem


def ins(table):
    return f"INSERT INTO {table} (return_id, amount) VALUES ($1, $2) RETURNING id, return_id, amount"


def count(admin, table):
    return admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_driver_call_without_casts(connect, table, admin):
    # section 1 from the driver: psycopg sends str parameters untyped
    conn = connect()
    with conn.transaction():
        r = conn.execute("SELECT idem_execute(%s, %s, %s, %s)::text",
                         (f"{table}:raw", ins(table), "inv-1", "25.00")).fetchone()[0]
    assert '"amount": 25.00' in r
    assert count(admin, table) == 1


def test_execute_then_replay_exact_numerics(connect, table, admin):
    conn = connect()
    key = f"{table}:1"
    with conn.transaction():
        first = idem.execute(conn, key, ins(table), "inv-1", Decimal("25.00"))
    assert first.replayed is False and first.rowcount == 1
    assert first.rows[0]["amount"] == Decimal("25.00")
    assert str(first.rows[0]["amount"]) == "25.00"   # not 25.0, not a float
    with conn.transaction():
        again = idem.execute(conn, key, ins(table), "inv-1", "25.00")
    assert again.replayed is True
    assert again.rows == first.rows
    assert again.first_executed_at == first.first_executed_at
    assert count(admin, table) == 1


def test_async_execute_and_step(route, table, admin):
    """aexecute and astep on an AsyncConnection: the same calls as execute
    and step (a retry from the other helper replays), the same errors."""
    dsn, kw = route

    async def calls():
        async with await psycopg.AsyncConnection.connect(dsn, **kw) as conn:
            async with conn.transaction():
                first = await idem.aexecute(conn, f"{table}:a1", ins(table), "inv-a",
                                            Decimal("25.00"))
            async with conn.transaction():
                again = await idem.aexecute(conn, f"{table}:a1", ins(table), "inv-a", "25.00")
            with pytest.raises(idem.KeyReused) as e:
                async with conn.transaction():
                    await idem.aexecute(conn, f"{table}:a1", ins(table), "inv-a", "26.00")
            await conn.set_autocommit(True)
            await conn.execute("SELECT idem_run_begin(%s, steps => ARRAY['pay'])",
                               (f"{table}:run",))
            step = await idem.astep(conn, f"{table}:run", "pay", ins(table), "inv-s", 3)
            return first, again, e.value, step
    first, again, reused, step = asyncio.run(calls())
    assert first.replayed is False and first.rows[0]["amount"] == Decimal("25.00")
    assert again.replayed is True and again.rows == first.rows
    assert reused.sqlstate == "ID422" and isinstance(reused, psycopg.Error)
    assert step.replayed is False and step.rowcount == 1
    # the same call from the blocking helper replays
    conn = psycopg.connect(dsn, **kw)
    with conn.transaction():
        assert idem.execute(conn, f"{table}:a1", ins(table), "inv-a", "25.00").replayed
    conn.close()
    assert count(admin, table) == 2


def test_arguments_and_timestamps_arrive_exactly(connect, table, admin):
    # the arguments travel as one text[] literal: quotes, backslashes,
    # braces, commas, spaces, an empty string, the word NULL and a real
    # NULL all arrive as sent
    conn = connect()
    tricky = ['say "hi"', "back\\slash", "{a,b}", " x ", "", "NULL", None]
    with conn.transaction():
        r = idem.execute(conn, f"{table}:args", "SELECT $1 AS a, $2 AS b, $3 AS c, $4 AS d,"
                         " $5 AS e, $6 AS f, $7 AS g", *tricky)
    assert list(r.rows[0].values()) == tricky
    # first_executed_at is the record's creation time, to the microsecond
    created = admin.execute("SELECT created_at FROM idem.keys WHERE key = %s",
                            (f"{table}:args",)).fetchone()[0]
    assert r.first_executed_at == created


def test_rolled_back_call_leaves_nothing(connect, table, admin):
    conn = connect()
    key = f"{table}:rb"
    with pytest.raises(RuntimeError):
        with conn.transaction():
            idem.execute(conn, key, ins(table), "inv-1", "1.00")
            raise RuntimeError("application fails after the call")
    assert count(admin, table) == 0
    with conn.transaction():
        assert idem.execute(conn, key, ins(table), "inv-1", "1.00").replayed is False
    assert count(admin, table) == 1


def test_key_reused(connect, table, admin):
    conn = connect()
    key = f"{table}:1"
    with conn.transaction():
        idem.execute(conn, key, ins(table), "inv-1", "25.00")
    with pytest.raises(idem.KeyReused) as e:
        with conn.transaction():
            idem.execute(conn, key, ins(table), "inv-1", "26.00")
    assert e.value.sqlstate == "ID422"
    assert "Retry advice: never" in e.value.hint
    # psycopg's conventions: a psycopg.Error whose diag is the server's report
    assert isinstance(e.value, psycopg.DatabaseError)
    assert e.value.diag.sqlstate == "ID422"
    assert e.value.diag.message_primary == e.value.message and "key" in e.value.message
    assert e.value.diag.message_hint == e.value.hint
    assert isinstance(e.value.__cause__, psycopg.Error) and e.value.__cause__.sqlstate == "ID422"
    assert count(admin, table) == 1


def test_in_progress_without_wait(connect, table, admin):
    holder, other = connect(), connect()
    key = f"{table}:busy"
    with holder.transaction():
        idem.execute(holder, key, ins(table), "inv-1", "1.00")
        with pytest.raises(idem.InProgress) as e:
            with other.transaction():
                idem.execute(other, key, ins(table), "inv-1", "1.00", wait=False)
        assert e.value.sqlstate == "ID409"
    with other.transaction():
        assert idem.execute(other, key, ins(table), "inv-1", "1.00").replayed is True


def test_nested_key(connect, table):
    conn = connect()
    key = f"{table}:nest"
    with pytest.raises(idem.NestedKey):
        with conn.transaction():
            idem.execute(conn, key, "SELECT idem_execute($1, 'SELECT 1')", key)


def test_event_not_found_is_not_run_not_found(connect, table):
    """An outbox event that does not exist is IDE04, its own class: a
    missing run (ID404) is something else."""
    conn = connect()
    with pytest.raises(idem.EventNotFound) as e:
        with conn.transaction():
            idem.execute(conn, f"{table}:ack", "SELECT idem_outbox_ack("
                         "'00000000-0000-4000-8000-000000000000',"
                         " '00000000-0000-4000-8000-000000000001') AS acked")
    assert e.value.sqlstate == "IDE04" and not isinstance(e.value, idem.RunNotFound)
    with pytest.raises(idem.RunNotFound) as e:
        with conn.transaction():
            idem.step(conn, f"{table}:no-run", "a", "SELECT 1")
    assert e.value.sqlstate == "ID404" and not isinstance(e.value, idem.EventNotFound)


def test_options_apply_to_the_call_only(connect, table, admin):
    conn = connect()
    with conn.transaction():
        idem.execute(conn, f"{table}:o1", ins(table), "inv-1", "1.00",
                     outbox_topic="refunds", ttl="2 hours")
        # not even the rest of the transaction sees the option
        assert conn.execute("SELECT current_setting('idem.outbox_topic')").fetchone()[0] == ""
        idem.execute(conn, f"{table}:o2", ins(table), "inv-2", "2.00")
    topics = admin.execute("SELECT key, topic FROM idem.outbox WHERE key LIKE %s ORDER BY key",
                           (f"{table}:%",)).fetchall()
    assert topics == [(f"{table}:o1", "refunds")]
    ttl = admin.execute("SELECT expires_at - created_at FROM idem.keys WHERE key = %s",
                        (f"{table}:o1",)).fetchone()[0]
    assert 7100 < ttl.total_seconds() < 7300


def test_cached_error(connect, table, admin):
    conn = connect()
    key = f"{table}:dup"
    admin.execute(f"INSERT INTO {table} (return_id, amount) VALUES ('taken', 1)")
    for replay in (False, True):
        with conn.transaction():
            conn.execute("SELECT set_config('idem.cache_errors', '23', true)")
            with pytest.raises(idem.CachedError) as e:
                idem.execute(conn, key, ins(table), "taken", "5.00")
            # caught inside the transaction, so the recorded outcome commits
        assert e.value.sqlstate == "23505" and e.value.replayed is replay
    assert count(admin, table) == 1


def test_steps_and_sequencing(connect, table, admin):
    conn = connect()
    run = f"{table}:run"
    with conn.transaction():
        conn.execute("SELECT idem_run_begin(%s, ARRAY['refund', 'notify'])", (run,))
    with pytest.raises(idem.OutOfSequence):
        with conn.transaction():
            idem.step(conn, run, "notify", "SELECT 1 AS sent")
    with pytest.raises(idem.StepUndeclared):
        with conn.transaction():
            idem.step(conn, run, "label", "SELECT 1")
    with pytest.raises(idem.RunNotFound):
        with conn.transaction():
            idem.step(conn, run + "-nope", "refund", "SELECT 1")
    with conn.transaction():
        r = idem.step(conn, run, "refund", ins(table), "ret-1", "9.90")
    assert r.replayed is False and r.rows[0]["amount"] == Decimal("9.90")
    with conn.transaction():
        assert idem.step(conn, run, "refund", ins(table), "ret-1", "9.90").replayed is True
    with conn.transaction():
        conn.execute("SELECT idem_run_fail(%s, 'carrier down')", (run,))
    with pytest.raises(idem.RunNotRunning):
        with conn.transaction():
            idem.step(conn, run, "notify", "SELECT 1 AS sent")
    assert count(admin, table) == 1


def test_retry_after_connection_killed_mid_transaction(connect, table, admin):
    """The backend is terminated after the call, before COMMIT: the
    transaction is lost, the wrapper reconnects and runs all of it again,
    and the call executes once."""
    key = f"{table}:crash"
    attempts, retried = [], []

    def tx(conn):
        r = idem.execute(conn, key, ins(table), "inv-1", "3.00")
        attempts.append(r.replayed)
        if len(attempts) == 1:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            # wait (up to 10 s) until the backend is gone
            admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
            conn.execute("SELECT 1")     # the connection is gone
        return r

    r, conn = idem.retry(connect, tx, base=0.01,
                         on_retry=lambda e, d: retried.append(e))
    assert attempts == [False, False]    # the first attempt was rolled back
    assert len(retried) == 1
    assert r.replayed is False and count(admin, table) == 1


def test_retry_replays_after_serialization_failure(connect, table, admin):
    """Two agents resume one run; the one whose REPEATABLE READ snapshot
    predates the other's step gets 40001, and its retry replays."""
    run = f"{table}:rr"
    admin.execute("SELECT idem_run_begin(%s, ARRAY['refund'])", (run,))
    other = connect()
    attempts = []

    def tx(conn):
        conn.execute("SELECT 1")        # the snapshot is taken here
        if not attempts:
            with other.transaction():
                idem.step(other, run, "refund", ins(table), "ret-1", "4.00")
        attempts.append(None)
        return idem.step(conn, run, "refund", ins(table), "ret-1", "4.00")

    conn = connect()
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    r, _ = idem.retry(connect, tx, base=0.01, conn=conn)
    assert len(attempts) == 2 and r.replayed is True
    assert count(admin, table) == 1


def test_never_advice_is_not_retried(connect, table):
    calls = []

    def tx(conn):
        calls.append(1)
        idem.execute(conn, f"{table}:bad", "SELECT $1::int AS v", "x")

    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        idem.retry(connect, tx, base=0.01)
    assert calls == [1]


def test_retry_after_values():
    """A Retry-After's odd values: never sooner than asked, capped, and a
    header's raw bytes and an int past float's range read (str(b"120") was
    no number nor date, float(10**400) raised OverflowError: either way the
    step or event failed at the server's backoff, sooner than asked); a
    timedelta (which the helpers' ttl takes) and a signaling NaN raised
    ValueError, failing the step at the backoff instead."""
    cap = idem._RETRY_AFTER_MAX_S
    for value, seconds in [(b"120", 120.0), (bytearray(b" 7 "), 7.0), (10 ** 400, cap),
                           ("1e400", cap), ("-5", 0.0), (float("nan"), 0.0), (None, 0.0),
                           ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0), (b"", 0.0),
                           (datetime.timedelta(seconds=90), 90.0), (Decimal("sNaN"), 0.0)]:
        assert idem.RetryAfter(value).seconds == seconds, value
    assert 86000 < idem.RetryAfter(
        (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1))
        .strftime("%a, %d %b %Y %H:%M:%S GMT").encode()).seconds <= 86400
    with pytest.raises(ValueError):
        idem.RetryAfter("soon")


def test_retry_on_a_sql_ascii_database(sql_ascii_db, monkeypatch):
    """On a SQL_ASCII connection idem_retry_advice's text came as bytes:
    b"never" was no "never", and retry() ran a KeyReused again at every
    attempt."""
    monkeypatch.setattr(idem, "_advice_cache", {})
    calls = []

    def write(value):
        def fn(conn):
            calls.append(value)
            return idem.execute(conn, "ascii:retry", "SELECT $1::text AS v", value).rows
        return fn
    connect = lambda: psycopg.connect(sql_ascii_db)  # noqa: E731
    rows, conn = idem.retry(connect, write("a"), sleep=lambda s: None)
    assert rows == [{"v": "a"}]
    with pytest.raises(idem.KeyReused):
        idem.retry(connect, write("b"), conn=conn, sleep=lambda s: None)
    assert calls == ["a", "b"]
    conn.close()


def test_backoff_is_full_jitter(monkeypatch, connect, table, admin):
    """retry_later (ID409) waits uniform(0, min(cap, base*2**(n+1)))."""
    holder = connect()
    key = f"{table}:jitter"
    delays, bounds = [], []
    monkeypatch.setattr(idem.random, "uniform",
                        lambda lo, hi: (bounds.append((lo, hi)), hi / 2)[1])

    def tx(conn):
        return idem.execute(conn, key, ins(table), "inv-1", "1.00", wait=False)

    with holder.transaction():
        idem.execute(holder, key, ins(table), "inv-1", "1.00")
        with pytest.raises(idem.InProgress):
            idem.retry(connect, tx, attempts=4, base=0.1, cap=0.3, sleep=delays.append)
    assert bounds == [(0, 0.2), (0, 0.3), (0, 0.3)]
    assert delays == [0.1, 0.15, 0.15]


def test_no_session_state_leaks_through_the_pooler(bouncer, table, admin):
    """Two clients of a one-connection pool share one server session: the
    helper's per-call options do not reach the other client, while a plain
    session SET (the thing to avoid) does -- so the check can see a leak."""
    a = psycopg.connect(bouncer.dsn("idemone"), prepare_threshold=None, autocommit=True)
    b = psycopg.connect(bouncer.dsn("idemone"), prepare_threshold=None, autocommit=True)
    try:
        pid_a = a.execute("SELECT pg_backend_pid()").fetchone()[0]
        with a.transaction():
            idem.execute(a, f"{table}:leak", ins(table), "inv-1", "1.00",
                         outbox_topic="refunds", wait=False, ttl=3600)
        assert b.execute("SELECT pg_backend_pid()").fetchone()[0] == pid_a
        assert b.execute("SELECT current_setting('idem.outbox_topic'), "
                         "current_setting('idem.wait'), current_setting('idem.ttl')"
                         ).fetchone() == ("", "on", "1d")
        a.execute("SET idem.outbox_topic = 'leaked'")
        assert b.execute("SELECT current_setting('idem.outbox_topic')").fetchone()[0] == "leaked"
        b.execute("RESET idem.outbox_topic")
    finally:
        a.close()
        b.close()


def test_lost_commit_acknowledgement_replays(cluster, table, admin):
    """The COMMIT succeeds and its reply is lost (a proxy drops the
    connection): the wrapper cannot know, runs the transaction again, and
    idem replays instead of refunding twice."""
    from clusters import AckLosingProxy
    proxy = AckLosingProxy(cluster.port)
    key = f"{table}:ack"
    seen = []

    def tx(conn):
        r = idem.execute(conn, key, ins(table), "inv-1", "7.00")
        seen.append(r.replayed)
        return r

    def connect():
        return psycopg.connect(proxy.dsn(), prepare_threshold=None)

    try:
        proxy.armed = True
        r, conn = idem.retry(connect, tx, base=0.01)
        conn.close()
    finally:
        proxy.stop()
    assert proxy.lost == 1
    assert seen == [False, True] and r.replayed is True
    assert count(admin, table) == 1
