"""SQLite under resource groups (issue 34): ``resgroups.integrations.sqlite.execute``
runs one statement as a managed query whose progress handler checkpoints inside
SQLite, so a long statement is sliced, weighted, limited and cancelled there."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import engine_checks as checks
import pytest
from engine_checks import all_back, group_row, in_group
from waiting import bounded, wait_until

import resgroups
from resgroups.integrations.sqlite import execute

SLOW = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000000) "
    "SELECT sum(x) FROM c"
)  # minutes inside SQLite, no row until the end
WORKLOAD = {
    "short": "SELECT count(*) FROM t WHERE i < 100",
    "work": "SELECT k, sum(v), max(v) FROM t GROUP BY k",  # about a tenth of a second
    "slow": SLOW,
}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite") / "warehouse.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE t (i INTEGER, k INTEGER, v REAL)")
        con.execute(
            "WITH RECURSIVE s(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < 199999) "
            "INSERT INTO t SELECT x, x % 1000, x * 0.5 FROM s"
        )
    return path


class Connections:
    """One connection per thread (a progress handler is the connection's)."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self.local = threading.local()
        self.opened: list[sqlite3.Connection] = []
        self.lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        con: sqlite3.Connection | None = getattr(self.local, "con", None)
        if con is None:
            con = self.local.con = sqlite3.connect(self.database, check_same_thread=False)
            with self.lock:
                self.opened.append(con)
        return con


@pytest.fixture
def connections(database: Path) -> Iterator[Connections]:
    pool = Connections(database)
    yield pool
    for con in pool.opened:
        con.close()


@pytest.fixture
def run(connections: Connections) -> checks.Run:
    return lambda session, name: execute(session, connections.get(), WORKLOAD[name])


def test_rows_come_back_parameters_bind_and_kinds_are_read(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "a.db")
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        execute(session, con, "CREATE TABLE a (x INTEGER)")  # "other": unmanaged
        execute(session, con, "INSERT INTO a SELECT 1 UNION ALL SELECT 2")
        assert execute(session, con, "SELECT x, x * ? FROM a ORDER BY x", (10,)) == [
            (1, 10),
            (2, 20),
        ]
        assert group_row(engine, "DEFAULT")["admitted_total"] == 2  # INSERT, SELECT
        all_back(engine, "DEFAULT")
    con.close()


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "b.db")
    with resgroups.Engine(workers=1) as engine:
        session = engine.connect()
        with pytest.raises(resgroups.InvalidParameter, match="non-empty string"):
            execute(session, con, "  ")
        with pytest.raises(resgroups.InvalidParameter, match="steps"):
            execute(session, con, "SELECT 1", steps=0)
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            execute(session, con, "SELECT * FROM missing")
        all_back(engine, "DEFAULT")
    con.close()


def test_memory_is_charged_per_batch_and_a_group_limit_refuses_a_big_one(
    connections: Connections,
) -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP small WITH (memory_limit = '64K')")
        with pytest.raises(resgroups.MemoryLimitExceeded):
            execute(in_group(engine, "small"), connections.get(), "SELECT i, k, v FROM t")
        all_back(engine, "small")
        rows = execute(in_group(engine, "DEFAULT"), connections.get(), "SELECT i FROM t")
        assert len(rows) == 200_000
        assert checks.leaks(engine) == 0


def test_a_long_statement_is_sliced_inside_sqlite_by_weight(
    connections: Connections,
) -> None:
    """Two statements that each run minutes in one native call, one worker: the
    scheduler hands the worker over at the progress handler's checkpoints."""
    with resgroups.Engine(workers=1) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP hi WITH (cpu_weight = 400)")
        admin.execute("CREATE RESOURCE GROUP lo WITH (cpu_weight = 100)")
        outcomes: list[object] = []
        runners = [
            threading.Thread(
                target=lambda g=g: outcomes.append(
                    bounded(lambda: execute(in_group(engine, g), connections.get(), SLOW), 60)
                )
            )
            for g in ("hi", "lo")
        ]
        for t in runners:
            t.start()
        wait_until(lambda: len(engine.live_queries()) == 2, timeout=30)
        wait_until(
            lambda: min(group_row(engine, g)["cpu_nanos_total"] for g in ("hi", "lo")) > 0,
            timeout=30,
        )  # both have run: the worker changed hands inside SQLite
        start = {g: group_row(engine, g)["cpu_nanos_total"] for g in ("hi", "lo")}
        wait_until(
            lambda: group_row(engine, "hi")["cpu_nanos_total"] - start["hi"] > 1.5e9, timeout=60
        )
        used = {g: group_row(engine, g)["cpu_nanos_total"] - start[g] for g in ("hi", "lo")}
        for q in engine.live_queries():
            q.cancel()
        for t in runners:
            t.join(30)
        assert all(isinstance(o, resgroups.QueryCancelled) for o in outcomes), outcomes
        assert used["hi"] / max(1, used["lo"]) >= 2.0, used


def test_a_limited_groups_long_statement_is_held_to_its_limit_inside_sqlite(
    connections: Connections,
) -> None:
    with resgroups.Engine(workers=2) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP lim WITH (cpu_limit = '25%')")
        outcome: list[object] = []
        session = in_group(engine, "lim")
        runner = threading.Thread(
            target=lambda: outcome.append(
                bounded(lambda: execute(session, connections.get(), SLOW), 60)
            )
        )
        runner.start()
        wait_until(lambda: len(engine.live_queries()) == 1, timeout=30)
        (q,) = engine.live_queries()
        wait_until(lambda: q.state.value == "running", timeout=30)
        started, cpu = time.monotonic(), time.process_time_ns()
        wait_until(lambda: time.monotonic() - started > 3, timeout=10)  # measuring
        pct = 100 * (time.process_time_ns() - cpu) / 1e9 / (time.monotonic() - started)
        q.cancel()
        runner.join(30)
        assert isinstance(outcome[0], resgroups.QueryCancelled), outcome
        # a cap: at most 10 points above (a loaded machine may give it less)
        assert 10 <= pct / engine.cpus <= 35, f"{pct / engine.cpus:.1f} % of the CPUs"


# ---- the checks every integration passes (tests/engine_checks.py) ------------------


def test_no_leak_after_many_queries(run: checks.Run) -> None:
    checks.no_leak_after_many(run)


def test_the_statement_and_the_rows_read_are_reported(run: checks.Run) -> None:
    checks.statement_and_scanned_are_reported(run, "WITH RECURSIVE c(x)")


def test_a_cancel_and_a_timeout_end_native_work(run: checks.Run) -> None:
    checks.cancel_and_timeout_end_native_work(run)


def test_the_admission_limit_holds(run: checks.Run) -> None:
    checks.admission_limit_holds(run)


def test_sqlites_cpu_is_charged_to_the_group(run: checks.Run) -> None:
    checks.native_cpu_is_charged(run)


def test_weights_hold(run: checks.Run) -> None:
    checks.weights_hold(run)


def test_a_cpu_limit_holds(run: checks.Run) -> None:
    checks.limit_holds(run)
