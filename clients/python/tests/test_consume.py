"""The outbox consumer loop, idem_client.consume(), against a real server.

With wakeup="notify" the consumer connects directly: LISTEN needs its own
session, which PgBouncer in transaction mode does not give (see consume's
docstring); with wakeup="wait" (claims that wait, the cluster preloads
idem) it also runs through PgBouncer.  The producers publish through both
targets, like the other tests."""

import datetime
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from decimal import Decimal

import psycopg
import pytest

import idem_client as idem
from claim_fault import claim_faults
from nesting import deepest_stack, nested_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
SECOND = datetime.timedelta(seconds=1)


@pytest.fixture
def topic(admin, request):
    name = "t_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    admin.execute("SELECT idem_outbox_create_topic(%s)", (name,))
    return name


def publish(connect, topic, *keys, amount="25.00"):
    with connect() as conn:
        for key in keys:
            with conn.transaction():
                idem.execute(conn, f"{topic}:{key}", "SELECT $1::text AS who, $2::numeric AS amount",
                             key, amount, outbox_topic=topic)


def direct(cluster):
    return lambda: psycopg.connect(cluster.dsn())


def events(admin, topic):
    """key (without the topic prefix) -> its row of idem_outbox_events"""
    cur = admin.cursor(row_factory=psycopg.rows.dict_row)
    rows = cur.execute("SELECT * FROM idem_outbox_events WHERE topic = %s", (topic,)).fetchall()
    return {r["key"].split(":", 1)[1]: r for r in rows}


def server_now(admin):
    return admin.execute("SELECT clock_timestamp()").fetchone()[0]


def until(predicate, timeout=10, what="condition"):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Loop:
    """consume() in a thread, with a stop event and the handler's calls."""

    def __init__(self, dsn, topic, handler=None, connect_kw=None, **kw):
        self.seen = []
        self.stop = threading.Event()
        self.result = None
        self.error = None
        self.handler = handler or (lambda e: None)

        def h(event):
            self.seen.append(event)
            self.handler(event)

        # named after the topic, for wait_until_sleeping
        kw_conn = {"application_name": topic, **(connect_kw or {})}

        def run():
            try:
                self.result = idem.consume(lambda: psycopg.connect(dsn, **kw_conn),
                                           topic, h,
                                           stop=self.stop, **kw)
            except BaseException as e:  # the test asserts the loop did not die
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def keys(self):
        return [e["key"].split(":", 1)[1] for e in self.seen]

    def finish(self, timeout=5):
        self.stop.set()
        self.join(timeout)
        assert not self.thread.is_alive(), "consume() did not return after stop"
        assert self.error is None, f"consume() raised {self.error!r}"
        return self.result

    def join(self, timeout):
        self.thread.join(timeout)


# idem_retry_advice's retry (40001, class 72) and a standby (25006:
# reconnect); 72000 and 25006 stopped consume()
@pytest.mark.parametrize("wakeup", ["notify", "wait"])
@pytest.mark.parametrize("sqlstate", ["40001", "72000", "25006"])
def test_a_transient_claim_error_is_retried(cluster, topic, admin, sqlstate, wakeup):
    """A claim error that idem_retry_advice calls transient (or a standby)
    is retried after the backoff: the loop goes on and delivers."""
    name = f"ct_{sqlstate}_{wakeup}"
    claims, kw = claim_faults(admin, name, sqlstate, 3)
    publish(direct(cluster), topic, "a")
    loop = Loop(cluster.dsn(), topic, connect_kw=kw, consumer=name, idle=0.2, wakeup=wakeup)
    until(lambda: len(loop.seen) == 1 or not loop.thread.is_alive(), 20, "the delivery")
    assert loop.finish() == 1
    assert loop.keys() == ["a"]
    assert claims() > 3


# idem_retry_advice's never; 54000 and 55000 (psycopg's OperationalError)
# were retried for ever
@pytest.mark.parametrize("sqlstate", ["42501", "22023", "54000", "55000"])
def test_a_permanent_claim_error_stops_the_loop(cluster, topic, admin, sqlstate):
    """A claim error that retrying will not cure (idem_retry_advice: never)
    stops consume(): it raises the error at its first claim, having
    delivered nothing."""
    name = f"cp_{sqlstate}"
    claims, kw = claim_faults(admin, name, sqlstate, 1000)
    publish(direct(cluster), topic, "a")
    loop = Loop(cluster.dsn(), topic, connect_kw=kw, consumer=name, idle=0.2)
    loop.join(10)
    assert not loop.thread.is_alive(), "consume() did not stop"
    assert isinstance(loop.error, psycopg.Error) and loop.error.sqlstate == sqlstate, repr(loop.error)
    assert claims() == 1 and loop.seen == []
    assert events(admin, topic)["a"]["state"] == "pending"


def test_delivers_and_acks(cluster, connect, topic, admin):
    publish(connect, topic, "a", "b", "c")
    loop = Loop(cluster.dsn(), topic, max_events=2)   # two claims at least
    until(lambda: len(loop.seen) == 3, what="three deliveries")
    assert loop.finish() == 3
    assert sorted(loop.keys()) == ["a", "b", "c"]
    ev = loop.seen[0]
    assert ev["topic"] == topic and ev["attempt"] == 1
    # the payload is the call's response, numerics exact
    assert ev["payload"]["rows"][0]["amount"] == Decimal("25.00")
    assert str(ev["payload"]["rows"][0]["amount"]) == "25.00"
    rows = events(admin, topic)
    assert {k: r["state"] for k, r in rows.items()} == {"a": "delivered", "b": "delivered",
                                                        "c": "delivered"}
    assert all(r["attempts"] == 1 for r in rows.values())


def test_delivers_an_integer_longer_than_int_reads(cluster, connect, topic, admin):
    """A payload with an integer of 5001 digits (a numeric column may hold
    one): read as an exact Decimal; int() refused it (ValueError, more than
    sys.get_int_max_str_digits) and consume() raised out of its loop."""
    big = 10 ** 5000
    publish(connect, topic, "a", amount="1" + "0" * 5000)
    loop = Loop(cluster.dsn(), topic)
    until(lambda: len(loop.seen) == 1, what="the delivery")
    assert loop.finish() == 1
    assert loop.seen[0]["payload"]["rows"][0]["amount"] == big


def test_a_payload_nested_deeper_than_the_decoder_reads(cluster, connect, topic, admin,
                                                       undecodable_depth):
    """A payload nested deeper than the decoder reads (a jsonb column of
    the business rows) fails its event with the decoder's RecursionError
    and the loop goes on; the error raised out of consume() at each claim
    of the event."""
    d = undecodable_depth

    def make():
        with connect() as conn, conn.transaction():  # (execute would parse the response)
            deepest_stack(conn)
            conn.execute("SELECT 1 FROM idem_call(%s, %s, '{}', outbox_topic => %s)",
                         (f"{topic}:deep", f"SELECT (repeat('[', {d}) || repeat(']', {d}))::jsonb"
                          " AS deep", topic))
    nested_or_skip(d, make)
    publish(connect, topic, "b")
    loop = Loop(cluster.dsn(), topic)
    until(lambda: events(admin, topic)["deep"]["last_error"] is not None and len(loop.seen) == 1,
          what="the failure and the other delivery")
    assert loop.finish() == 1
    assert "RecursionError" in events(admin, topic)["deep"]["last_error"]


# Retry-After decides, attempt 1's backoff window being 1 s: exactly 20 s;
# one later than idem.outbox_max_retry_after (1 day) allows is as late as
# allowed (it was refused, and the failure lost)
@pytest.mark.parametrize("retry_after, seconds", [(20, 20),
                                                  ("Wed, 21 Oct 2099 07:28:00 GMT", 86400)],
                         ids=["20s", "in-2099"])
def test_retry_after_sets_the_next_attempt(cluster, connect, topic, admin, retry_after, seconds):
    publish(connect, topic, "a")

    def handler(event):
        raise idem.RetryAfter(retry_after, "mailer 429")
    before = server_now(admin)
    loop = Loop(cluster.dsn(), topic, handler)
    until(lambda: events(admin, topic)["a"]["last_error"] is not None, what="the failure")
    after = server_now(admin)
    assert loop.finish() == 0
    row = events(admin, topic)["a"]
    assert row["state"] == "pending" and row["last_error"] == "mailer 429"
    assert before + seconds * SECOND <= row["next_attempt_at"] <= after + seconds * SECOND
    assert len(loop.seen) == 1   # not due again while the loop ran


def test_a_tiny_retry_after_fails_the_event(cluster, connect, topic, admin):
    """Retry-After 1e-7 s (below 1e-4, Python writes it with an exponent,
    which interval input refused: the fail was refused and the loop raised
    it): the event fails, no earlier than asked, and the loop goes on."""
    publish(connect, topic, "a")

    def handler(event):
        raise idem.RetryAfter("0.0000001", "mailer 429")
    before = server_now(admin)
    loop = Loop(cluster.dsn(), topic, handler)
    until(lambda: events(admin, topic)["a"]["last_error"] is not None, what="the failure")
    assert loop.finish() == 0
    row = events(admin, topic)["a"]
    assert row["state"] == "pending" and row["last_error"] == "mailer 429"
    assert row["next_attempt_at"] >= before + SECOND / 1000000


def test_other_exception_gets_the_server_backoff(cluster, connect, topic, admin):
    publish(connect, topic, "a")

    def handler(event):
        raise ConnectionRefusedError("mailer down")
    # jitter off and a long base: the server's window end is exact and far
    # from both 0 (an ack or retry_after 0) and any Retry-After
    dsn = cluster.dsn() + " options='-c idem.outbox_jitter=off -c idem.outbox_backoff_base=45s'"
    before = server_now(admin)
    loop = Loop(dsn, topic, handler)
    until(lambda: events(admin, topic)["a"]["last_error"] is not None, what="the failure")
    after = server_now(admin)
    assert loop.finish() == 0
    row = events(admin, topic)["a"]
    assert row["state"] == "pending"
    assert row["last_error"] == "ConnectionRefusedError: mailer down"
    assert before + 45 * SECOND <= row["next_attempt_at"] <= after + 45 * SECOND


def test_an_exception_text_a_string_cannot_hold(cluster, connect, topic, admin):
    """A handler's exception with a NUL and a lone surrogate in its message
    fails the event, the characters escaped; the fail was refused and
    consume() raised it (the NUL), or raised UnicodeEncodeError (the
    surrogate)."""
    publish(connect, topic, "a")

    def handler(event):
        raise ValueError("bad \x00 byte in \udc80.txt")
    loop = Loop(cluster.dsn(), topic, handler)
    until(lambda: events(admin, topic)["a"]["last_error"] is not None, what="the failure")
    assert loop.finish() == 0
    assert events(admin, topic)["a"]["last_error"] == "ValueError: bad \\x00 byte in \\udc80.txt"


def test_an_exception_text_the_connection_encoding_cannot_hold(cluster, connect, topic, admin):
    """A handler's exception with an emoji in its message fails the event;
    on a LATIN1 connection psycopg refused to encode the fail and consume()
    raised UnicodeEncodeError.  The consumer's connection speaks UTF8."""
    publish(connect, topic, "a")

    def handler(event):
        raise ValueError("caf\u00e9 \U0001f600")
    loop = Loop(cluster.dsn(), topic, handler, connect_kw={"client_encoding": "LATIN1"})
    until(lambda: events(admin, topic)["a"]["last_error"] is not None or not loop.thread.is_alive(),
          what="the failure")
    assert loop.finish() == 0
    assert events(admin, topic)["a"]["last_error"] == "ValueError: caf\u00e9 \U0001f600"


def test_an_exception_text_longer_than_an_event_error_holds(cluster, connect, topic, admin):
    """A handler's exception with a message of 70,000 characters fails the
    event with its first 16,384 (64 kB in any encoding); the fail was
    refused (22001, the error at most 64 kB) and consume() raised it."""
    publish(connect, topic, "a")

    def handler(event):
        raise ValueError("x" * 70000)
    loop = Loop(cluster.dsn(), topic, handler)
    until(lambda: events(admin, topic)["a"]["last_error"] is not None or not loop.thread.is_alive(),
          what="the failure")
    assert loop.finish() == 0
    row = events(admin, topic)["a"]
    assert row["state"] == "pending" and row["last_error"] == ("ValueError: " + "x" * 70000)[:16384]


def test_a_sql_ascii_database(sql_ascii_db):
    """In a SQL_ASCII database psycopg reads text as bytes: the event's key,
    topic and the topic's channel were bytes (LISTEN on "b'...'", a channel
    nobody notifies).  The consumer's connection speaks UTF8: str, and the
    event's UTF-8 text as it was written."""
    with psycopg.connect(sql_ascii_db, autocommit=True) as c:
        with c.transaction():
            # the accent as the UTF-8 bytes a SQL_ASCII database keeps
            idem.execute(c, "notes:a", "SELECT 'caf' || E'\\303\\251' AS note",
                         outbox_topic="notes")
        loop = Loop(sql_ascii_db, "notes")
        until(lambda: loop.seen, what="the delivery")
        assert loop.finish() == 1
        e = loop.seen[0]
        assert (e["key"], e["topic"], e["payload"]["rows"]) == (
            "notes:a", "notes", [{"note": "caf\u00e9"}])
        assert c.execute("SELECT state FROM idem_outbox_events WHERE key = 'notes:a'"
                         ).fetchone()[0] == b"delivered"


def test_stop_ends_a_long_idle_wait_at_once(cluster, topic):
    loop = Loop(cluster.dsn(), topic, idle=60)
    time.sleep(0.5)   # in its first wait by now
    t = time.time()
    assert loop.finish() == 0
    assert time.time() - t < 1


def wait_until_sleeping(admin, topic):
    """The topic's consumer has made its (empty) claim and waits on
    LISTEN.  (Any other session idle after a claim, a consumer left by a
    failed test, is not this one.)"""
    until(lambda: admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle' AND application_name = %s"
        " AND query LIKE '%%idem_outbox_claim%%'", (topic,)).fetchone()[0] > 0,
        what="the consumer's claim")


def test_notify_wakes_the_consumer(cluster, connect, topic, admin):
    loop = Loop(cluster.dsn(), topic, idle=60)
    wait_until_sleeping(admin, topic)
    t = time.time()
    publish(connect, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery")
    assert time.time() - t < 3    # not the 60 s idle poll
    assert loop.finish() == 1


def test_lost_connection_is_replaced(cluster, connect, topic, admin):
    loop = Loop(cluster.dsn(), topic, idle=60)
    wait_until_sleeping(admin, topic)
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                  " WHERE query LIKE '%%idem_outbox_claim%%' AND pid <> pg_backend_pid()")
    time.sleep(0.5)
    wait_until_sleeping(admin, topic)   # a new session, listening again
    publish(connect, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery after reconnecting")
    assert loop.finish() == 1
    assert events(admin, topic)["a"]["state"] == "delivered"


@pytest.mark.parametrize("wakeup", ["notify", "wait"])
@pytest.mark.parametrize("outcome", ["ack", "fail"])
def test_lease_taken_over_is_skipped(cluster, topic, admin, caplog, outcome, wakeup):
    # the handler outlives its 1 s lease and another consumer takes the
    # event over: the late ack or fail is fenced (ID412), the loop logs it
    # and goes on
    publish(direct(cluster), topic, "slow")
    started, taken = threading.Event(), threading.Event()

    def handler(event):
        if event["key"].endswith("slow"):
            started.set()
            taken.wait(10)
            if outcome == "fail":
                raise RuntimeError("late failure")
    caplog.set_level(logging.WARNING, logger="idem_client")
    loop = Loop(cluster.dsn(), topic, handler, lease=1, idle=60, wakeup=wakeup)
    assert started.wait(10)
    time.sleep(1.2)
    stolen = admin.execute("SELECT key FROM idem_outbox_claim(%s, 10, '30 s', 'thief')",
                           (topic,)).fetchall()
    assert stolen == [(f"{topic}:slow",)]
    taken.set()
    publish(direct(cluster), topic, "next")
    until(lambda: "next" in loop.keys(), what="the next event after the fenced one")
    assert loop.finish() == 1
    row = events(admin, topic)["slow"]
    assert row["state"] == "leased" and row["lease_holder"] == "thief" and row["last_error"] is None
    assert "ID412" in caplog.text


def test_ack_after_the_lease_expired_but_not_taken_over(cluster, topic, admin):
    publish(direct(cluster), topic, "slow")
    loop = Loop(cluster.dsn(), topic, lambda e: time.sleep(1.5), lease=1, idle=60)
    until(lambda: events(admin, topic)["slow"]["state"] == "delivered", what="the late ack")
    assert loop.finish() == 1


def consumer_proc(cluster, topic, log, *args):
    return subprocess.Popen([sys.executable, os.path.join(HERE, "outbox_consumer.py"),
                             cluster.dsn(), topic, log, *args],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PGAPPNAME": topic})


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split("\n")[:-1]


@pytest.mark.parametrize("wakeup", ["notify", "wait"])
def test_sigterm_finishes_the_event_and_exits_0(cluster, topic, admin, tmp_path, wakeup):
    publish(direct(cluster), topic, "a", "b", "c", "d")
    log = str(tmp_path / "deliveries")
    p = consumer_proc(cluster, topic, log, "--lease", "2", "--handler-seconds", "1",
                      "--wakeup", wakeup)
    until(lambda: len(lines(log)) == 1, what="the first delivery")
    p.send_signal(signal.SIGTERM)            # inside the first handler
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0
    assert out.strip() == "1"                # the running delivery was acked
    assert len(lines(log)) == 1              # and no other began
    rows = events(admin, topic)
    done = [k for k, r in rows.items() if r["state"] == "delivered"]
    assert done == [lines(log)[0].split()[0].split(":", 1)[1]]
    rest = sorted(set(rows) - set(done))
    # the rest of the batch was handed back (idem_outbox_release): due now,
    # the claim's attempt not counted, so anyone takes it at once as the
    # first attempt, well before its 2 s lease would have ended
    assert all(rows[k]["state"] == "pending" and rows[k]["attempts"] == 0 for k in rest)
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup=wakeup)
    until(lambda: len(loop.seen) == 3, what="the rest, released")
    assert loop.finish() == 3
    assert sorted(loop.keys()) == rest and all(e["attempt"] == 1 for e in loop.seen)


def test_sigterm_while_idle_exits_at_once(cluster, topic, admin, tmp_path):
    p = consumer_proc(cluster, topic, str(tmp_path / "deliveries"))
    wait_until_sleeping(admin, topic)
    t = time.time()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0 and out.strip() == "0"
    assert time.time() - t < 2                # not the 60 s idle timeout


def test_sigkill_after_the_handler_redelivers_and_the_receiver_dedupes(
        cluster, topic, admin, tmp_path):
    publish(direct(cluster), topic, "a", "b", "c")
    log = str(tmp_path / "deliveries")
    # dies right after the second delivery happened, before its ack
    p = consumer_proc(cluster, topic, log, "--lease", "2", "--kill-after", "2")
    p.communicate(timeout=10)
    assert p.returncode == -signal.SIGKILL
    first = [line.split() for line in lines(log)]
    assert len(first) == 2
    killed_key = first[1][0]
    states = {k: r["state"] for k, r in events(admin, topic).items()}
    assert sorted(states.values()) == ["delivered", "leased", "leased"]

    # another consumer, delivering to the same receiver, which keeps one
    # effect per key however many attempts reach it
    effects = {}

    def receiver(event):
        with open(log, "a") as f:
            f.write(f"{event['key']} {event['attempt']}\n")
        effects.setdefault(event["key"], event["attempt"])

    for key, attempt in first:
        effects.setdefault(key, int(attempt))
    loop = Loop(cluster.dsn(), topic, receiver, idle=0.2)
    until(lambda: len(loop.seen) == 2, what="redelivery after the lease")
    assert loop.finish() == 2
    attempts = [line.split() for line in lines(log)]
    assert [a for k, a in attempts if k == killed_key] == ["1", "2"]   # delivered twice
    assert len(effects) == 3                                          # one effect per event
    assert all(r["state"] == "delivered" for r in events(admin, topic).values())


# wakeup="wait": claims that wait (idem_outbox_claim(..., wait => idle))
# instead of LISTEN, producers without NOTIFY

def publish_quiet(cluster, topic, *keys):
    """publish() with the producer's NOTIFY off (idem.outbox_notify)."""
    publish(lambda: psycopg.connect(cluster.dsn() + " options='-c idem.outbox_notify=off'"),
            topic, *keys)


@pytest.fixture
def listener(cluster, topic):
    """A session listening on the topic's channel: the NOTIFYs producers sent."""
    heard = []
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.add_notify_handler(heard.append)
        channel = c.execute("SELECT idem_outbox_channel(%s)", (topic,)).fetchone()[0]
        c.execute(f'LISTEN "{channel}"')

        def heard_now():
            c.execute("SELECT 1")   # reads what has arrived
            return heard
        yield heard_now


# a claim with a wait, as pg_stat_activity shows its query
WAITING_CLAIM = "query LIKE '%%idem_outbox_claim(%%wait =>%%' AND pid <> pg_backend_pid()"


def wait_until_waiting(admin, what="the consumer's waiting claim"):
    """A session's claim with a wait is waiting (it found nothing)."""
    until(lambda: admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        " AND wait_event_type = 'Extension' AND " + WAITING_CLAIM).fetchone()[0] > 0,
        what=what)


def no_wait_running(admin):
    return admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        " AND " + WAITING_CLAIM).fetchone()[0] == 0


def test_wait_mode_delivers_a_commit_without_notify(cluster, topic, admin, listener):
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup="wait")
    wait_until_waiting(admin)
    t = time.time()
    publish_quiet(cluster, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery")
    assert time.time() - t < 3    # woken by the commit, not the 60 s timeout
    wait_until_waiting(admin)     # waiting again, for the next one
    publish_quiet(cluster, topic, "b")
    until(lambda: len(loop.seen) == 2, timeout=5, what="the second delivery")
    assert time.time() - t < 6
    assert loop.finish() == 2
    assert events(admin, topic)["b"]["state"] == "delivered"
    assert listener() == []   # no NOTIFY was sent


def test_wait_mode_claims_and_waits_in_one_statement(cluster, topic, admin):
    # what makes wait mode safe behind a transaction pooler: the statement
    # that waits is the claim itself, so no commit can fall between an empty
    # claim and a wait on another server session
    app = "idem-claimwait"
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup="wait",
                connect_kw={"application_name": app, "options": "-c log_statement=all"})

    def idling():
        return admin.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = %s"
            " AND state = 'active' AND wait_event_type = 'Extension'", (app,)).fetchall()
    until(lambda: idling(), what="the consumer's session to wait")
    [(pid, query)] = idling()
    assert "idem_outbox_claim(" in query and "wait =>" in query, query
    publish_quiet(cluster, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery")
    until(lambda: idling(), what="the consumer's session to wait again")
    assert idling() == [(pid, query)]      # the same session, claiming with a wait again
    assert loop.finish() == 1
    # every statement the consumer sent (log_statement=all on its session)
    with open(os.path.join(cluster.dir, "log")) as f:
        sent = [line for line in f if f"[{pid}] LOG:  execute " in line
                or f"[{pid}] LOG:  statement: " in line]
    claims = [q for q in sent if "idem_outbox_claim(" in q]
    assert len(claims) >= 2 and all("wait =>" in q for q in claims), sent
    assert not [q for q in sent if "idem_outbox_wait" in q], sent


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_wait_mode_at_a_default_isolation_above_read_committed(cluster, topic, admin, isolation):
    """Where the session's default isolation (a role's or the database's
    setting) is above READ COMMITTED, at which a claim with a wait is
    refused (0A000), each waiting claim is a READ COMMITTED transaction
    block of its own: it waits, and delivers the event a commit brings.
    The loop stopped at its first claim."""
    options = "-c default_transaction_isolation=" + isolation.replace(" ", "\\ ")
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup="wait", connect_kw={"options": options})
    wait_until_waiting(admin)
    publish_quiet(cluster, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery")
    assert loop.finish() == 1
    assert events(admin, topic)["a"]["state"] == "delivered"


def test_wait_mode_stop_cancels_a_long_wait(cluster, topic, admin):
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup="wait")
    wait_until_waiting(admin)
    t = time.time()
    assert loop.finish(timeout=3) == 0    # returned normally, 0 acked
    assert time.time() - t < 3
    until(lambda: no_wait_running(admin), timeout=2, what="the server's wait to end")


def test_wait_mode_sigterm_while_waiting_exits_at_once(cluster, topic, admin, tmp_path):
    p = consumer_proc(cluster, topic, str(tmp_path / "deliveries"), "--wakeup", "wait")
    wait_until_waiting(admin)
    t = time.time()
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=10)
    assert p.returncode == 0 and out.strip() == "0"
    assert time.time() - t < 3                # not the 60 s wait


@pytest.mark.parametrize("db", ["idemtest", "idemone"])
def test_wait_mode_through_pgbouncer(cluster, bouncer, topic, admin, db):
    # idemone: a pool of one server connection, which the wait holds
    loop = Loop(bouncer.dsn(db), topic, idle=60, wakeup="wait",
                connect_kw={"prepare_threshold": None})
    for n, key in enumerate(["a", "b", "c"], 1):
        wait_until_waiting(admin)
        t = time.time()
        publish_quiet(cluster, topic, key)
        until(lambda: len(loop.seen) == n, timeout=5, what=f"delivery {n}")
        assert time.time() - t < 3
    wait_until_waiting(admin)
    t = time.time()
    assert loop.finish(timeout=3) == 3    # the stop's cancel goes through PgBouncer too
    assert time.time() - t < 3
    assert sorted(loop.keys()) == ["a", "b", "c"]
    assert all(r["state"] == "delivered" for r in events(admin, topic).values())
    with psycopg.connect(bouncer.dsn(db)) as c:   # PgBouncer outlived the cancel
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_wait_mode_lost_connection_is_replaced(cluster, topic, admin):
    loop = Loop(cluster.dsn(), topic, idle=60, wakeup="wait")
    wait_until_waiting(admin)
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                  " WHERE state = 'active' AND " + WAITING_CLAIM)
    time.sleep(0.5)
    wait_until_waiting(admin)   # a new session, waiting again
    publish_quiet(cluster, topic, "a")
    until(lambda: len(loop.seen) == 1, timeout=5, what="the delivery after reconnecting")
    assert loop.finish() == 1


def test_wait_mode_without_shared_preload_libraries(plain_cluster):
    """Without the preload the claim's wait polls: an event published
    while the loop waits is delivered long before idle runs out."""
    with psycopg.connect(plain_cluster.dsn(), autocommit=True) as c:
        c.execute("SELECT idem_outbox_create_topic('plain')")
        loop = Loop(plain_cluster.dsn(), "plain", idle=60, wakeup="wait")
        wait_until_waiting(c)
        publish(lambda: psycopg.connect(plain_cluster.dsn()), "plain", "a")
        until(lambda: len(loop.seen) == 1, timeout=10, what="the delivery during the wait")
    assert loop.finish() == 1
