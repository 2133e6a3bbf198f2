"""The drivers table's psycopg2 row (Debian's python3-psycopg2): the plain
driver call without casts, directly and through PgBouncer (dsn fixture),
and what psycopg2 puts on the wire."""

from decimal import Decimal

import psycopg2
import pytest

import idem_client as idem


def ins(table):
    return f"INSERT INTO {table} (return_id, amount) VALUES ($1, $2) RETURNING id, return_id, amount"


@pytest.fixture
def pg2(dsn):
    c = psycopg2.connect(dsn)
    yield c
    c.close()


def test_psycopg2_untyped_call_works_and_is_the_helpers_request(pg2, connect, table, admin):
    key = f"{table}:pg2"
    with pg2, pg2.cursor() as cur:
        cur.execute("SELECT idem_execute(%s, %s, %s, %s)::text", (key, ins(table), "inv-1", "25.00"))
        response = cur.fetchone()[0]
        # psycopg2 sends no parameters: it quotes them into the statement on
        # the client, so idem gets unknown-typed literals, the untyped overload
        assert cur.query.decode().endswith(", 'inv-1', '25.00')::text")
    assert '"amount": 25.00' in response
    # the same request as the helper's (psycopg 3, strings): a replay
    conn = connect()
    with conn.transaction():
        r = idem.execute(conn, key, ins(table), "inv-1", Decimal("25.00"))
    assert r.replayed is True and r.rows[0]["amount"] == Decimal("25.00")
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 1


def test_psycopg2_numbers_are_typed_literals(pg2, table, admin):
    key = f"{table}:pg2"
    with pg2, pg2.cursor() as cur:
        cur.execute("SELECT idem_execute(%s, %s, %s, %s)::text", (key, ins(table), "inv-1", "25.00"))
        # a Decimal is quoted as a bare literal, typed numeric: the typed
        # call, still the same request (25.00 = 25.00, same scale)
        cur.execute("SELECT idem_execute(%s, %s, %s, %s)::text", (key, ins(table), "inv-1",
                                                                  Decimal("25.00")))
        assert cur.query.decode().endswith(", 'inv-1', 25.00)::text")
    # an int is integer 25: another request than 25.00, refused
    with pytest.raises(psycopg2.DatabaseError) as e:
        with pg2, pg2.cursor() as cur:
            cur.execute("SELECT idem_execute(%s, %s, %s, %s)::text", (key, ins(table), "inv-1", 25))
    assert e.value.pgcode == "ID422"
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 1
