"""The helper as a package: pip-installable from its directory with no
package index, errors that are psycopg's, JSON that keeps numerics exact."""

import datetime
import json
import os
import subprocess
import sys
from decimal import Decimal

import psycopg
import pytest

import idem_client as idem

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_offline(tmp_path):
    """A venv (seeing Debian's psycopg), `pip install --no-index` of the
    directory: the modules land in the venv and import from anywhere."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run(pip + ["install", "--no-index", "--no-cache-dir", "-q", HERE], check=True,
                   cwd=tmp_path)
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import idem_client, idem_workflow; print(idem_client.__file__);"
                          " print(idem_client.Workflow is idem_workflow.Workflow)"],
                         check=True, capture_output=True, text=True, cwd="/").stdout.split()
    assert out[0].startswith(str(venv)) and out[1] == "True"
    meta = subprocess.run(pip + ["show", "idem-client"], check=True, capture_output=True,
                          text=True).stdout
    assert "Requires: psycopg" in meta
    # the tree is left as it was (no build/ or *.egg-info)
    assert not [n for n in os.listdir(HERE) if n == "build" or n.endswith(".egg-info")]


def test_errors_are_psycopg_errors():
    for cls in (idem.KeyReused, idem.InProgress, idem.NestedKey, idem.RunNotFound,
                idem.StepUndeclared, idem.RunNotRunning, idem.OutOfSequence,
                idem.EventNotFound, idem.LeaseLost, idem.CachedError):
        assert issubclass(cls, psycopg.Error) and issubclass(cls, idem.IdemError)
    # made in the client (no server report): the diag holds what was given
    e = idem.LeaseLost("lease lost", detail="Taken over.", hint="Stop.")
    assert (e.sqlstate, e.diag.sqlstate, e.diag.message_primary, e.diag.message_detail,
            e.diag.message_hint) == ("ID412", "ID412", "lease lost", "Taken over.", "Stop.")
    c = idem.CachedError({"sqlstate": "23505", "message": "duplicate key", "detail": "d"}, True)
    assert c.sqlstate == c.diag.sqlstate == "23505" and c.detail == "d" and c.replayed


def test_json_round_trips_decimals():
    value = {"amount": Decimal("25.00"), "big": Decimal("12345678901234567890.000000001"),
             "exp": Decimal("1E+3"), "n": 7, "f": 1.5, "s": "25.00", "none": None,
             "list": [Decimal("-0.10"), True, {"nested": Decimal("0.0")}]}
    with pytest.raises(TypeError, match="Decimal is not JSON serializable"):
        json.dumps(value)
    text = idem.dumps(value)
    assert '"amount": 25.00' in text and '"s": "25.00"' in text and "1E+3" in text
    back = idem.loads(text)
    assert back == value
    assert str(back["amount"]) == "25.00" and str(back["list"][2]["nested"]) == "0.0"
    assert json.loads(text)["amount"] == 25.0     # plain JSON for any reader
    with pytest.raises(ValueError):
        idem.dumps(Decimal("NaN"))


def test_json_keys_as_json_dumps_writes_them():
    """A dict key that is no str is written as json.dumps writes it (True
    as "true", None as "null"), a Decimal as its number; one json.dumps
    refuses is refused (a tuple was written as "(1, 2)", True as "True",
    NaN as "nan": other keys read back, silently)."""
    keys = {True: 1, None: 2, 7: 3, 1.5: 4, "s": 5}
    assert idem.dumps(keys) == json.dumps(keys)
    assert idem.dumps({Decimal("2.50"): 1}) == '{"2.50": 1}'
    for bad in ({(1, 2): 1}, {datetime.date(2020, 1, 1): 1}, {Decimal("NaN"): 1}):
        with pytest.raises(TypeError, match="keys must be str"):
            idem.dumps(bad)
    with pytest.raises(ValueError):
        idem.dumps({float("nan"): 1})


def test_payload_round_trip_through_the_server(connect, admin):
    """A Decimal read from a response goes back as the same JSON number:
    the payload of an outbox event, re-sent as a jsonb argument, is equal
    (the consumer example's json.dumps(payload) is idem.dumps)."""
    conn = connect()
    with conn.transaction():
        r = idem.execute(conn, "pkg:json:1", "SELECT $1::numeric AS amount, $2::jsonb AS doc",
                         "25.00", {"price": Decimal("19.90"), "qty": 3})
    row = r.rows[0]
    assert row["amount"] == Decimal("25.00") and str(row["doc"]["price"]) == "19.90"
    with conn.transaction():
        echoed = idem.execute(conn, "pkg:json:2", "SELECT $1::jsonb AS doc", row).rows[0]["doc"]
    assert echoed == row and str(echoed["amount"]) == "25.00"
