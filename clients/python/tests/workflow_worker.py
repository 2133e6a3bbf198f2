"""A worker process for the tests: the returns workflow of
returns_workflow.py on one queue, logging "ready WORKER" once SIGTERM is
handled and each claim ("claim RUN WORKER") to --log before it works on
it; exits 0 after SIGTERM.  --asyncio: an AsyncWorker and the workflow's
async steps."""

import argparse
import asyncio
import faulthandler
import functools
import os
import signal
import sys
import threading

# SIGTERM during the imports below is a stop too (the Worker takes the event)
stop = threading.Event()
def _term(*_):
    stop.set()
    # a drain that hangs shows where, in the test's output
    faulthandler.dump_traceback_later(15)


signal.signal(signal.SIGTERM, _term)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import psycopg  # noqa: E402

import idem_client as idem  # noqa: E402
import idem_workflow  # noqa: E402
import returns_workflow  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    for a in ("--dsn", "--carrier", "--queue", "--name", "--log"):
        ap.add_argument(a, required=True)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--lease", type=float, default=1.0)
    ap.add_argument("--no-prepare", action="store_true")
    ap.add_argument("--asyncio", action="store_true")
    a = ap.parse_args()
    kw = {"prepare_threshold": None} if a.no_prepare else {}
    wf = returns_workflow.make(a.carrier, queue=a.queue, asynchronous=a.asyncio)
    log = open(a.log, "a", buffering=1)
    if a.asyncio:
        return asyncio.run(run_async(a, kw, wf, log))
    worker = idem.Worker(functools.partial(psycopg.connect, a.dsn, **kw), [wf],
                         concurrency=a.concurrency, lease=a.lease, poll=0.2, name=a.name,
                         stop=stop)
    logged(worker, a.name, log)
    worker.run()
    return 0


def logged(worker, name, log):
    """Log each claim before the worker works on it."""
    hand_over = worker._hand_over

    def _logged(c):
        log.write(f"claim {c.run_id} {name}\n")
        hand_over(c)
    worker._hand_over = _logged
    log.write(f"ready {name}\n")


async def run_async(a, kw, wf, log):
    astop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # the SIGTERM handler above sets the threading event; watch it here
    loop.add_signal_handler(signal.SIGTERM, lambda: (stop.set(), astop.set(), _term()))
    if stop.is_set():
        astop.set()
    worker = idem.AsyncWorker(functools.partial(psycopg.AsyncConnection.connect, a.dsn, **kw),
                              [wf], concurrency=a.concurrency, lease=a.lease, poll=0.2,
                              name=a.name, stop=astop)
    logged(worker, a.name, log)
    await worker.run()
    return 0


if __name__ == "__main__":
    assert idem_workflow
    sys.exit(main())
