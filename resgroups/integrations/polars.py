"""Polars under resource groups: one lazy query, one managed query.

>>> import polars as pl
>>> from resgroups.integrations.polars import collect
>>> sales = pl.scan_parquet("sales/*.parquet")
>>> frame = collect(session, lambda guard: guard(sales).group_by("region").agg(...))

How a plan runs
    On a driver thread of its own (``resgroups-polars``), while the query's
    thread waits, checkpointing every ``poll_s`` and charging the CPU of
    Polars' threads (``native_cpu``) and of the driver thread (Polars plans
    the query there: seconds for a deep expression) to the query. A plan
    built by a function given ``guard`` runs on Polars' streaming engine,
    whose checkpoints need it; any other on the in-memory engine, unless
    ``engine`` says otherwise. Why not the streaming engine for all: Polars
    2.1's streaming engine holds a plan back while another runs (measured: a
    1 ms query waited 0.5 s, median, behind a 1 s group-by; 0.5 ms on the
    in-memory engine), so the polars demo's dashboards p99 with groups went
    from 45-64 ms to 0.9-2.2 s when every plan ran on it.

How it is stopped
    ``q.on_cancel`` sets the run's stop flag; the query waits up to
    ``STOP_WAIT_S`` for the plan to end, then raises QueryCancelled or
    QueryTimeout. The only thing that stops a running plan from outside in
    Polars 2.1 is a Python call inside it that raises: the run's checkpoint,
    a streamable ``map_batches`` that the streaming engine's threads call on
    each batch passing it. One sits at the plan's root (each batch of
    output); ``guard`` puts one on an input (each batch read). A checkpoint
    that raises ends the streaming graph at once, as long as batches flow
    through it; a blocking phase already under way (a join's build, a sort's
    sort, a group-by's merge) runs to its own end first. Measured on 2 CPUs,
    a cancel or a 1 s timeout: Polars' threads idle within 0.01-0.8 s for a
    group-by, a filter, sorts or a parquet scan over guarded inputs and for
    a streaming plan whose rows come out as it runs; 2 s for a join still
    building its table. Not stopped: a plan on the in-memory engine (it
    calls the root's checkpoint once, at its end), and an unguarded plan
    whose root outputs nothing until its end (a group-by, a sort, an
    aggregate, a filter no row passes). It runs on after the query ended,
    its CPU unattributed (``EngineThreads.unattributed_ns``), kept in
    ``DRAIN`` until it ends, and stopped and waited for (at most
    ``EXIT_WAIT_S``) when the interpreter exits.

Other duties
    Polars' pool has a fixed size, ``POLARS_MAX_THREADS`` (default: the CPUs),
    set once when Polars is imported: it is never changed per query, and a
    group's ``cpu_limit`` holds by the budget the query repays after its
    result. The result is charged to the query's memory
    (``DataFrame.estimated_size()``, so a group's ``memory_limit`` refuses a
    result too large for it) and given back when it is handed to the caller.

Alternatives rejected (measured with Polars 2.1.0)
    ``collect(background=True)`` and ``InProcessQuery.cancel()`` (this
    module's first design): the in-memory engine, whose cancel token is read
    between plan nodes; cancelled after 1.5 s, a group-by, a long filter, 40
    sorts, a join and a parquet scan each ran on to its end (1-11 s more),
    and dropping the running handle aborts the process. Inserting checkpoints
    at a built plan's leaves by itself: Polars' API cannot (the IR visitor
    replaces a subtree only by a function returning a whole DataFrame, and
    does not show a ``map_batches`` function), hence ``guard`` in the
    builder. SIGINT sets Polars' interrupt flag, which its kernels read, but
    for every plan in the process, and Python raises KeyboardInterrupt in the
    main thread.

Install with ``pip install 'resgroups[polars]'``.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, TypeAlias

import polars as pl

from resgroups.errors import InternalError, InvalidParameter
from resgroups.integrations.native_cpu import EngineThreads, thread_cpu_ns

if TYPE_CHECKING:
    from resgroups.session import Session

# what a plan's builder is given: it puts a checkpoint on the batches of an input
Guard: TypeAlias = Callable[[pl.LazyFrame | pl.DataFrame], pl.LazyFrame]

ENGINES: Final = ("in-memory", "streaming")
POLL_S: Final = 0.005  # how often the waiting query thread checkpoints
STOP_WAIT_S: Final = 0.2  # how long a cancelled query waits for its plan to stop
EXIT_WAIT_S: Final = 5.0  # how long the interpreter's exit waits for plans still running

# Polars' compute pool ("polars-N") and its streaming engine's executors
THREADS: Final = EngineThreads(
    "polars", lambda name: name.startswith(("polars-", "async-executor"))
)


class Stopped(Exception):
    """Raised by a plan's checkpoint once its query was cancelled (it ends the plan)."""


class Run:
    """One plan collected on its driver thread, stopped at its next checkpoint by
    :meth:`stop`."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.done = threading.Event()
        self.result: pl.DataFrame | None = None
        self.error: BaseException | None = None
        self._plan: pl.LazyFrame | None = None
        self._engine = "in-memory"
        self._thread = threading.Thread(target=self._drive, name="resgroups-polars", daemon=True)
        self._final_cpu_ns: int | None = None  # the driver's CPU clock as it ended
        self.charged_ns = 0  # of the driver's CPU, charged to the query so far

    def guard(self, frame: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
        """``frame`` with a checkpoint on each of its batches, for a plan's inputs:
        Polars' threads call it as they read them, and it raises once the run is
        stopped. Projections and slices are pushed through it; filters stay
        above it (a filter that keeps no row of a batch still passes it)."""
        if isinstance(frame, pl.DataFrame):
            frame = frame.lazy()
        if not isinstance(frame, pl.LazyFrame):
            raise InvalidParameter(
                f"guard(): a polars LazyFrame or DataFrame, not {type(frame).__name__}"
            )
        return frame.map_batches(
            self._checkpoint, streamable=True, projection_pushdown=True, slice_pushdown=True
        )

    def start(self, frame: pl.LazyFrame, engine: str) -> None:
        # the root's checkpoint: Polars' threads call it for each batch of output
        self._plan = frame.map_batches(self._checkpoint, streamable=True)
        self._engine = engine
        self._thread.start()

    def stop(self) -> None:
        """Stop the plan at its next checkpoint (callable from any thread)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _checkpoint(self, batch: pl.DataFrame) -> pl.DataFrame:
        if self._stop.is_set():
            raise Stopped("the query was cancelled")
        return batch

    def driver_cpu(self) -> int:
        """CPU the driver thread used since the last call (ns): Polars plans the
        query on it (seconds for a deep expression) before its threads run it."""
        final = self._final_cpu_ns
        if final is not None:
            used = final
        else:
            tid = self._thread.native_id
            try:
                used = thread_cpu_ns(tid) if tid is not None else 0
            except OSError:  # ended between the two reads: its final clock is set
                used = self._final_cpu_ns or 0
        nanos = max(0, used - self.charged_ns)
        self.charged_ns += nanos
        return nanos

    def _drive(self) -> None:
        try:
            assert self._plan is not None  # set by start()
            self.result = self._plan.collect(engine=self._engine)  # type: ignore[call-overload]
        except BaseException as exc:  # handed to the query's thread
            self.error = exc
        finally:
            self._final_cpu_ns = time.thread_time_ns()
            self.done.set()


class _Drain:
    """Runs a cancel or a timeout left running (on the in-memory engine, or with no
    batch passing a checkpoint), kept until they end: ``running()`` counts them,
    and the interpreter's exit stops and waits for them, bounded (a driver thread
    returning from Polars while Python finalises could abort the process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[Run] = []

    def keep(self, run: Run) -> None:
        with self._lock:
            self._runs = [r for r in self._runs if not r.done.is_set()]
            self._runs.append(run)

    def running(self) -> int:
        """Cancelled queries whose plan has not stopped yet."""
        with self._lock:
            self._runs = [r for r in self._runs if not r.done.is_set()]
            return len(self._runs)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every kept run to end: did they?"""
        deadline = time.monotonic() + timeout
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            run.stop()
            if not run.done.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True


DRAIN: Final = _Drain()
atexit.register(DRAIN.wait, EXIT_WAIT_S)


def pool_size() -> int:
    """Polars' thread pool size: fixed when Polars was imported."""
    return int(pl.thread_pool_size())


def collect(
    session: Session,
    frame: pl.LazyFrame | Callable[[Guard], pl.LazyFrame],
    *,
    statement: str | None = None,
    kind: str = "select",
    engine: str | None = None,
    poll_s: float = POLL_S,
    timings: dict[str, float] | None = None,
) -> pl.DataFrame:
    """Collect ``frame`` as a managed query of ``session``; the result.

    ``frame`` is a LazyFrame, or a function that builds it from ``guard``,
    which puts a checkpoint on the batches of an input: a cancel or the query
    timeout then stops the plan as it reads them, even a group-by or a sort.

    >>> collect(session, lambda guard: guard(sales).group_by("region").agg(...))

    ``engine`` is ``"streaming"`` (the default for a builder) or
    ``"in-memory"`` (for a LazyFrame). ``statement`` names the query for
    selectors, rules and ``resource_group_queries()`` (default: the plan
    Polars shows, ``frame.explain(optimized=False)``). A cancel or the query
    timeout raises QueryCancelled or QueryTimeout within ``STOP_WAIT_S``; a
    plan it cannot stop runs on (see the module's notes). ``timings``, when
    given, receives ``wait_ms`` and ``native_cpu_ms``.
    """
    run = Run()
    if callable(frame) and not isinstance(frame, pl.LazyFrame):
        frame = frame(run.guard)
        engine = "streaming" if engine is None else engine
    engine = "in-memory" if engine is None else engine
    if engine not in ENGINES:
        raise InvalidParameter(f"collect(): engine is one of {', '.join(ENGINES)}, not {engine!r}")
    if not isinstance(frame, pl.LazyFrame):
        raise InvalidParameter(f"collect(): a polars LazyFrame, not {type(frame).__name__}")
    if not isinstance(poll_s, (int, float)) or not 0 < poll_s <= 1:
        raise InvalidParameter(f"collect(): poll_s is in (0, 1] seconds, not {poll_s!r}")
    text = statement if statement is not None else frame.explain(optimized=False)
    with session.query(kind=kind, statement=text) as q, THREADS.inside(q) as native:
        if timings is not None:
            timings["wait_ms"] = q.waited_s * 1000
        q.on_cancel(run.stop)
        with native.active():
            run.start(frame, engine)
            try:
                while not run.done.wait(poll_s):  # no completion callback: poll
                    native.charge()
                    q.charge_cpu(run.driver_cpu())
                    q.checkpoint()
            finally:
                if not run.done.is_set():  # cancelled, timed out or failed: stop the plan
                    run.stop()
                    if not run.done.wait(STOP_WAIT_S):  # its last batch, charged to q
                        DRAIN.keep(run)  # it outputs nothing until its end: runs on
                q.charge_cpu(run.driver_cpu())
        native.charge()
        if run.error is not None:
            if run.stopped:
                q.checkpoint()  # raises QueryCancelled, QueryTimeout or the failure
            raise run.error
        result = run.result
        if result is None:
            raise InternalError("polars: a plan ended with neither a result nor an error")
        nbytes = int(result.estimated_size())
        q.scanned(result.height, nbytes)
        q.memory.allocate(nbytes)  # the result, held until it is handed over
        q.checkpoint()
        q.memory.release(nbytes)
        if timings is not None:
            timings["native_cpu_ms"] = (native.charged_ns + run.charged_ns) / 1e6
        return result
