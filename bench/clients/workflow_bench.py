"""Workflow benchmark (issue 22): runs/s of the 4-step returns workflow
with 4 workers from Python, next to the same steps written by hand with
psycopg.

  workflow  idem_client.Workflow + Worker: 4 worker processes
            (concurrency 1 each), claims, heartbeats, fenced steps; the runs
            are enqueued (idem_run_begin, in one transaction) while the
            workers poll, and the clock runs from the enqueue's commit
            until the last run completed (its finished_at)
  hand      what an application writes without a runtime, no recovery at
            all: 4 processes, each taking orders from a shared counter;
            per order UPDATE stock (autocommit), the label call, INSERT the
            refund and its outbox row (one transaction), the notify call

The steps are the same: check (restock), label (an external call, here a
local function that returns at once, so that the database path is what is
measured), refund (a row and an outbox event), notify (no database).
Interleaved rounds; reports runs/s per round, the median, and the ratio
workflow/hand.  Usage (as the cluster user, idem installed in $PG_CONFIG):
  python3 workflow_bench.py [--runs 300] [--rounds 3] [--procs 4] [--prefetch N] [--cpu]
                            [--compare-client DIR] [--asyncio] [--prepare]

--compare-client DIR adds a third side to each round: the workflow run by
the Python helpers of another tree (DIR/clients/python, e.g. a checkout of
an earlier commit) against this tree's server, so that two clients are
measured interleaved in one session.

--asyncio adds a side too: the workflow with the same steps as async def,
run by AsyncWorker processes (concurrency 1 each, psycopg's
AsyncConnection).

--cpu also reports, per round, the CPU time per run of the client
processes (the workers, or the hand-written processes: their rusage once
joined) and of the server (the postmaster's reaped children and its live
ones, from /proc), and the server's committed transactions per run: CPU
time is what a shared, noisy machine still measures fairly.
"""

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "clients", "python"))
sys.path.insert(0, os.path.join(here, "..", "..", "clients", "python", "tests"))

import psycopg  # noqa: E402

import idem_client as idem  # noqa: E402

STEPS = ["check", "label", "refund", "notify"]


def label_call(key):
    return {"label_id": "LBL-" + key[-12:]}


def make_workflow(queue, mod=idem):
    wf = mod.Workflow(queue, steps=STEPS)

    @wf.step("check")
    def check(ctx):
        return ctx.execute("UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1 RETURNING on_hand",
                           ctx.input["sku"])

    @wf.external("label")
    def label(ctx):
        return label_call(ctx.key)

    @wf.step("refund", outbox_topic="refunds")
    def refund(ctx):
        return ctx.execute("INSERT INTO refunds (order_id, amount, label_id) VALUES ($1, $2, $3)"
                           " RETURNING id", ctx.input["order"], ctx.input["amount"],
                           ctx.results["label"]["label_id"])

    @wf.step("notify")
    def notify(ctx):
        return {"to": ctx.input["customer"]}
    return wf


def make_async_workflow(queue):
    """make_workflow's steps as AsyncWorker runs them."""
    wf = idem.Workflow(queue, steps=STEPS)

    @wf.step("check")
    async def check(ctx):
        return await ctx.execute("UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1"
                                 " RETURNING on_hand", ctx.input["sku"])

    @wf.external("label")
    async def label(ctx):
        return label_call(ctx.key)

    @wf.step("refund", outbox_topic="refunds")
    async def refund(ctx):
        return await ctx.execute("INSERT INTO refunds (order_id, amount, label_id)"
                                 " VALUES ($1, $2, $3) RETURNING id", ctx.input["order"],
                                 ctx.input["amount"], ctx.results["label"]["label_id"])

    @wf.step("notify")
    async def notify(ctx):
        return {"to": ctx.input["customer"]}
    return wf


def connect_kw(prepare):
    """psycopg's default (statements prepared on the server after their
    5th execution), or none prepared, as behind PgBouncer in transaction
    mode; the same for both sides."""
    return {} if prepare else {"prepare_threshold": None}


def client_module(client_dir):
    """idem_client from client_dir/clients/python (None: this tree's), in
    a worker process of its own."""
    if client_dir is None:
        return idem
    for m in ("idem_client", "idem_workflow"):
        sys.modules.pop(m, None)
    sys.path.insert(0, os.path.join(client_dir, "clients", "python"))
    import idem_client
    return idem_client


def worker_proc(dsn, queue, stop, prefetch, prepare, client_dir=None):
    kw = {} if prefetch is None else {"prefetch": prefetch}
    mod = client_module(client_dir)
    mod.Worker(lambda: psycopg.connect(dsn, **connect_kw(prepare)), [make_workflow(queue, mod)],
               concurrency=1, lease=30, poll=0.05, stop=stop, **kw).run()


def async_worker_proc(dsn, queue, stop, prefetch, prepare, client_dir=None):
    kw = {} if prefetch is None else {"prefetch": prefetch}

    async def run():
        astop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # the round's multiprocessing event, waited for in a thread
        loop.run_in_executor(None, lambda: (stop.wait(), loop.call_soon_threadsafe(astop.set)))
        await idem.AsyncWorker(lambda: psycopg.AsyncConnection.connect(dsn, **connect_kw(prepare)),
                               [make_async_workflow(queue)], concurrency=1, lease=30, poll=0.05,
                               stop=astop, **kw).run()
    asyncio.run(run())


def hand_proc(dsn, counter, total, go, tag, prepare):
    conn = psycopg.connect(dsn, autocommit=True, **connect_kw(prepare))
    go.wait()
    while True:
        with counter.get_lock():
            i = counter.value
            counter.value += 1
        if i >= total:
            break
        order = f"{tag}-{i}"
        conn.execute("UPDATE stock SET on_hand = on_hand + 1 WHERE sku = %s RETURNING on_hand",
                     (f"sku-{i % 10}",)).fetchone()
        label = label_call(order)
        with conn.transaction():
            rid = conn.execute("INSERT INTO refunds (order_id, amount, label_id) VALUES (%s, %s, %s)"
                               " RETURNING id", (order, "25.00", label["label_id"])).fetchone()[0]
            conn.execute("INSERT INTO hand_outbox (topic, payload) VALUES ('refunds', %s)",
                         (idem.dumps({"id": rid, "amount": idem.loads("25.00")}),))
        {"to": f"cust-{i}"}     # notify: no database
    conn.close()


_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu(pid):
    """CPU seconds of the postmaster's children: those it reaped (its
    cutime, cstime) and those alive."""
    def fields(p):
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in fields(pid)[13:15])
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                f = fields(p)
            except OSError:
                continue
            if int(f[1]) == pid:
                total += int(f[11]) + int(f[12])
    return total / _TICK


class Cpu:
    """CPU seconds of this process's joined children and of the server,
    and the server's commits, between start() and stop()."""

    def __init__(self, cluster, admin):
        with open(os.path.join(cluster.data, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.admin = admin

    def _now(self):
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        xacts = self.admin.execute("SELECT xact_commit FROM pg_stat_database"
                                   " WHERE datname = current_database()").fetchone()[0]
        return ru.ru_utime + ru.ru_stime, _server_cpu(self.pid), xacts

    def _calls(self):
        return dict(self.admin.execute("SELECT funcname, calls FROM pg_stat_user_functions"
                                       " WHERE funcname LIKE 'idem%'").fetchall())

    def start(self):
        self.t0 = self._now()
        self.calls0 = self._calls()

    def stop(self, n):
        time.sleep(1.0)         # the backends' statistics reach the server
        t1 = self._now()
        calls = self._calls()
        self.calls = {f: (c - self.calls0.get(f, 0)) / n for f, c in sorted(calls.items())
                      if c != self.calls0.get(f, 0)}
        return tuple((b - a) / n for a, b in zip(self.t0, t1))


def round_workflow(dsn, admin, n, procs, r, prefetch, prepare, cpu=None, client_dir=None,
                   target=worker_proc, tag="bench"):
    queue = f"{tag}{r}" if client_dir is None else f"benchcmp{r}"
    admin.execute("SELECT idem_queue_create(%s)", (queue,))
    stop = mp.Event()
    ps = [mp.Process(target=target, args=(dsn, queue, stop, prefetch, prepare, client_dir))
          for _ in range(procs)]
    for p in ps:
        p.start()
    time.sleep(1.0)     # the workers are up and polling an empty queue
    wf = make_workflow(queue)
    with admin.transaction():
        for i in range(n):
            wf.start(admin, f"{queue}:{i}", input={"order": f"{queue}-{i}", "sku": f"sku-{i % 10}",
                                                  "amount": idem.loads("25.00"),
                                                  "customer": f"cust-{i}"})
        # the clock and the CPU count start as the runs become visible to
        # the workers: enqueueing is the producer's work, and the
        # hand-written side takes its orders from a counter
        if cpu:
            cpu.start()
        t0 = admin.execute("SELECT clock_timestamp()").fetchone()[0]
    # the clock stops at the last run's completion as the server recorded
    # it; the polls only say when to look (each scans the queue's runs
    # through the idem_runs view: polled every 20 ms they took a few
    # per cent of the machine from the workers)
    while admin.execute("SELECT count(*) FROM idem_runs WHERE queue = %s AND status = 'completed'",
                        (queue,)).fetchone()[0] < n:
        time.sleep(0.1)
    end = admin.execute("SELECT max(finished_at) FROM idem_runs WHERE queue = %s",
                        (queue,)).fetchone()[0]
    elapsed = (end - t0).total_seconds()
    stop.set()
    for p in ps:
        p.join()
    return n / elapsed, cpu and cpu.stop(n)


def round_hand(dsn, n, procs, r, prepare, cpu=None):
    if cpu:
        cpu.start()
    counter, go = mp.Value("l", 0), mp.Event()
    ps = [mp.Process(target=hand_proc, args=(dsn, counter, n, go, f"hand{r}", prepare))
          for _ in range(procs)]
    for p in ps:
        p.start()
    time.sleep(1.0)
    t0 = time.time()
    go.set()
    for p in ps:
        p.join()
    return n / (time.time() - t0), cpu and cpu.stop(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--prefetch", type=int, default=None,
                    help="the workers' prefetch (default: the Worker's)")
    ap.add_argument("--prepare", action="store_true",
                    help="psycopg's default prepare_threshold on both sides"
                         " (default: none prepared, as behind PgBouncer)")
    ap.add_argument("--compare-client", metavar="DIR",
                    help="also run the workflow with the Python helpers of the tree DIR")
    ap.add_argument("--asyncio", action="store_true",
                    help="also run the workflow with AsyncWorker processes")
    ap.add_argument("--cpu", action="store_true",
                    help="report CPU time per run, client and server, and commits per run")
    a = ap.parse_args()
    from clusters import Cluster
    cluster = Cluster()
    try:
        admin = psycopg.connect(cluster.dsn(), autocommit=True)
        admin.execute("ALTER SYSTEM SET synchronous_commit = off")
        if a.cpu:
            admin.execute("ALTER SYSTEM SET track_functions = 'all'")
        admin.execute("""
            CREATE TABLE stock (sku text PRIMARY KEY, on_hand int NOT NULL);
            INSERT INTO stock SELECT 'sku-' || g, 0 FROM generate_series(0, 9) g;
            CREATE TABLE refunds (id bigserial PRIMARY KEY, order_id text NOT NULL,
                                  amount numeric NOT NULL, label_id text NOT NULL);
            CREATE TABLE hand_outbox (id bigserial PRIMARY KEY, topic text NOT NULL,
                                      payload jsonb NOT NULL, created_at timestamptz DEFAULT now());""")
        admin.execute("SELECT pg_reload_conf()")
        cpu = Cpu(cluster, admin) if a.cpu else None
        wf_rates, hand_rates, cmp_rates, async_rates = [], [], [], []
        for r in range(a.rounds):
            rate, hcpu = round_hand(cluster.dsn(), a.runs, a.procs, r, a.prepare, cpu)
            hand_rates.append(rate)
            rate, wcpu = round_workflow(cluster.dsn(), admin, a.runs, a.procs, r, a.prefetch,
                                        a.prepare, cpu)
            wf_rates.append(rate)
            print(f"round {r + 1}: hand {hand_rates[-1]:.0f} runs/s, workflow {wf_rates[-1]:.0f} runs/s"
                  f" ({wf_rates[-1] / hand_rates[-1]:.2f}x)", flush=True)
            sides = [("hand", hcpu), ("workflow", wcpu)]
            if a.compare_client:
                calls = cpu and cpu.calls
                rate, ccpu = round_workflow(cluster.dsn(), admin, a.runs, a.procs, r, a.prefetch,
                                            a.prepare, cpu, a.compare_client)
                cmp_rates.append(rate)
                print(f"  compared: workflow {rate:.0f} runs/s ({rate / hand_rates[-1]:.2f}x)"
                      f" with the helpers of {a.compare_client}", flush=True)
                sides.append(("compared", ccpu))
                if cpu:
                    cpu.calls = calls
            if a.asyncio:
                calls = cpu and cpu.calls
                rate, acpu = round_workflow(cluster.dsn(), admin, a.runs, a.procs, r, a.prefetch,
                                            a.prepare, cpu, target=async_worker_proc,
                                            tag="benchasync")
                async_rates.append(rate)
                print(f"  asyncio: workflow {rate:.0f} runs/s ({rate / hand_rates[-1]:.2f}x)"
                      " with AsyncWorker", flush=True)
                sides.append(("asyncio", acpu))
                if cpu:
                    cpu.calls = calls
            if cpu:
                for side, (c, s, x) in sides:
                    print(f"  {side:8} CPU per run: client {c * 1e6:.0f} us, server {s * 1e6:.0f} us;"
                          f" {x:.2f} commits per run", flush=True)
                print("  workflow calls per run: " + ", ".join(f"{f} {c:.2f}" for f, c
                                                             in cpu.calls.items()), flush=True)
        h, w = statistics.median(hand_rates), statistics.median(wf_rates)
        print(f"median over {a.rounds} rounds of {a.runs} runs, {a.procs} processes each,"
              f" synchronous_commit off, {'prepared' if a.prepare else 'unprepared'}"
              f" statements: hand {h:.0f} runs/s, workflow {w:.0f} runs/s,"
              f" ratio {w / h:.2f}")
        if cmp_rates:
            print(f"compared: workflow {statistics.median(cmp_rates):.0f} runs/s, ratio"
                  f" {statistics.median([c / h for c, h in zip(cmp_rates, hand_rates)]):.2f}"
                  f" (median of the rounds' ratios)")
        if async_rates:
            print(f"asyncio: workflow {statistics.median(async_rates):.0f} runs/s, ratio"
                  f" {statistics.median([c / h for c, h in zip(async_rates, hand_rates)]):.2f}"
                  f" (median of the rounds' ratios)")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
