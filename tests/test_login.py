"""Login and secrets (SPEC §2): failures tell nothing, passwords never leak."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import pytest

import resgroups

SECRET = "hunter2-do-not-print"


@pytest.fixture
def engine() -> resgroups.Engine:
    engine = resgroups.Engine(access_control=True)
    engine.connect().execute(f"CREATE USER ann WITH PASSWORD '{SECRET}'; CREATE USER open")
    return engine


def _median_s(attempt: Callable[[], object], tries: int) -> float:
    """Median CPU time of ``attempt`` on this thread: the work a login does, which
    other processes on a loaded machine do not blur as they blur wall time."""
    times = []
    for _ in range(tries):
        started = time.thread_time()
        attempt()
        times.append(time.thread_time() - started)
    return statistics.median(times)


def _fails(engine: resgroups.Engine, name: str) -> Callable[[], object]:
    def attempt() -> None:
        with pytest.raises(resgroups.AuthenticationFailed):
            engine.connect(name, "wrong password")

    return attempt


def _ratio_of_medians(a: Callable[[], object], b: Callable[[], object]) -> float:
    """median(a) / median(b) over interleaved rounds."""
    a_times, b_times = [], []
    for _ in range(3):
        a_times.append(_median_s(a, 5))
        b_times.append(_median_s(b, 5))
    return statistics.median(a_times) / statistics.median(b_times)


def test_an_unknown_name_and_a_wrong_password_take_the_same_time(
    engine: resgroups.Engine,
) -> None:
    # one hash (~tens of ms) against none (~0.1 ms) would be a ratio near 0.01 or
    # 100; the same hash differs only by noise, within 2x even on a loaded machine
    ratio = _ratio_of_medians(_fails(engine, "nobody"), _fails(engine, "ann"))
    assert 0.5 <= ratio <= 2.0, ratio


def test_a_principal_without_a_password_pays_the_same_hash(engine: resgroups.Engine) -> None:
    ratio = _ratio_of_medians(lambda: engine.connect("open"), _fails(engine, "ann"))
    assert 0.5 <= ratio <= 2.0, ratio


@pytest.mark.parametrize("password", ["\ud800", "ok\udfffok"])
def test_an_unencodable_password_fails_cleanly(engine: resgroups.Engine, password: str) -> None:
    with pytest.raises(resgroups.AuthenticationFailed) as failed:
        engine.connect("ann", password)
    assert failed.value.sqlstate == "28P01"
    with pytest.raises(resgroups.InvalidParameter, match="valid UTF-8"):
        engine.connect().execute(f"CREATE USER bob WITH PASSWORD '{password}'")


@pytest.mark.parametrize(
    "sql",
    [
        f"CREATE USER bob WITH PASSWORD '{SECRET}' extra",
        f"CREATE USER bob WITH PASSWORD '{SECRET}",  # unterminated
        f"CREATE USER bob PASSWORD '{SECRET}'",
        f"CREATE SERVICE ACCOUNT bot WITH PASSWORD '{SECRET}' ,",
        f"CREATE USER ann WITH PASSWORD '{SECRET}'",  # a duplicate: a catalog error
        f"CREATE USER bob WITH PASSWORD '{SECRET}';\nSELEC 1",
    ],
)
def test_a_password_never_appears_in_an_error_or_a_log(
    engine: resgroups.Engine, sql: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(resgroups.Error) as failed:
        engine.connect().execute(sql)
    error = failed.value
    shown = " ".join(
        str(part)
        for part in (error, error.message, getattr(error, "context", ""), repr(error.args))
    )
    assert SECRET not in shown
    assert SECRET[:6] not in shown
    assert SECRET not in caplog.text


def test_show_never_shows_a_password(engine: resgroups.Engine) -> None:
    for statement in ("SHOW USERS", "SHOW SERVICE ACCOUNTS", "SHOW GROUPS"):
        rows = engine.connect().execute(statement).rows
        assert SECRET not in repr(rows)


def test_revoke_assume_ends_an_active_assumption_at_the_next_query() -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE USER u; CREATE SERVICE ACCOUNT bot; CREATE RESOURCE GROUP g;"
            "GRANT ASSUME SERVICE ACCOUNT bot TO u; GRANT RESOURCE GROUP ADMIN TO bot"
        )
        user = engine.connect("u")
        user.execute("ASSUME SERVICE ACCOUNT bot")
        user.execute("SELECT name FROM resource_groups()")  # bot's permission
        admin.execute("REVOKE ASSUME SERVICE ACCOUNT bot FROM u")
        with pytest.raises(resgroups.PermissionDenied, match="RESOURCE GROUP ADMIN"):
            user.execute("SELECT name FROM resource_groups()")  # u again
        assert user.identity.assumed_id is None
