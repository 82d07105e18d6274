from __future__ import annotations

import gc
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

import resgroups

SEEDS = Path(__file__).resolve().parent / "seeds"

# A shell without job control starts a background command with SIGINT ignored,
# and Python then leaves it ignored: the tests of Ctrl-C (test_interrupts.py,
# the DDL interrupted in test_catalog_faults.py) need Python's usual handler
# whether the suite runs in a terminal, in CI or as `pytest &` in a script.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_query_left_in_flight() -> Iterator[None]:
    """After every test: no hold in force and no main-thread query counted as in
    flight (resgroups.interrupts), or the program's signal handlers would stay
    wrapped for every test after it. A query lost and reclaimed is settled at the
    next hold; it counts as gone here."""
    yield
    from resgroups import interrupts

    in_flight = interrupts.STATE.queries - len(interrupts._LOST)
    assert (interrupts.STATE.depth, in_flight) == (0, 0), (
        "a hold or a main-thread query was left in force by this test"
    )


@pytest.fixture(autouse=True)
def _no_foreign_gc_callbacks(request: pytest.FixtureRequest) -> Iterator[None]:
    """The every-instruction tests of test_interrupts.py call a raising handler
    before the nth instruction of resgroups or of what it calls. A collection
    that starts inside resgroups runs ``gc.callbacks`` there (hypothesis registers
    one once a stateful test has run), and CPython swallows an exception raised
    in a gc callback, so the test would see the handler's exception lost whenever
    the nth instruction fell in one. Those tests run without foreign callbacks."""
    if request.module.__name__ != "test_interrupts":
        yield
        return
    saved = list(gc.callbacks)
    gc.callbacks.clear()
    try:
        yield
    finally:
        gc.callbacks[:] = saved


@pytest.fixture
def engine() -> Iterator[resgroups.Engine]:
    with resgroups.Engine() as e:
        yield e


@pytest.fixture
def ac_engine() -> Iterator[resgroups.Engine]:
    """An engine with access control on; connect() without a user is the admin."""
    with resgroups.Engine(access_control=True) as e:
        yield e


@pytest.fixture
def admin(ac_engine: resgroups.Engine) -> resgroups.Session:
    return ac_engine.connect()


PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def pg_catalog() -> Iterator[str]:
    """The DSN of a fresh PostgreSQL database of this test's own (dropped after),
    on the server RESGROUPS_TEST_PG_DSN names. It fails, never skips, when the
    server is not there: CI starts it."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = f"resgroups_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(PG_DSN)
    user = quote(str(params.get("user", "postgres")))
    secret = f":{quote(str(params['password']))}" if params.get("password") else ""
    where = f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    try:
        yield f"postgresql://{user}{secret}@{where}/{name}"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
