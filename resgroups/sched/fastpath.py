"""A managed query's fast path: a slot and a worker in one step, and back in one.

Goal
    The per-query cost every user pays (SPEC §6, docs/queries.md "Cost"): in
    the common case (the group below its limit with nobody queued, a free
    worker with nobody waiting for one in the pool) a query takes its slot
    and its worker under the dispatcher's one lock, which every gate of the
    engine shares, in straight-line code, and gives both back the same way.

What it is
    :func:`admit` is ``Gate.submit`` followed by ``CpuScheduler.submit`` for
    exactly the case where both succeed at once: it first checks that both
    would (``Gate.has_room_now``, ``CpuScheduler.may_grant_now``, the same
    predicates the slow path's methods use), then makes the changes those
    methods make in that case, through the same ``Gate._admit`` and
    ``CpuScheduler._grant``. When either would queue or park, it changes
    nothing and returns False: the query takes the slow path (the gate's
    ``enter``, then ``Dispatcher.acquire``), with the same state machines.
    :func:`leave` is ``CpuScheduler.release`` (handing the worker on only
    when somebody may take it) and ``Gate.release`` under one lock.

How it is checked
    ``tests/test_fastpath.py`` runs random workloads through an engine with
    the fast path and one without, and compares every counter after every
    step; the gate's and the scheduler's invariant checks hold throughout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.sched.admission import Gate, Ticket, wake
from resgroups.sched.cpu import Runner, RunnerState

if TYPE_CHECKING:
    from resgroups.sched.pool import Dispatcher

_RUNNING = RunnerState.RUNNING
_DONE = RunnerState.DONE


def admit(dispatcher: Dispatcher, gate: Gate, ticket: Ticket, runner: Runner) -> bool:
    """Take a slot of ``gate`` and a worker for ``runner`` at once (True), or
    nothing at all (False: one of them would have to wait)."""
    core = dispatcher.core
    with dispatcher.lock:
        if dispatcher.closed or dispatcher.fault_hook is not None or not dispatcher.fast_path:
            return False
        now = dispatcher.now()
        if not gate.has_room_now() or not core.may_grant_now(runner, now):
            return False
        # what Gate.submit and CpuScheduler.submit do in this case, without
        # checking again what the two predicates above just said
        gate._admit(ticket, now)
        g = runner.group
        if core.engaged and g.charged and g not in core.busy:
            core._place(g)  # an idle group becoming runnable: no banking
        runner.fresh = True
        runner.runnable_since = now
        core._grant(runner, now)
        return True


def leave(dispatcher: Dispatcher, gate: Gate, ticket: Ticket, runner: Runner, cpu_ns: int) -> None:
    """Give back the worker of ``runner`` (charging ``cpu_ns``) and the slot of
    ``ticket`` under the one lock; wake whoever takes them."""
    core = dispatcher.core
    with dispatcher.lock:
        now = dispatcher.now()
        try:
            if runner.state is _RUNNING and dispatcher.fault_hook is None:
                # CpuScheduler.release of a running runner
                if runner.scheduled or cpu_ns:
                    core._charge(runner, cpu_ns, now)
                core._unhold(runner, now)
                runner.state = _DONE
                if core.waiting_in[runner.pool] or runner.group.limit_cores is not None:
                    dispatcher._wake(core.dispatch(now, core._freed(runner)))
            elif runner.state is not _DONE:  # waiting, or faults injected: the slow path's
                dispatcher._wake(dispatcher._release_locked(runner, cpu_ns, now))
        finally:
            wake(gate.release(ticket, now))
