"""The returns agent: a crash-injected workflow run with the Python helper.

  python3 returns_agent.py [--seed N] [--crashes N]

Starts a throwaway cluster (as the cluster user; idem installed in
$PG_CONFIG), a fake carrier and a fake mailer, HTTP services on loopback
that honour an Idempotency-Key header and sometimes answer 503 with
Retry-After.  Then it runs the agent (a child process) for one return --
validate, restock, shipping label, refund, notify -- and an outbox consumer
(another child, idem_client.consume()) that delivers the notify step's
outbox event to the mailer.  Crashes are injected at seeded random points:
the agent killed with SIGKILL (mid-transaction, after a commit, after the
carrier answered), its connection dropped, its transaction aborted, the
consumer killed with SIGKILL after the mailer accepted a notification and
before the ack.  Each is restarted until the run completes and the event
is delivered; the consumer is then stopped with SIGTERM.  At the end it
proves from the database and the services' logs: one refund, one label, one
restock, one notification event, delivered, and one notification sent by
the mailer, however many delivery attempts reached it.
"""

import argparse
import http.server
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))

import psycopg  # noqa: E402
import idem_client as idem  # noqa: E402

STEPS = ["validate", "restock", "label", "refund", "notify"]
RUN = "returns:acme:ret-4471"
TOPIC = "customer-notifications"
# crashes at a step of the agent's transactions, and two with one place each
IN_STEPS = ("kill-in-tx", "kill-after-commit", "drop-connection", "abort-tx")
KINDS = IN_STEPS + ("kill-after-carrier", "kill-consumer-mid-batch")
LEASE = 2       # seconds: a killed consumer's event comes back quickly


def crash_plan(rnd, n):
    """n crash points, every kind once before any repeats (so that a run
    with n >= 6 shows all of them), in the order the run meets them."""
    kinds = rnd.sample(KINDS, min(n, len(KINDS)))
    kinds += [rnd.choice(KINDS) for _ in range(n - len(kinds))]
    points = [f"{k}:{rnd.choice([s for s in STEPS if s != 'label'])}" if k in IN_STEPS else k
              for k in kinds]

    def order(c):
        if c == "kill-consumer-mid-batch":
            return len(STEPS)
        return STEPS.index(c.rpartition(":")[2] if ":" in c else "label")
    return sorted(points, key=order)


# --- the fake downstream services --------------------------------------------

class Service(http.server.ThreadingHTTPServer):
    """A downstream that honours Idempotency-Key: the first request of a key
    that it does not refuse has the effect, a repeat gets that effect's
    result, and a share of requests is refused with 503 and Retry-After 1.
    Every request is logged as (key, outcome)."""

    def __init__(self, rnd, fail_share):
        super().__init__(("127.0.0.1", 0), ServiceHandler)
        self.rnd = rnd
        self.fail_share = fail_share
        self.done = {}       # Idempotency-Key -> the effect's result
        self.log = []        # (key, outcome)
        self.lock = threading.Lock()

    def request(self, key, body):
        """(outcome, status, response body) of one request, under the lock."""
        if key in self.done:
            return self.repeated, 200, self.reply(key, self.repeated)
        if self.rnd.random() < self.fail_share:
            return "503", 503, self.reply(None, "503")
        self.done[key] = self.effect(body)
        return self.created, self.created_status, self.reply(key, self.created)


class Carrier(Service):
    """Creates one shipping label per key; a 503 is 40% likely."""
    repeated, created, created_status = "replayed", "created", 201

    def __init__(self, seed):
        super().__init__(random.Random(seed), 0.4)

    def effect(self, body):
        return {"label_id": f"LBL-{len(self.done) + 1:04d}", "return_id": body["return_id"],
                "tracking": f"1Z{self.rnd.randrange(10**9):09d}"}

    def reply(self, key, outcome):
        return self.done[key] if key is not None else {"error": "busy"}


class Mailer(Service):
    """Sends one notification per key (the outbox event's key); a 503 is 30%
    likely."""
    repeated, created, created_status = "duplicate", "sent", 202

    def __init__(self, seed):
        super().__init__(random.Random(seed + 1), 0.3)

    def effect(self, body):
        return f"MSG-{len(self.done) + 1:04d}"

    def reply(self, key, outcome):
        return {"message_id": self.done.get(key), "outcome": outcome}


class ServiceHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server
        key = self.headers.get("Idempotency-Key")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with srv.lock:
            outcome, status, reply = srv.request(key, body)
            srv.log.append((key, outcome))
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(reply).encode())

    def log_message(self, *a):
        pass


# --- the outbox consumer (a child process) -----------------------------------

def consumer(dsn, mailer_url, plan, crashlog):
    """Delivers the topic's events to the mailer with idem_client.consume();
    a planned crash kills it after the mailer accepted, before the ack."""
    import logging
    import urllib.error
    import urllib.request

    logging.basicConfig(format="  consumer  %(message)s", stream=sys.stdout)
    plan = [c for c in plan.split(",") if c]

    def say(what):
        print(f"  {'consumer':<9} {what}", flush=True)

    def deliver(event):
        p = event["payload"]["rows"][0]
        req = urllib.request.Request(mailer_url, method="POST",
                                     data=json.dumps({"to": p["customer"], "text": p["message"]}).encode(),
                                     headers={"Idempotency-Key": event["key"],
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            if e.code not in (429, 503):
                raise           # the server's backoff; the error is the event's last_error
            wait = float(e.headers.get("Retry-After", "1"))
            say(f"mailer answered {e.code} (attempt {event['attempt']}): failing the event,"
                f" due again after {wait:g} s (Retry-After)")
            raise idem.RetryAfter(wait, f"mailer {e.code}")
        say(f"notification {answer['outcome']} ({answer['message_id']}, attempt {event['attempt']})")
        if plan:
            with open(crashlog, "a") as f:
                f.write(plan.pop(0) + "\n")
            say("CRASH: consumer killed after the mailer accepted, before the ack")
            os.kill(os.getpid(), signal.SIGKILL)

    say(f"listening for {TOPIC} (lease {LEASE} s)")
    n = idem.consume(lambda: psycopg.connect(dsn), TOPIC, deliver, lease=LEASE, idle=1,
                     consumer="demo-consumer")
    say(f"stopped by SIGTERM after {n} acknowledged")


# --- the agent (a child process) ---------------------------------------------

def agent(dsn, carrier_url, plan, crashlog):
    """Runs the sequence, applying the planned crashes in order as it passes
    their points (a dropped connection is survived, so the next one may
    come in the same start); each one applied is appended to crashlog."""
    import urllib.error
    import urllib.request

    plan = [c for c in plan.split(",") if c]

    def crash_here(h, step):
        if plan and plan[0] == f"{h}:{step}" or (plan and h == plan[0] == "kill-after-carrier"):
            with open(crashlog, "a") as f:
                f.write(plan.pop(0) + "\n")
            return True
        return False

    def say(step, what):
        print(f"  {step:<9} {what}", flush=True)

    def connect():
        return psycopg.connect(dsn, prepare_threshold=None)

    def run_step(name, sql, *args, **opts):
        retried = []

        def tx(conn):
            r = idem.step(conn, RUN, name, sql, *args, **opts)
            if crash_here("kill-in-tx", name):
                say(name, "CRASH: agent killed before COMMIT")
                os.kill(os.getpid(), signal.SIGKILL)
            if crash_here("drop-connection", name):
                say(name, "CRASH: connection dropped before COMMIT")
                conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            if crash_here("abort-tx", name):
                say(name, "CRASH: transaction aborted, agent exits")
                raise SystemExit(3)
            return r

        r, conn = idem.retry(connect, tx, on_retry=lambda e, d: retried.append(d))
        conn.close()
        note = f" (retried after {retried[-1]:.2f} s)" if retried else ""
        say(name, ("replayed" if r.replayed else "executed") + note)
        if crash_here("kill-after-commit", name):
            say(name, "CRASH: agent killed after COMMIT")
            os.kill(os.getpid(), signal.SIGKILL)
        return r

    with connect() as conn:
        conn.execute("SELECT idem_run_begin(%s, %s, %s)",
                     (RUN, STEPS, json.dumps({"return_id": "ret-4471", "sku": "sku-1"})))
        conn.commit()

    run_step("validate", "SELECT return_id, amount FROM returns WHERE return_id = $1 AND status = 'approved'",
             "ret-4471")
    run_step("restock", "UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand", "sku-1")

    # the label: an external call under the step's key, recorded afterwards
    with connect() as conn:
        key = conn.execute("SELECT idem_step_key(%s, 'label')", (RUN,)).fetchone()[0]
        done = conn.execute("SELECT response FROM idem_run_steps(%s) WHERE step = 'label'"
                            " AND state = 'completed'", (RUN,)).fetchone()
    if done:
        say("label", f"replayed ({done[0]['label_id']})")
    else:
        while True:
            req = urllib.request.Request(carrier_url, method="POST",
                                         data=json.dumps({"return_id": "ret-4471"}).encode(),
                                         headers={"Idempotency-Key": key,
                                                  "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req) as resp:
                    label = json.loads(resp.read())
                break
            except urllib.error.HTTPError as e:
                wait = float(e.headers.get("Retry-After", "1"))
                say("label", f"carrier answered {e.code}: retrying after {wait:g} s (Retry-After)")
                time.sleep(wait)
        if crash_here("kill-after-carrier", "label"):
            say("label", "CRASH: agent killed after the carrier answered, before recording")
            os.kill(os.getpid(), signal.SIGKILL)
        with connect() as conn:
            conn.execute("SELECT idem_step_complete(%s, 'label', %s)", (RUN, json.dumps(label)))
            conn.commit()
        say("label", f"executed ({label['label_id']})")

    run_step("refund", "INSERT INTO refunds (return_id, amount) VALUES ($1, $2) RETURNING id, amount",
             "ret-4471", "25.00")
    run_step("notify", "SELECT $1 AS customer, $2 AS message", "cust-17",
             "Your refund of 25.00 is on its way.", outbox_topic=TOPIC)


# --- the supervisor ----------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--crashes", type=int, default=4)
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--consumer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dsn", help=argparse.SUPPRESS)
    ap.add_argument("--carrier", help=argparse.SUPPRESS)
    ap.add_argument("--mailer", help=argparse.SUPPRESS)
    ap.add_argument("--plan", default="", help=argparse.SUPPRESS)
    ap.add_argument("--crashlog", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.agent:
        agent(a.dsn, a.carrier, a.plan, a.crashlog)
        return 0
    if a.consumer:
        consumer(a.dsn, a.mailer, a.plan, a.crashlog)
        return 0

    seed = a.seed if a.seed is not None else random.randrange(10**6)
    rnd = random.Random(seed)
    # in run order, so that each restart gets further and most crashes hit
    # work that has not completed yet
    plan = crash_plan(rnd, a.crashes)
    print(f"returns agent: seed {seed}, {a.crashes} crashes planned: {', '.join(plan) or 'none'}")
    agent_plan = [c for c in plan if c != "kill-consumer-mid-batch"]
    consumer_plan = [c for c in plan if c == "kill-consumer-mid-batch"]

    sys.path.insert(0, os.path.join(here, "..", "tests"))
    from clusters import Cluster
    cluster = Cluster()
    carrier, mailer = Carrier(seed), Mailer(seed)
    for srv in (carrier, mailer):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{carrier.server_address[1]}/labels"
    mailer_url = f"http://127.0.0.1:{mailer.server_address[1]}/notifications"
    consumer_proc = None
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as db:
            db.execute(f"""
                CREATE TABLE returns (return_id text PRIMARY KEY, amount numeric, status text);
                CREATE TABLE stock (sku text PRIMARY KEY, on_hand int);
                CREATE TABLE refunds (id serial PRIMARY KEY, return_id text, amount numeric);
                INSERT INTO returns VALUES ('ret-4471', 25.00, 'approved');
                INSERT INTO stock VALUES ('sku-1', 3);
                SELECT idem_outbox_create_topic('{TOPIC}');""")
        t0 = time.time()
        starts = consumer_starts = 0
        crashlog = os.path.join(cluster.dir, "crashes")
        consumer_crashlog = os.path.join(cluster.dir, "consumer-crashes")
        open(crashlog, "w").close()
        open(consumer_crashlog, "w").close()

        def applied(log):
            with open(log) as f:
                return f.read().split()

        def start_consumer():
            nonlocal consumer_starts
            consumer_starts += 1
            left = consumer_plan[len(applied(consumer_crashlog)):]
            print(f"consumer start {consumer_starts}" + (f" (crashes left: {', '.join(left)})" if left else ""),
                  flush=True)
            return subprocess.Popen([sys.executable, __file__, "--consumer", "--dsn", cluster.dsn(),
                                     "--mailer", mailer_url, "--plan", ",".join(left),
                                     "--crashlog", consumer_crashlog])

        def delivery_state():
            with psycopg.connect(cluster.dsn()) as db:
                return db.execute("SELECT state, attempts FROM idem_outbox_events WHERE topic = %s",
                                  (TOPIC,)).fetchone()

        # the consumer waits from the start: the notify step's commit wakes it
        consumer_proc = start_consumer()
        while True:
            before = applied(crashlog)
            left = agent_plan[len(before):]
            starts += 1
            print(f"agent start {starts}" + (f" (crashes left: {', '.join(left)})" if left else ""),
                  flush=True)
            p = subprocess.run([sys.executable, __file__, "--agent", "--dsn", cluster.dsn(),
                                "--carrier", url, "--plan", ",".join(left), "--crashlog", crashlog])
            with psycopg.connect(cluster.dsn()) as db:
                status, done, total = db.execute(
                    "SELECT status, steps_done, steps_total FROM idem_run_status(%s)",
                    (RUN,)).fetchone()
            print(f"  -- progress: {done}/{total} steps, run {status}, agent exit {p.returncode}", flush=True)
            now_applied = len(applied(crashlog))
            # done when the run is complete and every planned crash happened
            # (or a whole pass met none of the remaining ones)
            if status == "completed" and p.returncode == 0 and (
                    now_applied == len(agent_plan) or now_applied == len(before)):
                break
            if starts > len(agent_plan) + 3:
                raise SystemExit("the run did not complete")

        # the notification: restart the consumer whenever it died, until the
        # event is delivered (a killed consumer's event is back after the lease)
        deadline = time.time() + 30 + LEASE * (len(consumer_plan) + 1)
        while True:
            state = delivery_state()
            if state and state[0] == "delivered":
                break
            if consumer_proc.poll() is not None:
                print(f"  -- delivery: event {state[0] if state else 'missing'} after {state[1] if state else 0}"
                      f" attempts, consumer exit {consumer_proc.returncode}", flush=True)
                consumer_proc = start_consumer()
            if time.time() > deadline:
                raise SystemExit("the notification was not delivered")
            time.sleep(0.1)
        print(f"  -- delivery: event delivered after {state[1]} attempts", flush=True)
        consumer_proc.send_signal(signal.SIGTERM)
        consumer_exit = consumer_proc.wait(10)

        with psycopg.connect(cluster.dsn()) as db:
            refunds = db.execute("SELECT count(*) FROM refunds").fetchone()[0]
            on_hand = db.execute("SELECT on_hand FROM stock").fetchone()[0]
            events, delivered = db.execute(
                "SELECT count(*), count(*) FILTER (WHERE state = 'delivered')"
                " FROM idem_outbox_events WHERE topic = %s", (TOPIC,)).fetchone()
        created = sum(1 for _, o in carrier.log if o == "created")
        sent = sum(1 for _, o in mailer.log if o == "sent")
        injected = len(applied(crashlog)) + len(applied(consumer_crashlog))
        print(f"\ndone in {time.time() - t0:.1f} s after {starts} agent starts and {consumer_starts}"
              f" consumer starts ({injected} crashes injected); carrier saw {len(carrier.log)} requests "
              f"({', '.join(o for _, o in carrier.log)}); mailer saw {len(mailer.log)} delivery attempts "
              f"({', '.join(o for _, o in mailer.log)})")
        checks = [("refunds", refunds, 1), ("labels created by the carrier", created, 1),
                  ("restocks (on_hand 3 -> 4)", on_hand - 3, 1),
                  ("customer notification events", events, 1),
                  ("of them delivered (acked)", delivered, 1),
                  ("notifications sent by the mailer", sent, 1),
                  ("consumer exit status after SIGTERM", consumer_exit, 0)]
        ok = True
        for what, got, want in checks:
            print(f"  {what}: {got}" + ("" if got == want else f"  <-- expected {want}"))
            ok &= got == want
        print("PROVED: every effect exactly once" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if consumer_proc is not None and consumer_proc.poll() is None:
            consumer_proc.kill()
            consumer_proc.wait()
        carrier.shutdown()
        mailer.shutdown()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
