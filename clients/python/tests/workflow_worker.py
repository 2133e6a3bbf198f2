"""A worker process for the tests: the returns workflow of
returns_workflow.py on one queue, logging "ready WORKER" once SIGTERM is
handled and each claim ("claim RUN WORKER") to --log before it works on
it; exits 0 after SIGTERM."""

import argparse
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
    a = ap.parse_args()
    kw = {"prepare_threshold": None} if a.no_prepare else {}
    wf = returns_workflow.make(a.carrier, queue=a.queue)
    log = open(a.log, "a", buffering=1)
    worker = idem.Worker(functools.partial(psycopg.connect, a.dsn, **kw), [wf],
                         concurrency=a.concurrency, lease=a.lease, poll=0.2, name=a.name,
                         stop=stop)
    hand_over = worker._hand_over

    def logged(c):
        log.write(f"claim {c.run_id} {a.name}\n")
        hand_over(c)
    worker._hand_over = logged
    log.write(f"ready {a.name}\n")
    worker.run()
    return 0


if __name__ == "__main__":
    assert idem_workflow
    sys.exit(main())
