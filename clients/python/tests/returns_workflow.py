"""The 4-step returns workflow the workflow tests, the worker processes of
the kill test and the benchmark share: check (restock, a database step),
label (an external call to a carrier that deduplicates by Idempotency-Key),
refund (a database step publishing to the outbox), notify (a step that
writes nothing and records its return value).  ``make(carrier_url)``
builds it (``asynchronous=True``: the same steps as ``async def``, for
AsyncWorker); ``SCHEMA`` is its tables."""

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from idem_client import RetryAfter, Workflow  # noqa: E402

STEPS = ["check", "label", "refund", "notify"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS wf_stock (sku text PRIMARY KEY, on_hand int NOT NULL);
CREATE TABLE IF NOT EXISTS wf_refunds (id serial PRIMARY KEY, run_id text NOT NULL,
    amount numeric NOT NULL, label_id text NOT NULL);
"""


def post(url, key, body):
    """POST JSON with an Idempotency-Key; a 429/503 is RetryAfter."""
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Idempotency-Key": key,
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        if e.code in (429, 503):
            raise RetryAfter(e.headers.get("Retry-After"), f"carrier {e.code}")
        raise


def make(carrier_url, queue="returns", topic="refunds", max_attempts=None, asynchronous=False):
    if asynchronous:
        return _make_async(carrier_url, queue, topic, max_attempts)
    wf = Workflow(queue, steps=STEPS, max_attempts=max_attempts)

    @wf.step("check")
    def check(ctx):
        return ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1"
                           " RETURNING on_hand", ctx.input["sku"])

    @wf.external("label", max_attempts=8)
    def label(ctx):
        return post(carrier_url, ctx.key, {"run": ctx.run_id, "attempt": ctx.attempt})

    @wf.step("refund", outbox_topic=topic)
    def refund(ctx):
        return ctx.execute("INSERT INTO wf_refunds (run_id, amount, label_id) VALUES ($1, $2, $3)"
                           " RETURNING id, amount, label_id",
                           ctx.run_id, ctx.input["amount"], ctx.results["label"]["label_id"])

    @wf.step("notify")
    def notify(ctx):
        refund = ctx.results["refund"]["rows"][0]
        return {"to": ctx.input["customer"], "amount": refund["amount"]}

    return wf


def _make_async(carrier_url, queue, topic, max_attempts):
    wf = Workflow(queue, steps=STEPS, max_attempts=max_attempts)

    @wf.step("check")
    async def check(ctx):
        return await ctx.execute("UPDATE wf_stock SET on_hand = on_hand + 1 WHERE sku = $1"
                                 " RETURNING on_hand", ctx.input["sku"])

    @wf.external("label", max_attempts=8)
    async def label(ctx):
        return await asyncio.to_thread(post, carrier_url, ctx.key,
                                       {"run": ctx.run_id, "attempt": ctx.attempt})

    @wf.step("refund", outbox_topic=topic)
    async def refund(ctx):
        return await ctx.execute("INSERT INTO wf_refunds (run_id, amount, label_id)"
                                 " VALUES ($1, $2, $3) RETURNING id, amount, label_id",
                                 ctx.run_id, ctx.input["amount"],
                                 ctx.results["label"]["label_id"])

    @wf.step("notify")
    def notify(ctx):
        # a plain function in an AsyncWorker: its return value is the result
        refund = ctx.results["refund"]["rows"][0]
        return {"to": ctx.input["customer"], "amount": refund["amount"]}

    return wf
