from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
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

# The servers, nodes and programs the suite starts (124 processes in a full run)
# each need the SQL parser; its LALR tables take 0.4-0.8 s to build. The first
# process to build them keeps them in a directory of this run's own (made here,
# removed at the end, so every run starts as cold as CI's), and the others load
# them in ~0.05 s (resgroups/sql/parser.py). A directory named in the
# environment already is used as it is.
_PARSER_CACHE = None
if not os.environ.get("RESGROUPS_PARSER_CACHE"):
    _PARSER_CACHE = tempfile.mkdtemp(prefix="resgroups-parser-")
    os.environ["RESGROUPS_PARSER_CACHE"] = _PARSER_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    if _PARSER_CACHE is not None:
        shutil.rmtree(_PARSER_CACHE, ignore_errors=True)


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


def _create_database() -> str:
    import psycopg

    name = f"resgroups_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class _Databases:
    """Fresh databases for ``pg_catalog``, made and dropped on a helper thread: the
    next test's database is created while a test runs, and a test's own is dropped
    after it while the next one runs, so neither CREATE nor DROP DATABASE (about
    0.15 s each, over 200 tests) is in a test's time. A database made ahead is as
    fresh as one made on demand: nothing connects to it before its test."""

    def __init__(self) -> None:
        # one thread creates, another drops: a database made ahead never waits
        # behind the drop of the one before
        self._maker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-create")
        self._dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-drop")
        self._ahead: Future[str] | None = None
        self._drops: list[Future[None]] = []

    def take(self) -> str:
        ahead = self._ahead or self._maker.submit(_create_database)
        self._ahead = None
        name = ahead.result()  # a server that is not there fails the test here
        self._ahead = self._maker.submit(_create_database)
        return name

    def give_back(self, name: str) -> None:
        self._drops.append(self._dropper.submit(_drop_database, name))
        self._check_drops(done_only=True)

    def _check_drops(self, done_only: bool) -> None:
        """A failed DROP fails the suite as it failed the test's teardown before."""
        pending = []
        for drop in self._drops:
            if done_only and not drop.done():
                pending.append(drop)
            else:
                drop.result()
        self._drops = pending

    def close(self) -> None:
        try:
            if self._ahead is not None:
                with contextlib.suppress(Exception):  # its failure was a test's, or none
                    self._drops.append(self._dropper.submit(_drop_database, self._ahead.result()))
            self._check_drops(done_only=False)
        finally:
            self._maker.shutdown(wait=True)
            self._dropper.shutdown(wait=True)


@pytest.fixture(scope="session")
def _pg_databases() -> Iterator[_Databases]:
    databases = _Databases()
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def pg_catalog(_pg_databases: _Databases) -> Iterator[str]:
    """The DSN of a fresh PostgreSQL database of this test's own (dropped after),
    on the server RESGROUPS_TEST_PG_DSN names. It fails, never skips, when the
    server is not there: CI starts it."""
    from psycopg.conninfo import conninfo_to_dict

    name = _pg_databases.take()
    params = conninfo_to_dict(PG_DSN)
    user = quote(str(params.get("user", "postgres")))
    secret = f":{quote(str(params['password']))}" if params.get("password") else ""
    where = f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    try:
        yield f"postgresql://{user}{secret}@{where}/{name}"
    finally:
        _pg_databases.give_back(name)
