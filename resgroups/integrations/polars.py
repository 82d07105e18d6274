"""Polars under resource groups: one lazy query, one managed query.

>>> import polars as pl
>>> from resgroups.integrations.polars import collect
>>> frame = collect(session, pl.scan_parquet("sales/*.parquet").group_by("region").agg(...))

The plan runs with ``LazyFrame.collect(background=True)`` on Polars' own
thread pool while the query's thread waits, checkpointing every
``poll_s``: ``q.on_cancel`` calls the handle's ``cancel()``, and the query
raises QueryCancelled or QueryTimeout at its next poll. Polars 2.1 honours
``cancel()`` only at a few points of a plan (measured: a chain of sorts, a
long expression or a streaming scan runs on to its end, a group-by stops),
so its threads may go on working after the query ended, uncharged: that
work cannot be governed. Its handle is kept (``DRAIN``) until it stops:
Polars 2.1 aborts the process when the handle of a running background
query is dropped. The CPU
of Polars' threads is read and charged to the queries running in Polars
(``resgroups.integrations.native_cpu``). Polars' pool has a fixed size,
``POLARS_MAX_THREADS`` (default: the CPUs), set once when Polars is
imported: it is never changed per query, and a group's ``cpu_limit`` holds
by the budget the query repays after its result (the work of one plan is
not stopped midway). The result is charged to the query's memory
(``DataFrame.estimated_size()``, so a group's ``memory_limit`` refuses a
result too large for it) and given back when it is handed to the caller.

Install with ``pip install 'resgroups[polars]'``.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final

import polars as pl

from resgroups.errors import InvalidParameter
from resgroups.integrations.native_cpu import EngineThreads

if TYPE_CHECKING:
    from polars.lazyframe.in_process import InProcessQuery

    from resgroups.session import Session

POLL_S: Final = 0.005  # how often the waiting query thread checkpoints
DRAIN_POLL_S: Final = 0.05  # how often cancelled queries left running are looked at

# Polars' compute pool ("polars-N") and its async executors
THREADS: Final = EngineThreads(
    "polars", lambda name: name.startswith(("polars-", "async-executor"))
)


class _Drain:
    """Background queries a cancel or a timeout left running, kept until they stop.

    Polars 2.1 aborts the process (a panic on its result channel) when a
    background query's handle is dropped before the query ends; a cancelled
    query's handle is therefore kept here, and one daemon thread polls them
    until each has stopped or finished.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles: list[InProcessQuery] = []
        self._thread: threading.Thread | None = None

    def keep(self, handle: InProcessQuery) -> None:
        with self._lock:
            self._handles.append(handle)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="resgroups-polars-drain", daemon=True
                )
                self._thread.start()

    def running(self) -> int:
        """Cancelled queries whose work has not stopped yet."""
        with self._lock:
            return len(self._handles)

    def _run(self) -> None:
        while True:
            with self._lock:
                handles = list(self._handles)
            if not handles:
                with self._lock:
                    if not self._handles:
                        self._thread = None
                        return
                continue
            ended = []
            for handle in handles:
                try:
                    if handle.fetch() is not None:
                        ended.append(handle)
                except Exception:  # stopped: "query interrupted", or its own failure
                    ended.append(handle)
            with self._lock:
                self._handles = [h for h in self._handles if h not in ended]
            time.sleep(DRAIN_POLL_S)


DRAIN: Final = _Drain()


def pool_size() -> int:
    """Polars' thread pool size: fixed when Polars was imported."""
    return int(pl.thread_pool_size())


def collect(
    session: Session,
    frame: pl.LazyFrame,
    *,
    statement: str | None = None,
    kind: str = "select",
    poll_s: float = POLL_S,
    timings: dict[str, float] | None = None,
) -> pl.DataFrame:
    """Collect ``frame`` as a managed query of ``session``; the result.

    ``statement`` names the query for selectors, rules and
    ``resource_group_queries()`` (default: the plan Polars shows,
    ``frame.explain(optimized=False)``). A cancel or the query timeout
    cancels the plan between its nodes and raises QueryCancelled or
    QueryTimeout. ``timings``, when given, receives ``wait_ms`` and
    ``native_cpu_ms``.
    """
    if not isinstance(frame, pl.LazyFrame):
        raise InvalidParameter(f"collect(): a polars LazyFrame, not {type(frame).__name__}")
    if not isinstance(poll_s, (int, float)) or not 0 < poll_s <= 1:
        raise InvalidParameter(f"collect(): poll_s is in (0, 1] seconds, not {poll_s!r}")
    text = statement if statement is not None else frame.explain(optimized=False)
    with session.query(kind=kind, statement=text) as q, THREADS.inside(q) as native:
        if timings is not None:
            timings["wait_ms"] = q.waited_s * 1000
        handle: InProcessQuery | None = None
        result: pl.DataFrame | None = None
        try:
            with native.active():
                handle = frame.collect(background=True)
                q.on_cancel(handle.cancel)
                result = handle.fetch()
                while result is None:
                    time.sleep(poll_s)  # polars has no completion callback: poll
                    native.charge()
                    q.checkpoint()
                    result = handle.fetch()
        except pl.exceptions.ComputeError as exc:
            result = pl.DataFrame()  # it ended: nothing to keep
            if "interrupted" in str(exc):
                q.checkpoint()  # raises QueryCancelled or QueryTimeout
            raise
        finally:
            if handle is not None and result is None:  # still running: never dropped
                handle.cancel()
                DRAIN.keep(handle)
        native.charge()
        nbytes = int(result.estimated_size())
        q.scanned(result.height, nbytes)
        q.memory.allocate(nbytes)  # the result, held until it is handed over
        q.checkpoint()
        q.memory.release(nbytes)
        if timings is not None:
            timings["native_cpu_ms"] = native.charged_ns / 1e6
        return result
