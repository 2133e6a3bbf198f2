"""Client-side benchmark (issue 14, section 5): what an application sees
from Python over loopback TCP, 4 processes, one connection each.

  hand   the pattern applications write by hand, 7 round trips for a new
         key: BEGIN; advisory lock; SELECT the key; INSERT the business row;
         INSERT the key record; INSERT the outbox event; COMMIT (a replay:
         BEGIN; lock; SELECT; COMMIT)
  local  idem with its options as settings, 4 round trips: BEGIN;
         SET LOCAL idem.outbox_topic; SELECT idem_execute(...); COMMIT
  call   the Python helper's one round trip: idem_call with outbox_topic
         per call, in autocommit (clients/python idem_client.execute)

For new keys and for replays of 2,000 seeded keys per design, interleaved rounds,
with synchronous_commit off and on.  Reports calls/s and p50/p99 latency
of one call (the whole transaction), and the ratios against hand.
Usage (as the cluster user, idem installed in $PG_CONFIG):
  python3 bench.py [--seconds 4] [--rounds 2] [--procs 4]
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid

here = os.path.dirname(os.path.abspath(__file__))
top = os.path.abspath(os.path.join(here, "..", ".."))
sys.path.insert(0, os.path.join(top, "clients", "python"))
sys.path.insert(0, os.path.join(top, "clients", "python", "tests"))

import psycopg  # noqa: E402
import idem_client as idem  # noqa: E402
from conftest import Cluster  # noqa: E402

SQL = "INSERT INTO bench.payments (invoice, amount) VALUES ($1, $2) RETURNING id, invoice, amount"
SEEDS = 2000


def hand(conn, key, invoice, amount):
    # what applications write by hand: every statement is a round trip
    conn.execute("BEGIN")
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
    rec = conn.execute("SELECT fingerprint, response FROM bench.keys"
                       " WHERE owner = current_user::regrole AND key = %s", (key,)).fetchone()
    fp = f"{SQL}\x1f{invoice}\x1f{amount}".encode()
    if rec is not None:
        conn.execute("COMMIT")
        if bytes(rec[0]) != fp:
            raise RuntimeError("key reused")
        return rec[1]
    rows = conn.execute("INSERT INTO bench.payments (invoice, amount) VALUES (%s, %s)"
                        " RETURNING id, invoice, amount", (invoice, amount)).fetchall()
    response = json.dumps({"rows": [{"id": r[0], "invoice": r[1], "amount": str(r[2])} for r in rows],
                           "command": "INSERT", "rowcount": len(rows)})
    conn.execute("INSERT INTO bench.keys (key, owner, fingerprint, response, created_at,"
                 " expires_at, fingerprint_version) VALUES (%s, current_user::regrole, %s,"
                 " %s, now(), now() + interval '1 day', 2)", (key, fp, response))
    conn.execute("INSERT INTO bench.outbox (event_id, key, owner, topic, payload, created_at,"
                 " state, attempts, next_attempt_at) VALUES (gen_random_uuid(), %s,"
                 " current_user::regrole, 'payments', %s, now(), 'pending', 0, now())",
                 (key, response))
    conn.execute("COMMIT")
    return response


def local(conn, key, invoice, amount):
    conn.execute("BEGIN")
    conn.execute("SET LOCAL idem.outbox_topic = 'payments'")
    r = conn.execute("SELECT idem_execute(%s, %s, %s, %s)", (key, SQL, invoice, amount)).fetchone()
    conn.execute("COMMIT")
    return r


def call(conn, key, invoice, amount):
    return idem.execute(conn, key, SQL, invoice, amount, outbox_topic="payments")


DESIGNS = {"hand": hand, "local": local, "call": call}


def worker(dsn, design, mode, seconds, sync, seed, out):
    rnd = random.Random(seed)
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"SET synchronous_commit = {sync}")
    fn = DESIGNS[design]
    lat = []
    deadline = time.perf_counter() + seconds
    while True:
        if mode == "new":
            key = str(uuid.uuid4())
            i = rnd.randint(1, 1000000)
        else:
            i = rnd.randint(1, SEEDS)
            key = f"seed-{design}-{i}"
        t0 = time.perf_counter()
        fn(conn, key, f"inv-{i}", f"{i}.00")
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        if t1 >= deadline:
            break
    conn.close()
    out.put(lat)


def measure(dsn, design, mode, seconds, sync, procs):
    out = mp.Queue()
    ps = [mp.Process(target=worker, args=(dsn, design, mode, seconds, sync, n * 7919 + 1, out))
          for n in range(procs)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    lats = [out.get() for _ in ps]
    for p in ps:
        p.join()
    # throughput: each process's calls over its own running time, summed
    tps = sum(len(lat) / sum(lat) for lat in lats)
    allv = sorted(x for lat in lats for x in lat)
    return tps, allv[len(allv) // 2] * 1000, allv[int(len(allv) * 0.99)] * 1000, len(allv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--sync", default="off,on")
    a = ap.parse_args()

    cluster = Cluster()
    try:
        admin = psycopg.connect(cluster.dsn(), autocommit=True)
        admin.execute(open(os.path.join(top, "test", "bench", "schema.sql")).read())
        dsn = cluster.tcp_dsn().replace("user=postgres", "user=bench")
        seeder = psycopg.connect(dsn, autocommit=True)
        for design, fn in DESIGNS.items():
            for i in range(1, SEEDS + 1):
                fn(seeder, f"seed-{design}-{i}", f"inv-{i}", f"{i}.00")
        seeder.close()
        admin.execute("VACUUM ANALYZE")
        results = {}
        for sync in a.sync.split(","):
            for rnd in range(a.rounds):
                for mode in ("new", "replay"):
                    for design in DESIGNS:
                        admin.execute("CHECKPOINT")
                        r = measure(dsn, design, mode, a.seconds, sync, a.procs)
                        results.setdefault((sync, mode, design), []).append(r)
        print(f"# {a.procs} processes, loopback TCP, {a.rounds} rounds x {a.seconds} s,"
              " median of rounds; latency of one call in ms")
        print(f"{'sync_commit':<12}{'keys':<8}{'design':<7}{'calls/s':>10}{'p50':>8}{'p99':>8}"
              f"{'x tps':>8}{'p50/hand':>10}")
        for (sync, mode, design), rs in results.items():
            tps = statistics.median(r[0] for r in rs)
            p50 = statistics.median(r[1] for r in rs)
            p99 = statistics.median(r[2] for r in rs)
            base = results[(sync, mode, "hand")]
            btps = statistics.median(r[0] for r in base)
            bp50 = statistics.median(r[1] for r in base)
            print(f"{sync:<12}{mode:<8}{design:<7}{tps:>10.0f}{p50:>8.3f}{p99:>8.3f}"
                  f"{tps / btps:>8.2f}{p50 / bp50:>10.2f}")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
