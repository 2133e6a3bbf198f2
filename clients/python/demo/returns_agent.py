"""The returns agent: a crash-injected workflow run with the Python helper.

  python3 returns_agent.py [--seed N] [--crashes N]

Starts a throwaway cluster (as the cluster user; idem installed in
$PG_CONFIG) and a fake carrier HTTP service on loopback that honours an
Idempotency-Key header and sometimes answers 503 with Retry-After.  Then it
runs the agent (a child process) for one return -- validate, restock,
shipping label, refund, notify -- injecting crashes at seeded random points:
the agent killed with SIGKILL (mid-transaction, after a commit, after the
carrier answered), its connection dropped, its transaction aborted.  Each
time it is restarted, until the run completes.  At the end it proves from
the database and the carrier's log: one refund, one label, one restock, one
customer notification event in the outbox.

The notification is the step's outbox event; delivering it to the customer
(the outbox consumer of the delivery API) is not part of this branch.
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
CRASHES = [f"{how}:{step}" for step in STEPS if step != "label"
           for how in ("kill-in-tx", "kill-after-commit", "drop-connection", "abort-tx")]
CRASHES += ["kill-after-carrier"]


# --- the fake carrier -------------------------------------------------------

class Carrier(http.server.ThreadingHTTPServer):
    def __init__(self, seed):
        super().__init__(("127.0.0.1", 0), CarrierHandler)
        self.rnd = random.Random(seed)
        self.labels = {}     # Idempotency-Key -> label
        self.log = []        # (key, outcome)
        self.lock = threading.Lock()


class CarrierHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server
        key = self.headers.get("Idempotency-Key")
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with srv.lock:
            if key in srv.labels:
                outcome, status, label = "replayed", 200, srv.labels[key]
            elif srv.rnd.random() < 0.4:
                outcome, status, label = "503", 503, None
            else:
                label = {"label_id": f"LBL-{len(srv.labels) + 1:04d}", "return_id": body["return_id"],
                         "tracking": f"1Z{srv.rnd.randrange(10**9):09d}"}
                srv.labels[key] = label
                outcome, status = "created", 201
            srv.log.append((key, outcome))
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(label or {"error": "busy"}).encode())

    def log_message(self, *a):
        pass


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
             "Your refund of 25.00 is on its way.", outbox_topic="customer-notifications")


# --- the supervisor ----------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--crashes", type=int, default=4)
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dsn", help=argparse.SUPPRESS)
    ap.add_argument("--carrier", help=argparse.SUPPRESS)
    ap.add_argument("--plan", default="", help=argparse.SUPPRESS)
    ap.add_argument("--crashlog", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.agent:
        agent(a.dsn, a.carrier, a.plan, a.crashlog)
        return 0

    seed = a.seed if a.seed is not None else random.randrange(10**6)
    rnd = random.Random(seed)
    # in step order, so that each restart gets further and most crashes hit
    # work that has not completed yet
    plan = sorted((rnd.choice(CRASHES) for _ in range(a.crashes)),
                  key=lambda c: STEPS.index(c.rpartition(":")[2] if ":" in c else "label"))
    print(f"returns agent: seed {seed}, {a.crashes} crashes planned: {', '.join(plan) or 'none'}")

    sys.path.insert(0, os.path.join(here, "..", "tests"))
    from clusters import Cluster
    cluster = Cluster()
    carrier = Carrier(seed)
    threading.Thread(target=carrier.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{carrier.server_address[1]}/labels"
    try:
        with psycopg.connect(cluster.dsn(), autocommit=True) as db:
            db.execute("""
                CREATE TABLE returns (return_id text PRIMARY KEY, amount numeric, status text);
                CREATE TABLE stock (sku text PRIMARY KEY, on_hand int);
                CREATE TABLE refunds (id serial PRIMARY KEY, return_id text, amount numeric);
                INSERT INTO returns VALUES ('ret-4471', 25.00, 'approved');
                INSERT INTO stock VALUES ('sku-1', 3);
                SELECT idem_outbox_create_topic('customer-notifications');""")
        t0 = time.time()
        starts = 0
        crashlog = os.path.join(cluster.dir, "crashes")
        open(crashlog, "w").close()
        while True:
            applied = open(crashlog).read().split()
            left = plan[len(applied):]
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
            now_applied = len(open(crashlog).read().split())
            # done when the run is complete and every planned crash happened
            # (or a whole pass met none of the remaining ones)
            if status == "completed" and p.returncode == 0 and (
                    now_applied == len(plan) or now_applied == len(applied)):
                break
            if starts > len(plan) + 3:
                raise SystemExit("the run did not complete")

        with psycopg.connect(cluster.dsn()) as db:
            refunds = db.execute("SELECT count(*) FROM refunds").fetchone()[0]
            on_hand = db.execute("SELECT on_hand FROM stock").fetchone()[0]
            events = db.execute("SELECT count(*) FROM idem.outbox WHERE topic = 'customer-notifications'"
                                ).fetchone()[0]
        created = sum(1 for _, o in carrier.log if o == "created")
        print(f"\ndone in {time.time() - t0:.1f} s after {starts} agent starts "
              f"({len(open(crashlog).read().split())} crashes injected); carrier saw {len(carrier.log)} requests "
              f"({', '.join(o for _, o in carrier.log)})")
        checks = [("refunds", refunds, 1), ("labels created by the carrier", created, 1),
                  ("restocks (on_hand 3 -> 4)", on_hand - 3, 1),
                  ("customer notification events", events, 1)]
        ok = True
        for what, got, want in checks:
            print(f"  {what}: {got}" + ("" if got == want else f"  <-- expected {want}"))
            ok &= got == want
        print("PROVED: every effect exactly once" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        carrier.shutdown()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
