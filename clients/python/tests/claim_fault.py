"""idem_run_claim and idem_outbox_claim shadowed by search_path
(claim_fault.sql, which the Node tests share): a worker's or a consumer's
claims raise a server's error of a chosen SQLSTATE."""

import os

with open(os.path.join(os.path.dirname(__file__), "claim_fault.sql")) as _f:
    CLAIM_FAULT = _f.read()


def claim_faults(admin, worker, sqlstate, times):
    """The claims of worker raise sqlstate `times` times; returns the
    number of its claims so far (a function) and the connect keywords that
    put claimfault first."""
    admin.execute(CLAIM_FAULT)
    seq = f"claimfault.calls_{worker.replace('-', '_')}"
    admin.execute(f"DROP SEQUENCE IF EXISTS {seq}; CREATE SEQUENCE {seq}")
    admin.execute("INSERT INTO claimfault.plan VALUES (%s, %s, %s, %s) ON CONFLICT (worker) DO UPDATE"
                  " SET sqlstate = excluded.sqlstate, times = excluded.times, calls = excluded.calls",
                  (worker, sqlstate, times, seq))
    calls = lambda: admin.execute(f"SELECT last_value, is_called FROM {seq}").fetchone()  # noqa: E731
    return (lambda: calls()[0] if calls()[1] else 0), {"options": "-c search_path=claimfault,public"}
