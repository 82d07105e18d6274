"""Polars under resource groups (issue 34): ``resgroups.integrations.polars.collect``
collects a LazyFrame in the background as a managed query, cancelled through
``q.on_cancel``, Polars' own threads' CPU charged to the group."""

from __future__ import annotations

import engine_checks as checks
import polars as pl
import pytest
from engine_checks import all_back, group_row, in_group
from waiting import wait_until

import resgroups
from resgroups.integrations.polars import DRAIN, collect, pool_size

ROWS = 2_000_000
BASE = pl.DataFrame({"i": pl.int_range(0, ROWS, eager=True)}).with_columns(
    k=pl.col("i") % 1000, v=pl.col("i") * 0.5
)


def slow_plan() -> pl.LazyFrame:
    """Hundreds of sorts: several seconds. Polars 2.1 honours cancel() only at a
    few points of a plan (measured: a chain of sorts runs on to its group_by),
    so the work is bounded: what a cancel leaves running drains soon."""
    lf = BASE.lazy().select("i", "k")
    for s in range(150):
        lf = lf.sort("i", descending=bool(s % 2)).with_columns(i=(pl.col("i") * 7 + s) % 1000003)
    return lf.group_by("k").agg(pl.col("i").sum())


PLANS = {
    "short": lambda: BASE.lazy().filter(pl.col("i") < 1000).select(pl.col("v").sum()),
    "work": lambda: BASE.lazy().group_by("k").agg(pl.col("v").sum(), pl.col("i").max()),
    "slow": slow_plan,
}
STATEMENTS = {"short": "short", "work": "work: group by k", "slow": "slow: hundreds of sorts"}


@pytest.fixture
def run() -> checks.Run:
    return lambda session, name: collect(session, PLANS[name](), statement=STATEMENTS[name])


def test_the_result_is_right_and_charged_then_handed_over() -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP small WITH (memory_limit = '1M')")
        frame = collect(engine.connect(), PLANS["work"]())
        assert frame.height == 1000
        assert frame.sort("k").row(0) == (
            0,
            sum(i * 0.5 for i in range(0, ROWS, 1000)),
            ROWS - 1000,
        )
        with pytest.raises(resgroups.MemoryLimitExceeded):  # 16 MB of result
            collect(in_group(engine, "small"), BASE.lazy())
        all_back(engine, "small")
        assert checks.leaks(engine) == 0


def test_the_statement_defaults_to_the_plan_and_bad_input_is_refused() -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        with pytest.raises(resgroups.InvalidParameter, match="LazyFrame"):
            collect(session, BASE)  # type: ignore[arg-type]
        with pytest.raises(resgroups.InvalidParameter, match="poll_s"):
            collect(session, BASE.lazy(), poll_s=0)
        seen: list[str | None] = []
        original = session.query

        def spy(**kwargs: object) -> object:
            q = original(**kwargs)  # type: ignore[arg-type]
            seen.append(q.statement)
            return q

        session.query = spy  # type: ignore[method-assign]
        collect(session, PLANS["short"]())
        assert seen[0] is not None
        assert "FILTER" in seen[0].upper()
        assert group_row(engine, "DEFAULT")["admitted_total"] == 1


def test_the_pool_size_is_polars_fixed_one() -> None:
    assert pool_size() == pl.thread_pool_size() >= 1


# ---- the checks every integration passes (tests/engine_checks.py) ------------------


def test_no_leak_after_many_queries(run: checks.Run) -> None:
    checks.no_leak_after_many(run)


def test_the_statement_and_the_rows_read_are_reported(run: checks.Run) -> None:
    checks.statement_and_scanned_are_reported(run, "hundreds of sorts")


def test_a_cancel_and_a_timeout_end_the_query_and_the_handle_is_kept_until_polars_stops(
    run: checks.Run,
) -> None:
    checks.cancel_and_timeout_end_native_work(run)
    # Polars went on (it honours cancel() only at a few points): the two handles are
    # kept, not dropped (dropping one aborts the process), until their work ends
    assert DRAIN.running() >= 1
    wait_until(lambda: DRAIN.running() == 0, timeout=120)


def test_the_admission_limit_holds(run: checks.Run) -> None:
    checks.admission_limit_holds(run)


def test_polars_threads_cpu_is_charged_to_the_group(run: checks.Run) -> None:
    checks.native_cpu_is_charged(run)


def test_weights_hold_on_native_work(run: checks.Run) -> None:
    checks.weights_hold(run)


def test_a_cpu_limit_holds_on_native_work(run: checks.Run) -> None:
    checks.limit_holds(run)
