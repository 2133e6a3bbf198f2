# asyncpg: it encodes each parameter as the type the server describes, so
# the amount is cast in the statement ($4::numeric) and passed as a Decimal;
# for idem_call a list of str, a timedelta (interval) and a bool
import asyncio, os, sys
from datetime import timedelta
from decimal import Decimal
import asyncpg

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex($1, $2, $3, $4::numeric)"
IDEM_CALL = ("SELECT replayed, response::text FROM idem_call($1, $2, $3,"
             " outbox_topic => $4, ttl => $5, wait => $6)")
bouncer = os.environ.get("VIA_BOUNCER") == "1"

async def call(conn, *args, sql=CALL):
    if not bouncer:
        return await conn.fetchrow(sql, *args)
    # PgBouncer in transaction mode: one transaction keeps one server
    async with conn.transaction():
        return await conn.fetchrow(sql, *args)

async def idem_call(conn, key, wait):
    return await call(conn, key, SQL, [key, "25.00"], "matrix", timedelta(days=2, hours=3), wait,
                      sql=IDEM_CALL)

async def main():
    conn = await asyncpg.connect(host=os.environ["PGHOST"], port=int(os.environ["PGPORT"]),
                                 user=os.environ["PGUSER"], database=os.environ["PGDATABASE"],
                                 statement_cache_size=0 if bouncer else 100)
    mode, keys = sys.argv[1], sys.argv[2:]
    for key in keys:
        if mode == "call":
            for _ in range(2):
                row = await idem_call(conn, key, True)
                print(f"call\t{key}\t{str(row[0]).lower()}\t{row[1]}")
            continue
        if mode == "busy":
            try:
                await idem_call(conn, key, False)
                print(f"busy\t{key}\tnone")
            except asyncpg.PostgresError as e:
                print(f"busy\t{key}\t{e.sqlstate}")
            continue
        row = await call(conn, key, SQL, key, Decimal("25.00"))
        print(f"result\t{key}\t{str(row[0]).lower()}\t{row[1]}")
        if mode == "retry":
            try:
                await call(conn, key, SQL, key, Decimal("26.00"))
                print(f"mismatch\t{key}\tnone")
            except asyncpg.PostgresError as e:
                print(f"mismatch\t{key}\t{e.sqlstate}")
    await conn.close()

asyncio.run(main())
