"""Input that could cost unbounded time or memory is answered in bounded time
(issue: hostile input). Every case runs on a helper thread joined with a
bound, so a regression fails the test instead of hanging the suite."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import resgroups
from resgroups.exec.executor import long_sequence

INT64_MAX = 2**63 - 1


def bounded(fn: Callable[[], object], seconds: float = 30.0) -> object:
    """``fn()`` on a helper thread: its result or its exception, within ``seconds``."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return outcome[0]


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
            while not session._running:
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
