# SQLAlchemy (Core, text() with bound parameters) over psycopg2; for
# idem_call a list, a timedelta and a bool, as psycopg2 sends them
import os, sys
from datetime import timedelta
from decimal import Decimal
import sqlalchemy as sa

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = sa.text("SELECT replayed, response::text FROM idem_execute_ex(:key, :sql, :ref, :amount)")
IDEM_CALL = sa.text("SELECT replayed, response::text FROM idem_call(:key, :sql, :args,"
                    " outbox_topic => :topic, ttl => :ttl, wait => :wait)")
e = os.environ
engine = sa.create_engine(f"postgresql+psycopg2://{e['PGUSER']}@{e['PGHOST']}:{e['PGPORT']}/{e['PGDATABASE']}",
                          isolation_level="AUTOCOMMIT")
mode, keys = sys.argv[1], sys.argv[2:]

def idem_call(conn, key, wait):
    return conn.execute(IDEM_CALL, dict(key=key, sql=SQL, args=[key, "25.00"], topic="matrix",
                                        ttl=timedelta(days=2, hours=3), wait=wait)).one()

with engine.connect() as conn:
    for key in keys:
        if mode == "call":
            for _ in range(2):
                replayed, response = idem_call(conn, key, True)
                print(f"call\t{key}\t{str(replayed).lower()}\t{response}")
            continue
        if mode == "busy":
            try:
                idem_call(conn, key, False)
                print(f"busy\t{key}\tnone")
            except sa.exc.DBAPIError as err:
                print(f"busy\t{key}\t{err.orig.pgcode}")
            continue
        replayed, response = conn.execute(CALL, dict(key=key, sql=SQL, ref=key, amount=Decimal("25.00"))).one()
        print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
        if mode == "retry":
            try:
                conn.execute(CALL, dict(key=key, sql=SQL, ref=key, amount=Decimal("26.00")))
                print(f"mismatch\t{key}\tnone")
            except sa.exc.DBAPIError as err:
                print(f"mismatch\t{key}\t{err.orig.pgcode}")
