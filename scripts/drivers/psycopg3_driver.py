# psycopg 3: str is sent untyped, Decimal as numeric (a mixed call); for
# idem_call a list of str, a timedelta (interval) and a bool
import os, sys
from datetime import timedelta
from decimal import Decimal
import psycopg

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex(%s, %s, %s, %s)"
IDEM_CALL = ("SELECT replayed, response::text FROM idem_call(%s, %s, %s,"
             " outbox_topic => %s, ttl => %s, wait => %s)")
bouncer = os.environ.get("VIA_BOUNCER") == "1"
conn = psycopg.connect("", autocommit=True,
                       prepare_threshold=None if bouncer else 5)

def idem_call(key, wait):
    return conn.execute(IDEM_CALL, (key, SQL, [key, "25.00"], "matrix",
                                    timedelta(days=2, hours=3), wait)).fetchone()

mode, keys = sys.argv[1], sys.argv[2:]
for key in keys:
    if mode == "call":
        for _ in range(2):
            replayed, response = idem_call(key, True)
            print(f"call\t{key}\t{str(replayed).lower()}\t{response}")
        continue
    if mode == "busy":
        try:
            idem_call(key, False)
            print(f"busy\t{key}\tnone")
        except psycopg.Error as e:
            print(f"busy\t{key}\t{e.sqlstate}")
        continue
    replayed, response = conn.execute(CALL, (key, SQL, key, Decimal("25.00"))).fetchone()
    print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
    if mode == "retry":
        try:
            conn.execute(CALL, (key, SQL, key, Decimal("26.00")))
            print(f"mismatch\t{key}\tnone")
        except psycopg.Error as e:
            print(f"mismatch\t{key}\t{e.sqlstate}")
