"""Managed queries: resolve once, pass the gate, hold a worker, give it all back.

>>> with session.query(kind="select") as q:
...     for batch in batches:
...         q.checkpoint()
...         process(batch)

Lifecycle of a managed query (kinds select, ctas, insert_select, export)::

    NEW --enter--> ADMITTING --slot+worker--> RUNNING --exit--> DONE
                                              |     ^
                                        suspend     resume (passes the gate again)
                                              v     |
                                             SUSPENDED

``checkpoint()`` is one compare of the clock against ``_deadline``: the query
timeout, with cancellation folded in (cancel sets it to -inf), so the fast
path takes no lock. Unmanaged queries (kind "other", the feature disabled)
take no slot and no worker but still observe cancellation and the timeout.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from resgroups.errors import (
    Error,
    FeatureNotSupported,
    InternalError,
    InvalidParameter,
    QueryCancelled,
    QueryTimeout,
)
from resgroups.sched.admission import Ticket, TicketState

if TYPE_CHECKING:
    from resgroups.sched.pool import WorkerPool
    from resgroups.sched.runtime import GroupRuntime
    from resgroups.session import Session

KINDS: Final = ("select", "ctas", "insert_select", "export", "other")
MANAGED_KINDS: Final = frozenset(KINDS) - {"other"}

T = TypeVar("T")
R = TypeVar("R")


class QueryState(Enum):
    NEW = "new"
    ADMITTING = "admitting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"


class QueryMemory:
    """Tracked native memory of one query (counting; budgets arrive with §8)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.used = 0

    def allocate(self, nbytes: int) -> None:
        if nbytes < 0:
            raise InvalidParameter(f"allocate({nbytes}): bytes must be >= 0")
        with self._lock:
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        if nbytes < 0:
            raise InvalidParameter(f"release({nbytes}): bytes must be >= 0")
        with self._lock:
            if nbytes > self.used:
                raise InvalidParameter(
                    f"release({nbytes}) exceeds the {self.used} bytes this query holds"
                )
            self.used -= nbytes

    def release_all(self) -> int:
        with self._lock:
            held, self.used = self.used, 0
            return held


class Task:
    """What a ``map`` task function receives: checkpoints and memory of its query."""

    def __init__(self, query: Query, batch: _MapBatch[Any, Any]) -> None:
        self.query = query
        self._batch = batch
        self.memory = query.memory

    def checkpoint(self) -> None:
        """The query's checkpoint, plus: stop early once a sibling task failed."""
        self.query.checkpoint()
        if self._batch.failed:
            raise QueryCancelled("a sibling task of this query failed")


class _MapBatch(Generic[T, R]):
    """The tasks of one ``map`` call: pending indexes, results, the first error."""

    def __init__(self, query: Query, fn: Callable[[Task, T], R], items: list[T]) -> None:
        self.query = query
        self.fn = fn
        self.items = items
        self.results: list[Any] = [None] * len(items)
        self._pending = deque(range(len(items)))
        self._unfinished = len(items)
        self._cond = threading.Condition()
        self.error: BaseException | None = None
        self.failed = False

    def run_one(self) -> bool:
        with self._cond:
            if not self._pending:
                return False
            index = self._pending.popleft()
            if self.failed:  # skip what a failure made pointless
                self._finish_locked()
                return True
        try:
            self.results[index] = self.fn(Task(self.query, self), self.items[index])
        except BaseException as exc:
            with self._cond:
                if self.error is None:
                    self.error = exc
                self.failed = True
        with self._cond:
            self._finish_locked()
        return True

    def _finish_locked(self) -> None:
        self._unfinished -= 1
        if not self._unfinished:
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            while self._unfinished:
                self._cond.wait()


class Query:
    """One managed (or unmanaged) query of a session; use it as a context manager."""

    def __init__(self, session: Session, kind: str, pool: str) -> None:
        if kind not in KINDS:
            raise InvalidParameter(f"query kind {kind!r} is not one of {', '.join(KINDS)}")
        engine = session.engine
        self.session = session
        self.kind = kind
        self.pool_name = pool
        self.user = session.user
        self.group: str | None = None
        self.memory = QueryMemory()
        self.state = QueryState.NEW
        self._now = engine.clock.monotonic
        self._timeout = engine.query_timeout
        self._timeout_at = math.inf
        self._deadline = math.inf  # the one field checkpoint() reads
        self._cancelled = False
        self._runtime: GroupRuntime | None = None
        self._pool: WorkerPool = engine.pool(pool)
        self._ticket: Ticket | None = None
        self._holds_worker = False
        self._suspended_at = 0.0

    # ---- the fast path ------------------------------------------------------------

    def checkpoint(self) -> None:
        """Cooperative yield point: raises QueryCancelled or QueryTimeout when due."""
        if self._now() >= self._deadline:
            self._checkpoint_slow()

    def _checkpoint_slow(self) -> None:
        if self._cancelled:
            raise QueryCancelled(f"query cancelled [group={self.group}, user={self.user}]")
        if self._now() >= self._timeout_at:
            raise QueryTimeout(
                f"query timeout [timeout={self._timeout}s, group={self.group}, user={self.user}]"
            )

    @property
    def managed(self) -> bool:
        return self._runtime is not None

    @property
    def runtime(self) -> GroupRuntime | None:
        """The live state of the query's group (None: unmanaged)."""
        return self._runtime

    # ---- entering and leaving --------------------------------------------------------

    def __enter__(self) -> Query:
        if self.state is not QueryState.NEW:
            raise InternalError("a query is entered once")
        engine = self.session.engine
        self.state = QueryState.ADMITTING
        submitted = self._now()
        if self._timeout is not None:
            self._timeout_at = self._deadline = submitted + self._timeout
        try:
            engine.open_query(self)
            group = self.session.managed_group_def(export=self.kind == "export")
            if group is not None and self.kind in MANAGED_KINDS:
                self.group = group.name
                self._runtime = engine.runtime_for(group)
                self._admit()
            self.state = QueryState.RUNNING
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave()

    def _admit(self) -> None:
        """Pass the gate, then take a worker (keeping the slot while waiting for one)."""
        runtime = self._runtime
        if runtime is None:
            raise InternalError("an unmanaged query has no gate to pass")
        ticket = Ticket(self.user, query_deadline=self._timeout_at)
        self._ticket = ticket
        runtime.gate.enter(ticket, self._is_cancelled)
        self._pool.acquire(self._timeout_at, self._wait_error)
        self._holds_worker = True

    def _is_cancelled(self) -> bool:
        return self._cancelled

    def _wait_error(self) -> Error | None:
        if self._cancelled:
            return QueryCancelled(
                f"query cancelled while waiting for a worker [group={self.group}]"
            )
        if self._now() >= self._timeout_at:
            return QueryTimeout(
                f"query timeout while waiting for a worker of pool {self.pool_name} "
                f"[timeout={self._timeout}s, group={self.group}]"
            )
        return None

    def _give_back(self) -> None:
        """Return the worker and the slot, whatever state they are in.

        Only the query's own thread calls this (exit, suspend, a failed resume).
        """
        holds_worker, self._holds_worker = self._holds_worker, False
        ticket, self._ticket = self._ticket, None
        try:
            if holds_worker:
                self._pool.release()
        finally:
            if ticket is not None and self._runtime is not None:
                if ticket.state is TicketState.ACTIVE:
                    self._runtime.gate.leave(ticket)
                elif ticket.state is TicketState.QUEUED:
                    self._runtime.gate.withdraw(ticket, QueryCancelled("query left the queue"))

    def _leave(self) -> None:
        if self.state is QueryState.DONE:
            return
        was_suspended = self.state is QueryState.SUSPENDED
        try:
            self._give_back()
        finally:
            self.memory.release_all()
            self.state = QueryState.DONE
            if self._runtime is not None and was_suspended:
                self._runtime.suspend(-1)
            self.session.engine.close_query(self)

    # ---- cursors -------------------------------------------------------------------

    def suspend(self) -> None:
        """Give the slot and the worker back between pages; memory stays charged."""
        if self.state is not QueryState.RUNNING:
            raise InvalidParameter(f"suspend() on a {self.state.value} query")
        self._give_back()
        self._suspended_at = self._now()
        if self._runtime is not None:
            self._runtime.suspend(+1)
        self.state = QueryState.SUSPENDED

    def resume(self) -> None:
        """Pass the gate again; a refusal raises and leaves the query suspended."""
        if self.state is not QueryState.SUSPENDED:
            raise InvalidParameter(f"resume() on a {self.state.value} query")
        if self._cancelled:
            raise QueryCancelled(f"query cancelled [group={self.group}]")
        # the query timeout does not run while the cursor is suspended
        now = self._now()
        self._timeout_at += now - self._suspended_at
        self._suspended_at = now  # a refused resume may be retried
        if not self._cancelled:
            self._deadline = self._timeout_at
        if self._runtime is not None:
            try:
                self._admit()
            except BaseException:
                self._give_back()
                raise
            self._runtime.suspend(-1)
        self.state = QueryState.RUNNING

    # ---- cancellation and parallel work ---------------------------------------------

    def cancel(self) -> None:
        """Cancel from any thread: the query raises QueryCancelled at its next
        checkpoint, or at once if it waits in a queue or for a worker."""
        self._cancelled = True
        self._deadline = -math.inf
        ticket = self._ticket
        if ticket is not None and self._runtime is not None:
            self._runtime.gate.poke(ticket)
        self._pool.poke()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def map(self, fn: Callable[[Task, T], R], items: Iterable[T]) -> list[R]:
        """``[fn(task, item) for item in items]`` on pool workers, results in order.

        While it waits, the calling thread runs its own pending tasks, so a
        query never deadlocks on workers its group or its callers hold. The
        first exception of a task is raised once every started task ended.
        """
        if self.state is not QueryState.RUNNING:
            raise FeatureNotSupported(f"map() on a {self.state.value} query")
        batch: _MapBatch[T, R] = _MapBatch(self, fn, list(items))
        if not batch.items:
            return []
        if len(batch.items) > 1:
            self._pool.submit(batch, len(batch.items) - 1)
        while batch.run_one():
            pass
        batch.wait()
        if batch.error is not None:
            raise batch.error
        return list(batch.results)
