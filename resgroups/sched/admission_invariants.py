"""The invariants of an admission gate, checked (SPEC §6, §14). I1-I9 are stated
in ``sched/admission.py``'s memo; :func:`check_invariants` recomputes each
from the gate's tickets, queue views and counts, and raises
:class:`~resgroups.errors.InternalError` naming every one broken.
``Gate._check_invariants`` calls it, for the stateful tests after every
step; it reads every queued ticket and runs on no query's path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.errors import InternalError
from resgroups.sched.admission_records import (
    TICKET_ACTIVE,
    TICKET_QUEUED,
    Ticket,
    _by_arrival,
    _first_deadline,
)

if TYPE_CHECKING:
    from resgroups.sched.admission import Gate


def check_invariants(gate: Gate) -> None:
    problems = []
    in_order = gate.queued_tickets()
    queued = set(in_order)
    if len(queued) != len(in_order):
        problems.append("a ticket is queued twice")
    if gate.waiting != len(in_order):
        problems.append(f"waiting {gate.waiting} != {len(in_order)} queued")
    by_user = [t for mine in gate._by_user.values() for t in mine if t.state is TICKET_QUEUED]
    if gate._per_user != gate._uses_per_user():
        problems.append("the per-user view is kept when it is not used, or not kept")
    if sorted(by_user, key=_by_arrival) != (
        sorted(in_order, key=_by_arrival) if gate._per_user else []
    ):
        problems.append("the per-user view of the queue is not the queue")
    arrivals = [t.arrival for t in gate._queue]
    if arrivals != sorted(arrivals):
        problems.append("the queue is not in arrival order")
    by_deadline = [e[2] for e in gate._deadlines if e[2].state is TICKET_QUEUED]
    if set(by_deadline) != queued or len(by_deadline) != len(in_order):
        problems.append("the deadline view and the arrival view of the queue differ")
    if any(e[0] != _first_deadline(e[2]) for e in gate._deadlines):
        problems.append("a deadline in the heap is not its ticket's")
    if queued & gate._active:
        problems.append("a ticket is both active and queued")
    if any(t.state is not TICKET_ACTIVE for t in gate._active):
        problems.append("an active ticket is not in state ACTIVE")
    if gate.counted < 0:
        problems.append(f"{gate.counted} counted slots")
    if gate.load > gate._limit():
        problems.append(f"{gate.load} active above the limit {gate._limit()}")
    if gate.nested:
        problems += tree_problems(gate, in_order)
    elif in_order and gate._has_room():
        problems.append("a ticket waits while a slot is free")
    max_queued = gate.config.max_queued
    if max_queued is not None and len(in_order) > max(max_queued, gate._queue_grandfathered):
        problems.append(f"{len(in_order)} queued above max_queued_queries {max_queued}")
    by_ticket: dict[str, int] = {}
    for t in gate._active:
        by_ticket[t.user] = by_ticket.get(t.user, 0) + 1
    if sum(gate._held.values()) != gate.active or any(
        gate._held.get(user, 0) < n for user, n in by_ticket.items()
    ):
        problems.append(
            f"held slots per user {gate._held} are not the tickets' {by_ticket} "
            f"and {gate.counted} counted"
        )
    if problems:
        raise InternalError(
            f"admission gate of {gate.config.name} broken: {'; '.join(problems)}; "
            f"active={sorted(t.seq for t in gate._active)} counted={gate.counted} "
            f"queue={[t.seq for t in in_order]} config={gate.config}"
        )


def tree_problems(gate: Gate, in_order: list[Ticket]) -> list[str]:
    """I7-I9 of a gate in a tree (see "Nested groups" in ``admission.py``'s memo)."""
    problems = []
    if any(gate._admissible(t.user) for t in in_order):
        problems.append("a ticket waits that could be admitted at every level")
    if gate.below != sum(c.load for c in gate.children):
        problems.append(f"below {gate.below} is not the children's slots")
    if gate.waiting_below != sum(c.waiting + c.waiting_below for c in gate.children):
        problems.append(f"waiting_below {gate.waiting_below} is not the children's queues")
    held: dict[str, int] = {}
    for child in gate.children:
        for user in {*child._held, *child._held_below}:
            held[user] = held.get(user, 0) + child.held_by(user)
    if held != gate._held_below:
        problems.append(f"held below {gate._held_below} is not the children's {held}")
    if gate.parent is not None and gate not in gate.parent.children:
        problems.append("not among its parent's children")
    return problems
