"""The workflow examples of clients/README.md are examples/returns.py and
examples/returns_async.py: the README shows each file as it is (checked
here), and each runs as written."""

import os
import re
import subprocess
import sys

import psycopg

from clusters import DBNAME

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.join(HERE, "..", "..")


def readme_block(lang, source):
    """The fenced block of clients/README.md that follows the line naming source."""
    with open(os.path.join(TOP, "README.md")) as f:
        text = f.read()
    m = re.search(re.escape(f"From `{source}`") + r".*?\n```" + lang + r"\n(.*?)```", text, re.S)
    assert m, f"clients/README.md shows no {lang} block for {source}"
    return m.group(1)


def test_readme_shows_the_python_example():
    with open(os.path.join(TOP, "python", "examples", "returns.py")) as f:
        assert readme_block("python", "python/examples/returns.py") == f.read()


def test_the_python_example_runs(cluster, admin):
    # the setup the README shows before the example (the test cluster has the topic)
    with open(os.path.join(TOP, "README.md")) as f:
        setup = re.search(r"From `python/examples/returns\.py` needs.*?\n```sql\n(.*?)```",
                          f.read(), re.S).group(1)
    admin.execute(setup.replace("SELECT idem_outbox_create_topic('refunds');", ""))
    env = dict(os.environ, PGHOST=cluster.dir, PGPORT=str(cluster.port), PGUSER="postgres",
               PGDATABASE="idemtest", PYTHONPATH=os.path.join(TOP, "python"))
    out = subprocess.run([sys.executable, os.path.join(TOP, "python", "examples", "returns.py")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "check completed", "label completed", "refund completed", "notify completed",
        "step_failed completed",      # the first claim ended at the 503, the second completed
        "4 [(Decimal('25.00'), 'LB-1')]"]
    notify = admin.execute("SELECT response FROM idem_run_steps('returns:acme:ret-4471')"
                           " WHERE step = 'notify'").fetchone()[0]
    assert notify == {"to": "cust-17", "refund": 25.0}
    assert admin.execute("SELECT count(*) FROM idem.outbox WHERE topic = 'refunds'"
                         " AND run_id = 'returns:acme:ret-4471'").fetchone()[0] == 1


def test_readme_shows_the_asyncio_example():
    with open(os.path.join(TOP, "python", "examples", "returns_async.py")) as f:
        assert readme_block("python", "python/examples/returns_async.py") == f.read()


def test_the_asyncio_example_runs(cluster, admin):
    """In a database of its own, with the setup the README shows."""
    admin.execute("DROP DATABASE IF EXISTS idem_async_example")
    admin.execute("CREATE DATABASE idem_async_example")
    with open(os.path.join(TOP, "README.md")) as f:
        setup = re.search(r"### Python with asyncio.*?\n```sql\n(.*?)```", f.read(), re.S).group(1)
    with psycopg.connect(cluster.dsn().replace(f"dbname={DBNAME}", "dbname=idem_async_example"),
                         autocommit=True) as c:
        c.execute("CREATE EXTENSION idem")
        c.execute(setup)
    env = dict(os.environ, PGHOST=cluster.dir, PGPORT=str(cluster.port), PGUSER="postgres",
               PGDATABASE="idem_async_example", PYTHONPATH=os.path.join(TOP, "python"))
    out = subprocess.run([sys.executable,
                          os.path.join(TOP, "python", "examples", "returns_async.py")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "check completed", "label completed", "refund completed", "notify completed",
        "4 25.00"]
    with psycopg.connect(cluster.dsn().replace(f"dbname={DBNAME}", "dbname=idem_async_example"),
                         autocommit=True) as c:
        assert [r[0] for r in c.execute(
            "SELECT outcome FROM idem_run_attempts WHERE run_id = 'returns:acme:ret-4471'"
            " ORDER BY claim")] == ["step_failed", "completed"]
        assert c.execute("SELECT count(*) FROM idem.outbox WHERE topic = 'refunds'").fetchone()[0] == 1
