"""A fake carrier on loopback for the workflow tests and the demo: one label
per Idempotency-Key (a repeat gets the same label), every request logged as
(key, outcome); ``busy`` answers that share of first requests with 503 and
Retry-After; ``delay`` seconds per request."""

import http.server
import json
import random
import threading
import time


class Carrier(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, busy=0.0, delay=0.0, seed=0, retry_after="1"):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.busy, self.delay, self.retry_after = busy, delay, retry_after
        self.rnd = random.Random(seed)
        self.labels = {}     # key -> label
        self.log = []        # (key, outcome)
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/labels"

    def created(self):
        return sum(1 for _, o in self.log if o == "created")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        srv = self.server
        key = self.headers.get("Idempotency-Key")
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if srv.delay:
            time.sleep(srv.delay)
        with srv.lock:
            if key in srv.labels:
                outcome, status, body = "replayed", 200, srv.labels[key]
            elif srv.rnd.random() < srv.busy:
                outcome, status, body = "503", 503, {"error": "busy"}
            else:
                body = srv.labels[key] = {"label_id": f"LBL-{len(srv.labels) + 1:05d}"}
                outcome, status = "created", 201
            srv.log.append((key, outcome))
        try:
            self.send_response(status)
            if status == 503:
                self.send_header("Retry-After", srv.retry_after)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())
        except (BrokenPipeError, ConnectionResetError):
            pass        # the caller was killed; its retry gets the same label

    def log_message(self, *a):
        pass
