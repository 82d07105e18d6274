"""A real signal (``signal.raise_signal``, no tracing) at the worst instant of an
operation other than a query: a DDL statement, ``engine.close()``, an
engine's construction. Whatever the operation took is either kept whole and
reachable, or given back; the handler's exception is never lost.

The handler raises an exception of the test's own, never KeyboardInterrupt,
so that pytest never takes it for the user's Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import resgroups
import resgroups.engine as engine_module
from resgroups.catalog import store
from resgroups.catalog.store import DirectoryLog


class Interrupted(BaseException):
    """What the test's SIGINT handler raises."""


def _raise(signum: int, frame: object) -> None:
    raise Interrupted


@pytest.fixture
def raising_sigint() -> Iterator[None]:
    before = signal.signal(signal.SIGINT, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _signal_after(real: Callable[..., object]) -> Callable[..., object]:
    """``real``, with a SIGINT raised as its first call returns (later calls plain)."""
    fired: list[bool] = []

    def call(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)
        if not fired:
            fired.append(True)
            signal.raise_signal(signal.SIGINT)
        return result

    return call


@pytest.mark.usefixtures("raising_sigint")
@pytest.mark.parametrize(
    ("setup", "statement", "expected"),
    [
        ("", "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)", 1),
        (
            "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)",
            "ALTER RESOURCE GROUP g SET (max_active_queries = 5)",
            5,
        ),
    ],
)
def test_a_signal_during_a_ddl_append_leaves_the_log_and_the_engine_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: str, statement: str, expected: int
) -> None:
    """A Ctrl-C during the directory log's fsync (a DDL's slowest step): the
    statement raises it once its change is in the log and in the engine both,
    never with the record durable and the running engine a version behind."""
    with resgroups.Engine(workers=2, catalog=tmp_path / "catalog") as engine:
        admin = engine.connect()
        if setup:
            admin.execute(setup)
        monkeypatch.setattr(store.os, "fsync", _signal_after(os.fsync))
        with pytest.raises(Interrupted):
            admin.execute(statement)
        monkeypatch.undo()
        assert engine.snapshot.version == DirectoryLog.newest_version(engine._log)
        rows = {r["name"]: r for r in engine.resource_groups()}
        assert rows["g"]["max_active_queries"] == expected  # the live engine has it
        admin.execute("SET RESOURCE GROUP g")
        with pytest.raises(resgroups.Error, match="already exists"):
            admin.execute("CREATE RESOURCE GROUP g")
    with resgroups.Engine(workers=2, catalog=tmp_path / "catalog") as reopened:
        rows = {r["name"]: r for r in reopened.resource_groups()}
        assert rows["g"]["max_active_queries"] == expected


def _threads_of_resgroups() -> set[int]:
    return {t.ident or 0 for t in threading.enumerate() if t.name.startswith("resgroups")}


def _gone(threads: set[int], timeout: float = 10.0) -> bool:
    """Every resgroups thread not in ``threads`` has ended (a bounded wait)."""
    stopped = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if not _threads_of_resgroups() - threads:
            return True
        stopped.wait(0.02)
    return False


@pytest.mark.usefixtures("raising_sigint")
@pytest.mark.parametrize(
    "part", ["open_log", "Catalog", "Dispatcher", "GroupRuntimes", "Reconciler", "EngineMetrics"]
)
def test_a_signal_as_an_engine_is_made_leaves_no_lock_and_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, part: str
) -> None:
    """A Ctrl-C as each part of an engine is made: the constructor raises it, and
    what was made is closed (the catalog's writer lock, the pools' threads), so
    that the program can open the catalog again."""
    before = _threads_of_resgroups()
    monkeypatch.setattr(engine_module, part, _signal_after(getattr(engine_module, part)))
    with pytest.raises(Interrupted):
        resgroups.Engine(workers=2, catalog=tmp_path / "catalog")
    monkeypatch.undo()
    assert _gone(before), sorted(t.name for t in threading.enumerate())
    with resgroups.Engine(workers=1, catalog=tmp_path / "catalog") as again:
        assert again.connect().execute("SELECT 1").rows == [(1,)]


@pytest.mark.usefixtures("raising_sigint")
def test_a_signal_during_the_close_grace_cuts_it_short_and_still_shuts_everything(
    tmp_path: Path,
) -> None:
    """A Ctrl-C while ``close()`` waits for a running query: the wait ends there,
    the query is cancelled, the threads stop and the catalog is released; the
    handler's exception leaves ``close()`` once all that is done."""
    before = _threads_of_resgroups()
    engine = resgroups.Engine(workers=2, catalog=tmp_path / "catalog")
    running = threading.Event()
    ended: list[BaseException | None] = []

    def long_query() -> None:
        try:
            with engine.connect().query() as q:
                running.set()
                signalled = False
                for _ in range(3000):  # at most ~30 s, a checkpoint every 10 ms
                    q.checkpoint()
                    if engine.closed and not signalled:  # close() is waiting for us
                        signalled = True
                        os.kill(os.getpid(), signal.SIGINT)
                    threading.Event().wait(0.01)
            ended.append(None)
        except BaseException as exc:  # the cancel, as a query sees it
            ended.append(exc)

    worker = threading.Thread(target=long_query)
    worker.start()
    assert running.wait(10)
    with pytest.raises(Interrupted):
        engine.close(grace=60)
    worker.join(10)
    assert not worker.is_alive()
    assert len(ended) == 1, ended
    assert isinstance(ended[0], resgroups.QueryCancelled), ended
    assert _gone(before), sorted(t.name for t in threading.enumerate())
    with resgroups.Engine(workers=1, catalog=tmp_path / "catalog") as again:  # no lock left
        assert again.connect().execute("SELECT 1").rows == [(1,)]
