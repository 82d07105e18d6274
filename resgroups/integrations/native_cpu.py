"""The CPU of an embedded engine's own threads, charged to the queries inside it (SPEC §17).

What it does
    DuckDB, DataFusion and Polars run a query on threads of their own, which
    resgroups never meters (it reads a query thread's own clock,
    ``time.thread_time_ns``). An :class:`EngineThreads` reads those threads'
    CPU clocks and attributes what they used since its last reading to the
    queries inside the engine then, each in proportion to its time inside
    during the interval; a query takes its share on its own thread, between
    units of output, with :meth:`Inside.charge`, which hands it to
    ``Query.charge_cpu``: from there weights, limits, ``cpu_used_pct`` and
    rules on ``cpu_time`` see it, and a group whose budget it overdraws is
    held back at its next slice end.

Symbols
    T      the engine's threads: the process's threads (``/proc/self/task``)
           that Python does not run (not in ``threading.enumerate()``) whose
           name (``comm``) the engine's predicate accepts
    C(t)   sum over T of each thread's CPU clock at time t
    Q      the queries inside the engine (between entry and exit)
    s_q    q's active time during a reading's interval (t0, t1]: the time its
           thread spent in the engine's calls (``Inside.active``, a fetch of
           the next unit of output), not in its checkpoints (where it may be
           parked by the scheduler, the engine idle for it) or its own code
    A reading at t1 gives q the share (C(t1) - C(t0)) * s_q / sum of s over
    Q. Every entry and exit is a reading, so nothing is attributed to a
    query that was not inside; CPU read while no query was active is
    unattributed.

Invariants
    every nanosecond read is either pending for a query inside, taken by a
    query, or counted unattributed (no query inside): ``read_ns ==
    taken_ns + pending + unattributed_ns``, checked by
    :meth:`EngineThreads._check_invariants`.

Accuracy and what cannot be governed
    A thread's clock is read with ``clock_gettime`` on the thread's CPU
    clock id (nanoseconds); a thread born between readings contributes its
    whole clock. Threads of two engines with the same name are not told
    apart (DuckDB's threads carry no name of their own: every unnamed native
    thread counts as DuckDB's, BLAS threads included). The CPU is charged
    when the query next takes it, between units of output: work an engine
    does before its first batch (a hash aggregate, a sort) is charged all at
    once after it, and a limited group's query repays that debt before its
    next batch; it cannot be stopped midway except by a cancel.

Alternatives rejected
    psutil's thread times and ``getrusage`` tick in 2.4-10 ms steps; reading
    ``/proc/<tid>/schedstat`` costs a file open per thread. A sampling
    thread per engine would wake when nobody needs a reading; readings at
    the queries' own units of output cost nothing while the engine is idle.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final, TypeVar, cast

from resgroups.errors import InternalError

if TYPE_CHECKING:
    from resgroups.query import Query

MIN_INTERVAL_S: Final = 0.002  # readings closer than this are skipped (entries and exits force one)
_TASKS: Final = "/proc/self/task"
_END: Final = object()
T = TypeVar("T")


def thread_cpu_ns(tid: int) -> int:
    """The CPU clock of thread ``tid`` of this process (Linux: the clock id the
    kernel derives from a thread id, as ``pthread_getcpuclockid`` does). Raises
    OSError once the thread has ended."""
    clock_id = ((~tid) << 3) | 6  # CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED
    return time.clock_gettime_ns(clock_id)


def _comm(tid: int) -> str | None:
    try:
        with open(f"{_TASKS}/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # ended meanwhile
        return None


def unnamed(name: str) -> bool:
    """Is ``name`` that of a thread nobody named (it inherits the process's name,
    ``python`` or ``pytest``, as DuckDB's threads do)?"""
    return name == _process_name()


@functools.cache
def _process_name() -> str:
    with open("/proc/self/comm") as f:
        return f.read().strip()


class EngineThreads:
    """One engine's own threads in this process, and the queries inside it.

    >>> DUCKDB = EngineThreads("duckdb", unnamed)
    >>> with session.query(statement=sql) as q, DUCKDB.inside(q) as native:
    ...     with native.active():
    ...         reader = cursor.execute(sql).fetch_record_batch()
    ...     for batch in native.each(reader):
    ...         q.checkpoint()

    ``accepts(name)`` picks the engine's threads by their name; ``clock`` is
    monotonic seconds and ``clocks()`` the threads' CPU clocks (thread id ->
    ns), both injectable for tests.
    """

    def __init__(
        self,
        engine: str,
        accepts: Callable[[str], bool],
        clock: Callable[[], float] = time.monotonic,
        clocks: Callable[[], dict[int, int]] | None = None,
    ) -> None:
        self.engine = engine
        self._accepts = accepts
        self._clock = clock
        self._clocks = clocks if clocks is not None else self._thread_clocks
        self._lock = threading.Lock()
        self._names: dict[int, bool] = {}  # tid -> one of the engine's threads
        self._last_cpu: dict[int, int] = {}  # tid -> its clock at the last reading
        self._last_at: float | None = None  # None: no baseline yet
        self._entered: dict[Query, float | None] = {}  # inside: active since (None: not)
        self._active_s: dict[Query, float] = {}  # active time since the last reading
        self._pending: dict[Query, float] = {}  # attributed, not yet taken
        self.read_ns = 0  # every nanosecond read since the baseline
        self.taken_ns = 0  # charged to queries
        self.unattributed_ns = 0.0  # used while no query was inside

    # ---- reading the threads' clocks (under the lock) -----------------------------

    def _threads(self) -> list[int]:
        python = {t.native_id for t in threading.enumerate()}
        tids = []
        for entry in os.listdir(_TASKS):
            tid = int(entry)
            if tid in python:
                continue
            known = self._names.get(tid)
            if known is None:
                name = _comm(tid)
                known = self._names[tid] = name is not None and self._accepts(name)
            if known:
                tids.append(tid)
        return tids

    def _thread_clocks(self) -> dict[int, int]:
        """The engine's live threads' CPU clocks: thread id -> ns."""
        clocks = {}
        for tid in self._threads():
            try:
                clocks[tid] = thread_cpu_ns(tid)
            except OSError:  # ended since it was listed
                continue
        return clocks

    def _read(self, baseline: bool) -> int:
        """The CPU the engine's threads used since the last reading (ns)."""
        now_cpu = self._clocks()
        used = 0
        for tid, cpu in now_cpu.items():
            used += cpu - self._last_cpu.get(tid, cpu if baseline else 0)
        for tid in self._last_cpu.keys() - now_cpu.keys():
            self._names.pop(tid, None)  # ended: its id may be reused
        self._last_cpu = now_cpu
        return max(0, used)

    def _reading(self, now: float, *, force: bool) -> None:
        last = self._last_at
        if not force and last is not None and now - last < MIN_INTERVAL_S:
            return
        used = self._read(baseline=last is None)
        self._last_at = now
        if last is None:
            return
        self.read_ns += used
        spans = self._active_s
        for q, since in self._entered.items():
            if since is not None:
                spans[q] = spans.get(q, 0.0) + now - max(last, since)
        self._active_s = {}
        total = sum(spans.values())
        if total <= 0:
            self.unattributed_ns += used
            return
        for q, span in spans.items():
            self._pending[q] = self._pending.get(q, 0.0) + used * span / total

    # ---- the queries -------------------------------------------------------------------

    @contextmanager
    def inside(self, q: Query) -> Iterator[Inside]:
        """``q`` runs in the engine for the block; what the engine's threads used
        for it is charged to it at each :meth:`Inside.charge` and when the block
        ends (call it on the query's own thread, inside ``session.query()``)."""
        with self._lock:
            if q in self._entered:
                raise InternalError(f"{q} is inside {self.engine} already")
            self._reading(self._clock(), force=True)
            self._entered[q] = None
        handle = Inside(self, q)
        try:
            yield handle
        finally:
            with self._lock:
                self._reading(self._clock(), force=True)
                del self._entered[q]
            handle.charge()

    def _activity(self, q: Query, active: bool) -> None:
        with self._lock:
            since = self._entered[q]
            now = self._clock()
            if active:
                self._entered[q] = now if since is None else since
            elif since is not None:
                last = self._last_at if self._last_at is not None else since
                self._active_s[q] = self._active_s.get(q, 0.0) + now - max(last, since)
                self._entered[q] = None

    def take(self, q: Query) -> int:
        """Read the threads (at most every MIN_INTERVAL_S) and take ``q``'s share so
        far, in whole nanoseconds (the fraction stays pending)."""
        with self._lock:
            if q in self._entered:
                self._reading(self._clock(), force=False)
            pending = self._pending.pop(q, 0.0)
            whole = int(pending)
            if q in self._entered:
                self._pending[q] = pending - whole
            else:
                self.unattributed_ns += pending - whole  # a fraction of a ns, at its end
            self.taken_ns += whole
            return whole

    def inside_now(self) -> int:
        """How many queries are inside the engine now."""
        with self._lock:
            return len(self._entered)

    def _check_invariants(self) -> None:
        with self._lock:
            pending = sum(self._pending.values())
            accounted = self.taken_ns + pending + self.unattributed_ns
            if abs(self.read_ns - accounted) > 1 + 1e-9 * self.read_ns:
                raise InternalError(
                    f"{self.engine} threads: read {self.read_ns} ns, accounted {accounted:.0f} "
                    f"(taken {self.taken_ns}, pending {pending:.0f}, "
                    f"unattributed {self.unattributed_ns:.0f})"
                )


class Inside:
    """A query inside an engine: :meth:`active` marks the time its thread is in the
    engine's calls; :meth:`charge` hands it its share of the engine's threads'
    CPU so far (``Query.charge_cpu``), on its own thread."""

    __slots__ = ("charged_ns", "query", "threads")

    def __init__(self, threads: EngineThreads, query: Query) -> None:
        self.threads = threads
        self.query = query
        self.charged_ns = 0  # what the engine's threads used for it, all charged

    @contextmanager
    def active(self) -> Iterator[None]:
        """The query's thread is in the engine's calls for the block (running or
        fetching its work): its share of the engine's threads counts this time."""
        self.threads._activity(self.query, True)
        try:
            yield
        finally:
            self.threads._activity(self.query, False)

    def each(self, units: Iterable[T]) -> Iterator[T]:
        """The units of ``units`` (batches of output), each fetched while active
        and followed by :meth:`charge`."""
        iterator = iter(units)
        while True:
            with self.active():
                unit = next(iterator, _END)
            self.charge()
            if unit is _END:
                return
            yield cast(T, unit)

    def charge(self) -> None:
        nanos = self.threads.take(self.query)
        if nanos:
            self.charged_ns += nanos
            self.query.charge_cpu(nanos)
