"""A consumer process for test_consume.py: idem_client.consume() with a
handler that "delivers" each event by appending its key and attempt to a
file (the receiver's log), so the tests can see what ran before a signal.

  outbox_consumer.py DSN TOPIC LOG [--lease S] [--max-events N]
                     [--handler-seconds S] [--kill-after N] [--wakeup notify|wait]

--handler-seconds: each delivery takes that long (a SIGTERM can land in it).
--kill-after N: SIGKILL itself right after the N-th delivery, before its ack.
Prints the number of acknowledged events when the loop ends."""

import argparse
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import psycopg  # noqa: E402
import idem_client as idem  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("dsn")
ap.add_argument("topic")
ap.add_argument("log")
ap.add_argument("--lease", type=float, default=2)
ap.add_argument("--max-events", type=int, default=10)
ap.add_argument("--handler-seconds", type=float, default=0)
ap.add_argument("--kill-after", type=int, default=0)
ap.add_argument("--wakeup", default="notify")
a = ap.parse_args()

delivered = 0


def handler(event):
    global delivered
    with open(a.log, "a") as f:
        f.write(f"{event['key']} {event['attempt']}\n")
    delivered += 1
    time.sleep(a.handler_seconds)
    if delivered == a.kill_after:
        os.kill(os.getpid(), signal.SIGKILL)


print(idem.consume(lambda: psycopg.connect(a.dsn), a.topic, handler, lease=a.lease,
                   max_events=a.max_events, idle=60, wakeup=a.wakeup), flush=True)
