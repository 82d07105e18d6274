"""Worker pools for real threads, driven by the CPU scheduler core (``cpu.py``).

A pool of size N has N workers and N threads. A managed query holds one
worker from entry to exit while its body runs on the caller's own thread
(except while it is parked by the scheduler or suspended); the pool's
threads run the parallel tasks of ``Query.map``, each holding a worker while
it runs, so at most N threads of a pool run query work at once.

Every decision (who gets a freed worker, renew or yield at a slice end) is
the core's, taken under one lock. This layer turns its answers into thread
wake-ups: a waiting query thread waits on its own event; a task granted a
worker goes to the pool's threads. Nobody runs a timer: a runner waiting
for its group's CPU budget wakes itself when the budget refills.

The fast path (every query's cost, SPEC §6): the gates share this lock, so
in the common case (the group below its limit with nobody queued, a free
worker with nobody waiting for one) a query takes its slot and its worker in
one step and gives both back in one. A query holds only what it uses: while
CPU scheduling is not engaged it is never sliced, so it takes a counted slot
and a counted worker (:meth:`Dispatcher.admit_counted`: ``Gate.count_in``,
``CpuScheduler.count_in``) and creates no ticket, runner or wake-up; while
scheduling is engaged it brings a ticket and a runner
(:meth:`Dispatcher.admit_at_once`: ``Gate.take_slot``,
``CpuScheduler.grant_at_once``). Each half is a method of the state machine
it changes, under that machine's invariants; when either would queue or
park, nothing changes and the query takes the slow path with a ticket and a
runner (``GateRuntime.enter``, then :meth:`Dispatcher.acquire`). Leaving
(:meth:`Dispatcher.leave`, :meth:`Dispatcher.leave_counted`) hands the
worker on with the slot when the slot goes to a queued query: the gate
gives its slot back first, then the worker goes straight to the query it
admitted (``CpuScheduler.hand_over``) or, when that is not exact, back to
the pool and to that query if it is still free (``CpuScheduler.grant_now``).
Whoever hands a query's thread its worker under the lock finds its lane
then (``Runner.lane``), so the woken thread takes neither the lock nor any
decision: it returns from its wait holding a slot and a worker.
``tests/test_fastpath.py`` runs random workloads with the fast path and
without it and compares every counter after every step.

Priority lanes (``lanes.py``): while scheduling is engaged, a pool whose
workers outnumber the CPUs runs each group's tasks on threads of its lane
(a fixed nice for life; threads per pool and lane start on demand from one
spawner thread and are kept), and a query's own thread runs at its lane
where the nice can come back (``query.waiting.take_lane``, ``Holdings.release``).
``Engine(oversubscribe=f)`` resizes each pool to ceil(f x workers) while
lanes are on (``CpuScheduler.resize``); the core's accounting is unchanged.

Faults: any exception from the core degrades the scheduler for good
(grants in arrival order, no slicing, the degraded gauge reads 1); the
operation is then retried in degraded mode.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import NamedTuple, Protocol, TypeVar

from resgroups.errors import EngineClosed, Error
from resgroups.sched.admission import Gate, Ticket, wake
from resgroups.sched.cpu import (
    METERED,
    RUNNER_DONE,
    RUNNER_RUNNING,
    RUNNER_WAITING,
    CpuScheduler,
    GroupCpu,
    Runner,
)
from resgroups.sched.lanes import Lanes, Privilege, WeightsAndLimits
from resgroups.sched.shares import Share
from resgroups.sched.wakeup import Wakeup

log = logging.getLogger("resgroups.sched")


T = TypeVar("T")


def _holds_worker(runner: Runner) -> bool:
    return runner.state is RUNNER_RUNNING


class CpuReading(NamedTuple):
    share: Share
    budget_ns: float | None  # fractional limits only
    limit_cores: float | None


class TaskWork(Protocol):
    def run_task(self, runner: Runner) -> None:
        """Run one pending task while ``runner`` holds a worker."""
        ...


class PoolView:
    """What a pool looks like from outside (tests, statistics)."""

    def __init__(self, dispatcher: Dispatcher, name: str) -> None:
        self._dispatcher = dispatcher
        self.name = name

    @property
    def free(self) -> int:
        return self._dispatcher.core.free[self.name]

    @property
    def waiting(self) -> int:
        core = self._dispatcher.core
        with self._dispatcher.lock:
            return sum(
                1
                for g in [*core.groups.values(), core.outside]
                for r in g.waiting.get(self.name, [])
                if not r.is_task
            )


class Dispatcher:
    """Threads over the scheduling core: one lock, an event per waiting query."""

    def __init__(
        self,
        pools: dict[str, int],
        now: Callable[[], float],
        *,
        slice_ms: float,
        granularity_ms: float,
        cpus: float | None = None,
        share_window_s: float = 10.0,
        lanes: bool = True,
        oversubscribe: float = 1.0,
        privilege: Privilege | None = None,
    ) -> None:
        self.core = CpuScheduler(
            pools,
            slice_ms=slice_ms,
            granularity_ns=round(granularity_ms * 1e6),
            cpus=cpus,
            share_window_s=share_window_s,
        )
        self.lock = threading.Lock()
        self.now = now
        self.fault_hook: Callable[[], None] | None = None  # tests inject scheduler faults
        self.fast_path = True  # False: every query takes the slow path (tests compare them)
        self._events: dict[Runner, Wakeup] = {}
        self._pending_work: dict[Runner, TaskWork] = {}
        self._closed = False
        # priority lanes (lanes.py): pool threads per (pool, lane), lane 0 made now,
        # the others (and lane 0's beyond the configured size) on demand
        self.lanes = Lanes(lanes, privilege, cpus)
        self._sizes = dict(pools)  # as configured; oversubscribed while lanes are on
        self._oversubscribe = oversubscribe
        # lanes act where the kernel has more of its threads than CPUs to choose among
        over_cpus = cpus or float(os.cpu_count() or 1)
        self._laned = frozenset(
            pool for pool, size in pools.items() if math.ceil(size * oversubscribe) > over_cpus
        )
        self._granted_tasks: dict[tuple[str, int], deque[tuple[Runner, TaskWork]]] = {}
        self._task_ready: dict[tuple[str, int], threading.Condition] = {}
        self._lane_threads: dict[tuple[str, int], int] = {}  # started or being started
        self._lane_idle: dict[tuple[str, int], int] = {}  # waiting for a task
        self._spawns: deque[tuple[str, int]] = deque()
        self._spawn_ready = threading.Condition(self.lock)
        self._threads: list[threading.Thread] = []
        for pool, size in pools.items():
            self._lane(pool, 0)
            self._lane_threads[(pool, 0)] = size
            for _ in range(size):
                self._start_thread(pool, 0)
        if self.lanes.supported:  # threads of other lanes start from one at lane 0
            self._start(threading.Thread(target=self._spawner, name="resgroups-lanes", daemon=True))

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def degraded(self) -> bool:
        return self.core.degraded

    # ---- the core, with faults contained ---------------------------------------------

    def _guarded(self, op: Callable[[], T]) -> T:
        """Run a core operation; a fault degrades the scheduler and retries (lock held)."""
        try:
            if self.fault_hook is not None and self.core.engaged and not self.core.degraded:
                self.fault_hook()
            return op()
        except Exception as exc:
            return self._degrade(exc, op)

    def _degrade(self, exc: Exception, retry: Callable[[], T]) -> T:
        """Lock held: a core fault degrades the scheduler for good; retry degraded."""
        if self.core.degraded:
            raise exc
        log.error("CPU scheduler fault, degrading to arrival order: %r", exc)
        self.core.degraded = True
        try:  # weights stop applying between checkpoints too
            self._set_lanes(False)
        except Exception as lanes_exc:
            log.error("turning priority lanes off after the fault failed: %r", lanes_exc)
        result = retry()
        # caps and budgets no longer apply: a runner waiting behind one takes a free
        # worker now (no clock wakes a wait behind a cap, only a worker's return)
        self._wake(self.core.dispatch(self.now()))
        return result

    def _wake(self, granted: list[Runner]) -> None:
        """Lock held: hand each granted runner its worker (a task: to a pool thread of
        its group's lane, started if none is idle)."""
        for runner in granted:
            work = self._pending_work.pop(runner, None)
            if work is not None:
                key = (runner.pool, self._lane_locked(runner.group.group_id, runner.pool))
                tasks = self._granted_tasks.get(key)
                if tasks is None:
                    tasks = self._lane(*key)
                tasks.append((runner, work))
                self._task_ready[key].notify()
                if len(tasks) > self._lane_idle[key]:
                    self._more_threads(key)
            else:
                event = self._events.get(runner)
                if event is not None:
                    event.set()

    # ---- query threads ------------------------------------------------------------------

    def acquire(self, runner: Runner, check: Callable[[], Error | None], deadline: float) -> None:
        """Block until ``runner`` (a query's own thread) holds a worker.

        ``check`` may end the wait with an error (cancelled, timed out); the
        runner then holds nothing.
        """
        with self.lock:
            if self._closed:
                raise EngineClosed("the worker pools are closed")
            now = self.now()
            try:  # _guarded, inlined on the per-query path
                if self.fault_hook is not None and self.core.engaged and not self.core.degraded:
                    self.fault_hook()
                granted = self.core.submit(runner, now)
            except Exception as exc:
                granted = self._degrade(exc, partial(self.core.submit, runner, now))
            if len(granted) != 1 or granted[0] is not runner:
                self._wake([r for r in granted if r is not runner])
            if runner.state is RUNNER_RUNNING:
                return
            event = self._events[runner] = Wakeup()
        self._wait(runner, event, check, deadline)

    def _wait(
        self,
        runner: Runner,
        event: Wakeup,
        check: Callable[[], Error | None],
        deadline: float,
    ) -> None:
        try:
            while True:
                with self.lock:
                    if runner.state is RUNNER_RUNNING:
                        return
                    error = check()
                    if self._closed:
                        error = EngineClosed("the worker pools are closed")
                    if error is not None:
                        self.core.release(runner, 0, self.now())  # leave the wait
                        raise error
                    now = self.now()
                    # a budget may have refilled: let the core hand out workers
                    granted = self._guarded(partial(self.core.dispatch, now))
                    self._wake([r for r in granted if r is not runner])
                    if _holds_worker(runner):
                        return
                    wake_at = min(self.core.next_wakeup(now), deadline)
                timeout = 0.25 if wake_at == math.inf else min(0.25, max(0.0005, wake_at - now))
                event.wait(timeout)
        finally:
            with self.lock:
                self._events.pop(runner, None)

    # ---- the fast path: a slot and a worker in one step, and back in one ------------

    def admit_counted(self, gate: Gate, group: GroupCpu, pool: str, user: str, now: float) -> int:
        """A counted slot of ``gate`` and a counted worker of ``pool`` for a query of
        ``user`` in ``group`` (COUNTED, or METERED while engaged: see
        ``CpuScheduler.count_in``), or nothing at all (0: one of them would
        have to wait, or the worker needs a runner now: a cap or budget on its
        group's path, the fair order, an oversubscribed pool, a lane of its
        own). While engaged the query becomes a runner at its first slice end
        (:meth:`promote`). The worker is taken first and given back if the slot
        is not free."""
        with self.lock:
            if self._closed or self.fault_hook is not None or not self.fast_path:
                return 0
            core = self.core
            lanes = self.lanes  # on only while engaged and not degraded
            # a runner's at once where its thread would run at a lane of its own (H4);
            # one that may not meter takes a runner anyway (its lane found only then)
            if (
                lanes.on
                and lanes.privilege is Privilege.FULL
                and (not core.meterable(group, pool) or self._lane_locked(group.group_id, pool))
            ):
                return 0
            taken = core.count_in(group, pool, now)
            if not taken or gate.count_in(user, now):
                return taken
            self._wake(core.count_out(group, pool, now, metered=taken == METERED))
            return 0

    def leave_counted(
        self,
        gate: Gate,
        group: GroupCpu,
        pool: str,
        user: str,
        cpu_ns: int = 0,
        metered: bool = False,
    ) -> None:
        """Give back a counted worker (``metered``: charging ``cpu_ns``) and a
        counted slot (:meth:`admit_counted`) under the one lock; wake whoever
        takes them."""
        with self.lock:
            now = self.now()
            try:
                granted = self.core.count_out(group, pool, now, cpu_ns, user, metered)
                if granted:
                    self._wake(granted)
            finally:
                admitted = gate.count_out(user, now)
                if admitted:
                    self._hand_on(admitted, now)

    def promote(self, gate: Gate, ticket: Ticket, runner: Runner, granted_at: float) -> bool:
        """A counted slot and metered worker (taken at ``granted_at``) of a query at
        its first slice end become ``ticket``'s and ``runner``'s, active and
        running, so that it is sliced from here (True); False while not engaged
        (it stays counted)."""
        with self.lock:
            if self._closed or self.fault_hook is not None:
                return False
            now = self.now()
            if not self.core.promote(runner.group, runner, now, granted_at):
                return False
            gate.promote(ticket)
            return True

    def admit_at_once(self, gate: Gate, ticket: Ticket, runner: Runner) -> bool:
        """A slot of ``gate`` and a worker for ``runner`` at once (True), or nothing
        at all (False: one of them would have to wait)."""
        with self.lock:
            if (
                not gate.has_room_now(ticket.user)
                or self._closed
                or self.fault_hook is not None
                or not self.fast_path
            ):
                return False
            now = self.now()
            if not self.core.grant_at_once(runner, now):
                return False
            gate.take_slot(ticket, now)  # its room was seen above, under this lock
            self._found_lane(runner)
            return True

    def leave(self, gate: Gate, ticket: Ticket, runner: Runner, cpu_ns: int) -> None:
        """Give back the worker of ``runner`` (charging ``cpu_ns``) and the slot of
        ``ticket`` under the one lock; wake whoever takes them. The slot first:
        when it goes to a queued query, the worker goes with it, straight
        (``CpuScheduler.hand_over``) or through the pool when another may take
        it first (``CpuScheduler.grant_now``), so the woken query has nothing
        left to take."""
        core = self.core
        with self.lock:
            now = self.now()
            admitted: list[Ticket] = []
            try:
                admitted = gate.release(ticket, now)
            finally:
                try:
                    if runner.state is RUNNER_RUNNING and self.fault_hook is None:
                        # the worker straight to the query the slot admitted, when
                        # nothing else could take it in between (hand_over)
                        waiter = admitted[0].runner if admitted and self.fast_path else None
                        if waiter is not None and core.hand_over(runner, cpu_ns, waiter, now):
                            admitted[0].runner = None
                            self._found_lane(waiter)
                        else:
                            self._wake(core.release_running(runner, cpu_ns, now))
                    elif runner.state is not RUNNER_DONE:  # waiting, or faults injected
                        self._wake(self._release_locked(runner, cpu_ns, now))
                finally:
                    self._hand_on(admitted, now)

    def _hand_on(self, admitted: list[Ticket], now: float) -> None:
        """Lock held: wake the tickets a freed slot admitted, each with a free worker
        when one is (``CpuScheduler.grant_now``), so that it has nothing left to take."""
        if not admitted:
            return
        if self.fast_path and self.fault_hook is None:
            for next_ticket in admitted:
                waiter = next_ticket.runner
                if waiter is not None:
                    next_ticket.runner = None
                    if self.core.grant_now(waiter, now):
                        self._found_lane(waiter)
        wake(admitted)

    def _found_lane(self, runner: Runner) -> None:
        """Lock held: the lane the thread of ``runner`` takes with the worker it was
        just handed, found now, so that the thread need not take the lock again
        to ask (``query.waiting.take_lane``)."""
        if self.lanes.on:
            runner.lane = self._lane_locked(runner.group.group_id, runner.pool)

    # ---- the slow path ----------------------------------------------------------------

    def release(self, runner: Runner, cpu_ns: int) -> None:
        """The runner gives its worker back (charging its last CPU), or leaves its wait."""
        with self.lock:
            if runner.state is not RUNNER_DONE:
                self._wake(self._release_locked(runner, cpu_ns, self.now()))

    def _release_locked(self, runner: Runner, cpu_ns: int, now: float) -> list[Runner]:
        try:  # _guarded, inlined on the per-query path
            if self.fault_hook is not None and self.core.engaged and not self.core.degraded:
                self.fault_hook()
            return self.core.release(runner, cpu_ns, now)
        except Exception as exc:
            return self._degrade(exc, partial(self.core.release, runner, cpu_ns, now))

    def slice_end(
        self, runner: Runner, cpu_ns: int, check: Callable[[], Error | None], deadline: float
    ) -> bool:
        """At the first checkpoint after a slice: True if it renewed in place; after a
        yield, blocks until the runner holds a worker again (or ``check`` fails)."""
        with self.lock:
            decision = self._guarded(lambda: self.core.slice_end(runner, cpu_ns, self.now()))
            self._wake(decision.granted)
            if decision.renew:
                return True
            event = self._events[runner] = Wakeup()
        self._wait(runner, event, check, deadline)
        return False

    def cpu_readings(self) -> dict[int, CpuReading]:
        """Per group: entitled and used CPU over the share window, and for a
        fractional limit the budget now (ns); one consistent moment."""
        with self.lock:
            now = self.now()
            core = self.core
            shares = core.fairness(now)
            return {
                gid: CpuReading(
                    shares.get(gid, Share(0.0, 0.0)), core.budget(gid, now), g.limit_cores
                )
                for gid, g in core.groups.items()
            }

    def blocked_by(self, runner: Runner) -> str | None:
        """Why a waiting runner has no worker: "cpu_budget", "cpu_limit" or "worker"
        (None: it is not waiting)."""
        with self.lock:
            return self.core.blocked_by(runner, self.now())

    def wake_parked(self, runner: Runner | None) -> None:
        """Wake a waiting runner so it re-checks (it was cancelled)."""
        if runner is None:
            return
        with self.lock:
            event = self._events.get(runner)
        if event is not None:
            event.set()

    # ---- tasks -----------------------------------------------------------------------------

    def submit_tasks(self, runners: list[Runner], work: TaskWork) -> None:
        """Offer tasks to the pools; each runs on a pool thread once granted a worker."""
        with self.lock:
            for runner in runners:
                self._pending_work[runner] = work
                granted = self._guarded(partial(self.core.submit, runner, self.now()))
                self._wake(granted)

    def withdraw_tasks(self, runners: list[Runner]) -> None:
        """Tasks not granted yet that are no longer needed (their query ran them itself)."""
        with self.lock:
            for runner in runners:
                if runner.state is RUNNER_WAITING:
                    self._pending_work.pop(runner, None)
                    self.core.release(runner, 0, self.now())

    def _lane_locked(self, group_id: int, pool: str) -> int:
        """Lock held: the lane of ``group_id``'s work in ``pool`` now."""
        lanes = self.lanes
        if not lanes.on:
            return 0
        now = self.now()
        lanes.note(group_id, now)
        lanes.refresh(now, self._busy_threads())
        return lanes.lane(group_id) if pool in self._laned else 0

    def _busy_threads(self) -> Iterator[tuple[int, int]]:
        """Lock held: each group with work, and its threads holding workers."""
        return ((g.group_id, len(g.running) + g.counted) for g in self.core.busy)

    def _set_lane_weights(self) -> None:
        """Lock held: every group's weight, and each limited group's own limit, to the
        lanes (an ALTER, a DROP, engagement), read at their next refresh (O(1) here:
        a DDL statement stays O(1) at 10,000 groups)."""
        self.lanes.set_weights_from(self._lane_weights)

    def _lane_weights(self) -> WeightsAndLimits:
        """Lock held (the lanes' refresh): what :meth:`_set_lane_weights` gives them."""
        groups = self.core.groups.items()
        return (
            [(gid, g.weight) for gid, g in groups],
            [(gid, g.limit_cores) for gid, g in groups if g.limit_cores is not None],
        )

    def lane_of(self, group_id: int, pool: str) -> int:
        """The lane a query of ``group_id`` runs at in ``pool`` now (0: lanes off)."""
        if not self.lanes.on:
            return 0
        with self.lock:
            return self._lane_locked(group_id, pool)

    def shown_lanes(self) -> dict[int, int] | None:
        """Each group's lane now (resource_groups()'s cpu_lane); None while lanes are off."""
        with self.lock:
            lanes = self.lanes
            if not lanes.on:
                return None
            lanes.refresh(self.now(), self._busy_threads())
            return {gid: lanes.lane(gid) for gid in self.core.groups}

    def _lane(self, pool: str, lane: int) -> deque[tuple[Runner, TaskWork]]:
        """Lock held: the task queue of ``pool``'s threads of ``lane``, made once."""
        key = (pool, lane)
        tasks = self._granted_tasks[key] = deque()
        self._task_ready[key] = threading.Condition(self.lock)
        self._lane_threads.setdefault(key, 0)
        self._lane_idle[key] = 0
        return tasks

    def _more_threads(self, key: tuple[str, int]) -> None:
        """Lock held: more tasks wait in a lane than its threads idle there: start one,
        while the lane has fewer threads than its pool has workers."""
        if self._lane_threads[key] < self.core.sizes[key[0]] and not self._closed:
            self._lane_threads[key] += 1
            self._spawns.append(key)
            self._spawn_ready.notify()

    def _spawner(self) -> None:
        """Starts lane threads, from a thread at the process's own priority (a new
        thread inherits its creator's nice, and without privilege one raised
        cannot come down)."""
        while True:
            with self.lock:
                while not self._spawns and not self._closed:
                    self._spawn_ready.wait()
                if self._closed:
                    return
                pool, lane = self._spawns.popleft()
            self._start_thread(pool, lane)

    def _start_thread(self, pool: str, lane: int) -> None:
        count = len(self._threads)
        self._start(
            threading.Thread(
                target=self._serve,
                args=(pool, lane),
                name=f"resgroups-{pool}-{count}" + (f"-lane{lane}" if lane else ""),
                daemon=True,
            )
        )

    def _start(self, thread: threading.Thread) -> None:
        self._threads.append(thread)  # list.append: atomic, no lock needed
        thread.start()

    def _serve(self, pool: str, lane: int = 0) -> None:
        if lane or self.lanes.supported:
            self.lanes.join_lane(lane)
        key = (pool, lane)
        ready = self._task_ready[key]
        tasks = self._granted_tasks[key]
        idle = self._lane_idle
        while True:
            with self.lock:
                while not tasks and not self._closed:
                    idle[key] += 1
                    ready.wait()
                    idle[key] -= 1
                if self._closed:
                    return
                runner, work = tasks.popleft()
            try:
                work.run_task(runner)  # records the task's own errors for its query
            except BaseException as exc:
                log.error("worker %s: task machinery failed: %r", pool, exc)
            finally:
                self.release(runner, runner.pending_cpu_ns)

    # ---- engagement and shutdown -----------------------------------------------------------

    def set_engaged(self, engaged: bool) -> None:
        with self.lock:
            if self.core.engaged == engaged:
                return
            self.core.set_engaged(engaged, self.now())
            # caps and budgets apply (or stop applying): hand out what may go now
            self._wake(self._guarded(partial(self.core.dispatch, self.now())))
            self._set_lanes(engaged)

    def _set_lanes(self, engaged: bool) -> None:
        """Lock held: lanes on or off, and the pools oversubscribed while they are on."""
        lanes = self.lanes
        lanes.engage(engaged and not self.core.degraded and bool(self._laned))
        if not lanes.supported:
            return
        self._set_lane_weights()
        if self._oversubscribe == 1:
            return
        for pool, size in self._sizes.items():
            target = math.ceil(size * self._oversubscribe) if lanes.on else size
            self._wake(self._guarded(partial(self.core.resize, pool, target, self.now())))

    def configure(
        self,
        group_id: int,
        name: str,
        weight: int,
        limit_cores: float | None,
        policy: str,
        *,
        parent: int | None = None,
    ) -> None:
        """ALTER online; ``parent`` (the id of the group it is nested in, None at the
        top) moves it in the core's tree with its runners, waiting or running."""
        with self.lock:
            granted = self._guarded(
                lambda: self.core.configure(
                    group_id, name, weight, limit_cores, policy, self.now(), parent=parent
                )
            )
            self._wake(granted)
            if self.lanes.supported:  # a weight changed: every group's lane may have
                self._set_lane_weights()

    def check_invariants(self) -> None:
        with self.lock:
            self.core._check_invariants(self.now())

    def close(self, timeout: float = 5.0) -> None:
        with self.lock:
            self._closed = True
            for ready in self._task_ready.values():
                ready.notify_all()
            self._spawn_ready.notify_all()
            for event in self._events.values():
                event.set()
        for thread in list(self._threads):
            thread.join(timeout)
