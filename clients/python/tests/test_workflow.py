"""Workflow and Worker on the runs on queues, directly and through
PgBouncer in transaction mode: runs complete with each effect once,
failures and Retry-After go through the runtime's policy, a slow step keeps
its lease, a taken-over run stops its holder, SIGTERM drains, and worker
processes SIGKILLed at random leave every effect exactly once and every
attempt on record; AsyncWorker (asyncio) the same for its runs, failures,
drain and kills; values written into a worker's statements reach the
server as written."""

import asyncio
import collections.abc
import datetime
import os
import random
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal

import psycopg
import pytest

import idem_client as idem
import returns_workflow
from carrier import Carrier
from claim_fault import claim_faults
from nesting import deepest_stack, nested_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
_queues = iter(range(1, 10**6))


@pytest.fixture
def queue(admin):
    """A fresh queue (fast backoff) and the workflow tables."""
    name = f"wfq{next(_queues)}_{os.getpid()}"
    admin.execute(returns_workflow.SCHEMA)
    admin.execute("SELECT idem_queue_create(%s, max_attempts => 3, backoff_base => '50 ms',"
                  " backoff_cap => '200 ms', jitter => 'none')", (name,))
    admin.execute("INSERT INTO wf_stock VALUES (%s, 0) ON CONFLICT DO NOTHING", (name,))
    return name


def until(cond, timeout, what):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Running:
    """A Worker in a thread, stopped (its stop event) by finish()."""

    def __init__(self, connect, wfs, **kw):
        self.stop = threading.Event()
        self.worker = idem.Worker(connect, wfs, stop=self.stop, **kw)
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.worker.run()
        except BaseException as e:      # what run() raised: finish() raises it
            self.error = e

    def finish(self):
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        return self.result


class RunningAsync:
    """An AsyncWorker on a loop of its own in a thread, stopped by finish()."""

    def __init__(self, route, wfs, **kw):
        dsn, ckw = route
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.worker = idem.AsyncWorker(lambda: psycopg.AsyncConnection.connect(dsn, **ckw), wfs,
                                       stop=self.stop, **kw)
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.loop.run_until_complete(self.worker.run())
        except BaseException as e:
            self.error = e

    def finish(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(15)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.loop.close()
        if self.error is not None:
            raise self.error
        return self.result


def running(asynchronous, dsn, kw, wfs, **opts):
    """A Worker (threads) or an AsyncWorker of wfs, started, connecting to
    dsn with the keywords kw (read at every connect)."""
    if asynchronous:
        return RunningAsync((dsn, kw), wfs, **opts)
    return Running(lambda: psycopg.connect(dsn, **kw), wfs, **opts)

def counting(connect, statements):
    """connect, with every statement sent through a cursor of the
    connection appended to statements (the worker's all are)."""
    class Counting(psycopg.Cursor):
        def execute(self, query, params=None, **kw):
            statements.append(query)
            return super().execute(query, params, **kw)

    def _connect():
        c = connect()
        c.cursor_factory = Counting
        return c
    return _connect


def statuses(admin, queue):
    return dict(admin.execute("SELECT status, count(*) FROM idem_runs WHERE queue = %s"
                              " GROUP BY status", (queue,)).fetchall())


def start_runs(connect, wf, queue, n):
    conn = connect()
    for i in range(n):
        with conn.transaction():
            s = wf.start(conn, f"{queue}:ret-{i}",
                         input={"sku": queue, "amount": Decimal("25.00"), "customer": f"c{i}"})
            assert s.created and s.status == "running"
    # the same run again is the same run
    with conn.transaction():
        again = wf.start(conn, f"{queue}:ret-0",
                         input={"sku": queue, "amount": Decimal("25.00"), "customer": "c0"})
    assert not again.created
    with pytest.raises(idem.KeyReused):
        with conn.transaction():
            wf.start(conn, f"{queue}:ret-0", input={"sku": queue, "amount": "26.00"})


def check_exactly_once(admin, queue, n, carrier):
    assert statuses(admin, queue) == {"completed": n}
    assert admin.execute("SELECT on_hand FROM wf_stock WHERE sku = %s", (queue,)).fetchone()[0] == n
    rows = admin.execute("SELECT run_id, amount::text, label_id FROM wf_refunds WHERE run_id LIKE %s",
                         (queue + ":%",)).fetchall()
    assert len(rows) == n and len({r[0] for r in rows}) == n
    assert {r[1] for r in rows} == {"25.00"}      # the Decimal input, exact
    # one label per run at the carrier, the refund recorded with it
    mine = {k: v for k, v in carrier.labels.items() if queue in k}
    assert len(mine) == n
    assert sorted(r[2] for r in rows) == sorted(v["label_id"] for v in mine.values())
    assert admin.execute("SELECT count(*) FROM idem.outbox WHERE run_id LIKE %s",
                         (queue + ":%",)).fetchone()[0] == n
    # every attempt ended, and each run's last one completed it
    assert admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id LIKE %s"
                         " AND outcome IS NULL", (queue + ":%",)).fetchone()[0] == 0
    assert admin.execute(
        "SELECT count(*) FROM (SELECT DISTINCT ON (run_id) run_id, outcome FROM idem_run_attempts"
        " WHERE run_id LIKE %s ORDER BY run_id, claim DESC) a WHERE outcome = 'completed'",
        (queue + ":%",)).fetchone()[0] == n


def check_completed(admin, queue, n, carrier, stats):
    """check_exactly_once, by one worker whose counts are stats."""
    check_exactly_once(admin, queue, n, carrier)
    assert stats["completed"] == n and stats["steps"] == 4 * n and stats["lost"] == 0
    # the notify step recorded its return value, with the refund's exact amount
    rec = admin.execute("SELECT response::text FROM idem_run_steps(%s)"
                        " WHERE step = 'notify'", (f"{queue}:ret-3",)).fetchone()
    assert rec is not None and idem.loads(rec[0]) == {"to": "c3", "amount": Decimal("25.00")}


def test_one_workflow_per_queue():
    """Two workflows on one queue in a worker: refused.  The second took the
    first's place, and the first's runs failed at steps it had no function
    for."""
    a, b = idem.Workflow("returns", steps=["a"]), idem.Workflow("returns2", steps=["b"],
                                                                queue="returns")
    for cls in (idem.Worker, idem.AsyncWorker):
        with pytest.raises(ValueError, match="one workflow per queue"):
            cls(psycopg.connect, [a, b])


def test_runs_complete_with_each_effect_once(connect, admin, queue):
    carrier = Carrier()
    wf = returns_workflow.make(carrier.url, queue=queue)
    start_runs(connect, wf, queue, 12)
    w = Running(connect, [wf], concurrency=3, lease=5, poll=0.2)
    until(lambda: statuses(admin, queue) == {"completed": 12}, 60, "12 completed runs")
    check_completed(admin, queue, 12, carrier, w.finish())


def test_async_runs_complete_with_each_effect_once(route, admin, queue):
    """AsyncWorker, the workflow's steps async def (the label's call in a
    thread), runs enqueued with astart: each effect once, the results
    recorded, a database step's key read with await ctx.step_key()."""
    dsn, kw = route
    carrier = Carrier()
    wf = returns_workflow.make(carrier.url, queue=queue, asynchronous=True)
    keys = []
    check = wf._steps["check"].fn

    async def check_with_key(ctx):
        with pytest.raises(RuntimeError, match="step_key"):
            ctx.key
        keys.append((ctx.run_id, await ctx.step_key()))
        return await check(ctx)
    wf._steps["check"] = wf._steps["check"]._replace(fn=check_with_key)

    async def enqueue():
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, **kw) as c:
            for i in range(10):
                s = await wf.astart(c, f"{queue}:ret-{i}", input={
                    "sku": queue, "amount": Decimal("25.00"), "customer": f"c{i}"})
                assert s.created and s.status == "running"
            again = await wf.astart(c, f"{queue}:ret-0", input={
                "sku": queue, "amount": Decimal("25.00"), "customer": "c0"})
            assert not again.created
            with pytest.raises(idem.KeyReused):
                await wf.astart(c, f"{queue}:ret-0", input={"sku": queue})
    asyncio.run(enqueue())
    w = RunningAsync(route, [wf], concurrency=3, lease=5, poll=0.2)
    until(lambda: statuses(admin, queue) == {"completed": 10}, 60, "10 completed runs")
    check_completed(admin, queue, 10, carrier, w.finish())
    assert len(keys) == 10 and all(
        k == admin.execute("SELECT idem_step_key(%s, 'check')", (r,)).fetchone()[0]
        for r, k in keys)


def test_async_retry_after_and_exceptions_go_through_the_policy(route, admin, queue):
    """In an AsyncWorker, an async step's RetryAfter brings the run back no
    sooner, and an exception fails the run after its last attempt."""
    carrier = Carrier(busy=1.0, retry_after="1")
    wf = returns_workflow.make(carrier.url, queue=queue, asynchronous=True)
    bad = idem.Workflow(queue + "_bad", steps=["boom"], max_attempts=2)
    seen = []

    @bad.step("boom")
    async def boom(ctx):
        seen.append(ctx.attempt)
        await asyncio.sleep(0)
        raise ValueError(f"bad return {ctx.input['id']}")
    admin.execute("SELECT idem_queue_create(%s, backoff_base => '50 ms', backoff_cap => '200 ms',"
                  " jitter => 'none')", (bad.queue,))
    conn = psycopg.connect(route[0], autocommit=True, **route[1])
    wf.start(conn, f"{queue}:ret-0", input={"sku": queue, "amount": Decimal("25.00"),
                                            "customer": "c0"})
    bad.start(conn, f"{queue}:bad", input={"id": 7})
    conn.close()
    w = RunningAsync(route, [wf, bad], concurrency=2, lease=5, poll=0.1)
    until(lambda: any(o == "503" for _, o in carrier.log), 10, "a 503")
    carrier.busy = 0.0
    t503 = time.time()
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    assert time.time() - t503 >= 0.9          # not before the Retry-After
    until(lambda: statuses(admin, bad.queue) == {"failed": 1}, 20, "the failed run")
    w.finish()
    assert [r[0] for r in admin.execute(
        "SELECT outcome FROM idem_run_attempts WHERE run_id = %s ORDER BY claim",
        (f"{queue}:ret-0",))] == ["step_failed", "completed"]
    assert [o for _, o in carrier.log] == ["503", "created"]
    assert seen == [1, 2]
    assert admin.execute("SELECT last_error FROM idem_runs WHERE run_id = %s",
                         (f"{queue}:bad",)).fetchone()[0] == "ValueError: bad return 7"


def test_retry_after_and_exceptions_go_through_the_policy(connect, admin, queue):
    # the carrier answers 503 with Retry-After: 1 to the first request of each key
    carrier = Carrier(busy=1.0, retry_after="1")
    wf = returns_workflow.make(carrier.url, queue=queue)
    start_runs(connect, wf, queue, 1)
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: any(o == "503" for _, o in carrier.log), 10, "a 503")
    carrier.busy = 0.0
    t503 = time.time()
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    assert time.time() - t503 >= 0.9          # not before the Retry-After
    w.finish()
    attempts = admin.execute("SELECT step, outcome, error FROM idem_run_attempts"
                             " WHERE run_id = %s ORDER BY claim", (f"{queue}:ret-0",)).fetchall()
    # (an attempt is recorded under the step it was claimed at)
    assert [(o, e) for _, o, e in attempts] == [("step_failed", "carrier 503"), ("completed", None)]
    assert attempts[-1][1] == "completed"
    # the same key twice at the carrier: one label
    assert [o for _, o in carrier.log] == ["503", "created"]


def test_an_exception_fails_the_run_after_its_last_attempt(connect, admin, queue):
    wf = idem.Workflow(queue, steps=["boom"], max_attempts=2)
    seen = []

    @wf.step("boom")
    def boom(ctx):
        seen.append(ctx.attempt)
        raise ValueError(f"bad return {ctx.input['id']}")
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:bad", input={"id": 7})
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"failed": 1}, 20, "the failed run")
    w.finish()
    assert seen == [1, 2]
    assert admin.execute("SELECT last_error FROM idem_runs WHERE run_id = %s",
                         (f"{queue}:bad",)).fetchone()[0] == "ValueError: bad return 7"


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_step_the_worker_has_no_function_for_waits_for_one_that_has(route, connect, admin,
                                                                      queue, asynchronous):
    """A rolling deploy: a worker of the old version has no function for
    the run's next step.  It hands the run back, due after
    unknown_step_delay, with no attempt used (the run allows one) and the
    reason on record, as often as it claims it; a worker that has the step
    completes the run, the first step executed once."""
    calls = []

    def make(with_b):
        wf = idem.Workflow(queue, steps=["a", "b"], max_attempts=1)

        @wf.step("a")
        def a(ctx):
            calls.append("a")
            return {"a": ctx.input["id"]}
        if with_b:
            @wf.step("b")
            def b(ctx):
                calls.append("b")
                return {"b": ctx.results["a"]["a"]}
        return wf

    def start(wf, name):
        return running(asynchronous, *route, [wf], concurrency=1, lease=5, poll=0.1,
                       unknown_step_delay=0.3, name=name)

    run_id = f"{queue}:deploy"
    conn = connect()
    conn.autocommit = True
    make(False).start(conn, run_id, input={"id": 7})
    old = start(make(False), "old")

    def released():
        return admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id = %s"
                             " AND outcome = 'released'", (run_id,)).fetchone()[0]
    until(lambda: released() >= 3, 20, "the old worker handing the run back three times")
    stats = old.finish()
    assert stats["released"] >= 3 and stats["failed_steps"] == 0
    row = admin.execute("SELECT status, attempt, next_step, last_error FROM idem_runs"
                        " WHERE run_id = %s", (run_id,)).fetchone()
    assert row[:3] == ("running", 1, "b")
    assert row[3] == f"worker old has no function for step 'b' of workflow {queue}"
    # handed back for a while, not at once: the claims are 0.3 s apart
    gaps = admin.execute(
        "SELECT min(c2.claimed_at - c1.ended_at) FROM idem_run_attempts c1"
        " JOIN idem_run_attempts c2 ON c2.run_id = c1.run_id AND c2.claim = c1.claim + 1"
        " WHERE c1.run_id = %s AND c1.outcome = 'released'", (run_id,)).fetchone()[0]
    assert gaps >= datetime.timedelta(seconds=0.3)
    new = start(make(True), "new")
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    new.finish()
    assert calls == ["a", "b"]
    assert admin.execute("SELECT response FROM idem_run_steps(%s) WHERE step = 'b'",
                         (run_id,)).fetchone()[0] == {"b": 7}


class _ReadOnlyUntilFlipped(collections.abc.Mapping):
    """Connect keywords that put each new session in read-only mode (as a
    standby's are) while read_only is set: read at every connect."""

    read_only = True

    def __init__(self):
        self.opened = []        # read_only at each connect

    def __iter__(self):
        return iter(["options"])

    def __len__(self):
        return 1

    def __getitem__(self, k):
        self.opened.append(self.read_only)
        return "-c default_transaction_read_only=on" if self.read_only else ""


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_claim_on_a_read_only_server_reconnects(cluster, admin, queue, asynchronous):
    """A claim that reaches a read-only server (25006: a standby, as after a
    failover before the address moves to the new primary) reconnects and
    claims again, as after a lost connection: the worker does not stop,
    and claims the run once the server it reaches is writable."""
    kw = _ReadOnlyUntilFlipped()
    wf = idem.Workflow(queue, steps=["a"])

    @wf.step("a")
    def a(ctx):
        return {"ok": ctx.input["id"]}
    wf.start(admin, f"{queue}:ro", input={"id": 1})
    w = running(asynchronous, cluster.dsn(), kw, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: kw.opened.count(True) >= 4, 20,
          "the claimer reconnecting to a read-only server")
    assert w.thread.is_alive(), "the worker stopped"
    assert admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id = %s",
                         (f"{queue}:ro",)).fetchone()[0] == 0
    kw.read_only = False
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    w.finish()


# idem_retry_advice's: retry (40001, class 72) and a standby (25006:
# reconnect); 72000 stopped the Python workers, the others were retried
@pytest.mark.parametrize("sqlstate", ["40001", "72000", "25006"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_transient_claim_error_is_retried(cluster, admin, queue, asynchronous, sqlstate):
    """A claim error that idem_retry_advice calls transient is retried
    after the worker's backoff (25006, a standby, on a new connection): the
    worker goes on and completes the run."""
    name = f"t-{queue}-{sqlstate}"
    claims, kw = claim_faults(admin, name, sqlstate, 3)
    wf = idem.Workflow(queue, steps=["a"])

    @wf.step("a")
    def a(ctx):
        return {"ok": ctx.input["id"]}
    wf.start(admin, f"{queue}:t", input={"id": 1})
    w = running(asynchronous, cluster.dsn(), kw, [wf], concurrency=1, lease=5, poll=0.1, name=name)
    until(lambda: statuses(admin, queue) == {"completed": 1} or not w.thread.is_alive(), 20,
          "the completed run")
    assert w.thread.is_alive(), f"the worker stopped: {w.error!r}"
    w.finish()
    assert statuses(admin, queue) == {"completed": 1}
    assert claims() > 3


# idem_retry_advice's never: no grant, a bad argument, a feature refused,
# a limit; 54000 and 55000 (psycopg's OperationalError) were retried for ever
@pytest.mark.parametrize("sqlstate", ["42501", "22023", "0A000", "54000", "55000"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_permanent_claim_error_stops_the_worker(cluster, admin, queue, asynchronous, sqlstate):
    """A claim error that retrying will not cure (idem_retry_advice: never)
    stops the worker: run() raises it, at its first claim, having claimed
    nothing."""
    name = f"p-{queue}-{sqlstate}"
    claims, kw = claim_faults(admin, name, sqlstate, 1000)
    wf = idem.Workflow(queue, steps=["a"])

    @wf.step("a")
    def a(ctx):
        return {"ok": 1}
    wf.start(admin, f"{queue}:p", input={})
    w = running(asynchronous, cluster.dsn(), kw, [wf], concurrency=1, lease=5, poll=0.1, name=name)
    w.thread.join(10)
    assert not w.thread.is_alive(), "the worker did not stop"
    assert isinstance(w.error, psycopg.Error) and w.error.sqlstate == sqlstate, repr(w.error)
    assert claims() == 1
    assert statuses(admin, queue) == {"running": 1}
    with pytest.raises(psycopg.Error):
        w.finish()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_worker_of_a_queue_dropped_stops(cluster, admin, queue, asynchronous):
    """A worker of a queue that does not exist (dropped, or never created:
    42704) stops with that error."""
    wf = idem.Workflow(queue + "_gone", steps=["a"])

    @wf.step("a")
    def a(ctx):
        return {}
    w = running(asynchronous, cluster.dsn(), {}, [wf], concurrency=1, lease=5, poll=0.1)
    w.thread.join(10)
    assert not w.thread.is_alive(), "the worker did not stop"
    assert isinstance(w.error, psycopg.errors.UndefinedObject), repr(w.error)


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["Worker", "AsyncWorker"])
def test_a_default_isolation_above_read_committed(cluster, admin, queue, asynchronous, isolation):
    """Where the session's default isolation (a role's or the database's
    setting) is REPEATABLE READ or SERIALIZABLE, in which a claim is
    refused (0A000), the worker claims in a READ COMMITTED transaction of
    its own and runs the steps at the default isolation: the run completes
    with its effect once.  The Worker stopped at its first claim, the
    AsyncWorker too."""
    wf = idem.Workflow(queue, steps=["check", "label"])
    check = ("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1"
             " RETURNING on_hand, current_setting('transaction_isolation') AS isolation")
    if asynchronous:
        @wf.step("check")
        async def acheck(ctx):
            return await ctx.execute(check, queue)
    else:
        @wf.step("check")
        def scheck(ctx):
            return ctx.execute(check, queue)

    @wf.external("label")
    def label(ctx):
        return {"label": ctx.key}
    wf.start(admin, f"{queue}:iso", input={})
    options = "-c default_transaction_isolation=" + isolation.replace(" ", "\\ ")
    w = running(asynchronous, cluster.dsn(), {"options": options}, [wf], concurrency=1, lease=5,
                poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1} or not w.thread.is_alive(), 20,
          "the completed run")
    w.finish()
    assert statuses(admin, queue) == {"completed": 1}
    assert admin.execute("SELECT on_hand FROM wf_stock WHERE sku = %s", (queue,)).fetchone()[0] == 1
    assert admin.execute("SELECT response FROM idem_run_steps(%s) WHERE step = 'check'",
                         (f"{queue}:iso",)).fetchone()[0]["rows"] == [{"on_hand": 1, "isolation": isolation}]
    assert admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id = %s",
                         (f"{queue}:iso",)).fetchone()[0] == 1


def test_retry_after_beyond_the_server_limit_is_the_limit(connect, admin, queue):
    """A Retry-After later than idem.outbox_max_retry_after (1 day) allows:
    the step fails as late as allowed; it was refused and the failure lost,
    and the run came back after the lease."""
    wf = idem.Workflow(queue, steps=["label"])

    @wf.external("label")
    def label(ctx):
        raise idem.RetryAfter("Wed, 21 Oct 2099 07:28:00 GMT", "carrier 429")
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:far", input={})
    w = Running(connect, [wf], concurrency=1, lease=2, poll=0.1)
    until(lambda: admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id = %s"
                                " AND outcome IS NOT NULL", (f"{queue}:far",)).fetchone()[0] > 0,
          10, "the failed attempt")
    w.finish()
    outcome, error = admin.execute("SELECT outcome, error FROM idem_run_attempts WHERE run_id = %s"
                                   " ORDER BY claim", (f"{queue}:far",)).fetchone()
    assert (outcome, error) == ("step_failed", "carrier 429")
    due = admin.execute("SELECT next_due - now() FROM idem_runs WHERE run_id = %s",
                        (f"{queue}:far",)).fetchone()[0]
    assert datetime.timedelta(hours=23) < due <= datetime.timedelta(days=1)


@pytest.mark.parametrize("retry_after", [1e-7, "0.00001"])
def test_a_tiny_retry_after_fails_the_step(connect, admin, queue, retry_after):
    """A Retry-After below 1e-4 s (written 1e-07 by Python) fails the step
    and the run goes on; the failure was refused (interval input) and the
    run came back only after its lease."""
    wf = idem.Workflow(queue, steps=["label"])

    @wf.external("label")
    def label(ctx):
        if ctx.attempt == 1:
            raise idem.RetryAfter(retry_after, "carrier 503")
        return {"label": "l-1"}
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:tiny", input={})
    w = Running(connect, [wf], concurrency=1, lease=30, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 10, "the completed run")
    w.finish()
    assert [r[:2] for r in admin.execute(
        "SELECT outcome, error FROM idem_run_attempts WHERE run_id = %s ORDER BY claim",
        (f"{queue}:tiny",))] == [("step_failed", "carrier 503"), ("completed", None)]


def test_a_run_with_an_integer_longer_than_int_reads(connect, admin, queue):
    """A run whose input holds an integer of 5001 digits (begun in SQL:
    jsonb writes 1e5000 out in full) runs, the integer an exact Decimal;
    int() refused it in the claim (ValueError) and Worker.run() raised:
    each worker that claimed the run ended."""
    wf = idem.Workflow(queue, steps=["echo"])
    wf.external("echo")(lambda ctx: {"n": ctx.input["n"]})
    admin.execute("SELECT idem_run_begin(%s, steps => ARRAY['echo'], input => '{\"n\": 1e5000}',"
                  " queue => %s)", (f"{queue}:big", queue))
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1} or not w.thread.is_alive(), 10,
          "the completed run")
    assert w.finish()["completed"] == 1
    response = admin.execute("SELECT response::text FROM idem_run_steps(%s)",
                             (f"{queue}:big",)).fetchone()[0]
    assert idem.loads(response) == {"n": 10 ** 5000}


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_a_run_nested_deeper_than_the_decoder_reads(route, connect, admin, queue, kind,
                                                    undecodable_depth):
    """A run whose input is nested deeper than the decoder reads (begun in
    SQL) fails its step with the decoder's RecursionError, and the worker
    goes on with the other runs; the error raised out of run() at each
    claim of the run, ending every worker that claimed it."""
    d = undecodable_depth
    wf = idem.Workflow(queue, steps=["a"])

    async def a(ctx):
        return {}
    wf.external("a")(a if kind == "asyncio" else lambda ctx: {})

    def make():
        with admin.transaction():
            deepest_stack(admin)
            admin.execute("SELECT idem_run_begin(%s, steps => ARRAY['a'], queue => %s,"
                          " input => (repeat('[', %s) || repeat(']', %s))::jsonb)",
                          (f"{queue}:deep", queue, d, d))
    nested_or_skip(d, make)
    wf.start(admin, f"{queue}:plain", input={})
    w = running(kind == "asyncio", *route, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"failed": 1, "completed": 1}, 20,
          "the deep run failed, the other completed")
    assert w.finish()["completed"] == 1
    assert "RecursionError" in admin.execute("SELECT last_error FROM idem_runs WHERE run_id = %s",
                                             (f"{queue}:deep",)).fetchone()[0]


def test_a_result_without_json_fails_its_step(connect, admin, queue):
    """An external step returning NaN (no JSON number) fails at once with
    the client's ValueError, though its result is held for the next step's
    call: json.dumps wrote NaN, the next call's complete_result was refused,
    its failure too, and the run came back only after its lease."""
    wf = idem.Workflow(queue, steps=["quote", "pay"])

    @wf.external("quote")
    def quote(ctx):
        return {"rate": float("nan") if ctx.attempt == 1 else Decimal("1.25")}
    wf.step("pay")(lambda ctx: ctx.execute("SELECT $1::numeric AS rate",
                                           ctx.results["quote"]["rate"]))
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:nan", input={})
    w = Running(connect, [wf], concurrency=1, lease=30, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 10, "the completed run")
    w.finish()
    (o1, e1, s1), (o2, _, _) = admin.execute(
        "SELECT outcome, error, step FROM idem_run_attempts WHERE run_id = %s ORDER BY claim",
        (f"{queue}:nan",)).fetchall()
    assert (o1, s1, o2) == ("step_failed", "quote", "completed") and e1.startswith("ValueError")
    with pytest.raises(ValueError):
        idem.dumps([float("inf")])


@pytest.mark.parametrize("message, recorded", [
    ("bad \x00 byte", "ValueError: bad \\x00 byte"),
    ("file \udc80.txt", "ValueError: file \\udc80.txt")], ids=["nul", "surrogate"])
def test_an_exception_text_a_string_cannot_hold(connect, admin, queue, message, recorded):
    """An exception whose message holds a NUL or a lone surrogate (bytes
    decoded with surrogateescape) fails its step, the characters escaped:
    the failure was refused (NUL: lost until the lease ended) or raised out
    of the executor (the surrogate: its next runs held for ever)."""
    wf = idem.Workflow(queue, steps=["a"])

    @wf.external("a")
    def a(ctx):
        if ctx.attempt == 1:
            raise ValueError(message)
        return {}
    conn = connect()
    conn.autocommit = True
    for r in ("r1", "r2"):
        wf.start(conn, f"{queue}:{r}", input={})
    w = Running(connect, [wf], concurrency=1, lease=30, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 2}, 10, "the completed runs")
    w.finish()
    assert [r[0] for r in admin.execute(
        "SELECT error FROM idem_run_attempts WHERE run_id LIKE %s AND outcome = 'step_failed'",
        (f"{queue}:%",))] == [recorded, recorded]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
@pytest.mark.parametrize("where", ["latin1-connection", "latin1-database"])
def test_an_exception_text_the_connection_encoding_cannot_hold(request, route, queue, kind, where):
    """An exception whose message holds an emoji fails its step: psycopg
    refused to encode the failure on a LATIN1 connection, or the server to
    convert it into a LATIN1 database, the failure was not recorded and the
    run waited out its lease.  The worker's connections speak UTF8 (a run
    whose id holds an emoji is claimed: a LATIN1 connection could not read
    it); into a LATIN1 database the emoji is written as its escape (what
    LATIN1 holds, the e acute, kept)."""
    dsn, kw = route
    if where == "latin1-connection":
        kw = {**kw, "client_encoding": "LATIN1"}
    else:
        if dsn != request.getfixturevalue("cluster").dsn():
            pytest.skip("the LATIN1 database is not behind the PgBouncer")
        dsn, kw = request.getfixturevalue("latin1_db"), {**kw, "client_encoding": "UTF8"}
    admin = psycopg.connect(dsn, autocommit=True)
    request.addfinalizer(admin.close)
    if where == "latin1-database":
        admin.execute("SELECT idem_queue_create(%s, max_attempts => 3,"
                      " backoff_base => '50 ms', jitter => 'none')", (queue,))
    wf = idem.Workflow(queue, steps=["a"])

    @wf.external("a")
    def a(ctx):
        if ctx.attempt == 1:
            raise ValueError("caf\u00e9 \U0001f600")
        return {}
    run = f"{queue}:r1" + ("\U0001f4e6" if where == "latin1-connection" else "")
    admin.execute("SELECT idem_run_begin(%s, steps => ARRAY['a'], queue => %s)", (run, queue))
    # a lease far longer than the wait: a lost failure cannot come back in time
    w = running(kind == "asyncio", dsn, kw, [wf], concurrency=1, lease=60, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 10, "the completed run")
    assert w.finish()["failed_steps"] == 1
    assert [r[0] for r in admin.execute(
        "SELECT error FROM idem_run_attempts WHERE run_id = %s AND outcome = 'step_failed'",
        (run,))] == ["ValueError: caf\u00e9 " + (
            "\U0001f600" if where == "latin1-connection" else "\\U0001f600")]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
@pytest.mark.parametrize("following", ["statement", "value"])
def test_a_result_the_database_cannot_hold_fails_its_step(latin1_db, queue, kind, following):
    """An external step's result that a LATIN1 database cannot hold (an
    emoji), held for the next (database) step's call: that call and the
    result's own record are refused (22P05), and the external step fails
    with the server's error, its value never changed; the record was the
    first statement of the failure, which was not recorded either (before
    a step that writes nothing: dropped from the hold, and that step's
    failure refused as out of sequence), and the run waited out its lease
    at every attempt."""
    admin = psycopg.connect(latin1_db, autocommit=True)
    admin.execute("SELECT idem_queue_create(%s, max_attempts => 2, backoff_base => '50 ms',"
                  " jitter => 'none')", (queue,))
    wf = idem.Workflow(queue, steps=["quote", "pay"])
    wf.external("quote")(lambda ctx: {"note": "caf\u00e9 \U0001f600"})
    wf.step("pay")(lambda ctx: {"paid": True} if following == "value" else ctx.execute(
        "SELECT $1::text AS note", ctx.results["quote"]["note"]))
    wf.start(admin, f"{queue}:r1", input={})
    kw = {"client_encoding": "UTF8"}
    w = running(kind == "asyncio", latin1_db, kw, [wf], concurrency=1, lease=60, poll=0.1)
    try:
        until(lambda: statuses(admin, queue) == {"failed": 1}, 10, "the failed run")
    finally:
        w.finish()
    rows = admin.execute("SELECT outcome, step, error FROM idem_run_attempts WHERE run_id = %s"
                         " ORDER BY claim", (f"{queue}:r1",)).fetchall()
    assert [(o, st) for o, st, _ in rows] == [("step_failed", "quote"), ("failed", "quote")]
    assert all(err.startswith("UntranslatableCharacter") and "LATIN1" in err for _, _, err in rows)
    admin.close()


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
@pytest.mark.parametrize("prepare", ["prepares", "inline"])
def test_a_sql_ascii_database(sql_ascii_db, queue, kind, prepare):
    """In a SQL_ASCII database psycopg reads text as bytes: a database
    step's response did not split (TypeError after its statement
    committed, the completed step then refused its failure, and the run
    waited out its lease), ctx.key was bytes, and execute() raised after
    its write.  The worker's connections speak UTF8, the caller's rows are
    decoded; a non-ASCII JSON value, which jsonb there refuses as the \\u
    escape the helpers write, fails its step with the server's error (it
    was held, refused again, and the run waited out its lease)."""
    admin = psycopg.connect(sql_ascii_db, autocommit=True)
    admin.execute("SELECT idem_queue_create(%s, max_attempts => 2, backoff_base => '50 ms',"
                  " jitter => 'none')", (queue,))
    wf = idem.Workflow(queue, steps=["note", "label", "done"])
    # the accent as the UTF-8 bytes a SQL_ASCII database keeps as they are
    wf.step("note")(lambda ctx: ctx.execute(
        "INSERT INTO notes VALUES ($1, 'caf' || CASE WHEN $2 THEN E'\\303\\251' ELSE 'e' END)"
        " RETURNING note", ctx.run_id, ctx.input["accent"]))
    wf.external("label")(lambda ctx: {"key": ctx.key,
                                      "note": ctx.results["note"]["rows"][0]["note"]})
    wf.step("done")(lambda ctx: {"ok": True})
    started = wf.start(admin, f"{queue}:ascii", input={"accent": False})
    assert started == ("running", "note", True)
    wf.start(admin, f"{queue}:latin", input={"accent": True})
    kw = {"prepare_threshold": None} if prepare == "inline" else {}
    w = running(kind == "asyncio", sql_ascii_db, kw, [wf], concurrency=1, lease=60, poll=0.1)
    try:
        until(lambda: admin.execute("SELECT array_agg(status::text ORDER BY run_id)"
                                    " FROM idem_runs WHERE queue = %s",
                                    (queue,)).fetchone()[0] == [b"completed", b"failed"], 10,
              "one run completed, the other failed")
    finally:
        w.finish()
    steps = admin.execute("SELECT step, response::text FROM idem_run_steps(%s)",
                          (f"{queue}:ascii",)).fetchall()
    label = idem.loads(steps[1][1])
    assert label["note"] == "cafe" and label["key"].startswith("idem.step:")
    # the database step wrote its text as it came (UTF-8); the external
    # step's result with it was refused, never changed
    assert admin.execute("SELECT note FROM notes WHERE run_id = %s",
                         (f"{queue}:latin",)).fetchone()[0] == "caf\u00e9".encode()
    err = admin.execute("SELECT last_error FROM idem_runs WHERE run_id = %s",
                        (f"{queue}:latin",)).fetchone()[0]
    # 0A000 on PostgreSQL 15, 22P05 on 17 and 18
    assert err.startswith((b"FeatureNotSupported", b"UntranslatableCharacter")), err
    with admin.transaction():
        r = idem.execute(admin, f"{queue}:read", "SELECT note FROM notes WHERE run_id = $1",
                         f"{queue}:latin")
    assert r.rows == [{"note": "caf\u00e9"}]
    admin.close()


def test_transient_sqlstate_is_retried_by_the_runtime(connect, admin, queue):
    """A serialization failure (40001, advice 'retry') in a step: the step
    fails, the runtime brings the run back, the retry executes once."""
    wf = idem.Workflow(queue, steps=["pay"])
    tries = []

    @wf.step("pay")
    def pay(ctx):
        tries.append(ctx.attempt)
        if len(tries) == 1:
            return ctx.execute("SELECT idem_test_raise_40001() AS x")
        return ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 100 WHERE sku = $1"
                           " RETURNING on_hand", ctx.input)
    admin.execute("CREATE OR REPLACE FUNCTION idem_test_raise_40001() RETURNS int LANGUAGE plpgsql"
                  " AS $$BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END$$")
    assert idem.retry_advice(admin, "40001") == "retry"
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:pay", input=queue)
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    w.finish()
    assert tries == [1, 2]
    assert admin.execute("SELECT on_hand FROM wf_stock WHERE sku = %s", (queue,)).fetchone()[0] == 100
    errors = [r[0] for r in admin.execute("SELECT error FROM idem_run_attempts WHERE run_id = %s"
                                          " ORDER BY claim", (f"{queue}:pay",))]
    assert "conflict" in errors[0] and errors[-1] is None


def test_results_read_back_on_resume_are_those_seen_before(connect, admin, queue):
    """What each step returned, as the next steps see it in ctx.results,
    is what a resumed run reads back from the database: a database step's
    whole response (its command too), Decimals, dates, big integers,
    non-str keys, None; by _complete, by a result held for the next call,
    and by a step that writes nothing."""
    wf = idem.Workflow(queue, steps=["db", "ext", "held", "quiet", "none", "look"])
    seen = {}
    wf.step("db")(lambda ctx: ctx.execute("SELECT $1::numeric AS amount, 2 AS n",
                                          Decimal("25.00")))
    wf.external("ext")(lambda ctx: {
        "amount": Decimal("1.50"), "at": datetime.datetime(2026, 1, 2, 3, 4, 5),
        "big": 10**30, 1: "an int key", "pair": (1, 2), "nothing": None, "s": "it's \\ \u00e9"})
    wf.external("held")(lambda ctx: "a plain string")       # held for quiet's call
    wf.step("quiet")(lambda ctx: [Decimal("0.10"), None])
    wf.external("none")(lambda ctx: None)

    @wf.external("look")
    def look(ctx):
        seen[ctx.attempt] = dict(ctx.results)
        if ctx.attempt == 1:
            raise idem.RetryAfter(0.05)     # the run is claimed again, its results read back
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:values", input={})
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    w.finish()
    assert sorted(seen) == [1, 2]
    assert seen[1] == seen[2]
    assert seen[1]["db"] == {"rows": [{"amount": Decimal("25.00"), "n": 2}], "rowcount": 1,
                             "command": "SELECT"}
    assert type(seen[2]["ext"]["amount"]) is Decimal and seen[2]["ext"]["big"] == 10**30
    assert seen[2]["quiet"] == [Decimal("0.10"), None] and seen[2]["none"] == {}


def test_external_steps_ride_on_the_database_steps_calls(connect, admin, queue):
    """The label's start commits with the check and its result with the
    refund (idem_call's start_step, complete_step): the start is on record
    when the carrier is called; a refund whose statement fails still leaves
    the label completed (recorded alone before the failure), so the retry
    does not call the carrier again; one statement per step in all."""
    wf = idem.Workflow(queue, steps=["check", "label", "refund", "notify"])
    seen = {}
    refunds = []

    @wf.step("check")
    def check(ctx):
        return ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1"
                           " RETURNING on_hand", ctx.input)

    @wf.external("label")
    def label(ctx):
        # what another worker resuming now would learn: the start, committed
        seen["started"] = admin.execute("SELECT started_step, started_count FROM idem.runs"
                                        " WHERE run_id = %s", (ctx.run_id,)).fetchone()
        seen.setdefault("keys", []).append((ctx.key, ctx.attempt))
        return {"label_id": "LBL-" + ctx.run_id[-3:]}

    @wf.step("refund", outbox_topic="refunds")
    def refund(ctx):
        refunds.append(ctx.attempt)
        fail = "1 / 0" if len(refunds) == 1 else "1"
        return ctx.execute(f"INSERT INTO wf_refunds (run_id, amount, label_id) VALUES ($1, 25, $2)"
                           f" RETURNING {fail} AS x", ctx.run_id, ctx.results["label"]["label_id"])

    @wf.step("notify")
    def notify(ctx):
        return {"to": ctx.input}
    conn = connect()
    conn.autocommit = True
    run = f"{queue}:fold"
    wf.start(conn, run, input=queue)
    statements = []
    w = Running(counting(connect, statements), [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    w.finish()
    assert seen["started"] == ("label", 1)
    key = admin.execute("SELECT idem_step_key(%s, 'label')", (run,)).fetchone()[0]
    assert seen["keys"] == [(key, 1)]       # called once: the failed refund kept the label
    assert refunds == [1, 2]
    steps = admin.execute("SELECT step, state, attempts, response::text FROM idem_run_steps(%s)",
                          (run,)).fetchall()
    assert [(s, st) for s, st, _, _ in steps] == [(s, "completed") for s in wf.steps]
    assert idem.loads(steps[1][3]) == {"label_id": "LBL-old"}
    assert admin.execute("SELECT count(*) FROM wf_refunds WHERE run_id = %s", (run,)).fetchone()[0] == 1
    attempts = admin.execute("SELECT step, outcome FROM idem_run_attempts WHERE run_id = %s"
                             " ORDER BY claim", (run,)).fetchall()
    assert [o for _, o in attempts] == ["step_failed", "completed"]
    assert "division by zero" in admin.execute("SELECT error FROM idem_run_attempts"
                                               " WHERE run_id = %s AND claim = 1",
                                               (run,)).fetchone()[0]
    # the statements sent: no idem_step_start (the check's call started the
    # label); idem_step_complete for the label alone before the refund's
    # failure, and for notify; the refund's first call carried the label's
    # result, its second did not need to
    sent = [q for q in statements if "idem_run_claim" not in q and "idem_run_extend" not in q]
    assert not any("idem_step_start" in q for q in sent)
    assert sum("idem_step_complete" in q for q in sent) == 2
    calls = [q for q in sent if "idem_call" in q]
    assert len(calls) == 3
    assert "start_step" in calls[0] and "complete_step" in calls[1]
    assert "complete_step" not in calls[2]


TRICKY = ["it's", "back\\slash\\", "\\'; SELECT 1; --", '"{a,b}"', "% %s %(x)s $1", "é ✓ \x1f",
          ""]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
@pytest.mark.parametrize("conforming", ["on", "off"])
def test_values_reach_the_server_as_written(cluster, admin, queue, kind, conforming):
    """A worker on a connection that prepares nothing (prepare_threshold
    None) writes its statements' values into them as literals: quotes,
    backslashes, placeholders and braces in a run id, its input, a step's
    arguments and results reach the server and come back as written, also
    on a session with standard_conforming_strings off (where a backslash in
    a plain '' string escapes; idem_call refuses such a session, so there
    the steps are an external one and one that writes nothing); a NUL fails
    the step, as psycopg's parameters do."""
    steps = ["echo", "label", "note", "nul"] if conforming == "on" else ["label", "note", "nul"]
    wf = idem.Workflow(queue, steps=steps)

    def echo_args(ctx):
        return ("SELECT $1::text AS a, $2::text AS b, $3::jsonb AS c, $4::numeric AS d",
                ctx.input["s"], ctx.run_id, ctx.input["s"].split(" "), Decimal("-1.50"))

    def label(ctx):
        return {"s": ctx.input["s"], "key": ctx.key}

    def note(ctx):
        return [ctx.input["s"], ctx.run_id, Decimal("2.50")]
    if kind == "asyncio":
        async def echo(ctx):
            return await ctx.execute(*echo_args(ctx))

        async def nul(ctx):
            return await ctx.execute("SELECT $1::text", "a\x00b")
    else:
        def echo(ctx):
            return ctx.execute(*echo_args(ctx))

        def nul(ctx):
            return ctx.execute("SELECT $1::text", "a\x00b")
    if conforming == "on":
        wf.step("echo")(echo)
    wf.external("label")(label)
    wf.step("note")(note)
    wf.step("nul")(nul)
    runs = {f"{queue}:{i}:{s}": s for i, s in enumerate(TRICKY)}
    for run_id, s in runs.items():
        wf.start(admin, run_id, input={"s": s})
    dsn = cluster.dsn() + f" options='-c standard_conforming_strings={conforming}'"
    statements = []
    if kind == "asyncio":
        w = RunningAsync((dsn, {"prepare_threshold": None}), [wf], concurrency=2, lease=5,
                         poll=0.1)
    else:
        w = Running(counting(lambda: psycopg.connect(dsn, prepare_threshold=None), statements),
                    [wf], concurrency=2, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"failed": len(runs)}, 30, "the runs failed at nul")
    w.finish()
    for run_id, s in runs.items():
        got = {st: (state, r and idem.loads(r)) for st, state, r in admin.execute(
            "SELECT step, state, response::text FROM idem_run_steps(%s)", (run_id,))}
        if conforming == "on":
            row = {"a": s, "b": run_id, "c": s.split(" "), "d": Decimal("-1.50")}
            assert got["echo"] == ("completed", {"rows": [row], "rowcount": 1,
                                                 "command": "SELECT"}), run_id
        key = admin.execute("SELECT idem_step_key(%s, 'label')", (run_id,)).fetchone()[0]
        assert got["label"] == ("completed", {"s": s, "key": key}), run_id
        assert got["note"] == ("completed", [s, run_id, Decimal("2.50")]), run_id
        assert got["nul"][0] == "pending"      # the run failed there
        errors = admin.execute("SELECT error FROM idem_run_attempts WHERE run_id = %s",
                               (run_id,)).fetchall()
        assert errors and all("DataError" in e and "NUL" in e for e, in errors)
    if kind == "threads":
        # the values were in the statements, E'' strings
        assert any("idem_step_complete(E'" in q for q in statements)


def test_a_step_that_raises_after_its_call_does_not_record_its_neighbour_again(
        connect, admin, queue):
    """The refund's call carried the label's result and committed; the
    refund's function then raises: the label's result is not sent again
    (it would count a replay as another attempt of the label)."""
    wf = idem.Workflow(queue, steps=["label", "refund"])

    @wf.external("label")
    def label(ctx):
        return {"label_id": "LBL-1"}

    @wf.step("refund")
    def refund(ctx):
        ctx.execute("INSERT INTO wf_refunds (run_id, amount, label_id) VALUES ($1, 25, $2)",
                    ctx.run_id, ctx.results["label"]["label_id"])
        raise ValueError("after the call")
    conn = connect()
    conn.autocommit = True
    run = f"{queue}:late"
    wf.start(conn, run, input={})
    statements = []
    w = Running(counting(connect, statements), [wf], concurrency=1, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    time.sleep(0.3)
    w.finish()
    assert not any("idem_step_complete" in q for q in statements)
    attempts = dict(admin.execute("SELECT step, attempts FROM idem_run_steps(%s)", (run,)).fetchall())
    assert attempts == {"label": 1, "refund": 1}


def test_a_step_that_raises_after_its_call_is_completed(connect, admin, queue):
    """A database step's function raises after its statement committed, a
    step after it: the step is completed (it cannot fail) and the run goes
    on at once; idem_step_fail was refused and the run sat under its lease
    until it expired, an attempt counted."""
    wf = idem.Workflow(queue, steps=["a", "b"])

    @wf.step("a")
    def a(ctx):
        ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1", queue)
        raise ValueError("after the call")
    wf.step("b")(lambda ctx: {"b": ctx.results["a"]["rowcount"]})
    conn = connect()
    conn.autocommit = True
    run = f"{queue}:after"
    wf.start(conn, run, input={})
    w = Running(connect, [wf], concurrency=1, lease=30, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 1}, 10, "the completed run")
    stats = w.finish()
    assert stats["completed"] == 1 and stats["failed_steps"] == 0
    assert [r[0] for r in admin.execute("SELECT outcome FROM idem_run_attempts WHERE run_id = %s",
                                        (run,))] == ["completed"]
    assert admin.execute("SELECT on_hand FROM wf_stock WHERE sku = %s", (queue,)).fetchone()[0] == 1


def test_a_slow_step_keeps_its_lease(connect, admin, queue):
    """Lease 1 s, an external call of 2.5 s, two workers: the heartbeat
    keeps the run with its holder, nobody else claims it, one attempt."""
    carrier = Carrier(delay=2.5)
    wf = returns_workflow.make(carrier.url, queue=queue)
    start_runs(connect, wf, queue, 1)
    w = Running(connect, [wf], concurrency=1, lease=1, poll=0.1, name="slow")
    other = Running(connect, [wf], concurrency=1, lease=1, poll=0.1, name="other")
    until(lambda: statuses(admin, queue) == {"completed": 1}, 20, "the completed run")
    w.finish(), other.finish()
    # one attempt, by whichever worker claimed first
    attempts = admin.execute("SELECT worker, outcome FROM idem_run_attempts WHERE run_id = %s",
                             (f"{queue}:ret-0",)).fetchall()
    assert len(attempts) == 1 and attempts[0][1] == "completed", attempts
    assert carrier.created() == 1 and len(carrier.log) == 1


def test_a_taken_over_run_stops_its_holder(connect, admin, queue):
    """While the holder's step runs, its lease expires and another worker
    claims the run: the holder's statement is fenced (LeaseLost), nothing
    of it executes, and it does not go on to the next step."""
    wf = idem.Workflow(queue, steps=["a", "b"])
    calls = []

    @wf.step("a")
    def a(ctx):
        calls.append(("a", ctx.worker))
        if ctx.worker == "old":
            admin.execute("UPDATE idem.runs SET due_at = now() - interval '1 s' WHERE run_id = %s",
                          (ctx.run_id,))
            taken.extend(admin.execute("SELECT run_id, attempt FROM idem_run_claim(%s, worker => 'thief',"
                                       " lease => '1 h')", (queue,)).fetchall())
        return ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand",
                           queue)

    @wf.step("b")
    def b(ctx):
        calls.append(("b", ctx.worker))
        return {}
    taken = []
    conn = connect()
    conn.autocommit = True
    wf.start(conn, f"{queue}:t")
    w = Running(connect, [wf], concurrency=1, lease=5, poll=0.1, name="old")
    until(lambda: w.worker.stats["lost"] == 1, 10, "the holder to see the takeover")
    stats = w.finish()
    assert taken == [(f"{queue}:t", 2)]
    assert calls == [("a", "old")] and stats["steps"] == 0
    assert admin.execute("SELECT on_hand FROM wf_stock WHERE sku = %s", (queue,)).fetchone()[0] == 0
    assert [r[0] for r in admin.execute("SELECT outcome FROM idem_run_attempts WHERE run_id = %s"
                                        " ORDER BY claim", (f"{queue}:t",))] == ["lease_expired", None]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_a_step_raising_systemexit_stops_its_worker(route, admin, queue, kind):
    """SystemExit (KeyboardInterrupt, CancelledError: a BaseException, no
    Exception) from a step stops the worker: its runs are handed back and
    run() raises it.  It killed the executor, whose runs stayed held under
    a heartbeat, for ever, and run() never returned."""
    dsn, kw = route
    wf = idem.Workflow(queue, steps=["a"])
    ran = []

    def a(ctx):
        ran.append(ctx.run_id)
        raise SystemExit(3)

    async def a_async(ctx):
        return a(ctx)
    wf.external("a")(a if kind == "threads" else a_async)
    for r in ("r1", "r2"):
        wf.start(admin, f"{queue}:{r}", input={})
    out = []
    if kind == "threads":
        w = idem.Worker(lambda: psycopg.connect(dsn, **kw), [wf], concurrency=1, lease=30,
                        poll=0.1, stop=threading.Event())
        run = w.run
    else:
        w = idem.AsyncWorker(lambda: psycopg.AsyncConnection.connect(dsn, **kw), [wf],
                             concurrency=1, lease=30, poll=0.1, stop=asyncio.Event())

        def run():
            return asyncio.run(w.run())

    def go():
        try:
            out.append(run())
        except BaseException as e:
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(15)
    assert not t.is_alive(), "the worker did not stop"
    assert type(out[0]) is SystemExit and out[0].code == 3
    assert len(ran) == 1
    # handed back (due now, unleased), the other run not held either
    assert admin.execute("SELECT count(*) FROM idem_runs WHERE queue = %s AND status = 'running'"
                         " AND lease_until IS NULL", (queue,)).fetchone()[0] == 2
    assert admin.execute("SELECT outcome FROM idem_run_attempts WHERE run_id = %s",
                         (ran[0],)).fetchall() == [("released",)]


def worker_proc(dsn, carrier_url, queue, name, log, concurrency=2, lease=1.0, extra=()):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "workflow_worker.py"),
                             "--dsn", dsn, "--carrier", carrier_url, "--queue", queue,
                             "--name", name, "--log", log, "--concurrency", str(concurrency),
                             "--lease", str(lease), *extra])


def process_options(kw, kind):
    return (("--no-prepare",) if kw else ()) + (("--asyncio",) if kind == "asyncio" else ())


@pytest.fixture(params=["threads", "asyncio"])
def kind(request):
    """The worker processes of a test: Worker's threads or AsyncWorker."""
    return request.param


def test_sigterm_drains(route, admin, queue, tmp_path, kind):
    """SIGTERM while steps run: they finish, their runs are handed back
    (released, due at once), the process exits 0, another worker completes
    them with every effect once."""
    dsn, kw = route
    carrier = Carrier(delay=0.8)
    wf = returns_workflow.make(carrier.url, queue=queue)
    start_runs(lambda: psycopg.connect(dsn, **kw), wf, queue, 2)
    log = str(tmp_path / "log")
    p = worker_proc(dsn, carrier.url, queue, "drained", log, extra=process_options(kw, kind))
    # (a worker process starts slowly on a loaded machine)
    until(lambda: len(carrier.log) >= 1, 90, "a label request")
    assert "ready drained" in open(log).read()
    p.send_signal(signal.SIGTERM)
    assert p.wait(40) == 0
    outcomes = [r[0] for r in admin.execute("SELECT outcome FROM idem_run_attempts WHERE worker = 'drained'"
                                            " AND run_id LIKE %s", (queue + ":%",))]
    # every claim ended: a run in hand handed back (released), or one whose
    # steps finished before the signal arrived completed (a loaded machine
    # may deliver it late)
    assert outcomes and None not in outcomes
    assert set(outcomes) <= {"released", "completed"}
    w = Running(lambda: psycopg.connect(dsn, **kw), [wf], concurrency=2, lease=5, poll=0.1)
    until(lambda: statuses(admin, queue) == {"completed": 2}, 30, "2 completed runs")
    w.finish()
    check_exactly_once(admin, queue, 2, carrier)


def test_sigkill_at_random_points_exactly_once(route, admin, queue, tmp_path, kind):
    """Three worker processes (concurrency 2, lease 1 s), SIGKILLed at
    random moments from outside and started again, until 30 runs complete:
    each business effect once, one label per run at the carrier however
    often it was asked, one outbox event per refund, and every claim a
    worker logged is an attempt on record, each ended (a killed one as
    lease_expired)."""
    dsn, kw = route
    rnd = random.Random(int(os.environ.get("IDEM_TEST_SEED", "22")))
    # a label takes 0.3 s: kills find runs in hand
    carrier = Carrier(busy=0.2, delay=0.3, seed=rnd.randrange(1000), retry_after="0")
    wf = returns_workflow.make(carrier.url, queue=queue)
    n = 30
    start_runs(lambda: psycopg.connect(dsn, **kw), wf, queue, n)
    extra = process_options(kw, kind)
    procs, names, kills, slot_names = {}, [], 0, {}
    logs = str(tmp_path / "claims")

    def spawn(slot):
        name = f"w{slot}-{len(names)}"
        names.append(name)
        procs[slot] = worker_proc(dsn, carrier.url, queue, name, logs, extra=extra)
        slot_names[slot] = len(names) - 1

    def has_claimed(name):
        try:
            with open(logs) as f:
                return any(line.startswith("claim ") and line.split()[2] == name for line in f)
        except FileNotFoundError:
            return False
    for slot in range(3):
        spawn(slot)
    deadline = time.time() + 120
    while statuses(admin, queue).get("completed", 0) < n:
        assert time.time() < deadline, f"not done: {statuses(admin, queue)}"
        time.sleep(rnd.uniform(0.1, 0.5))
        slot = rnd.randrange(3)
        # a process killed while it starts has nothing in hand: kill one
        # that has claimed work (at a random moment of that work)
        if kills < 8 and has_claimed(names[slot_names[slot]]):
            procs[slot].kill()
            procs[slot].wait()
            kills += 1
            spawn(slot)
    until(lambda: all(f"ready {names[slot_names[s]]}\n" in open(logs).read() for s in procs),
          30, "the workers to be up")
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    for p in procs.values():
        assert p.wait(40) == 0
    check_exactly_once(admin, queue, n, carrier)
    # up to 8 kills while the runs last: a faster worker may finish the
    # 30 runs before the eighth, but not before half of them
    assert kills >= 4, f"only {kills} workers were killed"
    # every claim a worker logged (before working on it) is on record
    with open(logs) as f:
        logged = {tuple(line.split()[1:3]) for line in f if line.startswith("claim ")}
    recorded = set(admin.execute("SELECT run_id, worker FROM idem_run_attempts WHERE run_id LIKE %s",
                                 (queue + ":%",)).fetchall())
    assert logged and logged <= recorded
    expired = admin.execute("SELECT count(*) FROM idem_run_attempts WHERE run_id LIKE %s"
                            " AND outcome = 'lease_expired'", (queue + ":%",)).fetchone()[0]
    # each kill had claimed runs in hand: their attempts expired
    assert expired >= kills
    # the carrier saw repeats of some keys (a resumed label) and answered
    # each with its one label
    assert carrier.created() == n
