"""Values nested deeper than the helpers' JSON decoder reads: how deep
that is for this Python, and storing one in PostgreSQL."""

import resource

import psycopg
import pytest

import idem_client


def undecodable_depth():
    """The least nesting, in steps of 500, that the helpers' JSON decoder
    refuses with RecursionError, or None.  It depends on the Python: about
    1000 in 3.11, 10,000 in 3.13, and in 3.14, which measures the C stack,
    more than PostgreSQL stores."""
    for depth in range(500, 200001, 500):
        try:
            idem_client.loads("[" * depth + "]" * depth)
        except RecursionError:
            return depth
    return None


def deepest_stack(conn):
    """Let this transaction parse jsonb as deep as the server's stack
    allows: max_stack_depth up to the stack limit (which the server
    inherited from this process) less PostgreSQL's 512 kB of slack."""
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    kb = 7680 if soft == resource.RLIM_INFINITY else soft // 1024 - 512
    conn.execute("SELECT set_config('max_stack_depth', %s, true)", (f"{kb}kB",))


def nested_or_skip(depth, make):
    """make() stores a jsonb nested depth deep; when the server's stack
    cannot parse that deep, no stored value reaches this Python's decoder
    limit and the case does not arise."""
    try:
        make()
    except psycopg.errors.StatementTooComplex:
        pytest.skip(f"PostgreSQL cannot store jsonb nested {depth} deep, the least this"
                    " Python's decoder refuses")
