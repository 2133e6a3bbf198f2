# The returns workflow on asyncio: AsyncWorker, async steps (clients/README.md
# shows this file; tests/test_examples.py and test/doc/run.py run it).
# Connects through the PG* environment variables; needs a queue 'returns'
# and the tables inventory and refunds.
import asyncio
from decimal import Decimal

import psycopg
from idem_client import AsyncWorker, RetryAfter, Workflow

connect = psycopg.AsyncConnection.connect    # PGHOST, PGDATABASE...
labels, busy = {}, [True]                     # a carrier that deduplicates by key


async def create_label(idempotency_key):
    await asyncio.sleep(0.01)                 # the carrier's round trip
    if busy and busy.pop():
        return None                           # its first answer: 503, Retry-After: 1
    return labels.setdefault(idempotency_key, {"label_id": f"LB-{len(labels) + 1}"})


returns = Workflow("returns", steps=["check", "label", "refund", "notify"])


@returns.step("check")
async def check(ctx):
    return await ctx.execute("UPDATE inventory SET qty = qty + 1 WHERE sku = $1 RETURNING qty",
                             ctx.input["sku"])


@returns.external("label", max_attempts=8)
async def label(ctx):
    r = await create_label(idempotency_key=ctx.key)
    if r is None:
        raise RetryAfter("1")                 # the run comes back in 1 s, never sooner
    return r


@returns.step("refund", outbox_topic="refunds")
async def refund(ctx):
    return await ctx.execute("INSERT INTO refunds (return_id, amount, label_id)"
                             " VALUES ($1, $2, $3) RETURNING amount", ctx.input["return_id"],
                             ctx.input["amount"], ctx.results["label"]["label_id"])


@returns.step("notify")
async def notify(ctx):                        # writes nothing: its return value is recorded
    return {"to": ctx.input["customer"], "refund": ctx.results["refund"]["rows"][0]["amount"]}


async def main():
    async with await connect(autocommit=True) as conn:
        await returns.astart(conn, "returns:acme:ret-4471",
                             input={"return_id": "ret-4471", "sku": "sku-1",
                                    "amount": Decimal("25.00"), "customer": "cust-17"})
        stop = asyncio.Event()                # or no stop: SIGTERM/SIGINT drain the worker
        worker = asyncio.create_task(AsyncWorker(connect, [returns], concurrency=4,
                                                 stop=stop).run())
        status = "SELECT status FROM idem_runs WHERE run_id = 'returns:acme:ret-4471'"
        while (await (await conn.execute(status)).fetchone())[0] != "completed":
            await asyncio.sleep(0.1)
        stop.set()
        await worker
        cur = await conn.execute("SELECT step, state FROM idem_run_steps('returns:acme:ret-4471')")
        for step, state in await cur.fetchall():
            print(step, state)
        cur = await conn.execute("SELECT qty, (SELECT amount FROM refunds) FROM inventory"
                                 " WHERE sku = 'sku-1'")
        print(*await cur.fetchone())


asyncio.run(main())
