"""A managed query's fast path: a slot and a worker in one step, and back in one.

Goal
    The per-query cost every user pays (SPEC §6, docs/queries.md "Cost"): in
    the common case (the group below its limit with nobody queued, a free
    worker with nobody waiting for one in the pool) a query takes its slot
    and its worker under the dispatcher's one lock, which every gate of the
    engine shares, in straight-line code, and gives both back the same way.

What it is
    :func:`admit` is ``Gate.submit`` followed by ``CpuScheduler.submit`` for
    exactly the case where both succeed at once. It first checks that both
    would (what ``Gate.has_room_now`` and ``CpuScheduler.may_grant_now``
    check, written out; ``CpuScheduler._may_run`` itself while scheduling is
    engaged), then makes the changes ``Gate._admit`` makes in that case,
    written out too, and grants the worker through ``CpuScheduler._grant``.
    Writing out the checks and the gate's part saves about 0.3 µs on a path
    of about 6; the scheduler's transitions (``_grant``, ``_unhold``) are
    called, at about 0.1 µs, so that each has one version. When either
    would queue or park, it changes nothing and returns False: the query
    takes the slow path (the gate's ``enter``, then ``Dispatcher.acquire``),
    with the same state machines.
    :func:`leave` is ``CpuScheduler.release`` (handing the worker on only
    when somebody may take it) and ``Gate.release`` under one lock; when the
    slot goes to the first queued query and a worker is free, the worker
    goes with it (``CpuScheduler.grant_now``), so the woken query has
    nothing left to take.

How it is checked
    ``tests/test_fastpath.py`` runs random workloads through an engine with
    the fast path and one without, and compares every counter after every
    step; the gate's and the scheduler's invariant checks hold throughout.
    Its unit tests check the worker handed on with a slot, and not handed
    on when the freed worker goes to a query already waiting for one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.sched.admission import TICKET_ACTIVE, Gate, Ticket, wake
from resgroups.sched.cpu import RUNNER_DONE, RUNNER_RUNNING, Runner

if TYPE_CHECKING:
    from resgroups.sched.pool import Dispatcher


def admit(dispatcher: Dispatcher, gate: Gate, ticket: Ticket, runner: Runner) -> bool:
    """Take a slot of ``gate`` and a worker for ``runner`` at once (True), or
    nothing at all (False: one of them would have to wait)."""
    core = dispatcher.core
    pool = runner.pool
    g = runner.group
    active = gate._active
    with dispatcher.lock:
        limit = gate.config.max_active
        if (
            gate.waiting  # Gate.has_room_now: nobody queued, a slot free
            or (limit is not None and len(active) >= limit)
            or not core.free[pool]  # CpuScheduler.may_grant_now: a worker free, nobody
            or core.waiting_in[pool]  # waiting for one
            or dispatcher._closed
            or dispatcher.fault_hook is not None
            or not dispatcher.fast_path
        ):
            return False
        now = dispatcher.now()
        engaged = core.engaged and not core.degraded
        if engaged and g.charged:
            if not core._may_run(runner, now):  # its group's CPU cap or budget
                return False
            if g not in core.busy:
                core._place(g)  # an idle group becoming runnable: no banking
        # Gate._admit (nobody queued: the demand is the slots held)
        ticket.state = TICKET_ACTIVE
        active.add(ticket)
        if len(active) > gate.demand_peak:
            gate.demand_peak = len(active)
        user = ticket.user
        held = gate._held
        held[user] = held.get(user, 0) + 1
        gate._last_admitted[user] = now
        gate.admitted_total += 1
        # CpuScheduler.submit granting at once
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
            if runner.state is RUNNER_RUNNING and dispatcher.fault_hook is None:
                # CpuScheduler.release of a running runner
                if runner.scheduled:
                    core._charge(runner, cpu_ns, now)
                core._unhold(runner, now)
                runner.state = RUNNER_DONE
                if core.waiting_in[runner.pool] or runner.group.limited:
                    dispatcher._wake(core.dispatch(now, core._freed(runner)))
            elif runner.state is not RUNNER_DONE:  # waiting, or faults injected: the slow path's
                dispatcher._wake(dispatcher._release_locked(runner, cpu_ns, now))
        finally:
            admitted = gate.release(ticket, now)
            if admitted:
                if dispatcher.fast_path and dispatcher.fault_hook is None:
                    for next_ticket in admitted:  # a free worker goes with the slot
                        waiter = next_ticket.runner
                        if waiter is not None:
                            next_ticket.runner = None
                            core.grant_now(waiter, now)
                wake(admitted)
