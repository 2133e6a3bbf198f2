"""Fixtures: the cluster, PgBouncer and proxy of clusters.py, per test
session, and connections to them."""

import os
import sys

import psycopg
import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from clusters import Cluster, Bouncer  # noqa: E402


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
def dsn(request, cluster):
    """Every helper test runs twice: straight to the server and through
    PgBouncer in transaction mode."""
    if request.param == "direct":
        return cluster.dsn()
    return request.getfixturevalue("bouncer").dsn()


@pytest.fixture
def connect(dsn):
    opened = []

    def _connect():
        # unnamed statements only: what PgBouncer 1.18 in transaction mode needs
        c = psycopg.connect(dsn, prepare_threshold=None)
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
