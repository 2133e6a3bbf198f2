# SQLAlchemy (Core, text() with bound parameters) over psycopg2
import os, sys
from decimal import Decimal
import sqlalchemy as sa

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = sa.text("SELECT replayed, response::text FROM idem_execute_ex(:key, :sql, :ref, :amount)")
e = os.environ
engine = sa.create_engine(f"postgresql+psycopg2://{e['PGUSER']}@{e['PGHOST']}:{e['PGPORT']}/{e['PGDATABASE']}",
                          isolation_level="AUTOCOMMIT")
mode, keys = sys.argv[1], sys.argv[2:]
with engine.connect() as conn:
    for key in keys:
        replayed, response = conn.execute(CALL, dict(key=key, sql=SQL, ref=key, amount=Decimal("25.00"))).one()
        print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
        if mode == "retry":
            try:
                conn.execute(CALL, dict(key=key, sql=SQL, ref=key, amount=Decimal("26.00")))
                print(f"mismatch\t{key}\tnone")
            except sa.exc.DBAPIError as err:
                print(f"mismatch\t{key}\t{err.orig.pgcode}")
