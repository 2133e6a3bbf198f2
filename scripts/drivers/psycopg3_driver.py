# psycopg 3: str is sent untyped, Decimal as numeric (a mixed call)
import os, sys
from decimal import Decimal
import psycopg

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex(%s, %s, %s, %s)"
bouncer = os.environ.get("VIA_BOUNCER") == "1"
conn = psycopg.connect("", autocommit=True,
                       prepare_threshold=None if bouncer else 5)
mode, keys = sys.argv[1], sys.argv[2:]
for key in keys:
    replayed, response = conn.execute(CALL, (key, SQL, key, Decimal("25.00"))).fetchone()
    print(f"result\t{key}\t{str(replayed).lower()}\t{response}")
    if mode == "retry":
        try:
            conn.execute(CALL, (key, SQL, key, Decimal("26.00")))
            print(f"mismatch\t{key}\tnone")
        except psycopg.Error as e:
            print(f"mismatch\t{key}\t{e.sqlstate}")
