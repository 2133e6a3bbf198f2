"""Returns under chaos: 20 orders through a 4-step workflow, 3 worker
processes, workers SIGKILLed at random from outside and PostgreSQL
restarted once with pg_ctl -m immediate; nobody restarts a run by hand.

  python3 returns_chaos.py [--seed N] [--crashes N] [--orders 20] [--workers 3] [--chart [FILE.svg]]

The workflow (idem_client.Workflow, the whole of the application's code is
in make_workflow below): check (restock the item: a database step), label
(a shipping label from a fake carrier on loopback: an external call keyed
by the step's key, 503 with Retry-After now and then), refund (a database
step that publishes the refund to the outbox topic "refunds"), notify (an
external call to a fake mailer, keyed likewise).  An outbox consumer
(idem_client.consume) delivers the refund events to a fake ledger that
books once per event key.  The workers are idem_client.Worker processes
(concurrency 2, lease 2 s); the chaos loop kills one with SIGKILL every
0.5-2 s, choosing among those holding runs (a replacement starts at once),
never one holding a run it has killed twice already: a run's lease expiries
count as attempts, and on a fast machine the last runs in hand would draw
every kill until they used up their 8 attempts and failed.  Once a quarter
of the orders are done, it crashes the server (pg_ctl stop -m immediate)
and starts it.

At the end it prints one order's audit trail (every attempt, the killed
ones too, and what the carrier and mailer saw of it), idem_stats, and the
proof; exits 1 if any check fails.  Run as the cluster user, idem
installed in $PG_CONFIG (scripts/agent-demo.sh does all that).
"""

import argparse
import collections
import http.server
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
sys.path.insert(0, os.path.join(here, "..", "tests"))

import psycopg  # noqa: E402

import idem_client as idem  # noqa: E402
from idem_client import RetryAfter, Workflow  # noqa: E402

LEASE = 2.0


# --- the application: what a user writes ----------------------------------

def make_workflow(carrier_url, mailer_url):
    returns = Workflow("returns", steps=["check", "label", "refund", "notify"])

    @returns.step("check")
    def check(ctx):
        return ctx.execute("UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand",
                           ctx.input["sku"])

    @returns.external("label", max_attempts=8)
    def label(ctx):
        return call(carrier_url, ctx.key, {"order": ctx.input["order"]})

    @returns.step("refund", outbox_topic="refunds")
    def refund(ctx):
        return ctx.execute("INSERT INTO refunds (order_id, amount, label_id) VALUES ($1, $2, $3)"
                           " RETURNING order_id, amount, label_id",
                           ctx.input["order"], ctx.input["amount"], ctx.results["label"]["label_id"])

    @returns.external("notify", max_attempts=8)
    def notify(ctx):
        return call(mailer_url, ctx.key, {"to": ctx.input["customer"],
                                          "text": f"refund of {ctx.input['amount']} on its way"})
    return returns


def call(url, key, body):
    """POST with an Idempotency-Key; 429/503 come back as RetryAfter."""
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code in (429, 503):
            raise RetryAfter(e.headers.get("Retry-After"), f"{e.code} from {url.rsplit('/', 1)[1]}")
        raise


# --- the fake services -------------------------------------------------------

class Service(http.server.ThreadingHTTPServer):
    """One effect per Idempotency-Key; a repeat gets the first answer.
    A share of first requests is refused with 503 and Retry-After: 1; each
    request takes 0.1-0.5 s, so that kills land during calls."""
    daemon_threads = True

    def __init__(self, kind, rnd, busy):
        super().__init__(("127.0.0.1", 0), Handler)
        self.kind, self.rnd, self.busy = kind, rnd, busy
        self.done, self.log, self.lock = {}, [], threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/{self.kind}"

    def effects(self):
        return sum(1 for _, o, _ in self.log if o == "created")


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server
        key = self.headers.get("Idempotency-Key")
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with srv.lock:
            pause = srv.rnd.uniform(0.1, 0.5)
            refuse = srv.rnd.random() < srv.busy
        time.sleep(pause)
        with srv.lock:
            if key in srv.done:
                outcome, status, body = "replayed", 200, srv.done[key]
            elif refuse:
                outcome, status, body = "503", 503, {"error": "busy"}
            else:
                prefix = "LBL" if srv.kind == "labels" else "MSG"
                body = srv.done[key] = {("label_id" if srv.kind == "labels" else "message_id"):
                                        f"{prefix}-{len(srv.done) + 1:03d}"}
                outcome, status = "created", 201
            srv.log.append((key, outcome, time.time()))
        try:
            self.send_response(status)
            if status == 503:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass    # the caller was killed

    def log_message(self, *a):
        pass


# --- a worker process --------------------------------------------------------

def worker_main(a):
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    logging.basicConfig(level=logging.CRITICAL)
    wf = make_workflow(a.carrier, a.mailer)
    idem.Worker(lambda: psycopg.connect(a.dsn, connect_timeout=3), [wf], concurrency=2,
                lease=LEASE, poll=0.2, name=a.name, stop=stop).run()
    return 0


# --- the supervisor ----------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--crashes", type=int, default=None,
                    help="SIGKILL at most this many workers (default: until the orders are done)")
    ap.add_argument("--chart", nargs="?", const="-", default=None,
                    help="draw attempts per order over time: on the terminal, or into FILE.svg")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--dsn", "--carrier", "--mailer", "--name"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker_main(a)

    seed = a.seed if a.seed is not None else random.randrange(10**6)
    rnd = random.Random(seed)
    t0 = time.time()

    def say(what):
        print(f"[{time.time() - t0:5.1f}s] {what}", flush=True)

    from clusters import BINDIR, Cluster
    say(f"seed {seed}: {a.orders} orders, {a.workers} worker processes, a chaos loop")
    cluster = Cluster()
    carrier = Service("labels", random.Random(rnd.random()), 0.25)
    mailer = Service("mail", random.Random(rnd.random()), 0.15)
    ledger, ledger_lock = {}, threading.Lock()        # event key -> deliveries
    procs, stop_consumer = {}, threading.Event()
    consumer = None
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as db:
            db.execute("""
                CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);
                CREATE TABLE refunds (order_id text PRIMARY KEY, amount numeric(10,2) NOT NULL,
                                      label_id text NOT NULL);""")
            wf = make_workflow(carrier.url, mailer.url)
            wf.create_queue(db, max_attempts=8, backoff_base="200 ms", backoff_cap="2 s")
            skus = [f"sku-{i}" for i in range(5)]
            db.execute("INSERT INTO stock SELECT unnest(%s::text[]), 0", (skus,))
            orders = [f"ord-{i:02d}" for i in range(1, a.orders + 1)]
            for i, o in enumerate(orders):
                wf.start(db, f"returns:acme:{o}",
                         input={"order": o, "sku": skus[i % len(skus)], "customer": f"cust-{i}",
                                "amount": idem.loads(f"{rnd.randrange(500, 9000) / 100:.2f}")})
        say(f"{a.orders} runs enqueued on queue 'returns' (idem_run_begin); starting workers")

        # the outbox consumer: refunds to the ledger, which books once per key
        def book(event):
            with ledger_lock:
                ledger[event["key"]] = ledger.get(event["key"], 0) + 1
        logging.basicConfig(level=logging.CRITICAL)
        consumer = threading.Thread(target=lambda: idem.consume(
            lambda: psycopg.connect(cluster.dsn(), connect_timeout=3), "refunds", book,
            lease=LEASE, idle=0.5, stop=stop_consumer), daemon=True)
        consumer.start()

        names = {}

        def spawn(slot):
            names[slot] = names.get(slot, 0) + 1
            name = f"w{slot + 1}" + ("" if names[slot] == 1 else f".{names[slot]}")
            procs[slot] = (name, subprocess.Popen(
                [sys.executable, __file__, "--worker", "--dsn", cluster.dsn(), "--carrier",
                 carrier.url, "--mailer", mailer.url, "--name", name]))
        for s in range(a.workers):
            spawn(s)

        def progress():
            try:
                with psycopg.connect(cluster.dsn(), connect_timeout=2) as db:
                    done = db.execute("SELECT count(*) FILTER (WHERE status = 'completed'),"
                                      " count(*) FILTER (WHERE status = 'failed') FROM idem_runs"
                                      " WHERE queue = 'returns'").fetchone()
                    delivered = db.execute("SELECT count(*) FROM idem_outbox_events"
                                           " WHERE topic = 'refunds' AND state = 'delivered'").fetchone()[0]
                    return done[0], done[1], delivered
            except psycopg.OperationalError:
                return None

        def holding(name):
            try:
                with psycopg.connect(cluster.dsn(), connect_timeout=2) as db:
                    return db.execute("SELECT run_id, next_step, attempt FROM idem_runs"
                                      " WHERE holder = %s AND state = 'leased' ORDER BY run_id",
                                      (name,)).fetchall()
            except psycopg.OperationalError:
                return []

        kills, restarted, deadline = 0, False, time.time() + 90
        killed_holding = collections.Counter()  # run id: kills of its holders
        next_kill = time.time() + rnd.uniform(1.0, 2.0)
        last = None
        while True:
            p = progress()
            if p and (p[0] + p[1] == a.orders) and p[2] == p[0]:
                break
            if time.time() > deadline:
                say("gave up waiting")
                break
            if p and p[:2] != last:
                last = p[:2]
                say(f"progress: {p[0]}/{a.orders} orders completed"
                    + (f", {p[1]} failed" if p[1] else "") + f", {p[2]} refunds delivered")
            if not restarted and p and p[0] >= a.orders // 4:
                restarted = True
                say("chaos: PostgreSQL crash (pg_ctl stop -m immediate), then start")
                subprocess.run([os.path.join(BINDIR, "pg_ctl"), "-D", cluster.data, "-m",
                                "immediate", "stop"], stdout=subprocess.DEVNULL, check=True)
                time.sleep(rnd.uniform(0.3, 1.0))
                subprocess.run([os.path.join(BINDIR, "pg_ctl"), "-D", cluster.data, "-w", "-l",
                                os.path.join(cluster.dir, "log"), "start"],
                               stdout=subprocess.DEVNULL, check=True)
                say("chaos: PostgreSQL is back (crash recovery done); the workers reconnect")
            if (time.time() >= next_kill and p and p[0] < a.orders
                    and (a.crashes is None or kills < a.crashes)):
                # a worker with runs in hand (one still starting has none)
                slot = rnd.randrange(a.workers)
                name, proc = procs[slot]
                held = holding(name)
                if not held or any(killed_holding[r] >= 2 for r, _, _ in held):
                    time.sleep(0.1)
                    continue
                proc.kill()
                proc.wait()
                kills += 1
                killed_holding.update(r for r, _, _ in held)
                what = ", ".join(f"{r.split(':')[-1]} at {s} (attempt {n})" for r, s, n in held)
                say(f"chaos: SIGKILL {name} (pid {proc.pid}) holding {what}")
                spawn(slot)
                next_kill = time.time() + rnd.uniform(0.5, 2.0)
            time.sleep(0.1)
        for name, proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        exits = [proc.wait(15) for _, proc in procs.values()]
        stop_consumer.set()
        consumer.join(10)
        elapsed = time.time() - t0
        say(f"all done: {kills} workers killed, PostgreSQL crashed once; workers stopped by SIGTERM"
            f" (exit {', '.join(map(str, exits))})")
        return report(cluster, orders, carrier, mailer, ledger, rnd, a.chart, t0, elapsed,
                      restarted, exits)
    finally:
        stop_consumer.set()
        for _, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        carrier.shutdown()
        mailer.shutdown()
        cluster.stop()


def report(cluster, orders, carrier, mailer, ledger, rnd, chart, t0, elapsed, restarted, exits):
    with psycopg.connect(cluster.dsn()) as db:
        runs = db.execute("SELECT run_id, status FROM idem_runs WHERE queue = 'returns'").fetchall()
        attempts = db.execute("SELECT run_id, claim, attempt, step, worker, claimed_at, ended_at,"
                              " outcome, error FROM idem_run_attempts ORDER BY run_id, claim").fetchall()
        keys = dict(db.execute("SELECT run_id || '/' || s.step, idem_step_key(run_id, s.step)"
                               " FROM idem_runs r, LATERAL unnest(ARRAY['label', 'notify']) s(step)"
                               " WHERE queue = 'returns'").fetchall())
        restocked = db.execute("SELECT sum(on_hand) FROM stock").fetchone()[0]
        refunds = db.execute("SELECT count(*), count(DISTINCT order_id) FROM refunds").fetchone()
        events = db.execute("SELECT count(*), count(*) FILTER (WHERE state = 'delivered'),"
                            " count(DISTINCT key) FROM idem_outbox_events WHERE topic = 'refunds'"
                            ).fetchone()
        stats = db.execute("SELECT executions, replays, mismatches, runs_claimed, run_lease_expiries,"
                           " run_retries, runs_failed, outbox_written, outbox_claimed, outbox_acked,"
                           " outbox_failed FROM idem_stats WHERE datname = current_database()"
                           ).fetchone()

    by_run = {}
    for r in attempts:
        by_run.setdefault(r[0], []).append(r)
    # the order with the most eventful history
    shown = max(by_run, key=lambda r: (len(by_run[r]), sum(1 for x in by_run[r]
                                                           if x[7] == "lease_expired"), r))
    print(f"\naudit trail of {shown} (idem_run_attempts: every claim, the killed ones too)")
    print(f"  {'claim':>5} {'attempt':>7} {'from step':<9} {'worker':<7} {'claimed':>8} {'ended':>8}  outcome")
    for _, claim, att, step, worker, at, end, outcome, error in by_run[shown]:
        ended = f"{end.timestamp() - t0:7.1f}s" if end else "       -"
        print(f"  {claim:>5} {att:>7} {step:<9} {worker:<7} {at.timestamp() - t0:7.1f}s {ended}  "
              f"{outcome or '-'}" + (f" ({error})" if error and outcome != "completed" else ""))
    for svc, step in ((carrier, "label"), (mailer, "notify")):
        key = keys[f"{shown}/{step}"]
        seen = [f"{o} at {t - t0:.1f}s" for k, o, t in svc.log if k == key]
        print(f"  {step}: key {key}, {svc.kind} saw {len(seen)} request(s): {', '.join(seen)}")

    print("\nidem_stats (shared-memory counters: they restart from 0 with the server's crash): " + ", ".join(f"{n} {v}" for n, v in zip(
        ("executions", "replays", "mismatches"), stats[0:3])))
    print("  runs: " + ", ".join(f"{n} {v}" for n, v in zip(
        ("claimed", "lease expiries", "retries", "failed"), stats[3:7])))
    print("  outbox: " + ", ".join(f"{n} {v}" for n, v in zip(
        ("written", "claimed", "acked", "failed"), stats[7:11])))

    n = len(orders)
    label_keys = {keys[f"returns:acme:{o}/label"] for o in orders}
    mail_keys = {keys[f"returns:acme:{o}/notify"] for o in orders}
    checks = [
        ("runs completed", sum(1 for _, s in runs if s == "completed"), n),
        ("restocks (one per order)", restocked, n),
        ("refund rows (one per order)", refunds[0], n),
        ("labels created, one per label key", len({k for k, o, _ in carrier.log if o == "created"}
                                                  & label_keys), n),
        ("carrier effects in all", carrier.effects(), n),
        ("mails sent, one per notify key", len({k for k, o, _ in mailer.log if o == "created"}
                                               & mail_keys), n),
        ("mailer effects in all", mailer.effects(), n),
        ("outbox events (one per refund)", events[0], n),
        ("outbox events delivered (acked)", events[1], n),
        ("ledger bookings, one per event key", len(ledger), n),
        ("attempts left open", sum(1 for r in attempts if r[7] is None), 0),
        ("workers' exit status after SIGTERM", max(exits), 0),
    ]
    print(f"\nproof ({n} orders; {len(attempts)} attempts on record, "
          f"{sum(1 for r in attempts if r[7] == 'lease_expired')} of them killed;"
          f" carrier asked {len(carrier.log)} times, mailer {len(mailer.log)},"
          f" ledger handed {sum(ledger.values())} deliveries):")
    ok = True
    for what, got, want in checks:
        good = got == want
        ok &= good
        print(f"  {'ok ' if good else 'BAD'} {what}: {got}" + ("" if good else f" (expected {want})"))
    if chart:
        draw(chart, by_run, t0, elapsed)
    print(f"\n{'PROVED' if ok else 'FAILED'}: each business effect exactly once, each external"
          f" call deduplicated by its key, each outbox event delivered once"
          f" ({elapsed:.1f} s, PostgreSQL {'restarted once' if restarted else 'not restarted'})"
          if ok else "\nFAILED")
    return 0 if ok else 1


def draw(where, by_run, t0, elapsed):
    """Attempts per order over time: one row per order, one cell per 0.5 s;
    a digit is the attempt holding the run (its claim number), x where a
    claim ended killed (lease expired), ! a failed step, * completion."""
    mark = {"lease_expired": "x", "step_failed": "!", "completed": "*", "released": "r"}
    width = int(elapsed / 0.5) + 1
    if where == "-":
        print(f"\nattempts per order over time (one column per 0.5 s; digit = claim holding the run,"
              f" x = killed, ! = step failed, * = completed)")
        for run in sorted(by_run):
            cells = [" "] * width
            ends = []
            for r in by_run[run]:
                a = int((r[5].timestamp() - t0) / 0.5)
                b = int(((r[6].timestamp() if r[6] else time.time()) - t0) / 0.5)
                for i in range(max(a, 0), min(b, width - 1) + 1):
                    cells[i] = str(r[1] % 10)
                ends.append((b, mark.get(r[7])))
            for b, m in ends:       # how each claim ended wins over the next one's start
                if m and 0 <= b < width:
                    cells[b] = m
            print(f"  {run.split(':')[-1]:>7} |{''.join(cells)}|")
        return
    colors = {"completed": "#2a2", "lease_expired": "#d22", "step_failed": "#e90",
              "released": "#888", None: "#888"}
    rows = sorted(by_run)
    sx, rh = 900 / max(elapsed, 1), 18
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="1000" height="{len(rows) * rh + 40}"'
           ' font-family="monospace" font-size="11">',
           '<text x="5" y="14">attempts per order over time: green completed, red killed'
           ' (lease expired), orange step failed</text>']
    for i, run in enumerate(rows):
        y = 24 + i * rh
        out.append(f'<text x="2" y="{y + 12}">{run.split(":")[-1]}</text>')
        for r in by_run[run]:
            x0 = 90 + (r[5].timestamp() - t0) * sx
            x1 = 90 + ((r[6].timestamp() if r[6] else t0 + elapsed) - t0) * sx
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{rh - 4}"'
                       f' fill="{colors.get(r[7], "#888")}" stroke="#000" stroke-width="0.5">'
                       f'<title>claim {r[1]} {r[4]} {r[7]}</title></rect>')
    out.append("</svg>")
    with open(where, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"\nchart of attempts per order over time written to {where}")


if __name__ == "__main__":
    sys.exit(main())
