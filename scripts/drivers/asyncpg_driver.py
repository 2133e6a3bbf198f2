# asyncpg: it encodes each parameter as the type the server describes, so
# the amount is cast in the statement ($4::numeric) and passed as a Decimal
import asyncio, os, sys
from decimal import Decimal
import asyncpg

SQL = "INSERT INTO matrix_pay (ref, amount) VALUES ($1, $2) RETURNING ref, amount"
CALL = "SELECT replayed, response::text FROM idem_execute_ex($1, $2, $3, $4::numeric)"
bouncer = os.environ.get("VIA_BOUNCER") == "1"

async def call(conn, *args):
    if not bouncer:
        return await conn.fetchrow(CALL, *args)
    # PgBouncer in transaction mode: one transaction keeps one server
    async with conn.transaction():
        return await conn.fetchrow(CALL, *args)

async def main():
    conn = await asyncpg.connect(host=os.environ["PGHOST"], port=int(os.environ["PGPORT"]),
                                 user=os.environ["PGUSER"], database=os.environ["PGDATABASE"],
                                 statement_cache_size=0 if bouncer else 100)
    mode, keys = sys.argv[1], sys.argv[2:]
    for key in keys:
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
