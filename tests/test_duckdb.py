"""DuckDB under resource groups (issues 19 and 34): ``q.on_cancel`` interrupts native
work at a cancel or the query timeout, and ``resgroups.integrations.duckdb.execute``
runs one statement as a managed query, DuckDB's own threads' CPU charged."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import duckdb
import engine_checks as checks
import pytest
from engine_checks import in_group, leaks
from waiting import bounded, wait_until

import resgroups
from resgroups.clock import ManualClock
from resgroups.integrations.duckdb import execute, statement_kind

SLOW = "SELECT sum(i % 7) FROM range(100000000000) t(i)"  # minutes of native work


def group_row(engine: resgroups.Engine, name: str) -> dict[str, Any]:
    return next(r for r in engine.resource_groups() if r["name"] == name)


def all_back(engine: resgroups.Engine, group: str) -> None:
    """Nothing of any query is held: no slot, no worker, no byte."""
    row = group_row(engine, group)
    assert (row["active_queries"], row["queued_queries"], row["memory_used_bytes"]) == (0, 0, 0)
    assert engine.pool("default").free == engine.workers
    assert engine.live_queries() == []


# ---- on_cancel, without DuckDB ----------------------------------------------------


def test_on_cancel_runs_once_on_another_thread_when_the_query_is_cancelled() -> None:
    with resgroups.Engine(workers=1) as engine:
        session = engine.connect()
        called: list[str] = []
        done = threading.Event()

        def callback() -> None:
            called.append(threading.current_thread().name)
            done.set()

        with session.query() as q:
            q.on_cancel(callback)
            q.cancel()
            assert done.wait(5)
            q.cancel()  # a second cancel calls nothing again
            with pytest.raises(resgroups.QueryCancelled):
                q.checkpoint()
        assert called == ["resgroups-deadlines"]


def test_on_cancel_runs_when_the_query_timeout_passes_on_one_timer_thread() -> None:
    clock = ManualClock()
    with resgroups.Engine(workers=4, clock=clock, query_timeout=10.0) as engine:
        fired: list[int] = []
        lock = threading.Lock()
        queries = [engine.connect().query() for _ in range(3)]
        for i, q in enumerate(queries):
            q.__enter__()
            q.on_cancel(lambda i=i: [lock.acquire(), fired.append(i), lock.release()])
        before = {t.name for t in threading.enumerate()}
        clock.advance(9.0)
        time.sleep(0.2)  # the watcher polls the hand-driven clock every 50 ms
        assert fired == []  # not due yet
        clock.advance(1.5)
        wait_until(lambda: len(fired) == 3, timeout=5)
        assert sorted(fired) == [0, 1, 2]
        # one thread watches them all: no thread per query
        assert {t.name for t in threading.enumerate()} - before == set()
        for q in queries:
            with pytest.raises(resgroups.QueryTimeout):
                q.checkpoint()
            q.__exit__(None, None, None)


def test_a_callback_that_raises_is_logged_and_the_query_still_ends_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with resgroups.Engine(workers=1) as engine:
        session = engine.connect()
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        session.execute("SET RESOURCE GROUP g")
        second: list[bool] = []

        def broken() -> None:
            raise RuntimeError("interrupt failed")

        with caplog.at_level(logging.ERROR, logger="resgroups"), session.query() as q:
            q.on_cancel(broken)
            q.on_cancel(lambda: second.append(True))
            q.cancel()
            wait_until(lambda: bool(second), timeout=5)
            with pytest.raises(resgroups.QueryCancelled):
                q.checkpoint()
        assert "on_cancel callback failed" in caplog.text
        assert "interrupt failed" in caplog.text
        all_back(engine, "g")


def test_no_callback_runs_after_exit_and_one_added_after_a_cancel_runs_at_once() -> None:
    with resgroups.Engine(workers=1, query_timeout=0.2) as engine:
        session = engine.connect()
        late: list[bool] = []
        with session.query() as q:
            q.on_cancel(lambda: late.append(True))
        time.sleep(0.4)  # past the timeout it had: the query ended, nothing runs
        q.cancel()
        time.sleep(0.1)
        assert late == []
        with pytest.raises(resgroups.InvalidParameter, match="ended"):
            q.on_cancel(lambda: None)
        now: list[bool] = []
        with session.query() as q2:
            q2.cancel()
            q2.on_cancel(lambda: now.append(True))
            wait_until(lambda: bool(now), timeout=5)
            with pytest.raises(resgroups.QueryCancelled):
                q2.checkpoint()


# ---- DuckDB ------------------------------------------------------------------------


@pytest.fixture
def con() -> Any:
    connection = duckdb.connect()
    yield connection
    connection.close()


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT 1", "select"),
        ("  -- a comment\n(SELECT 1)", "select"),
        ("WITH t AS (SELECT 1) SELECT * FROM t", "select"),
        ("CREATE OR REPLACE TABLE t AS SELECT 1", "ctas"),
        ("create temp table t as select 1", "ctas"),
        ("CREATE TABLE t (a INT)", "other"),
        ("INSERT INTO t SELECT 1", "insert_select"),
        ("COPY t TO 'out.parquet'", "export"),
        ("SET threads = 2", "other"),
    ],
)
def test_statement_kind(sql: str, kind: str) -> None:
    assert statement_kind(sql) == kind


def test_rows_come_back_and_parameters_bind(con: Any) -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        rows = execute(session, con, "SELECT i, i * ? AS twice FROM range(5) t(i)", [2])
        assert rows == [(i, 2 * i) for i in range(5)]
        execute(session, con, "CREATE TABLE t AS SELECT range AS i FROM range(3)")
        execute(session, con, "INSERT INTO t SELECT 10")
        assert execute(session, con, "SELECT sum(i) FROM t") == [(13,)]
        assert group_row(engine, "DEFAULT")["admitted_total"] == 4  # CTAS, INSERT, 2 SELECTs
        all_back(engine, "DEFAULT")


def test_the_query_timeout_interrupts_a_native_aggregation(con: Any) -> None:
    with resgroups.Engine(workers=2, query_timeout=1.0) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP reports WITH (queue_timeout = 1000)")
        admin.execute("SET RESOURCE GROUP reports")
        started = time.monotonic()
        with pytest.raises(resgroups.QueryTimeout):
            execute(admin, con, SLOW)
        took = time.monotonic() - started
        assert took < 3.0, f"timed out after {took:.2f} s: not interrupted in native code"
        all_back(engine, "reports")
        assert execute(admin, con, "SELECT 42") == [(42,)]  # the connection still works


def test_cancel_from_another_thread_interrupts_within_half_a_second(con: Any) -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        outcome: list[object] = []
        runner = threading.Thread(
            target=lambda: outcome.append(bounded(lambda: execute(session, con, SLOW), 60))
        )
        runner.start()
        wait_until(lambda: len(engine.live_queries()) == 1, timeout=30)
        (q,) = engine.live_queries()
        wait_until(lambda: q.state.value == "running", timeout=30)
        time.sleep(0.2)  # well inside DuckDB's aggregation
        cancelled_at = time.monotonic()
        q.cancel()
        runner.join(30)
        took = time.monotonic() - cancelled_at
        assert isinstance(outcome[0], resgroups.QueryCancelled), outcome
        assert took < 2.0, f"{took:.2f} s from cancel() to QueryCancelled"
        all_back(engine, "DEFAULT")


class _LateCursor:
    """A DuckDB cursor whose statement begins only once the query was cancelled:
    the cancel that lands between the query's entry and DuckDB's start."""

    def __init__(self, cursor: Any, cancelled: threading.Event) -> None:
        self._cursor, self._cancelled = cursor, cancelled

    def sql(self, *args: Any, **kwargs: Any) -> Any:
        assert self._cancelled.wait(30)
        return self._cursor.sql(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _LateConnection:
    def __init__(self, con: Any, cancelled: threading.Event) -> None:
        self._con, self._cancelled = con, cancelled

    def cursor(self) -> _LateCursor:
        return _LateCursor(self._con.cursor(), self._cancelled)


def test_a_cancel_before_duckdb_begins_still_interrupts_it(con: Any) -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        cancelled = threading.Event()
        late = _LateConnection(con, cancelled)
        outcome: list[object] = []
        runner = threading.Thread(
            target=lambda: outcome.append(bounded(lambda: execute(session, late, SLOW), 60))
        )
        runner.start()
        wait_until(lambda: len(engine.live_queries()) == 1, timeout=30)
        (q,) = engine.live_queries()
        wait_until(lambda: q.state.value == "running", timeout=30)
        q.cancel()
        wait_until(lambda: q.cancelled, timeout=30)
        cancelled.set()  # only now does DuckDB begin the statement
        runner.join(60)
        assert isinstance(outcome[0], resgroups.QueryCancelled), outcome
        all_back(engine, "DEFAULT")


def test_a_batch_is_charged_while_held_and_given_back_as_consumed(con: Any) -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP small WITH (memory_limit = '1M')")
        admin.execute("CREATE RESOURCE GROUP big WITH (memory_limit = '1G')")
        sql = "SELECT i, i * 2 AS j FROM range(1000000) t(i)"  # 10 batches of 1.6 MB
        admin.execute("SET RESOURCE GROUP small")
        with pytest.raises(resgroups.MemoryLimitExceeded):
            execute(admin, con, sql)
        all_back(engine, "small")
        admin.execute("SET RESOURCE GROUP big")
        peak: list[int] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak.append(group_row(engine, "big")["memory_used_bytes"])
                stop.wait(0.001)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            for _ in range(5):
                rows = execute(admin, con, sql)
        finally:
            stop.set()
            watcher.join(10)
        assert len(rows) == 1_000_000
        assert max(peak) > 0  # charged while a batch was held
        assert max(peak) < 4_000_000  # one batch at a time, never the whole result
        assert leaks(engine) == 0  # given back as consumed: not a leak at the end
        all_back(engine, "big")


def test_concurrent_queries_in_different_groups_never_change_each_others_threads(
    con: Any,
) -> None:
    """threads is the database's: a query in a group limited to one core leaves it
    alone, and a concurrent query of another group sees the database's value."""
    con.execute("SET threads = 2")
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        one_core = min(100.0, math.floor(10_000 / engine.cpus) / 100)
        admin.execute(f"CREATE RESOURCE GROUP one WITH (cpu_limit = '{one_core:.2f}%')")
        admin.execute("CREATE RESOURCE GROUP other")
        limited = in_group(engine, "one")
        outcome: list[object] = []
        runner = threading.Thread(
            target=lambda: outcome.append(bounded(lambda: execute(limited, con, SLOW), 60))
        )
        runner.start()
        wait_until(lambda: len(engine.live_queries()) == 1, timeout=30)
        (q,) = engine.live_queries()
        wait_until(lambda: q.state.value == "running", timeout=30)
        assert q.max_workers == 1
        seen = execute(in_group(engine, "other"), con, "SELECT current_setting('threads')")
        q.cancel()
        runner.join(30)
        assert isinstance(outcome[0], resgroups.QueryCancelled), outcome
        assert seen == [(2,)]
        assert execute(limited, con, "SELECT current_setting('threads')") == [(2,)]
        assert con.execute("SELECT current_setting('threads')").fetchall() == [(2,)]


# ---- the checks every integration passes (tests/engine_checks.py) ------------------


@pytest.fixture(scope="module")
def warehouse() -> Any:
    """A table whose GROUP BY takes about a tenth of a second on DuckDB's 2 threads."""
    connection = duckdb.connect()
    connection.execute("SET threads = 2")
    connection.execute(
        "CREATE TABLE t AS SELECT range AS i, range % 1000 AS k, random() AS v FROM range(4000000)"
    )
    yield connection
    connection.close()


WORKLOAD = {
    "short": "SELECT count(*) FROM t WHERE i < 1000",
    "work": "SELECT k, sum(v), max(v) FROM t GROUP BY k",
    "slow": SLOW,
}


@pytest.fixture
def run(warehouse: Any) -> checks.Run:
    return lambda session, name: execute(session, warehouse, WORKLOAD[name])


def test_no_leak_after_many_queries(run: checks.Run) -> None:
    checks.no_leak_after_many(run)


def test_the_statement_and_the_rows_read_are_reported(run: checks.Run) -> None:
    checks.statement_and_scanned_are_reported(run, "range(100000000000)")


def test_a_cancel_and_a_timeout_end_native_work(run: checks.Run) -> None:
    checks.cancel_and_timeout_end_native_work(run)


def test_the_admission_limit_holds(run: checks.Run) -> None:
    checks.admission_limit_holds(run)


def test_duckdbs_threads_cpu_is_charged_to_the_group(run: checks.Run) -> None:
    checks.native_cpu_is_charged(run)


def test_weights_hold_on_native_work(run: checks.Run) -> None:
    checks.weights_hold(run)


def test_a_cpu_limit_holds_on_native_work(run: checks.Run) -> None:
    checks.limit_holds(run)
