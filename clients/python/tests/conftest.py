"""Fixtures: the cluster, PgBouncer and proxy of clusters.py, per test
session, and connections to them."""

import os
import sys

import psycopg
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from clusters import Cluster, Bouncer  # noqa: E402
import nesting  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def plain_cluster():
    """A cluster without idem in shared_preload_libraries, made on demand."""
    c = Cluster(preload=False)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def bouncer(cluster):
    b = Bouncer(cluster)
    yield b
    b.stop()


@pytest.fixture(params=["direct", "pgbouncer"])
def route(request, cluster):
    """Every helper test runs twice: straight to the server and through
    PgBouncer in transaction mode.  (dsn, connect keywords): psycopg's
    default prepares, except through a PgBouncer older than 1.21, which
    needs unnamed statements only."""
    if request.param == "direct":
        return cluster.dsn(), {}
    b = request.getfixturevalue("bouncer")
    return b.dsn(), ({} if b.prepares else {"prepare_threshold": None})


@pytest.fixture
def dsn(route):
    return route[0]


@pytest.fixture
def connect(route):
    opened = []
    dsn, kw = route

    def _connect():
        c = psycopg.connect(dsn, **kw)
        opened.append(c)
        return c
    yield _connect
    for c in opened:
        c.close()


@pytest.fixture
def admin(cluster):
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        yield c


@pytest.fixture
def table(admin, request):
    """A fresh business table per test."""
    name = "refunds_" + request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    admin.execute(f"DROP TABLE IF EXISTS {name}")
    admin.execute(f"CREATE TABLE {name} (id serial PRIMARY KEY, return_id text UNIQUE,"
                  " amount numeric NOT NULL)")
    return name


@pytest.fixture(scope="session")
def undecodable_depth():
    depth = nesting.undecodable_depth()
    if depth is None:
        pytest.skip("this Python decodes JSON nested 200,000 deep")
    return depth


def database(cluster, name, encoding):
    """A database of the cluster in encoding, with idem: its dsn."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as c:
        if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            c.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C'"
                      " LC_CTYPE 'C' TEMPLATE template0")
    dsn = cluster.dsn().replace("dbname=idemtest", f"dbname={name}")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS idem")
    return dsn


@pytest.fixture(scope="session")
def latin1_db(cluster):
    return database(cluster, "idemlatin1", "LATIN1")


@pytest.fixture(scope="session")
def sql_ascii_db(cluster):
    """A SQL_ASCII database (what initdb makes without LANG), with a table
    and a topic, notes."""
    dsn = database(cluster, "idemascii", "SQL_ASCII")
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE IF NOT EXISTS notes (run_id text PRIMARY KEY, note text)")
        c.execute("SELECT idem_outbox_create_topic('notes') WHERE NOT EXISTS"
                  " (SELECT FROM idem.outbox_topics WHERE topic = 'notes')")
    return dsn
