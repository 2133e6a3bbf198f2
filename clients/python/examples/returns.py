# A returns workflow with idem_client (clients/README.md shows this file;
# tests/test_examples.py and test/doc/run.py run it).  Connects through the
# PG* environment variables; needs a queue 'returns' and the tables
# inventory and refunds.
import threading
from decimal import Decimal

import psycopg
from idem_client import RetryAfter, Worker, Workflow

connect = lambda: psycopg.connect()          # PGHOST, PGDATABASE...
labels, busy = {}, [True]                     # a carrier that deduplicates by key


def create_label(idempotency_key):
    if busy and busy.pop():
        return None                           # its first answer: 503, Retry-After: 1
    return labels.setdefault(idempotency_key, {"label_id": f"LB-{len(labels) + 1}"})


returns = Workflow("returns", steps=["check", "label", "refund", "notify"])


@returns.step("check")
def check(ctx):                               # ctx.input, ctx.results, ctx.attempt, ctx.key
    return ctx.execute("UPDATE inventory SET qty = qty + 1 WHERE sku = $1 RETURNING qty",
                       ctx.input["sku"])


@returns.external("label", max_attempts=8)
def label(ctx):
    r = create_label(idempotency_key=ctx.key)
    if r is None:
        raise RetryAfter("1")                 # the run comes back in 1 s, never sooner
    return r


@returns.step("refund", outbox_topic="refunds")
def refund(ctx):
    return ctx.execute("INSERT INTO refunds (return_id, amount, label_id) VALUES ($1, $2, $3)"
                       " RETURNING amount", ctx.input["return_id"], ctx.input["amount"],
                       ctx.results["label"]["label_id"])


@returns.step("notify")
def notify(ctx):                              # writes nothing: its return value is recorded
    return {"to": ctx.input["customer"], "refund": ctx.results["refund"]["rows"][0]["amount"]}


with connect() as conn:                       # commits on leaving the block
    returns.start(conn, "returns:acme:ret-4471",
                  input={"return_id": "ret-4471", "sku": "sku-1", "amount": Decimal("25.00"),
                         "customer": "cust-17"})

stop = threading.Event()                      # or no stop: SIGTERM/SIGINT drain the worker
worker = threading.Thread(target=Worker(connect, [returns], concurrency=4, lease=30, stop=stop).run)
worker.start()
with connect() as conn:
    while conn.execute("SELECT status FROM idem_runs WHERE run_id = 'returns:acme:ret-4471'"
                       ).fetchone()[0] != "completed":
        conn.commit()
        stop.wait(0.1)
    stop.set()
    worker.join()
    for step, state in conn.execute(
            "SELECT step, state FROM idem_run_steps('returns:acme:ret-4471')"):
        print(step, state)
    print(*(r[0] for r in conn.execute("SELECT outcome FROM idem_run_attempts"
                                       " WHERE run_id = 'returns:acme:ret-4471' ORDER BY claim")))
    print(conn.execute("SELECT qty FROM inventory WHERE sku = 'sku-1'").fetchone()[0],
          conn.execute("SELECT amount, label_id FROM refunds").fetchall())
