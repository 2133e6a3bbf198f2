"""A throwaway PostgreSQL cluster (Unix socket and loopback TCP) with idem
installed and preloaded, a PgBouncer in transaction mode in front of it,
and a TCP proxy that can lose the acknowledgement of a COMMIT: for the
tests (conftest.py) and the returns agent demo, which needs no pytest.  Run
as the cluster user (initdb refuses root); PG_CONFIG names the
installation."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PG_CONFIG = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
BINDIR = subprocess.check_output([PG_CONFIG, "--bindir"], text=True).strip()
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
DBNAME = "idemtest"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(dsn, timeout=30):
    deadline = time.time() + timeout
    while True:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


class Cluster:
    """preload: idem in shared_preload_libraries (the shared-memory wakeup of a claim with a wait)."""

    def __init__(self, preload=True):
        self.dir = tempfile.mkdtemp(prefix="idem-pytest.")
        self.port = free_port()
        data = os.path.join(self.dir, "data")
        # the encoding and locale stated: without LANG initdb makes SQL_ASCII
        subprocess.run([os.path.join(BINDIR, "initdb"), "-D", data, "-A", "trust",
                        "-U", "postgres", "--encoding=UTF8", "--no-locale"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(data, "postgresql.conf"), "a") as f:
            f.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                    f"unix_socket_directories = '{self.dir}'\n"
                    "max_connections = 40\n"
                    # the tests watch events' states after their ack, and
                    # consumers woken by their producers' NOTIFY
                    "idem.outbox_keep_delivered = on\n"
                    "idem.outbox_notify = on\n")
            if preload:
                f.write("shared_preload_libraries = 'idem'\n")
        self.data = data
        subprocess.run([os.path.join(BINDIR, "pg_ctl"), "-D", data, "-w", "-l",
                        os.path.join(self.dir, "log"), "start"], check=True,
                       stdout=subprocess.DEVNULL)
        admin = f"host={self.dir} port={self.port} user=postgres dbname=postgres"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DBNAME}")
        with psycopg.connect(self.dsn(), autocommit=True) as c:
            c.execute("CREATE EXTENSION idem")
            # publishing needs a registered topic (see the README's Outbox)
            c.execute("SELECT idem_outbox_create_topic('refunds')")

    def dsn(self):
        return f"host={self.dir} port={self.port} user=postgres dbname={DBNAME}"

    def tcp_dsn(self):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={DBNAME} sslmode=disable"

    def stop(self):
        subprocess.run([os.path.join(BINDIR, "pg_ctl"), "-D", self.data, "-m",
                        "immediate", "stop"], stdout=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)


class Bouncer:
    """PgBouncer in transaction pool mode on loopback.  Database idemtest
    has a pool of 4 server connections, idemone a pool of one, so that two
    clients of idemone share one server session (what a leak needs).
    From PgBouncer 1.21 on (Debian 13 has 1.24) transaction mode keeps
    protocol-level prepared statements (max_prepared_statements), so the
    tests use the drivers' default prepares through it; before that
    (Debian 12's 1.18) only unnamed statements work: `prepares` says which."""

    def __init__(self, cluster):
        out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"PgBouncer (\d+)\.(\d+)", out)
        self.version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        self.prepares = self.version >= (1, 21)
        self.dir = tempfile.mkdtemp(prefix="idem-pgbouncer.")
        self.port = free_port()
        users = os.path.join(self.dir, "users.txt")
        with open(users, "w") as f:
            f.write('"postgres" ""\n')
        ini = os.path.join(self.dir, "pgbouncer.ini")
        server = f"host={cluster.dir} port={cluster.port} dbname={DBNAME}"
        with open(ini, "w") as f:
            f.write(f"""[databases]
{DBNAME} = {server} pool_size=4
idemone = {server} pool_size=1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
{"max_prepared_statements = 200" if self.prepares else ""}
max_client_conn = 100
logfile = {self.dir}/pgbouncer.log
pidfile =
""")
        self.proc = subprocess.Popen([PGBOUNCER, ini], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for(self.dsn())

    def dsn(self, db=DBNAME):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={db} sslmode=disable"

    def stop(self):
        # SIGTERM: from 1.23 on PgBouncer waits for its clients to leave
        # first, so a client the test left open is cut off after a while
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class AckLosingProxy:
    """A loopback TCP proxy to the server.  Armed, it forwards the server's
    reply up to a COMMIT's CommandComplete and then closes the client's
    connection instead: the transaction committed, the client never hears."""

    COMMIT = b"C\x00\x00\x00\x0bCOMMIT\x00"

    def __init__(self, port):
        self.target = port
        self.armed = False
        self.lost = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def dsn(self):
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={DBNAME} sslmode=disable"

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, src, dst, from_server):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if from_server and self.armed and self.COMMIT in data:
                    self.armed = False
                    self.lost += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def stop(self):
        self.sock.close()
