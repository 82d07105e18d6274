"""A query that must wait, or will be sliced: its slow path through admission.

``Query._admit`` takes the fast path when it can (a counted slot and worker,
or a slot and a worker at once under the dispatcher's one lock); when a slot
or a worker would have to wait, nothing is taken and :func:`admit_slow` runs
the state machines with their waits, in order: the fleet's fence (fleet
mode), the gate's queue, what the admission mode holds after the slot (a
fleet lease), then a worker of the pool. Only here, and for a query whose
worker is scheduled, are a :class:`~resgroups.sched.admission.Ticket` and a
:class:`~resgroups.sched.cpu.Runner` made (:func:`ticket_and_runner`): a
query that never waits and is never sliced holds neither (issue 29).

A query that queued is usually handed everything by the query whose slot
it takes (``Dispatcher.leave``): the slot, a worker, and its lane, found
under the dispatcher's lock; it returns from the gate's wait without the
lock and takes nothing more. What the admission mode holds after the slot
is asked for only where the mode takes something then
(``AdmissionMode.after_slot_holds``: a fleet lease).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.errors import CoordinationUnavailable
from resgroups.fleet.modes import seconds_left
from resgroups.sched.admission import Ticket
from resgroups.sched.cpu import RUNNER_RUNNING, Runner

if TYPE_CHECKING:
    from resgroups.catalog.model import GroupDef
    from resgroups.fleet.modes import AdmissionMode
    from resgroups.query.lifecycle import Query
    from resgroups.sched.runtime import GroupRuntime


def ticket_and_runner(query: Query, runtime: GroupRuntime) -> tuple[Ticket, Runner]:
    """What a query that may wait or be sliced holds while it does: made now."""
    held = query.held
    ticket = held.ticket = Ticket(query.user, query._timeout_at)
    runner = held.runner = Runner(runtime.cpu, query.pool_name, query.user, query.id, query.kind)
    return ticket, runner


def promote(query: Query) -> Runner | None:
    """A query holding a counted slot and worker while engaged reached its first
    slice end: from here it holds a ticket and a runner, sliced like any
    (None: scheduling no longer engaged, it stays counted). Its CPU so far is
    charged at the slice end that follows, from its mark as for any runner."""
    held = query.held
    runtime = held.runtime
    assert runtime is not None
    ticket = Ticket(query.user, query._timeout_at)
    runner = Runner(runtime.cpu, query.pool_name, query.user, query.id, query.kind)
    granted_at = held.metered_at
    assert granted_at is not None
    if not query._engine.dispatcher.promote(runtime.gate.gate, ticket, runner, granted_at):
        return None
    held.counted, held.metered_at = False, None
    held.ticket, held.runner = ticket, runner
    return runner


def admit_slow(
    query: Query, runtime: GroupRuntime, mode: AdmissionMode, front: bool = False
) -> None:
    """The fleet's fence, the gate's queue, what the admission mode holds after
    the slot (a fleet lease), then a worker of the pool: each may wait."""
    held = query.held
    ticket, runner = held.ticket, held.runner
    if ticket is None or runner is None:
        ticket, runner = ticket_and_runner(query, runtime)
    dispatcher = query._engine.dispatcher
    if mode.fenced:  # fleet mode: nothing is admitted on what may have lapsed
        group = runtime.definition
        queue_timeout = group.queue_timeout_ms / 1000
        fence = query._uses().fence = mode.fence_for(group)
        if not (seconds_left(fence) > 0 and mode.fresh()):
            mode.prepare(group, min(query._timeout_at - query._now(), queue_timeout))
        if mode.fast and dispatcher.admit_at_once(runtime.gate.gate, ticket, runner):
            held.fenced = True  # it runs on the fence from here
            if seconds_left(fence) <= 0 or not mode.fresh():  # meanwhile
                hold_fence(query, group, queue_timeout)
            if runner.scheduled:
                query._mark_cpu()
            else:
                query._cpu_mark = 0
            take_lane(query)
            query._arm(query._now())
            return
    if mode.fast:  # who gives this ticket its slot may hand it a worker too
        ticket.runner = runner
    try:
        runtime.gate.enter(ticket, query._is_cancelled, mode.queued, front=front)
    finally:
        ticket.runner = None
    if mode.after_slot_holds:  # the local slot first, then the fleet's (SPEC §11)
        mode.after_slot(
            held,
            runtime,
            deadline=query._timeout_at,
            queue_deadline=query._now() + runtime.definition.queue_timeout_ms / 1000,
            cancelled=query._is_cancelled,
            now=query._now,
        )
    if runner.state is not RUNNER_RUNNING:  # not handed a worker with the slot
        # a worker is asked for once the slot is held: its arrival order counts
        # from here
        runner = held.runner = Runner(
            runtime.cpu, query.pool_name, query.user, query.id, query.kind
        )
        dispatcher.acquire(runner, query._wait_error, query._timeout_at)
    if mode.fenced:
        hold_fence(query, runtime.definition, runtime.definition.queue_timeout_ms / 1000)
    if runner.scheduled:
        query._mark_cpu()
    else:
        query._cpu_mark = 0
    take_lane(query)
    query._arm(query._now())


def take_lane(query: Query) -> None:
    """Holding a scheduled worker: its own thread runs at its group's priority
    lane while it holds it, where the process may put it back (its body and
    the map items it runs itself; sched/lanes.py). ``held.release`` restores it."""
    dispatcher = query._engine.dispatcher
    lanes = dispatcher.lanes
    held = query.held
    runner = held.runner
    if runner is not None and runner.lane is not None:  # found as it was handed the worker
        lane, runner.lane = runner.lane, None
        if runner.scheduled:
            held.nice = lanes.enter(lane, held.nice)
        return
    if not lanes.on and held.nice is None:
        return
    runtime = held.runtime
    if runner is not None and runner.scheduled and runtime is not None:
        lane = dispatcher.lane_of(runtime.group_id, query.pool_name)  # 0 once lanes are off
        held.nice = lanes.enter(lane, held.nice)


def hold_fence(query: Query, group: GroupDef, queue_timeout: float) -> None:
    """Fleet mode, once the slot is held: run on the fence from here. A query
    that waited in the queue across a lapse waits for the renewal first (the
    renewal fails the queries that run on the fence, not this one); one that
    finds the fence passed once it runs on it fails now."""
    mode = query._engine.admission
    fence = query._extra.fence if query._extra is not None else None
    assert fence is not None
    if seconds_left(fence) <= 0 or not mode.fresh():
        mode.prepare(group, min(query._timeout_at - query._now(), queue_timeout))  # or raise
        mode.recheck(query.held)  # what it took before the lapse may be gone: or raise
    query.held.fenced = True
    if seconds_left(fence) <= 0:
        query._check_fence()  # raises


def check_fence(query: Query) -> None:
    """Fleet mode: fail (for good, every thread of the query) once the
    instance's fence has passed: what it held may have been given to others;
    else note when to look again (any thread of the query may call this)."""
    fence = query._extra.fence if query._extra is not None else None
    assert fence is not None
    left = seconds_left(fence)
    if left <= 0:
        error = CoordinationUnavailable(
            f"this instance could not renew what it holds in the fleet in time "
            f"(a paused or partitioned process?): the slot of query {query.id} "
            f"[group={query.group}] may have been given to another process"
        )
        query.fail(error)
        raise CoordinationUnavailable(error.message)
    query._fence_at = query._now() + left
