"""Managed queries: resolve once, pass the gate, hold a worker, give it all back.

>>> with session.query(kind="select") as q:
...     for batch in batches:
...         q.checkpoint()
...         process(batch)

A query moves through :class:`~resgroups.query.QueryState` (NEW, ADMITTING,
RUNNING, SUSPENDED, DONE); what it holds meanwhile is one record, its
:class:`~resgroups.query.Holdings`, and every path out of a state gives
back through :meth:`Holdings.release`.

A query holds only what it uses (issue 29). Its ``__slots__`` are what every
query has: who and what it is, its holdings, the clock fields below, what
any thread of it may set (a cancel, a failure, ``q.scanned()``) and its CPU.
What a feature needs (rules, ``q.memory``, ``map``, ``on_cancel``, a fleet
fence, a cursor's suspension, a statement's fingerprint and estimate) is in
one :class:`~resgroups.query.extras.Extras`, made when the query first uses
one (``_extra is None`` until then), so an uncontended query's ``__exit__``
reads one field to find nothing to end. Entering writes out the counted
fast path (``_admit``'s first branch: a counted slot and worker, then the
checkpoint armed for a query that is never sliced); whatever must wait or be
sliced goes through :mod:`resgroups.query.waiting`. Per uncontended query
off the main thread (``perf/count_query_path.py``): 857 bytecodes, 18
Python calls, 12 C calls.

Time (every field on the engine's clock, ``engine.now``)
    ``_submitted_at``  when ``__enter__`` began;
    ``_timeout_at``    when the query timeout passes (inf: none); moved later by
                       the time a cursor spent suspended;
    ``_stop_at``       when every thread of the query must stop: ``_timeout_at``,
                       or -inf once it is cancelled or failed (tasks read it);
    ``_slice_end``     the end of the query thread's CPU slice (inf: unscheduled);
    ``_fence_at``      fleet mode: when the instance's fence passes, as last read;
    ``_check_at``      the one field ``checkpoint()`` compares with: the earliest of
                       ``_stop_at``, ``_slice_end``, ``_fence_at`` and the next
                       health probe (a quarter of the stall threshold away);
    ``_checked_at``    when a checkpoint last reached the slow path (a task's, any
                       checkpoint): a running query is *stalled* once it is older
                       than the stall threshold.
So ``checkpoint()`` is one clock read and one compare, and takes no lock:
``cancel()`` and ``fail()`` set ``_stop_at`` and ``_check_at`` to -inf from any
thread. The fleet's fence is kept on real monotonic time (the fleet's clock);
it enters a query's fields once, as the seconds it has left
(``fleet.modes.seconds_left``), added to the engine clock.

Unmanaged queries (kind "other", the feature disabled) take no slot and no
worker but still observe cancellation and the timeout.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from _thread import get_ident
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Final, TypeVar

from resgroups import interrupts
from resgroups.catalog.selectors import Attributes, Estimate
from resgroups.errors import (
    Error,
    FeatureNotSupported,
    InternalError,
    InvalidParameter,
    QueryCancelled,
    QueryTimeout,
)
from resgroups.fleet.modes import seconds_left
from resgroups.interrupts import (
    MAIN_IDENT,
    PENDING,
    Hold,
    end_main,
    hold_main,
    release_main,
)
from resgroups.query import cursors, native
from resgroups.query.extras import Extras
from resgroups.query.holdings import Holdings
from resgroups.query.memory import end_memory, memory_state
from resgroups.query.parallel import Task, run_map
from resgroups.query.progress import QueryProgress, progress_of
from resgroups.query.rules import (
    arm_rules,
    due,
    log_at_end,
    meter_for_rules,
    rules_for,
    watched,
)
from resgroups.query.states import (
    ADMITTING,
    DONE,
    KINDS,
    MANAGED_KINDS,
    NEW,
    RUNNING,
    SUSPENDED,
    Placement,
    QueryState,
)
from resgroups.query.waiting import (
    admit_slow,
    check_fence,
    promote,
    take_lane,
    ticket_and_runner,
)
from resgroups.sched.admission import Ticket
from resgroups.sched.cpu import METERED, RUNNER_RUNNING, Runner
from resgroups.sched.memory import MemoryCounter

if TYPE_CHECKING:
    from resgroups.engine import Engine
    from resgroups.sched.runtime import GroupRuntime
    from resgroups.session import Session

log = logging.getLogger("resgroups.query")
INF: Final = float("inf")  # read as one global on every query's path

T = TypeVar("T")
R = TypeVar("R")


class _ThreadToken(threading.local):
    """An object of each thread's own, made the first time the thread asks, and
    never the same for two threads while a query keeps one (``get_ident()`` is
    reused by the next thread to start once one has ended)."""

    def __init__(self) -> None:
        self.token = object()


_THREAD: Final = _ThreadToken()


class Query:
    """One managed (or unmanaged) query of a session; use it as a context manager."""

    __slots__ = (
        "__weakref__",
        "_cancelled",
        "_check_at",
        "_checked_at",
        "_cpu_mark",
        "_cpu_thread",
        "_engine",
        "_extra",
        "_failure",
        "_fence_at",
        "_now",
        "_placement",
        "_rules_at",
        "_slice_end",
        "_started_wall",
        "_stop_at",
        "_submitted_at",
        "_timeout_at",
        "admitted_at",
        "bytes_scanned",
        "cpu_ns",
        "held",
        "id",
        "kind",
        "pool_name",
        "rows_scanned",
        "session",
        "state",
        "statement",
        "user",
        "waited_s",
    )

    def __init__(
        self,
        session: Session,
        kind: str,
        pool: str,
        statement: str | None = None,
        fingerprint: str | None = None,
        estimate: Estimate | None = None,
    ) -> None:
        if kind not in KINDS:
            raise InvalidParameter(f"query kind {kind!r} is not one of {', '.join(KINDS)}")
        engine = session.engine
        if pool not in engine.pools:
            engine.pool(pool)  # an unknown pool fails here, naming the pools
        self.session = session
        self.kind = kind
        self.pool_name = pool
        self.user = session.user
        self.id = next(engine.query_ids)  # resource_group_queries().query_id
        self.state = NEW
        self.statement = statement  # the text the executor gave, if any
        self.held = Holdings(self)  # what it holds; the engine's registry keeps it too
        self._engine: Engine = engine
        self._now = engine.now  # the engine clock, for checkpoint()
        self._placement: Placement | None = None  # managed: where it runs
        # what only a query that uses a feature keeps (resgroups.query.extras)
        self._extra: Extras | None = (
            None if estimate is None and fingerprint is None else Extras(estimate, fingerprint)
        )
        # what any thread of it may set: why every thread stops (memory, fence, a
        # rule), and what the body read (q.scanned(), SPEC §16)
        self._cancelled = False
        self._failure: Error | None = None
        self.rows_scanned = self.bytes_scanned = 0
        # what it used: CPU charged to its group (while scheduled or metered), and
        # the thread's CPU clock when its worker was granted (0: not metered)
        self.cpu_ns = self._cpu_mark = 0
        self._cpu_thread: object = None  # whose clock the mark is (_THREAD.token)
        # the clock fields (the module's docstring); admitted_at stays 0 until its
        # first admission, waited_s is from submission to holding a slot and a worker
        self._submitted_at = self._checked_at = self._started_wall = 0.0
        self.admitted_at = self.waited_s = 0.0
        self._timeout_at = self._stop_at = self._check_at = INF
        self._slice_end = self._fence_at = self._rules_at = INF

    def _uses(self) -> Extras:
        """Its :class:`Extras`, made the first time a feature needs it: on the
        query's own thread, or before the query is shared (the module's memo)."""
        extra = self._extra
        if extra is None:
            extra = self._extra = Extras()
        return extra

    # ---- reading ---------------------------------------------------------------------

    @property
    def started_at(self) -> datetime | None:
        """The wall clock at submission (None: not entered yet)."""
        started = self._started_wall
        return datetime.fromtimestamp(started, UTC) if started else None

    @property
    def fingerprint(self) -> str | None:
        """The statement's fingerprint (SPEC §16), computed the first time a watch
        needs it, and kept once the query keeps :class:`Extras` (None: no statement)."""
        extra = self._extra
        if extra is not None and extra.fingerprint is not None:
            return extra.fingerprint
        if self.statement is None:
            return None
        fingerprint = self._engine.fingerprint(self.statement)
        if extra is not None:
            extra.fingerprint = fingerprint
        return fingerprint

    @property
    def rule(self) -> str | None:
        """The last runaway-query rule that acted on it (None: none)."""
        extra = self._extra
        return extra.rule if extra is not None else None

    @rule.setter
    def rule(self, name: str) -> None:
        self._uses().rule = name

    @property
    def moved_from(self) -> str | None:
        """The group a rule's MOVE took it from (None: not moved)."""
        extra = self._extra
        return extra.moved_from if extra is not None else None

    @moved_from.setter
    def moved_from(self, group: str) -> None:
        self._uses().moved_from = group

    @property
    def suspended_s(self) -> float:
        """Time it spent suspended (a cursor between pages): elapsed leaves it out."""
        extra = self._extra
        return extra.suspended_s if extra is not None else 0.0

    @property
    def leaked_bytes(self) -> int:
        """The tracked bytes it had not released when it ended."""
        extra = self._extra
        return extra.leaked_bytes if extra is not None else 0

    @property
    def group(self) -> str | None:
        """The group it resolved to (None: unmanaged, or not entered yet)."""
        return self.held.group

    @property
    def runtime(self) -> GroupRuntime | None:
        """The live state of the query's group (None: unmanaged)."""
        return self.held.runtime

    @property
    def timeout_at(self) -> float:
        """When the query timeout passes, on the engine clock (inf: none)."""
        return self._timeout_at

    @property
    def submitted_at(self) -> float:
        """When ``__enter__`` began, on the engine clock."""
        return self._submitted_at

    @property
    def _ticket(self) -> Ticket | None:
        """Its pass through the gate, if it has one (held in :attr:`held`)."""
        return self.held.ticket

    @property
    def _runner(self) -> Runner | None:
        """Its thread's claim on a worker, if it has one (held in :attr:`held`)."""
        return self.held.runner

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def max_workers(self) -> int:
        """How many workers this query's work may use at once: the size of its
        pool, capped by its group's CPU limit in whole cores (at least one). An
        embedded engine sizes its own threads by it (DuckDB's ``threads``)."""
        size = self._engine.pools[self.pool_name]
        runtime = self.held.runtime
        cpu = runtime.cpu if runtime is not None else None
        if cpu is None or cpu.limit_cores is None:
            return int(size)
        return max(1, min(int(size), int(cpu.cap)))

    @property
    def memory_ceiling(self) -> int | None:
        """The query's memory ceiling, fixed when it started (None: none)."""
        placement = self._placement
        return placement.ceiling if placement is not None else None

    def progress(self) -> QueryProgress | None:
        """Where this managed query stands now: queued, running, parked or suspended,
        and what it waits for (None: unmanaged, not started, or done)."""
        return progress_of(self)

    def task_workers(self) -> int:
        """The workers the tasks of its running ``map`` hold now."""
        batch = self._extra.batch if self._extra is not None else None
        return sum(r.state is RUNNER_RUNNING for r in batch.runners) if batch else 0

    def stalled(self, now: float) -> bool:
        """No checkpoint has reached the slow path for longer than the stall threshold."""
        return now - self._checked_at > self._engine.stall_threshold

    # ---- memory ----------------------------------------------------------------------

    @property
    def memory(self) -> MemoryCounter:
        """The accountant of this query's own thread (``allocate``/``release``)."""
        extra = self._uses()
        counter = extra.memory
        if counter is None:
            counter = extra.memory = MemoryCounter(memory_state(self))
        return counter

    # ---- checkpoints -------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Cooperative yield point: raises QueryCancelled or QueryTimeout when due."""
        if self._now() >= self._check_at:
            self._checkpoint_slow()

    def _checkpoint_slow(self) -> None:
        if self._failure is not None:
            raise type(self._failure)(self._failure.message)
        if self._cancelled:
            raise QueryCancelled(f"query cancelled [group={self.group}, user={self.user}]")
        extra = self._extra
        if extra is not None and extra.fence is not None:
            self._check_fence()
        now = self._now()
        if now >= self._timeout_at:
            raise QueryTimeout(
                f"query timeout [timeout={self._engine.query_timeout}s, group={self.group}, "
                f"user={self.user}]"
            )
        held = self.held
        runner = held.runner
        if held.metered_at is not None and now >= self._slice_end:
            with Hold(self._interrupted):  # sliced from here: a ticket and a runner
                runner = promote(self)
        if runner is not None and runner.scheduled and now >= self._slice_end:
            with Hold(self._interrupted):
                used = self._cpu_since_mark()
                self.cpu_ns += used
                # may park this thread until the scheduler gives it a worker again
                self._engine.dispatcher.slice_end(runner, used, self._wait_error, self._timeout_at)
                self._mark_cpu()
                take_lane(self)  # the competing groups may have changed
            now = self._now()
        if now >= self._rules_at:
            self.check_rules(now)
        self._arm(now)

    def check_rules(self, now: float, *, own_thread: bool = True) -> None:
        """Act on the rules of its group that are due (any thread of the query, at
        most once a slice): resgroups.query.rules.due."""
        due(self, now, own_thread=own_thread)

    def _meter_for_rules(self) -> None:
        meter_for_rules(self)  # resgroups.query.rules

    def _check_fence(self) -> None:
        check_fence(self)  # fleet mode: resgroups.query.waiting

    def _arm(self, now: float) -> None:
        """Set ``_check_at`` from ``now`` (the module's docstring): the stop time, the
        end of a new slice, the fence or the next health probe, whichever comes
        first. The probe makes the slow path run every quarter of the stall
        threshold, and the slow path notes when it ran (``_checked_at``), so the
        fast path stays one compare."""
        self._checked_at = now
        engine = self._engine
        check_at = now + engine.probe_s
        held = self.held
        runner = held.runner
        if (runner is not None and runner.scheduled) or held.metered_at is not None:
            slice_end = self._slice_end = now + engine.slice_s
            if slice_end < check_at:
                check_at = slice_end
        else:
            self._slice_end = INF
        if self._stop_at < check_at:
            check_at = self._stop_at
        if self._rules_at < check_at:  # runaway-query rules, once a slice
            check_at = self._rules_at
        extra = self._extra
        if extra is not None and extra.fence is not None:  # fleet mode: at the fence
            fence_at = self._fence_at = now + seconds_left(extra.fence)
            if fence_at < check_at:
                check_at = fence_at
        self._check_at = check_at
        if self._cancelled or self._failure is not None:  # cancel() or fail() ran meanwhile
            self._check_at = -INF

    # ---- failing and interrupting native work (on_cancel) ---------------------------------

    def fail(self, error: Error) -> None:
        """A task or thread of this query failed for good (memory limit): every
        other thread of the query raises it at its next checkpoint."""
        self._failure = error
        self._stop_at = self._check_at = -INF
        extra = self._extra
        if extra is not None and extra.watched:
            self._engine.deadlines.wake(self)

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback()`` once, on another thread, as soon as the query is
        cancelled, fails (a memory limit, a lost fleet lease), its query
        timeout passes or (fleet mode) the instance's fence passes, so that
        work inside one native call can be interrupted
        (``duckdb_connection.interrupt()``); the query then raises its error
        (QueryCancelled, QueryTimeout, CoordinationUnavailable) at its next
        checkpoint, as always. One timer thread watches every query's
        deadline; a callback that raises is logged, and none runs once
        ``__exit__`` has returned (resgroups.query.native)."""
        native.on_cancel(self, callback)

    def due_at(self) -> float:
        """When the on_cancel callbacks are due, on the engine clock (the watcher's)."""
        return native.due_at(self)

    def fire(self) -> None:
        """The watcher's thread: call each pending callback once."""
        native.fire(self)

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
        if self.state is not NEW:
            raise InternalError("a query is entered once")
        if get_ident() != MAIN_IDENT:
            self._enter()  # gives back what it took, if it fails
            return self
        hold_main(self._interrupted)  # wraps the handlers (a signal before finds nothing taken)
        try:
            interrupts.STATE.queries += 1  # the handlers stay wrapped until __exit__
            self.held.on_main_thread = True
            self._enter()
        except BaseException:
            try:
                self._leave()  # still held: give everything back first (if not already)
            finally:
                end_main()  # then deliver what is pending
            raise
        release_main()
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
        if self._cancelled:  # cancelled before it started: honoured for every kind
            self.state = DONE
            raise QueryCancelled(f"query cancelled before it started [user={self.user}]")
        self.state = ADMITTING
        engine = self._engine
        now = self._submitted_at = self._checked_at = self._now()
        self._started_wall = time.time()
        timeout = engine.query_timeout
        if timeout is not None:
            self._timeout_at = self._stop_at = self._check_at = now + timeout
        try:
            engine.open_query(self)
            # an unmanaged query resolves nothing: a dropped or forbidden choice
            # cannot fail what consumes nothing
            kind = self.kind
            if kind in MANAGED_KINDS:
                placement = self.session.placement(kind == "export", self._attributes)
                if placement is not None:
                    if self.statement is not None or placement.rules or self._extra is not None:
                        placement = self._place(placement)  # a watch, rules, q.memory
                    self._placement = placement
                    held = self.held
                    held.group = placement.group.name
                    runtime = held.runtime = placement.runtime
                    gate = runtime.gate.gate
                    dispatcher = engine.dispatcher
                    # _admit's fast path, written out (every query's path): nobody
                    # queued, a counted slot and worker free
                    if (
                        not gate.waiting
                        and not engine.admission.fenced
                        and (
                            taken := dispatcher.admit_counted(
                                gate, runtime.cpu, self.pool_name, self.user, now
                            )
                        )
                    ):
                        held.counted = True
                        self.admitted_at = now  # waited_s stays 0.0
                        # _arm(now) with no fence and no rules yet: the probe, the stop
                        # time, or while engaged its slice end (_checked_at is now)
                        check_at = now + engine.probe_s
                        if taken == METERED:  # charged as it leaves, or promoted
                            held.metered_at = now
                            self._cpu_mark = engine.cpu_meter()
                            self._cpu_thread = _THREAD.token
                            slice_end = self._slice_end = now + engine.slice_s
                            if slice_end < check_at:
                                check_at = slice_end
                        if self._stop_at < check_at:
                            check_at = self._stop_at
                        self._check_at = check_at
                        if self._cancelled or self._failure is not None:  # meanwhile
                            self._check_at = -INF
                    else:  # arms the checkpoint as it returns (_checked_at)
                        if gate.waiting or engine.admission.fenced:  # _admit's slow path
                            admit_slow(self, runtime, engine.admission)
                        else:
                            self._admit(now)
                        self.admitted_at = self._checked_at
                        self.waited_s = self._checked_at - now
                    if self._extra is not None:
                        arm_rules(self)
            self.state = RUNNING
        except BaseException:
            self._leave()
            raise

    def _place(self, placement: Placement) -> Placement:
        """Where a query with a statement, a group with rules, or a feature used
        before entry runs: ``placement``, or where a rule's watch on its
        statement moves it (or a refusal, RunawayQuery); its group's rules are
        looked up, and ``q.memory`` read before entry counts there."""
        if self.statement is not None:
            target = watched(self, placement.group)  # or refused (RunawayQuery)
            if target is not None:  # watched after a MOVE: admitted there at once
                placement = self._engine.placement(self.session, target)
        self._placement = placement
        held = self.held
        held.group = placement.group.name
        held.runtime = placement.runtime
        extra = self._extra
        if extra is not None and extra.memory is not None:  # q.memory read before entry
            extra.memory = MemoryCounter(memory_state(self))
        if placement.rules:  # most groups have no rules: then nothing is looked up
            self._uses().rules = rules_for(placement)
        return placement

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
        hold_main()
        try:
            self._leave()
        finally:
            end_main()  # and a signal's handler runs once everything is back

    def _interrupted(self, signum: int) -> None:
        """A signal arrived while a hold of this query was in force (signal handler
        context: flags only, no lock). SIGINT cancels, so a wait ends within one
        poll and the KeyboardInterrupt follows once everything is given back."""
        if signum == signal.SIGINT:
            self._cancelled = True
            self._stop_at = self._check_at = -INF

    # ---- admission ---------------------------------------------------------------------

    def _admit(self, now: float, *, front: bool = False) -> None:
        """Pass the gate, then take a worker (keeping the slot while waiting for one).

        The fast path first: when nobody waits in the group's queue or for a
        worker of the pool, the slot and the worker are taken together under the
        dispatcher's one lock, which every gate shares: by count, with no ticket
        or runner, while CPU scheduling is not engaged (``admit_counted``), else
        with a ticket and a runner to slice (``admit_at_once``). Otherwise it
        takes nothing, and the slow path runs the same state machines with
        their waits: the gate, the fleet lease, then a worker.
        """
        held = self.held
        runtime = held.runtime
        if runtime is None:
            raise InternalError("an unmanaged query has no gate to pass")
        engine = self._engine
        mode = engine.admission
        dispatcher = engine.dispatcher
        gate = runtime.gate.gate
        # read without the lock, as hints: somebody queued means no fast path (FIFO)
        if not mode.fenced and not gate.waiting:
            taken = dispatcher.admit_counted(gate, runtime.cpu, self.pool_name, self.user, now)
            if taken:
                held.counted = True
                # while engaged, metered: charged as it leaves, or promoted at a slice end
                if taken == METERED:
                    held.metered_at = now
                    self._mark_cpu()
                else:
                    self._cpu_mark = 0
                self._arm(now)
                return
            if dispatcher.core.engaged:
                ticket, runner = ticket_and_runner(self, runtime)
                if dispatcher.admit_at_once(gate, ticket, runner):
                    if runner.scheduled:
                        self._mark_cpu()
                    else:
                        self._cpu_mark = 0
                    take_lane(self)
                    self._arm(self._now())
                    return
        admit_slow(self, runtime, mode, front)

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
                f"[timeout={self._engine.query_timeout}s, group={self.group}]"
            )
        return None

    def _give_back(self) -> None:
        """Return the worker and the slot, whatever state they are in (the query's
        own thread: exit, suspend, a failed resume). A fault of the CPU meter
        does not keep the worker."""
        held = self.held
        engine = self._engine
        cpu_ns = 0
        try:
            runner = held.runner
            if (
                runner is not None and runner.scheduled and runner.state is RUNNER_RUNNING
            ) or held.metered_at is not None:
                cpu_ns = self._cpu_since_mark()
                self.cpu_ns += cpu_ns
        finally:
            held.release(engine.dispatcher, engine.admission, cpu_ns)

    def _leave(self) -> None:
        held = self.held
        if held.on_main_thread:  # the last main-thread query to leave lets handlers go back
            held.on_main_thread = False
            interrupts.STATE.queries -= 1
        state = self.state
        if state is DONE:
            return
        extra = self._extra
        engine = self._engine
        try:
            if extra is not None:  # it used a feature: end it first (rules, on_cancel)
                self._end_uses(extra, state)
            if held.counted and held.metered_at is None:  # nothing to charge: back by count
                held.release(engine.dispatcher, engine.admission, 0)
            elif (
                held.counted
                or held.ticket is not None
                or held.runner is not None
                or held.lease_id is not None
            ):
                self._give_back()
        finally:
            if extra is not None or held.published is not None:
                end_memory(self)
            self.state = DONE
            if state is SUSPENDED and held.runtime is not None:
                held.runtime.suspend(-1)
                held.suspended = False
            engine.close_query(self)

    def _end_uses(self, extra: Extras, state: QueryState) -> None:
        """Before it gives back what it holds: a last look by its rules (a fault
        there must not keep what it holds), and nothing interrupts it any more."""
        if extra.rules is not None and state in (RUNNING, SUSPENDED):
            try:
                log_at_end(self, extra.rules, self._now())
            except Exception:
                log.exception("%s: checking its rules at its end failed", self)
        if extra.watched:  # nothing interrupts the query once it has ended
            extra.on_cancel = ()
            self._engine.deadlines.unwatch(self)  # waits for a firing

    # ---- cursors -------------------------------------------------------------------

    def suspend(self) -> None:
        """Give the slot and the worker back between pages; memory stays charged
        (resgroups.query.cursors)."""
        cursors.suspend(self)

    def resume(self) -> None:
        """Pass the gate again; a refusal raises and leaves the query suspended."""
        cursors.resume(self)

    def _attributes(self) -> Attributes:
        """What selectors route this query on (SPEC §15)."""
        extra = self._extra
        estimate = extra.estimate if extra is not None else None
        return self.session.attributes(self.kind, self.statement, estimate)

    # ---- progress the body reports --------------------------------------------------

    def scanned(self, rows: int, nbytes: int = 0) -> None:
        """Report what the body read since its last report: ``rows`` and ``nbytes``
        add to ``rows_scanned`` and ``bytes_scanned`` (resource_group_queries(),
        and the rules on rows and bytes, SPEC §16). Any thread of the query."""
        if (
            not isinstance(rows, int)
            or isinstance(rows, bool)
            or not isinstance(nbytes, int)
            or isinstance(nbytes, bool)
            or rows < 0
            or nbytes < 0
        ):
            raise InvalidParameter(
                f"scanned({rows!r}, {nbytes!r}): rows and nbytes are integers >= 0"
            )
        self.rows_scanned += rows
        self.bytes_scanned += nbytes

    def _mark_cpu(self) -> None:
        """Read this thread's CPU clock: the mark its next charge counts from."""
        self._cpu_mark = self._engine.cpu_meter()
        self._cpu_thread = _THREAD.token

    def _cpu_since_mark(self) -> int:
        """This thread's CPU since the mark; 0 read on another thread than the mark's
        (one thread's clock says nothing of another's: a query entered on one
        thread and checkpointed or left on another is charged nothing for that
        stretch, and the next mark is the new thread's). Threads are told apart
        by a token of their own, not by ``get_ident()``, which a new thread
        reuses as soon as one has ended; never negative."""
        if _THREAD.token is not self._cpu_thread:
            return 0
        return max(0, self._engine.cpu_meter() - self._cpu_mark)

    def charge_cpu(self, nanos: int) -> None:
        """Charge ``nanos`` of CPU that threads resgroups does not run (an embedded
        engine's own) used for this query, with its own thread's CPU at its next
        slice end (SPEC §17): its group's weights, limit and rules see it. The
        query's own thread only; while its thread is not metered (scheduling not
        engaged and no rule on cpu_time) nothing is charged, as for its own CPU."""
        if not isinstance(nanos, int) or isinstance(nanos, bool) or nanos < 0:
            raise InvalidParameter(f"charge_cpu({nanos!r}): nanos is an integer >= 0")
        if self._cpu_mark:  # metered: the next reading includes it
            self._cpu_mark -= nanos

    # ---- cancellation and parallel work ---------------------------------------------

    def cancel(self) -> None:
        """Cancel from any thread: the query raises QueryCancelled at its next
        checkpoint, or at once if it waits in a queue or for a worker."""
        self._cancelled = True
        self._stop_at = self._check_at = -INF
        held = self.held
        ticket, runtime = held.ticket, held.runtime
        if ticket is not None and runtime is not None:
            runtime.gate.wake_queued(ticket)
        self._engine.dispatcher.wake_parked(held.runner)
        if held.seeking:
            self._engine.admission.wake_lease_waiters()  # a wait for a lease notices at once
        extra = self._extra
        if extra is not None and extra.watched:
            self._engine.deadlines.wake(self)  # interrupt native work now

    def map(self, fn: Callable[[Task, T], R], items: Iterable[T]) -> list[R]:
        """``[fn(task, item) for item in items]`` on pool workers, results in order.

        While it waits, the calling thread runs its own pending tasks, so a
        query never deadlocks on workers its group or its callers hold. The
        first exception of a task is raised once every started task ended
        (resgroups.query.parallel).
        """
        if self.state is not RUNNING:
            raise FeatureNotSupported(f"map() on a {self.state.value} query")
        memory_state(self)  # created here, on this thread, for its tasks to share
        return run_map(self, fn, items)
