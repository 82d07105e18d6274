"""Polars under resource groups: one lazy query, one managed query.

>>> import polars as pl
>>> from resgroups.integrations.polars import collect
>>> frame = collect(session, pl.scan_parquet("sales/*.parquet").group_by("region").agg(...))

The plan runs with ``LazyFrame.collect(background=True)`` on Polars' own
thread pool while the query's thread waits, checkpointing every
``poll_s``: ``q.on_cancel`` calls the handle's ``cancel()``, which Polars
honours between plan nodes (one long expression runs to its end). The CPU
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

import time
from typing import TYPE_CHECKING, Final

import polars as pl

from resgroups.errors import InvalidParameter
from resgroups.integrations.native_cpu import EngineThreads

if TYPE_CHECKING:
    from resgroups.session import Session

POLL_S: Final = 0.005  # how often the waiting query thread checkpoints

# Polars' compute pool ("polars-N") and its async executors
THREADS: Final = EngineThreads(
    "polars", lambda name: name.startswith(("polars-", "async-executor"))
)


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
            if "interrupted" in str(exc):
                q.checkpoint()  # raises QueryCancelled or QueryTimeout
            raise
        native.charge()
        nbytes = int(result.estimated_size())
        q.scanned(result.height, nbytes)
        q.memory.allocate(nbytes)  # the result, held until it is handed over
        q.checkpoint()
        q.memory.release(nbytes)
        if timings is not None:
            timings["native_cpu_ms"] = native.charged_ns / 1e6
        return result
