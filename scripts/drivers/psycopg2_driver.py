# psycopg2: parameters are quoted into the statement on the client; a str
# is an untyped literal, a Decimal a numeric literal
import os, sys
from decimal import Decimal
import psycopg2

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex(%s, %s, %s, %s)"
conn = psycopg2.connect("")
conn.autocommit = True
cur = conn.cursor()
mode, keys = sys.argv[1], sys.argv[2:]
for key in keys:
    cur.execute(CALL, (key, SQL, key, Decimal("25.00")))
    replayed, response = cur.fetchone()
    print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
    if mode == "retry":
        try:
            cur.execute(CALL, (key, SQL, key, Decimal("26.00")))
            print(f"mismatch\t{key}\tnone")
        except psycopg2.Error as e:
            print(f"mismatch\t{key}\t{e.pgcode}")
