# psycopg2: parameters are quoted into the statement on the client; a str
# is an untyped literal, a Decimal a numeric literal; for idem_call a list
# (ARRAY[...]), a timedelta ('...'::interval) and a bool
import os, sys
from datetime import timedelta
from decimal import Decimal
import psycopg2

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex(%s, %s, %s, %s)"
IDEM_CALL = ("SELECT replayed, response::text FROM idem_call(%s, %s, %s,"
             " outbox_topic => %s, ttl => %s, wait => %s)")
conn = psycopg2.connect("")
conn.autocommit = True
cur = conn.cursor()

def idem_call(key, wait):
    cur.execute(IDEM_CALL, (key, SQL, [key, "25.00"], "matrix", timedelta(days=2, hours=3), wait))
    return cur.fetchone()

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
        except psycopg2.Error as e:
            print(f"busy\t{key}\t{e.pgcode}")
        continue
    cur.execute(CALL, (key, SQL, key, Decimal("25.00")))
    replayed, response = cur.fetchone()
    print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
    if mode == "retry":
        try:
            cur.execute(CALL, (key, SQL, key, Decimal("26.00")))
            print(f"mismatch\t{key}\tnone")
        except psycopg2.Error as e:
            print(f"mismatch\t{key}\t{e.pgcode}")
