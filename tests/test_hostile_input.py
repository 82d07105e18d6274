"""Input that could cost unbounded time or memory is answered in bounded time
(issue: hostile input). Every case runs on a helper thread joined with a
bound, so a regression fails the test instead of hanging the suite."""

from __future__ import annotations

import contextlib
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import bounded

import resgroups
from resgroups.exec.executor import long_sequence

INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("n", [2**40, 2**62, INT64_MAX])
def test_the_query_timeout_holds_from_the_first_instant_of_a_huge_scan(n: int) -> None:
    with resgroups.Engine(query_timeout=1.0) as engine:
        session = engine.connect()
        got = bounded(lambda: session.execute(f"SELECT sum(x) FROM long_sequence({n})"), 20)
        assert isinstance(got, resgroups.QueryTimeout), got
        assert session.execute("SELECT count(*) FROM long_sequence(10)").rows == [(10,)]


def test_a_huge_scan_is_cancelled_at_once() -> None:
    with resgroups.Engine(query_timeout=120) as engine:
        session = engine.connect()
        started = threading.Event()

        def cancel_when_running() -> None:
            while not session.running_ids:
                if started.wait(0.002):
                    return
            session.cancel()

        canceller = threading.Thread(target=cancel_when_running, daemon=True)
        canceller.start()
        got = bounded(lambda: session.execute("SELECT sum(x) FROM long_sequence(2000000000000)"))
        started.set()
        assert isinstance(got, resgroups.QueryCancelled), got


def test_a_limit_over_the_largest_sequence_answers_at_once() -> None:
    session = resgroups.Engine().connect()
    got = bounded(lambda: session.execute(f"SELECT x FROM long_sequence({INT64_MAX}) LIMIT 3"))
    assert isinstance(got, resgroups.Result)
    assert got.rows == [(1,), (2,), (3,)]


def test_the_last_morsel_of_the_largest_sequence_ends_at_int64_max() -> None:
    (column,) = long_sequence(INT64_MAX).morsel(INT64_MAX - 3, INT64_MAX)
    assert column.tolist() == [INT64_MAX - 2, INT64_MAX - 1, INT64_MAX]


@pytest.mark.parametrize(
    ("n", "error"),
    [
        ("9223372036854775808", resgroups.NumericOverflow),
        ("-1", resgroups.InvalidParameter),
        ("1.5", resgroups.InvalidParameter),
        ("'3'", resgroups.InvalidParameter),
    ],
)
def test_a_sequence_length_outside_bigint_is_refused(n: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        resgroups.Engine().connect().execute(f"SELECT x FROM long_sequence({n})")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0.5},
        {"workers": 0},
        {"workers": -2},
        {"workers": float("nan")},
        {"workers": float("inf")},
        {"workers": "2"},
        {"workers": True},
        {"workers": 10**9},
        {"pools": {"x": 0.4}},
        {"pools": {"x": 0}},
        {"pools": {"x": 2.5}},
    ],
)
def test_thread_counts_that_are_not_positive_integers_are_refused(
    kwargs: dict[str, object],
) -> None:
    with pytest.raises(resgroups.InvalidParameter, match=r"expected an integer 1\.\.4096"):
        resgroups.Engine(**kwargs)  # type: ignore[arg-type]


def test_whole_float_thread_counts_are_accepted() -> None:
    with resgroups.Engine(workers=2.0, pools={"export": 3.0}) as engine:  # type: ignore[arg-type]
        assert engine.pools == {"default": 2, "export": 3}


# ---- statements that could cost unbounded time or memory ----------------------------------

DIGITS = "9" * 5000
NASTY: list[str] = [
    "CREATE RESOURCE GROUP a WITH (cpu_weight = 1e9999999)",
    "CREATE RESOURCE GROUP a WITH (max_active_queries = 1e18)",
    f"CREATE RESOURCE GROUP a WITH (max_active_queries = {DIGITS})",
    f"CREATE RESOURCE GROUP a WITH (queue_timeout = '{DIGITS}s')",
    f"CREATE RESOURCE GROUP a WITH (queue_timeout = {DIGITS}s)",
    f"CREATE RESOURCE GROUP a WITH (memory_limit = '{DIGITS}G')",
    "CREATE RESOURCE GROUP a WITH (memory_limit = -1e9999999)",
    f"CREATE RESOURCE GROUP a WITH (cpu_limit = '{DIGITS}%')",
    f"ALTER USER u SET MEMORY LIMIT {DIGITS}",
    f"ALTER GROUP team SET RESOURCE GROUP DEFAULT MAPPING PRIORITY {DIGITS}",
    "ALTER GROUP team SET RESOURCE GROUP DEFAULT MAPPING PRIORITY 1e9999999",
    f"SELECT {DIGITS}",
    "SELECT 1e9999999",
    f"SELECT 0.{DIGITS}",
    f"SELECT x FROM long_sequence(3) LIMIT {DIGITS}",
    f"SELECT x FROM long_sequence({DIGITS})",
    "SELECT x FROM long_sequence(1e300)",
    "SELECT " + "(" * 50_000 + "1" + ")" * 50_000,
    "SELECT " + " + ".join(["x"] * 30_000) + " FROM long_sequence(1)",
    "SELECT " + " * ".join(["1"] * 30_000),
    "SELECT " + "NOT " * 30_000 + "TRUE",
    "SELECT " + "abs(" * 5_000 + "1" + ")" * 5_000,
    "SELECT 1 IN (" + ", ".join(["1"] * 30_000) + ")",
    "SELECT * FROM resource_groups() WHERE " + " AND ".join(["cpu_weight > 0"] * 20_000),
    "SELECT " + "- " * 30_000 + "1",
    "x" * 1_000_001,
    "SELECT 1;" * 200_000,
]


@pytest.mark.parametrize("sql", NASTY, ids=lambda s: s[:40])
def test_nasty_statements_get_a_resgroups_error_in_bounded_time(sql: str) -> None:
    with resgroups.Engine(access_control=True, query_timeout=10) as engine:
        admin = engine.connect()
        admin.execute_script("CREATE USER u; CREATE GROUP team")
        got = bounded(lambda: admin.execute(sql), 20)
        assert isinstance(got, resgroups.Error | resgroups.Result), repr(got)[:300]
        if isinstance(got, resgroups.Error):
            assert len(got.message) < 2_000  # a message, not the statement echoed
        # and the engine serves normally afterwards
        assert admin.execute("SELECT count(*) FROM long_sequence(5)").rows == [(5,)]


def test_the_limits_name_themselves() -> None:
    session = resgroups.Engine().connect()
    with pytest.raises(resgroups.ProgramLimitExceeded, match="nesting depth exceeds the limit"):
        session.execute("SELECT " + "abs(" * 500 + "1" + ")" * 500)
    with pytest.raises(resgroups.ProgramLimitExceeded, match="numeric literal of 5000"):
        session.execute(f"SELECT {DIGITS}")
    with pytest.raises(resgroups.ProgramLimitExceeded, match="1,000,000"):
        session.execute("SELECT 1" + " " * 1_000_000)
    assert resgroups.ProgramLimitExceeded.sqlstate == "54000"


_OPS = st.sampled_from(["+", "-", "*", "/", "%", "=", "<", "AND", "OR"])


@st.composite
def _deep_expressions(draw: st.DrawFn) -> str:
    depth = draw(st.integers(min_value=0, max_value=3_000))
    text = draw(st.sampled_from(["1", "x", "2.5", "TRUE", "NULL"]))
    for _ in range(depth):
        shape = draw(st.integers(min_value=0, max_value=4))
        if shape == 0:
            text = f"({text})"
        elif shape == 1:
            text = f"{text} {draw(_OPS)} {draw(st.sampled_from(['1', 'x', '0']))}"
        elif shape == 2:
            text = f"abs({text})"
        elif shape == 3:
            text = f"NOT ({text})"
        else:
            text = f"-({text})"
    return text


@settings(max_examples=60, deadline=None)
@given(expr=_deep_expressions())
def test_any_nesting_is_answered_without_recursion_errors(expr: str) -> None:
    session = resgroups.Engine().connect()
    for sql in (f"SELECT {expr} FROM long_sequence(2)", f"SELECT {expr.replace('x', '7')}"):
        # a clear error is an answer; a RecursionError would escape here
        with contextlib.suppress(resgroups.Error):
            session.execute(sql)


@pytest.mark.parametrize("kind", ["select", "ctas", "insert_select", "export", "other"])
def test_a_cancel_before_enter_is_honoured_for_every_kind(kind: str) -> None:
    with resgroups.Engine(workers=1) as engine:
        session = engine.connect()
        q = session.query(kind=kind)
        q.cancel()
        with pytest.raises(resgroups.QueryCancelled, match="before it started"), q:
            pass
        with session.query(kind=kind) as again:  # nothing was taken: the worker is free
            again.checkpoint()
        assert engine.resource_groups()[0]["active_queries"] == 0
