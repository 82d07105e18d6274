"""DataFusion under resource groups: a runtime per group, one statement a managed query.

>>> from datafusion import SessionContext
>>> from resgroups.integrations.datafusion import DataFusion
>>> def tables(ctx: SessionContext) -> None:
...     ctx.register_parquet("sales", "sales/")
>>> fusion = DataFusion(tables)
>>> table = fusion.execute(session, "SELECT region, sum(amount) FROM sales GROUP BY 1")

Each group gets its own ``SessionContext`` (made on first use, with
``setup(ctx)`` registering the tables), whose runtime's memory pool is the
group's ``memory_limit``: a ``FairSpillPool``, so the operators that can
spill (sorts, hash aggregates) spill instead of failing, and "Resources
exhausted" surfaces as MemoryLimitExceeded (scope=group); a group without a
limit has an unbounded pool. ``target_partitions`` is the workers the query
may use (``q.max_workers``). Batches come from ``execute_stream()``, one
checkpoint each, their rows and bytes reported with ``q.scanned`` and
charged to ``q.memory`` while the result is gathered. The CPU of
DataFusion's threads (tokio's workers) is read and charged to the queries
running in DataFusion (``resgroups.integrations.native_cpu``).

Cancelling: dropping a stream from another thread, or an asyncio task, does
not stop DataFusion's native work (measured with datafusion 55); while the
query's thread is blocked in the stream's ``next()`` DataFusion still runs
Python's pending calls, so ``q.on_cancel`` delivers an exception to that
thread (``PyThreadState_SetAsyncExc``), only while it is inside ``next()``;
the thread then drops the stream, which stops the plan.

Install with ``pip install 'resgroups[datafusion]'``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

import pyarrow as pa
from datafusion import RuntimeEnvBuilder, SessionConfig, SessionContext

from resgroups.errors import InvalidParameter, MemoryLimitExceeded
from resgroups.integrations.kinds import statement_kind
from resgroups.integrations.native_cpu import EngineThreads

if TYPE_CHECKING:
    from resgroups.query import Query
    from resgroups.session import Session

# tokio's worker threads (Polars' async runtime names its own alike: not told apart)
THREADS: Final = EngineThreads("datafusion", lambda name: name.startswith("tokio-rt"))

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc


class _Interrupted(BaseException):
    """Delivered to a query's thread blocked in DataFusion; never leaves this module."""


class _Stopper:
    """Interrupts one thread's ``next(stream)``, and only that: the exception is
    sent while the thread is inside it, at most once, and a pending one is
    cleared as the thread leaves it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread = threading.get_ident()
        self._inside = False
        self._cancelled = False  # the query was cancelled: no next() starts
        self._sent = False

    def __call__(self) -> None:  # q.on_cancel, on the deadline thread
        with self._lock:
            self._cancelled = True
            if self._inside and not self._sent:
                self._sent = True
                _set_async_exc(ctypes.c_ulong(self._thread), ctypes.py_object(_Interrupted))

    def next(self, stream: Iterator[pa.RecordBatch]) -> pa.RecordBatch | None:
        """The stream's next batch; None at its end or once interrupted."""
        try:
            with self._lock:
                if self._cancelled:
                    return None
                self._inside = True
            try:
                return next(stream, None)
            finally:
                self._leave()
        except _Interrupted:
            self._leave()  # it may have come before the first leave finished
            return None

    def _leave(self) -> None:
        with self._lock:
            self._inside = False
            sent = self._sent
        if sent:  # nothing pending stays behind for later code
            _absorb_pending()


def _swallow() -> None:
    """A function call: where the interpreter raises a pending asynchronous
    exception (at the callee's first instruction)."""


def _absorb_pending() -> None:
    """Let an :class:`_Interrupted` still pending for this thread be raised here,
    and drop it. Clearing it with ``PyThreadState_SetAsyncExc(id, NULL)`` instead
    would leave the interpreter's eval breaker signalled for good (CPython 3.11
    signals on every call of it, and unsignals only as it raises one), which
    slows every thread and upsets the instants at which signal handlers run."""
    # not contextlib.suppress: its __enter__ is a call, where the exception would
    # be raised outside the block
    try:  # noqa: SIM105
        _swallow()
    except _Interrupted:
        pass


def _batches(stream: object) -> Iterator[pa.RecordBatch]:
    for batch in stream:  # type: ignore[attr-defined]
        yield batch.to_pyarrow()


class DataFusion:
    """DataFusion contexts per group, and statements run on them as managed queries.

    ``setup(ctx)`` registers the tables (and anything else) on a new context;
    it runs once per group (and again for a group whose memory_limit or
    workers changed).
    """

    def __init__(self, setup: Callable[[SessionContext], None]) -> None:
        if not callable(setup):
            raise InvalidParameter(f"DataFusion(setup): a callable, not {setup!r}")
        self._setup = setup
        self._lock = threading.Lock()
        self._contexts: dict[tuple[str, int, int], SessionContext] = {}

    def context(self, q: Query) -> SessionContext:
        """The context of ``q``'s group: its memory pool the group's memory_limit,
        its target_partitions the workers ``q`` may use."""
        runtime = q.runtime
        limit = runtime.definition.memory_limit if runtime is not None else 0
        key = (q.group or "", limit, q.max_workers)
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is None:
                builder = RuntimeEnvBuilder()
                builder = builder.with_fair_spill_pool(limit) if limit else builder
                config = SessionConfig().with_target_partitions(q.max_workers)
                ctx = self._contexts[key] = SessionContext(config, builder)
                self._setup(ctx)
            return ctx

    def execute(
        self,
        session: Session,
        sql: str,
        *,
        kind: str | None = None,
        timings: dict[str, float] | None = None,
    ) -> pa.Table:
        """Run one statement as a managed query of ``session``; its result.

        A cancel, the query timeout or a rule's KILL stops DataFusion's work
        and raises resgroups' error; the group's pool running out raises
        MemoryLimitExceeded. ``timings``, when given, receives ``wait_ms`` and
        ``native_cpu_ms``.
        """
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidParameter(f"execute(): the statement is a non-empty string, not {sql!r}")
        with session.query(kind=kind or statement_kind(sql), statement=sql) as q:
            if timings is not None:
                timings["wait_ms"] = q.waited_s * 1000
            ctx = self.context(q)
            stopper = _Stopper()
            q.on_cancel(stopper)
            batches: list[pa.RecordBatch] = []
            held = 0
            stream: Iterator[pa.RecordBatch] | None = None
            try:
                with THREADS.inside(q) as native:
                    try:
                        with native.active():
                            stream = _batches(ctx.sql(sql).execute_stream())
                        while True:
                            with native.active():
                                batch = stopper.next(stream) if stream is not None else None
                            native.charge()
                            q.checkpoint()  # raises the cancel's or the timeout's error
                            if batch is None:
                                break
                            q.scanned(batch.num_rows, batch.nbytes)
                            q.memory.allocate(batch.nbytes)  # held until handed over
                            held += batch.nbytes
                            batches.append(batch)
                    except Exception as exc:
                        if "Resources exhausted" in str(exc):
                            raise MemoryLimitExceeded(
                                f"query memory limit exceeded [scope=group, group={q.group}, "
                                f"DataFusion's pool: {exc}]"
                            ) from None
                        raise
                    finally:
                        stream = None  # dropping the stream stops the plan
                if timings is not None:
                    timings["native_cpu_ms"] = native.charged_ns / 1e6
                if batches:
                    return pa.Table.from_batches(batches)
                return pa.table({})
            finally:
                if held:
                    q.memory.release(held)
