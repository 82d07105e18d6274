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

import logging
import math
import signal
import threading
import time
import weakref
from _thread import get_ident
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, NamedTuple, TypeVar

from resgroups import interrupts
from resgroups.errors import (
    CoordinationUnavailable,
    Error,
    FeatureNotSupported,
    InternalError,
    InvalidParameter,
    QueryCancelled,
    QueryTimeout,
)
from resgroups.interrupts import MAIN_IDENT, PENDING, Hold
from resgroups.sched.admission import TICKET_ACTIVE, Ticket, TicketState
from resgroups.sched.cpu import RUNNER_RUNNING, Runner, RunnerState
from resgroups.sched.memory import Budget, MemoryCounter, QueryMemory

if TYPE_CHECKING:
    from resgroups.catalog.model import GroupDef
    from resgroups.fleet.modes import AdmissionMode, Fenced
    from resgroups.sched.pool import Dispatcher
    from resgroups.sched.runtime import GroupRuntime
    from resgroups.session import Session

log = logging.getLogger("resgroups.query")

KINDS: Final = ("select", "ctas", "insert_select", "export", "other")
MANAGED_KINDS: Final = frozenset(KINDS) - {"other"}

T = TypeVar("T")
R = TypeVar("R")


class QueryProgress(NamedTuple):
    """One row of ``resource_group_queries()`` (SPEC: explainability)."""

    query_id: int
    user_name: str
    resource_group: str | None
    state: str  # queued, running, parked, suspended
    blocked_by: str | None  # group_queue, fleet_lease, worker, cpu_budget, cpu_limit
    queue_position: int | None  # 1-based in arrival order, while queued in the group
    waited_millis: int  # queued: since submission; else the wait before it first ran
    timeout_in_millis: int | None  # the nearer of the queue and query deadlines
    cpu_nanos: int
    memory_used_bytes: int
    workers_held: int
    kind: str
    started_at: datetime | None
    stalled: bool  # running, but no checkpoint for longer than the stall threshold
    pool: str  # the pool whose workers it holds


PROGRESS_COLUMNS: Final = (
    ("query_id", "int"), ("user_name", "text"), ("resource_group", "text"), ("state", "text"),
    ("blocked_by", "text"), ("queue_position", "int"), ("waited_millis", "int"),
    ("timeout_in_millis", "int"), ("cpu_nanos", "int"), ("memory_used_bytes", "int"),
    ("workers_held", "int"), ("kind", "text"), ("started_at", "timestamptz"),
    ("stalled", "bool"), ("pool", "text"),
)  # fmt: skip


class Placement(NamedTuple):
    """Where a session's managed queries run, as resolved at one catalog version:
    the group, its live runtime, its memory budget and the query memory ceiling
    (SPEC §5, §8). A session keeps the last one (``Session.placement``)."""

    group: GroupDef
    runtime: GroupRuntime
    budget: Budget
    ceiling: int | None


class Holdings:
    """What a managed query holds, the one record of it: the query reads and
    changes it, the admission mode (fleet/modes.py) keeps its lease here, and it
    stays in the engine's registry, so that a query whose handle is lost without
    ``__exit__`` (a thread that died) can still give everything back: the
    reconcile loop finds its weak reference dead and calls :meth:`give_back`
    (SPEC: reconcile)."""

    # what a query holds at its start, as class attributes: a new query's holdings
    # store only who it is (the per-query cost, docs/queries.md "Cost")
    group: str | None = None
    runtime: GroupRuntime | None = None
    published: QueryMemory | None = None
    ticket: Ticket | None = None
    runner: Runner | None = None
    lease_id: str | None = None  # fleet lease mode: named before it is sought
    seeking = False  # waiting for the fleet lease
    leased = False  # the fleet lease is held (its row exists), not just sought
    unleased = False  # admitted while the group had no limit: holds no lease (yet)
    fenced = False  # fleet mode: runs on the instance's fence (a lapse fails it)
    suspended = False
    counted = False  # entered on the main thread and not left: interrupts.STATE.queries

    def __init__(self, query: Query) -> None:
        self.query_id = query.id
        self.user = query.user
        self.query_ref = weakref.ref(query)  # dead: the handle is lost (a zombie)

    @property
    def admitted(self) -> bool:
        """Holding a slot of its group now (not queued, not suspended)."""
        ticket = self.ticket
        return ticket is not None and ticket.state is TICKET_ACTIVE

    def give_back(self, dispatcher: Dispatcher, mode: AdmissionMode) -> int:
        """Release the worker, the slot, the lease and every byte; the bytes."""
        runner, self.runner = self.runner, None
        ticket, self.ticket = self.ticket, None
        self.uncount()
        if runner is not None:
            dispatcher.release(runner, 0)
        runtime = self.runtime
        mode.give_back(self)
        return_slot(runtime, ticket)
        if self.suspended and runtime is not None:
            runtime.suspend(-1)
            self.suspended = False
        published, self.published = self.published, None
        return published.finish() if published is not None else 0

    def uncount(self) -> None:
        """It was in flight on the main thread and is not any more, though its
        ``__exit__`` never ran (a zombie reclaimed, the engine closed beneath it):
        the program's handlers may go back (resgroups.interrupts)."""
        if self.counted:
            self.counted = False
            interrupts.query_lost()

    def fail(self, error: Error) -> None:
        """The query's memory failed for good: tell the query, if it still lives."""
        query = self.query_ref()
        if query is not None:
            query.fail(error)


def return_slot(runtime: GroupRuntime | None, ticket: Ticket | None) -> None:
    """Give back a query's admission slot or place in the queue."""
    if ticket is not None and runtime is not None:
        if ticket.state is TicketState.ACTIVE:
            runtime.gate.leave(ticket)
        elif ticket.state is TicketState.QUEUED:
            runtime.gate.withdraw(ticket, QueryCancelled("query left the queue"))


class QueryState(Enum):
    NEW = "new"
    ADMITTING = "admitting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"


_ENTERED: Final = frozenset({QueryState.ADMITTING, QueryState.RUNNING, QueryState.SUSPENDED})

# The states as module constants, as the ticket's (sched/admission.py)
_NEW: Final = QueryState.NEW
_ADMITTING: Final = QueryState.ADMITTING
_RUNNING: Final = QueryState.RUNNING
_SUSPENDED: Final = QueryState.SUSPENDED
_DONE: Final = QueryState.DONE


class Task:
    """What a ``map`` task function receives: checkpoints and memory of its query.

    A task running on a pool thread holds its own worker (its own runner);
    its checkpoints stop it when the query is cancelled or timed out, or a
    sibling failed, and charge its CPU to the group at each slice end.
    """

    def __init__(self, query: Query, batch: _MapBatch[Any, Any], runner: Runner | None) -> None:
        self.query = query
        self._batch = batch
        self._runner = runner  # None: running on the query's own thread
        # each task has its own accumulator, published when the task ends
        self.memory = MemoryCounter(query._published)  # map() created it for its tasks
        self.cpu_mark = query._meter() if runner is not None and runner.scheduled else 0
        self._slice_end = query._now() + query._slice_s if self.cpu_mark else math.inf

    def checkpoint(self) -> None:
        """The query's checkpoint, plus: stop early once a sibling task failed."""
        query = self.query
        if self._runner is None:
            query.checkpoint()
        else:
            now = query._seen = query._now()  # a task's progress is its query's
            if now >= query._stop_at:
                query._checkpoint_slow()
            if now >= query._fence_at:  # fleet mode: the instance's fence, for tasks too
                query._check_fence()
            if now >= self._slice_end:
                self._charge_slice(now)
        if self._batch.failed:
            raise QueryCancelled("a sibling task of this query failed")

    def _charge_slice(self, now: float) -> None:
        runner = self._runner
        assert runner is not None
        query = self.query
        mark = query._meter()
        query.cpu_ns += mark - self.cpu_mark
        query._dispatcher.slice_end(
            runner, mark - self.cpu_mark, query._wait_error, query._timeout_at
        )
        self.cpu_mark = mark
        self._slice_end = now + query._slice_s

    def cpu_to_charge(self) -> int:
        """The CPU used since the last charge (0 when unscheduled)."""
        if not self.cpu_mark:
            return 0
        used = self.query._meter() - self.cpu_mark
        self.query.cpu_ns += used
        return used


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
        self.runners: list[Runner] = []  # the task runners offered to the pools
        self.error: BaseException | None = None
        self.failed = False

    def run_one(self, runner: Runner | None = None) -> bool:
        """Run one pending item (on the caller's thread when ``runner`` is None)."""
        with self._cond:
            if not self._pending:
                return False
            index = self._pending.popleft()
            skip = self.failed  # what a failure made pointless is not run
        if skip:
            try:
                if runner is not None:
                    self.query._dispatcher.release(runner, 0)
            finally:
                with self._cond:
                    self._finish_locked()
            return True
        task = Task(self.query, self, runner)
        try:
            try:
                self.results[index] = self.fn(task, self.items[index])
            finally:
                task.memory.flush()
        except BaseException as exc:
            with self._cond:
                if self.error is None:
                    self.error = exc
                self.failed = True
        finally:
            try:
                if runner is not None:
                    runner.pending_cpu_ns = task.cpu_to_charge()
            except BaseException as exc:  # the meter failed: the task still ends
                with self._cond:
                    self.error = self.error or exc
                    self.failed = True
            finally:
                try:
                    if runner is not None:  # the worker is back before map() returns
                        self.query._dispatcher.release(runner, runner.pending_cpu_ns)
                finally:
                    with self._cond:
                        self._finish_locked()
        return True

    def run_task(self, runner: Runner) -> None:
        """A pool thread, holding ``runner``'s worker: run one pending item, and
        give the worker back before telling the query (so that when ``map``
        returns, every worker its tasks used is back in the pool)."""
        runner.pending_cpu_ns = 0
        try:
            self.run_one(runner)  # gives the worker back itself when it ran an item
        finally:
            try:
                self.query._dispatcher.release(runner, runner.pending_cpu_ns)  # idempotent
            finally:
                with self._cond:
                    self._cond.notify_all()

    def _finish_locked(self) -> None:
        self._unfinished -= 1
        if not self._unfinished:
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every item has ended and every task runner gave its worker back
        (or the pools closed under it)."""
        dispatcher = self.query._dispatcher
        with self._cond:
            while self._unfinished or any(r.state is not RunnerState.DONE for r in self.runners):
                if dispatcher.closed:
                    return
                self._cond.wait(0.25)


class Query:
    """One managed (or unmanaged) query of a session; use it as a context manager."""

    # What every query starts with, as class attributes: a new query stores only
    # what differs (the per-query cost, docs/queries.md "Cost").
    group: str | None = None
    state = _NEW
    leaked_bytes = 0
    waited_s = 0.0  # time from submission to holding a slot and a worker
    cpu_ns = 0  # CPU charged to the group for this query (while scheduled)
    _published: QueryMemory | None = None  # created when the query first tracks memory
    _memory: MemoryCounter | None = None  # q.memory, created on first use
    _budget: Budget | None = None  # the group's memory budget (managed queries)
    _ceiling: int | None = None  # the memory ceiling, fixed at the start
    _failure: Error | None = None
    _timeout_at = math.inf
    _stop_at = math.inf  # the timeout, or -inf once cancelled
    _deadline = math.inf  # the one field checkpoint() reads: stop or slice end
    _slice_end = math.inf
    _seen = 0.0  # the engine clock at the last checkpoint that reached the slow path
    _cpu_mark = 0
    _cancelled = False
    _runtime: GroupRuntime | None = None
    _ticket: Ticket | None = None
    _runner: Runner | None = None
    _suspended_at = 0.0
    _started = 0.0  # the wall clock at submission (time.time(); see started_at)
    _submitted = 0.0  # the engine clock at submission
    _batch: _MapBatch[Any, Any] | None = None  # the map running now, if any
    _watched = False  # on_cancel was called: the deadline watcher knows it
    _on_cancel: tuple[Callable[[], object], ...] = ()  # not yet called (on_cancel)
    _fenced = False  # fleet mode: what it holds lapses at the mode's valid_until
    _fence_at = math.inf  # that moment on the engine clock, as last looked (tasks read it)
    _fence: Fenced  # fleet mode: what says until when its group's holdings are valid

    def __init__(self, session: Session, kind: str, pool: str) -> None:
        if kind not in KINDS:
            raise InvalidParameter(f"query kind {kind!r} is not one of {', '.join(KINDS)}")
        engine = session.engine
        if pool not in engine.pools:
            engine.pool(pool)  # an unknown pool fails here, naming the pools
        self.session = session
        self.kind = kind
        self.pool_name = pool
        self.user = session.user
        self._now = engine.now
        self._meter = engine.cpu_meter
        self._timeout = engine.query_timeout
        self._slice_s = engine.slice_s
        self._probe_s = engine.probe_s  # a quarter of the stall threshold: see _arm
        self._dispatcher: Dispatcher = engine.dispatcher
        self._mode: AdmissionMode = engine.admission
        self.id = engine.next_query_id()  # resource_group_queries().query_id
        self.held = Holdings(self)  # mirrored for the reconcile loop

    @property
    def started_at(self) -> datetime | None:
        """The wall clock at submission (None: not entered yet)."""
        return datetime.fromtimestamp(self._started, UTC) if self._started else None

    @property
    def memory(self) -> MemoryCounter:
        """The accountant of this query's own thread (``allocate``/``release``)."""
        counter = self._memory
        if counter is None:
            counter = self._memory = MemoryCounter(self._memory_state())
        return counter

    def _memory_state(self) -> QueryMemory | None:
        """The query's published memory, created on first use (None: unmanaged, not
        entered, or ended). Only the query's own thread creates it (map() does so
        before its tasks start)."""
        published = self._published
        if published is None and self._budget is not None and self.state in _ENTERED:
            ledger = self.session.engine.memory_ledger
            runtime = self._runtime
            assert runtime is not None
            published = self._published = self.held.published = QueryMemory(
                ledger,
                runtime.group_id,
                self._budget,
                self._ceiling,
                f"group={self.group}, user={self.user}",
                self.held.fail,
            )
        return published

    # ---- the fast path ------------------------------------------------------------

    def checkpoint(self) -> None:
        """Cooperative yield point: raises QueryCancelled or QueryTimeout when due."""
        if self._now() >= self._deadline:
            self._checkpoint_slow()

    def _end_memory(self) -> None:
        """Publish what is pending and return every byte the query still holds."""
        try:
            if self._memory is not None:
                self._memory.flush()
        except InvalidParameter as exc:  # released more than it allocated: do not mask
            log.warning("%s: memory accounting error at the end of the query: %s", self, exc)
        finally:
            if self._published is not None:
                self.leaked_bytes = self._published.finish()

    def fail(self, error: Error) -> None:
        """A task or thread of this query failed for good (memory limit): every
        other thread of the query raises it at its next checkpoint."""
        self._failure = error
        self._stop_at = self._deadline = -math.inf
        if self._watched:
            self.session.engine.deadlines.wake(self)

    # ---- interrupting native work (on_cancel) ------------------------------------------

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once, on another thread, as soon as the query is
        cancelled, fails (a memory limit, a lost fleet lease), its query
        timeout passes or (fleet mode) the instance's fence passes, so that
        work inside one native call can be interrupted
        (``duckdb_connection.interrupt()``); the query then raises its error
        (QueryCancelled, QueryTimeout, CoordinationUnavailable) at its next
        checkpoint, as always. One timer thread watches every query's
        deadline; a callback that raises is logged, and none runs once
        ``__exit__`` has returned."""
        if self.state is _DONE:
            raise InvalidParameter("on_cancel() on a query that has ended")
        self._on_cancel = (*self._on_cancel, callback)
        self._watched = True
        self.session.engine.deadlines.watch(self)

    def due_at(self) -> float:
        """When the on_cancel callbacks are due, on the engine clock (the watcher's)."""
        if self._cancelled or self._failure is not None:
            return -math.inf
        if self.state is _SUSPENDED:  # the timeout does not run meanwhile
            return math.inf
        if self._fenced:  # fleet mode: native work stops at the fence too (re-read then)
            return min(self._timeout_at, self._now() + self._fence.valid_until - time.monotonic())
        return self._timeout_at

    def fire(self) -> None:
        """The watcher's thread: call each pending callback once."""
        callbacks, self._on_cancel = self._on_cancel, ()
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("%s: an on_cancel callback failed", self)

    def _checkpoint_slow(self) -> None:
        if self._failure is not None:
            raise type(self._failure)(self._failure.message)
        if self._cancelled:
            raise QueryCancelled(f"query cancelled [group={self.group}, user={self.user}]")
        if self._fenced:
            self._check_fence()
        now = self._now()
        if now >= self._timeout_at:
            raise QueryTimeout(
                f"query timeout [timeout={self._timeout}s, group={self.group}, user={self.user}]"
            )
        runner = self._runner
        if runner is not None and runner.scheduled and now >= self._slice_end:
            with Hold(self._interrupted):
                mark = self._meter()
                used = mark - self._cpu_mark
                self.cpu_ns += used
                # may park this thread until the scheduler gives it a worker again
                self._dispatcher.slice_end(runner, used, self._wait_error, self._timeout_at)
                self._cpu_mark = self._meter()
        self._arm()

    def _check_fence(self) -> None:
        """Fleet mode: fail (for good, every thread of the query) once the
        instance's fence has passed: what it held may have been given to others;
        else note when to look again (any thread of the query may call this)."""
        left = self._fence.valid_until - time.monotonic()
        if left <= 0:
            error = CoordinationUnavailable(
                f"this instance could not renew what it holds in the fleet in time "
                f"(a paused or partitioned process?): the slot of query {self.id} "
                f"[group={self.group}] may have been given to another process"
            )
            self.fail(error)
            raise CoordinationUnavailable(error.message)
        self._fence_at = self._now() + left

    def _arm(self) -> None:
        """Set the checkpoint deadline: the stop time, the end of a new slice, or
        the next health probe, whichever comes first. The probe makes the slow
        path run every quarter of the stall threshold, and the slow path notes
        when the query last reached a checkpoint (``_seen``), so the fast path
        stays one compare."""
        runner = self._runner
        now = self._seen = self._now()
        if runner is not None and runner.scheduled:
            self._slice_end = now + self._slice_s
        else:
            self._slice_end = math.inf
        self._deadline = min(self._stop_at, self._slice_end, now + self._probe_s)
        if self._fenced:  # fleet mode: a checkpoint at the fence (its clock is real time)
            fence = self._fence_at = now + self._fence.valid_until - time.monotonic()
            self._deadline = min(self._deadline, fence)
        if self._cancelled:  # cancel() may have run in between
            self._deadline = -math.inf

    @property
    def max_workers(self) -> int:
        """How many workers this query's work may use at once: the size of its
        pool, capped by its group's CPU limit in whole cores (at least one). An
        embedded engine sizes its own threads by it (DuckDB's ``threads``)."""
        size = self.session.engine.pools[self.pool_name]
        cpu = self._runtime.cpu if self._runtime is not None else None
        if cpu is None or cpu.limit_cores is None:
            return int(size)
        return max(1, min(int(size), int(cpu.cap)))

    @property
    def memory_ceiling(self) -> int | None:
        """The query's memory ceiling, fixed when it started (None: none)."""
        return self._ceiling

    @property
    def runtime(self) -> GroupRuntime | None:
        """The live state of the query's group (None: unmanaged)."""
        return self._runtime

    # ---- entering and leaving --------------------------------------------------------

    @interrupts.protect
    def __enter__(self) -> Query:
        """Resolve, pass the gate, take a worker. On the main thread this frame is
        protected (resgroups.interrupts): a signal that arrives anywhere in it, or
        in what it calls, is deferred, and one that arrives while the query waits
        (SIGINT) cancels the wait. Its handlers run as the last step: one that
        raises gives everything back first, so either the query was never
        entered, or it is entered and no exception leaves here (no ``__exit__``
        would follow). On any other thread no signal handler runs."""
        if self.state is not _NEW:
            raise InternalError("a query is entered once")
        if get_ident() != MAIN_IDENT:
            self._enter()  # gives back what it took, if it fails
            return self
        hold = Hold(self._interrupted)
        hold.__enter__()  # wraps the handlers (a signal before finds nothing taken)
        try:
            interrupts.STATE.queries += 1  # the handlers stay wrapped until __exit__
            self.held.counted = True
            self._enter()
        except BaseException:
            try:
                self._leave()  # still held: give everything back first (if not already)
            finally:
                hold.__exit__(None, None, None)  # then deliver what is pending
            raise
        hold.release()
        while PENDING:  # the last test: no eval-breaker check between it and the return
            self._deliver_entered()
        return self

    def _deliver_entered(self) -> None:
        """Run the handlers of signals deferred while the query was entered; one
        that raises gives everything back before its exception leaves ``__enter__``."""
        try:
            interrupts.deliver()
        except BaseException:
            with Hold():
                self._leave()
            raise

    def _enter(self) -> None:
        session = self.session
        if self._cancelled:  # cancelled before it started: honoured for every kind
            self.state = _DONE
            raise QueryCancelled(f"query cancelled before it started [user={self.user}]")
        self.state = _ADMITTING
        submitted = self._submitted = self._seen = self._now()
        self._started = time.time()
        if self._timeout is not None:
            self._timeout_at = self._stop_at = self._deadline = submitted + self._timeout
        try:
            session.engine.open_query(self)
            session.running_ids.add(self.id)
            # an unmanaged query resolves nothing: a dropped or forbidden choice
            # cannot fail what consumes nothing
            if self.kind in MANAGED_KINDS:
                placement = session.placement(export=self.kind == "export")
                if placement is not None:
                    held = self.held
                    self.group = held.group = placement.group.name
                    self._runtime = held.runtime = placement.runtime
                    self._budget = placement.budget
                    self._ceiling = placement.ceiling
                    if self._memory is not None:  # q.memory was read before entry
                        self._memory = MemoryCounter(self._memory_state())
                    self._admit()  # arms the checkpoint as it returns (_seen: now)
            self.waited_s = self._seen - submitted
            self.state = _RUNNING
        except BaseException:
            self._leave()
            raise

    @interrupts.protect
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Give back the worker, the slot and every tracked byte. On the main thread
        this frame is protected from its first instruction, so a signal that
        arrives before the hold below begins is deferred too; its handler runs as
        the hold ends, once everything is back."""
        if get_ident() != MAIN_IDENT:
            self._leave()
            return
        with Hold():  # and a signal's handler runs once everything is back
            self._leave()

    def _interrupted(self, signum: int) -> None:
        """A signal arrived while a hold of this query was in force (signal handler
        context: flags only, no lock). SIGINT cancels, so a wait ends within one
        poll and the KeyboardInterrupt follows once everything is given back."""
        if signum == signal.SIGINT:
            self._cancelled = True
            self._stop_at = self._deadline = -math.inf

    def _admit(self) -> None:
        """Pass the gate, then take a worker (keeping the slot while waiting for one).

        The fast path first: when nobody waits in the group's queue or for a
        worker of the pool, the slot and the worker are taken together under the
        dispatcher's one lock, which every gate shares (``Dispatcher.admit_at_once``).
        Otherwise it takes nothing, and the slow path runs the same state
        machines with their waits: the gate, the fleet lease, then a worker.
        """
        runtime = self._runtime
        if runtime is None:
            raise InternalError("an unmanaged query has no gate to pass")
        held = self.held
        user = self.user
        ticket = self._ticket = held.ticket = Ticket(user, self._timeout_at)
        runner = self._runner = held.runner = Runner(
            runtime.cpu, self.pool_name, user, self.id, self.kind
        )
        mode = self._mode
        if not mode.fenced and self._dispatcher.admit_at_once(runtime.gate.gate, ticket, runner):
            if runner.scheduled:
                self._cpu_mark = self._meter()
            self._arm()
            return
        self._admit_slow(runtime, ticket, mode)

    def _admit_slow(self, runtime: GroupRuntime, ticket: Ticket, mode: AdmissionMode) -> None:
        """The fleet's fence, the gate's queue, what the admission mode holds after
        the slot (a fleet lease), then a worker of the pool: each may wait."""
        runner = self._runner
        assert runner is not None
        group = runtime.definition
        queue_timeout = group.queue_timeout_ms / 1000
        if mode.fenced:  # fleet mode: nothing is admitted on what may have lapsed
            fence = self._fence = mode.fence_for(group)
            if not (time.monotonic() < fence.valid_until and mode.fresh()):
                mode.prepare(group, min(self._timeout_at - self._now(), queue_timeout))
            self._fenced = True
            if mode.fast and self._dispatcher.admit_at_once(runtime.gate.gate, ticket, runner):
                self.held.fenced = True  # it runs on the fence from here
                if time.monotonic() >= fence.valid_until or not mode.fresh():  # meanwhile
                    self._hold_fence(group, queue_timeout)
                self._cpu_mark = self._meter() if runner.scheduled else 0
                self._arm()
                return
        if mode.fast:  # who gives this ticket its slot may hand it a worker too
            ticket.runner = runner
        try:
            runtime.gate.enter(ticket, self._is_cancelled, mode.queued)
        finally:
            ticket.runner = None
        mode.after_slot(  # the local slot first, then the fleet's (SPEC §11)
            self.held,
            runtime,
            deadline=self._timeout_at,
            queue_deadline=self._now() + queue_timeout,
            cancelled=self._is_cancelled,
            now=self._now,
        )
        if runner.state is not RUNNER_RUNNING:  # not handed a worker with the slot
            # a worker is asked for once the slot is held: its arrival order counts
            # from here
            runner = Runner(runtime.cpu, self.pool_name, self.user, self.id, self.kind)
            self._runner = self.held.runner = runner
            self._dispatcher.acquire(runner, self._wait_error, self._timeout_at)
        if mode.fenced:
            self._hold_fence(group, queue_timeout)
        self._cpu_mark = self._meter() if runner.scheduled else 0
        self._arm()

    def _hold_fence(self, group: GroupDef, queue_timeout: float) -> None:
        """Fleet mode, once the slot is held: run on the fence from here. A query
        that waited in the queue across a lapse waits for the renewal first (the
        renewal fails the queries that run on the fence, not this one); one that
        finds the fence passed once it runs on it fails now."""
        mode = self._mode
        if time.monotonic() >= self._fence.valid_until or not mode.fresh():
            mode.prepare(group, min(self._timeout_at - self._now(), queue_timeout))  # or raise
            mode.recheck(self.held)  # what it took before the lapse may be gone: or raise
        self.held.fenced = True
        if time.monotonic() >= self._fence.valid_until:
            self._check_fence()  # raises

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
        runner, self._runner = self._runner, None
        ticket, self._ticket = self._ticket, None
        held = self.held
        held.runner = held.ticket = None
        held.fenced = False
        runtime = self._runtime
        if (
            runner is not None
            and ticket is not None
            and runtime is not None
            and held.lease_id is None
            and runner.state is RUNNER_RUNNING
            and ticket.state is TICKET_ACTIVE
        ):  # the fast path: the worker and the slot back under the one lock
            used = 0
            try:  # a fault of the CPU meter must not keep the worker
                if runner.scheduled:
                    used = self._meter() - self._cpu_mark
                    self.cpu_ns += used
            finally:
                self._dispatcher.leave(runtime.gate.gate, ticket, runner, used)
            return
        try:
            if runner is not None:
                used = 0
                try:  # a fault of the CPU meter must not keep the worker
                    if runner.scheduled and runner.state is RUNNER_RUNNING:
                        used = self._meter() - self._cpu_mark
                        self.cpu_ns += used
                finally:
                    self._dispatcher.release(runner, used)
        finally:
            try:
                self._mode.give_back(held)
            finally:
                return_slot(self._runtime, ticket)

    def _leave(self) -> None:
        held = self.held
        if held.counted:  # the last main-thread query to leave lets the handlers go back
            held.counted = False
            interrupts.STATE.queries -= 1
        state = self.state
        if state is _DONE:
            return
        try:
            if self._watched:  # nothing interrupts the query once it has ended
                self._on_cancel = ()
                self.session.engine.deadlines.unwatch(self)  # waits for a firing
            self._give_back()
        finally:
            if self._memory is not None or self._published is not None:
                self._end_memory()
                self.held.published = None
            self.state = _DONE
            if state is _SUSPENDED and self._runtime is not None:
                self._runtime.suspend(-1)
                self.held.suspended = False
            session = self.session
            session.running_ids.discard(self.id)
            session.engine.close_query(self)

    # ---- what it is doing now (resource_group_queries()) -----------------------------

    def progress(self) -> QueryProgress | None:
        """Where this managed query stands now: queued, running, parked or suspended,
        and what it waits for (None: unmanaged, not started, or done). Read without
        stopping the query: each field is true of a moment during the call."""
        runtime = self._runtime
        state = self.state
        if runtime is None or state in (_NEW, _DONE):
            return None
        now = self._now()
        ticket, runner = self._ticket, self._runner
        position = None
        blocked: str | None = None
        deadline = self._timeout_at
        if state is _SUSPENDED:
            shown = "suspended"
        elif ticket is not None and ticket.state is TicketState.QUEUED:
            shown, blocked = "queued", "group_queue"
            position = runtime.gate.position(ticket)
            deadline = min(deadline, ticket.queue_deadline)
        elif self.held.seeking:
            shown, blocked = "queued", "fleet_lease"
        elif runner is not None and runner.state is RunnerState.WAITING:
            shown = "parked"
            blocked = self._dispatcher.blocked_by(runner) or "worker"
        elif runner is not None and runner.state is RUNNER_RUNNING:
            shown = "running"
        else:  # between the gate and the worker, or leaving
            shown, blocked = ("queued", "group_queue") if ticket is None else ("parked", "worker")
        waited = now - self._submitted if shown == "queued" else self.waited_s
        batch = self._batch
        workers = int(runner is not None and runner.state is RUNNER_RUNNING) + (
            sum(r.state is RUNNER_RUNNING for r in batch.runners) if batch else 0
        )
        published = self._published
        return QueryProgress(
            query_id=self.id,
            user_name=self.user,
            resource_group=self.group,
            state=shown,
            blocked_by=blocked,
            queue_position=position,
            waited_millis=round(max(0.0, waited) * 1000),
            timeout_in_millis=(
                None if deadline == math.inf else max(0, round((deadline - now) * 1000))
            ),
            cpu_nanos=self.cpu_ns,
            memory_used_bytes=published.published if published is not None else 0,
            workers_held=workers,
            kind=self.kind,
            started_at=self.started_at,
            stalled=shown == "running" and now - self._seen > self._probe_s * 4,
            pool=self.pool_name,
        )

    # ---- cursors -------------------------------------------------------------------

    def suspend(self) -> None:
        """Give the slot and the worker back between pages; memory stays charged."""
        if self.state is not _RUNNING:
            raise InvalidParameter(f"suspend() on a {self.state.value} query")
        with Hold():
            self._give_back()
            if self._memory is not None:  # charged while suspended: publish what is pending
                self._memory.flush()
            self._suspended_at = self._now()
            if self._runtime is not None:
                self._runtime.suspend(+1)
                self.held.suspended = True
            self.state = _SUSPENDED

    def resume(self) -> None:
        """Pass the gate again; a refusal raises and leaves the query suspended."""
        if self.state is not _SUSPENDED:
            raise InvalidParameter(f"resume() on a {self.state.value} query")
        if self._cancelled:
            raise QueryCancelled(f"query cancelled [group={self.group}]")
        # the query timeout does not run while the cursor is suspended
        now = self._now()
        self._timeout_at += now - self._suspended_at
        self._suspended_at = now  # a refused resume may be retried
        if not self._cancelled and self._failure is None:
            self._stop_at = self._deadline = self._timeout_at
        with Hold(self._interrupted):
            if self._runtime is not None:
                try:
                    self._admit()
                except BaseException:
                    self._give_back()
                    raise
                self._runtime.suspend(-1)
                self.held.suspended = False
            self.state = _RUNNING
        if self._watched:  # its timeout runs again, later than it was
            self.session.engine.deadlines.watch(self)

    # ---- cancellation and parallel work ---------------------------------------------

    def cancel(self) -> None:
        """Cancel from any thread: the query raises QueryCancelled at its next
        checkpoint, or at once if it waits in a queue or for a worker."""
        self._cancelled = True
        self._stop_at = self._deadline = -math.inf
        ticket = self._ticket
        if ticket is not None and self._runtime is not None:
            self._runtime.gate.poke(ticket)
        self._dispatcher.poke(self._runner)
        if self.held.seeking:
            self._mode.poke()  # a wait for a fleet lease notices at once
        if self._watched:
            self.session.engine.deadlines.wake(self)  # interrupt native work now

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def _task_runners(self, count: int) -> list[Runner]:
        """Runners for the parallel tasks of a map (none: every task on this thread).

        A group limited to one core or less runs a query's parallel work on
        the query's own thread, and so does a CTAS in any limited group; the
        tasks of a CTAS in an unlimited group, and of unmanaged queries, run
        outside every group and are charged to none.
        """
        if count <= 0:
            return []
        core = self._dispatcher.core
        runtime = self._runtime
        group = core.outside
        if runtime is not None:
            cpu = runtime.cpu
            if cpu.single_threaded or (self.kind == "ctas" and cpu.limit_cores is not None):
                return []
            if self.kind != "ctas":
                group = cpu
        return [
            Runner(group, self.pool_name, self.user, self.id, self.kind, is_task=True)
            for _ in range(count)
        ]

    def map(self, fn: Callable[[Task, T], R], items: Iterable[T]) -> list[R]:
        """``[fn(task, item) for item in items]`` on pool workers, results in order.

        While it waits, the calling thread runs its own pending tasks, so a
        query never deadlocks on workers its group or its callers hold. The
        first exception of a task is raised once every started task ended.
        """
        if self.state is not _RUNNING:
            raise FeatureNotSupported(f"map() on a {self.state.value} query")
        self._memory_state()  # created here, on this thread, for its tasks to share
        batch: _MapBatch[T, R] = _MapBatch(self, fn, list(items))
        if not batch.items:
            return []
        # on the main thread, signals wait until every task has ended and its worker
        # is back; SIGINT cancels the query meanwhile, so tasks stop at a checkpoint
        with Hold(self._interrupted):
            runners = batch.runners = self._task_runners(len(batch.items) - 1)
            self._batch = batch
            try:
                if runners:
                    self._dispatcher.submit_tasks(runners, batch)
                while batch.run_one():
                    pass
                self._dispatcher.withdraw_tasks(runners)
                batch.wait()
            finally:
                self._batch = None
        if batch.error is not None:
            raise batch.error
        return list(batch.results)
