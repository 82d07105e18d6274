"""DataFusion under resource groups (issue 34): a runtime per group whose memory
pool is the group's memory_limit, statements streamed as managed queries,
cancelled by an exception delivered to the thread blocked in the stream."""

from __future__ import annotations

import time

import engine_checks as checks
import numpy as np
import pyarrow as pa
import pytest
from datafusion import SessionContext
from engine_checks import all_back, in_group

import resgroups
from resgroups.integrations.datafusion import DataFusion

ROWS = 4_000_000
SLOW = (
    "SELECT sum(v) FROM (SELECT value % 1000 AS k, value * 0.5 AS v "
    "FROM range(100000000000)) GROUP BY k"
)  # minutes of native work, no row until the end
WORKLOAD = {
    "short": "SELECT count(*) FROM t WHERE i < 1000",
    "work": "SELECT k, sum(v), max(v) FROM t GROUP BY k",
    "slow": SLOW,
}


@pytest.fixture(scope="module")
def table() -> pa.Table:
    i = np.arange(ROWS, dtype=np.int64)
    return pa.table({"i": i, "k": i % 1000, "v": i * 0.5})


@pytest.fixture(scope="module")
def fusion(table: pa.Table) -> DataFusion:
    def setup(ctx: SessionContext) -> None:
        ctx.register_record_batches("t", [table.to_batches(max_chunksize=100_000)])

    return DataFusion(setup)


@pytest.fixture
def run(fusion: DataFusion) -> checks.Run:
    return lambda session, name: fusion.execute(session, WORKLOAD[name])


def test_results_are_right_and_each_group_has_its_own_runtime(fusion: DataFusion) -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP a WITH (memory_limit = '256M')")
        result = fusion.execute(in_group(engine, "a"), "SELECT k, sum(i) AS s FROM t GROUP BY k")
        rows = dict(zip(result["k"].to_pylist(), result["s"].to_pylist(), strict=True))
        assert len(rows) == 1000
        assert rows[7] == sum(range(7, ROWS, 1000))
        contexts = set()
        for group in ("a", "DEFAULT"):
            with in_group(engine, group).query() as q:
                contexts.add(id(fusion.context(q)))
                assert fusion.context(q) is fusion.context(q)
        assert len(contexts) == 2
        all_back(engine, "a")


def test_the_groups_pool_spills_or_fails_as_memory_limit_exceeded(fusion: DataFusion) -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP tight WITH (memory_limit = '16M')")
        session = in_group(engine, "tight")
        # a hash aggregate of 4M groups spills to disk instead of failing: right result
        result = fusion.execute(
            session,
            "SELECT count(*) AS n, sum(s) AS total FROM (SELECT i, sum(v) AS s FROM t GROUP BY i)",
        )
        assert result.to_pylist() == [{"n": ROWS, "total": sum(range(ROWS)) * 0.5}]
        # a TopK cannot spill: "Resources exhausted" surfaces as MemoryLimitExceeded
        with pytest.raises(resgroups.MemoryLimitExceeded, match="scope=group"):
            fusion.execute(session, "SELECT i FROM t ORDER BY v DESC LIMIT 1000000")
        all_back(engine, "tight")
        assert checks.leaks(engine) == 0


def test_bad_input_gets_a_clear_error(fusion: DataFusion) -> None:
    with pytest.raises(resgroups.InvalidParameter, match="callable"):
        DataFusion("tables")  # type: ignore[arg-type]
    with resgroups.Engine(workers=1) as engine:
        with pytest.raises(resgroups.InvalidParameter, match="non-empty"):
            fusion.execute(engine.connect(), "")
        with pytest.raises(Exception, match="missing"):
            fusion.execute(engine.connect(), "SELECT * FROM missing")
        all_back(engine, "DEFAULT")


def test_a_cancelled_plan_stops_using_cpu(run: checks.Run) -> None:
    """Not only the query: DataFusion's threads stop too once it raised."""
    checks.cancel_and_timeout_end_native_work(run)
    process = time.process_time_ns()
    wall = time.monotonic()
    while time.monotonic() - wall < 0.5:  # measuring an idle half second
        time.sleep(0.05)
    used = (time.process_time_ns() - process) / 1e9
    assert used < 0.2, f"{used:.2f} s of CPU in the half second after the plans ended"


# ---- the checks every integration passes (tests/engine_checks.py) ------------------


def test_no_leak_after_many_queries(run: checks.Run) -> None:
    checks.no_leak_after_many(run)


def test_the_statement_and_the_rows_read_are_reported(run: checks.Run) -> None:
    checks.statement_and_scanned_are_reported(run, "range(100000000000)")


def test_the_admission_limit_holds(run: checks.Run) -> None:
    checks.admission_limit_holds(run)


def test_datafusions_threads_cpu_is_charged_to_the_group(run: checks.Run) -> None:
    checks.native_cpu_is_charged(run)


def test_weights_hold_on_native_work(run: checks.Run) -> None:
    checks.weights_hold(run)


def test_a_cpu_limit_holds_on_native_work(run: checks.Run) -> None:
    checks.limit_holds(run)
