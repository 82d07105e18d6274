"""Polars under resource groups (issue 34): ``resgroups.integrations.polars.collect``
collects a LazyFrame on Polars' streaming engine as a managed query, stopped
through ``q.on_cancel`` at the plan's next batch of output, Polars' own
threads' CPU charged to the group."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import engine_checks as checks
import polars as pl
import pytest
from engine_checks import all_back, group_row, in_group
from waiting import bounded, wait_until

import resgroups
from resgroups.integrations.polars import DRAIN, ENGINES, THREADS, Guard, collect, pool_size

ROWS = 2_000_000
BASE = pl.DataFrame({"i": pl.int_range(0, ROWS, eager=True)}).with_columns(
    k=pl.col("i") % 1000, v=pl.col("i") * 0.5
)


def slow_plan(guard: Guard | None = None) -> pl.LazyFrame:
    """A long expression over the two billion rows of a cross join: minutes of native
    work whose rows come out batch by batch (a few of each batch pass the filter),
    its input guarded when ``guard`` is given."""
    e = pl.col("v")
    for j in range(20):
        e = (e * 1.0000001 + pl.col("i") % (j + 3)).sqrt()
    times = pl.LazyFrame({"r": pl.int_range(0, 1000, eager=True)})
    rows = BASE.lazy().join(times, how="cross")
    if guard is not None:
        rows = guard(rows)
    return rows.filter(((pl.col("i") + pl.col("r")) % 1000 == 7) & (e > 1.0))


def group_by_over_copies(copies: int, guard: Guard | None = None) -> pl.LazyFrame:
    """A group-by over ``copies`` x 2M rows (a cross join): no row until its end,
    its input guarded (a checkpoint on each batch read) when ``guard`` is given."""
    times = pl.LazyFrame({"r": pl.int_range(0, copies, eager=True)})
    rows = BASE.lazy().join(times, how="cross")
    if guard is not None:
        rows = guard(rows)
    return rows.group_by((pl.col("i") + pl.col("r")) % 1000).agg(pl.col("v").sum())


def guarded_group_by(guard: Guard) -> pl.LazyFrame:
    """Minutes of native work, no row until its end, its input guarded."""
    return group_by_over_copies(1000, guard)


def blocking_plan() -> pl.LazyFrame:
    """Seconds of native work and no row until its end (the sum of a 100-term
    expression), nothing guarded, on the in-memory engine: nothing stops it."""
    e = pl.col("v")
    for j in range(100):
        e = (e * 1.0000001 + pl.col("i") % (j + 3)).sqrt()
    return BASE.lazy().select(e.sum())


PLANS = {
    "short": lambda: BASE.lazy().filter(pl.col("i") < 1000).select(pl.col("v").sum()),
    "work": lambda: BASE.lazy().group_by("k").agg(pl.col("v").sum(), pl.col("i").max()),
    "slow": lambda: slow_plan,  # a builder: guarded, on the streaming engine
    "blocking": blocking_plan,
}
STATEMENTS = {
    "short": "short",
    "work": "work: group by k",
    "slow": "slow: a long filter",
    "blocking": "blocking: a sum",
}


def polars_cpu_ns() -> int:
    """The CPU clocks of Polars' threads, summed."""
    return sum(THREADS._thread_clocks().values())


def polars_goes_quiet(timeout: float = 5.0, window: float = 0.3) -> float:
    """Wait until Polars' threads use under 30 ms of CPU in a ``window``; how long
    that took (AssertionError after ``timeout``)."""
    started = time.monotonic()
    last = [polars_cpu_ns(), started]

    def quiet() -> bool:
        now = time.monotonic()
        if now - last[1] < window:
            return False
        used = polars_cpu_ns() - last[0]
        last[:] = [used + last[0], now]
        return used < 30_000_000

    wait_until(quiet, timeout=timeout)
    return time.monotonic() - started


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
    checks.statement_and_scanned_are_reported(run, "a long filter")


def test_a_cancel_and_a_timeout_stop_polars_native_work(run: checks.Run) -> None:
    """Not only the query: Polars' threads stop too, at the plan's next batch."""
    _ends_and_goes_quiet(run)


def test_on_the_streaming_engine_a_plain_plan_stops_at_its_next_batch_of_output() -> None:
    """No guard: the root's checkpoint stops a plan whose rows come out as it runs."""
    _ends_and_goes_quiet(
        _with_slow(
            lambda session: collect(session, slow_plan(), statement="slow", engine="streaming")
        )
    )


def test_a_guarded_input_stops_a_plan_with_no_output_until_its_end() -> None:
    """A group-by outputs nothing before its end; with its input guarded, a cancel
    and a 1 s timeout stop it as it reads, and Polars' threads go quiet."""
    _ends_and_goes_quiet(
        _with_slow(
            lambda session: collect(session, guarded_group_by, statement="slow: a guarded group-by")
        )
    )


def _with_slow(slow: Callable[[resgroups.Session], object]) -> checks.Run:
    """The engine checks' runner with ``slow`` for their slow plan."""

    def run(session: resgroups.Session, name: str) -> object:
        if name == "slow":
            return slow(session)
        return collect(session, PLANS[name](), statement=STATEMENTS[name])

    return run


def _ends_and_goes_quiet(run: checks.Run) -> None:
    """A cancel and a 1 s timeout each end the slow query (the engine checks),
    and Polars' threads go quiet soon after, nothing left running."""
    checks.cancel_and_timeout_end_native_work(run)
    took = polars_goes_quiet()
    assert DRAIN.running() == 0
    assert took < 3, f"Polars' threads went on {took:.2f} s"


def test_guarded_inputs_change_no_result_and_bad_input_is_refused() -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        other = BASE.select("k", w="v").unique("k")
        got = collect(
            session,
            lambda guard: (
                guard(BASE)
                .filter(pl.col("k") < 10)
                .join(guard(other.lazy()), on="k")
                .select("i", "w")
                .sort("i")
                .head(1000)
            ),
        )
        want = (
            BASE.lazy()
            .filter(pl.col("k") < 10)
            .join(other.lazy(), on="k")
            .select("i", "w")
            .sort("i")
            .head(1000)
            .collect()
        )
        assert got.schema == want.schema
        assert got.equals(want)
        with pytest.raises(resgroups.InvalidParameter, match="guard"):
            collect(session, lambda guard: guard([1, 2]))  # type: ignore[arg-type]
        with pytest.raises(resgroups.InvalidParameter, match="LazyFrame"):
            collect(session, lambda guard: BASE)  # type: ignore[arg-type,return-value]
        all_back(engine, "DEFAULT")


def test_the_results_are_those_of_polars_own_collect() -> None:
    """The streaming engine and its checkpoint change no value, type or order."""
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        plans = {
            **{name: PLANS[name] for name in ("short", "work")},
            "rows": lambda: BASE.lazy().filter(pl.col("k") < 3),
            "types": lambda: (
                BASE.lazy()
                .with_columns(
                    s=pl.col("k").cast(pl.Utf8),
                    n=pl.lit(None),
                    d=pl.col("v").cast(pl.Decimal(20, 2)),
                    l=pl.concat_list("i", "k"),
                )
                .sort("v", descending=True)
                .head(5)
            ),
            "empty": lambda: BASE.lazy().filter(pl.col("i") < 0),
            "join": lambda: (
                BASE.lazy()
                .join(BASE.lazy().select("k", w="v").unique("k"), on="k", how="left")
                .sort("i")
                .slice(100, 1000)
            ),
        }
        for (name, plan), engine in itertools.product(plans.items(), ENGINES):
            got, want = collect(session, plan(), engine=engine), plan().collect()
            if name == "work":
                got, want = got.sort("k"), want.sort("k")
            assert got.schema == want.schema, (name, engine)
            assert got.equals(want), (name, engine)
        with pytest.raises(resgroups.InvalidParameter, match="engine"):
            collect(session, BASE.lazy(), engine="gpu")


def test_many_stopped_queries_leave_nothing_behind() -> None:
    """Cancelled and timed-out plans: no slot, worker, byte, driver thread or
    Polars CPU left once each query raised."""
    with resgroups.Engine(workers=2, query_timeout=0.3) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (memory_limit = '1G')")
        session = in_group(engine, "g")
        for i in range(8):
            outcome = bounded(lambda: collect(session, PLANS["slow"]()), 30)
            assert isinstance(outcome, resgroups.QueryTimeout), (i, outcome)
            collect(session, PLANS["short"]())
        assert checks.leaks(engine) == 0
        all_back(engine, "g")
    assert DRAIN.running() == 0
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "resgroups-polars"], 5)
    polars_goes_quiet()


def test_a_plan_with_no_output_until_its_end_runs_on_and_is_kept_until_it_ends() -> None:
    """What Polars 2.1 cannot stop: no batch comes out of a group-by before its end,
    so no checkpoint runs; the query still raises at once, and the run is kept
    (DRAIN) until Polars is done."""
    with resgroups.Engine(workers=2, query_timeout=0.5) as engine:
        outcome = bounded(lambda: collect(engine.connect(), PLANS["blocking"]()), 30)
        assert isinstance(outcome, resgroups.QueryTimeout), outcome
        all_back(engine, "DEFAULT")
    wait_until(lambda: DRAIN.running() == 0, timeout=120)
    polars_goes_quiet(timeout=30)


def test_the_admission_limit_holds(run: checks.Run) -> None:
    checks.admission_limit_holds(run)


def test_polars_threads_cpu_is_charged_to_the_group(run: checks.Run) -> None:
    checks.native_cpu_is_charged(run)


def test_weights_hold_on_native_work(run: checks.Run) -> None:
    checks.weights_hold(run)


def test_a_cpu_limit_holds_on_native_work(run: checks.Run) -> None:
    checks.limit_holds(run)
