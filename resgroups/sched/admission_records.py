"""The admission gate's records (SPEC §6): a :class:`Ticket`, its states, a
group's :class:`GateConfig`, and the counters that order a queue. The gate
that keeps them is ``sched/admission.py`` (its memo states the design and
the invariants I1-I9); every name here is importable from there too.

A ticket's states
    NEW, then QUEUED (waiting in one gate's queue) or ACTIVE (holding a
    slot) or REJECTED (the queue full); a queued ticket ends ACTIVE,
    EXPIRED (a deadline passed) or WITHDRAWN (cancelled, the engine
    closing); an active one ends RELEASED. The per-query path compares
    ``ticket.state`` with the ``TICKET_*`` module constants.

Order
    ``_ARRIVALS`` numbers every ticket queued at any gate, so the gates of a
    tree compare arrivals; a ticket put at the head of a queue takes its
    number from ``_FRONTS``, below every other. A queue's two views sort by
    ``_by_arrival`` and by ``_first_deadline``, which never change while a
    ticket is queued.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Final

from resgroups.errors import Error
from resgroups.sched.wakeup import Wakeup

if TYPE_CHECKING:
    from resgroups.sched.admission import Gate
    from resgroups.sched.cpu_records import Runner


class TicketState(Enum):
    NEW = "new"
    QUEUED = "queued"
    ACTIVE = "active"
    RELEASED = "released"
    REJECTED = "rejected"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


# The states as module constants, imported where the per-query path compares
# with them: reading an enum member through its class runs the enum metaclass's
# attribute hook, a global is a dict read.
TICKET_NEW: Final = TicketState.NEW
TICKET_QUEUED: Final = TicketState.QUEUED
TICKET_ACTIVE: Final = TicketState.ACTIVE
TICKET_RELEASED: Final = TicketState.RELEASED
TICKET_REJECTED: Final = TicketState.REJECTED
TICKET_EXPIRED: Final = TicketState.EXPIRED
TICKET_WITHDRAWN: Final = TicketState.WITHDRAWN


_SEQ: Final = itertools.count()
# Enqueue order, shared by every gate so that a tree's gates compare arrivals
# (SPEC §14: a parent admits its subtree's waiters in arrival order); tickets put
# at the head of a queue take numbers below every other, in their own order.
_ARRIVALS: Final = itertools.count()
_FRONTS: Final = itertools.count(-(2**62))


class Ticket:
    """One pass of one query through a gate, for a query that may wait (one that
    is admitted at once holds a counted slot instead: ``Gate.count_in``); a
    resumed cursor takes a new one."""

    __slots__ = (
        "arrival",
        "enqueued_at",
        "error",
        "gate",
        "query_deadline",
        "queue_deadline",
        "runner",
        "seq",
        "state",
        "user",
        "wake",
    )

    def __init__(self, user: str, query_deadline: float = math.inf) -> None:
        self.user = user
        self.query_deadline = query_deadline  # submission + the instance query timeout
        self.seq = next(_SEQ)
        self.state = TICKET_NEW
        self.enqueued_at = 0.0
        self.queue_deadline = math.inf
        self.arrival = 0  # the gate's enqueue counter: the queue's order
        self.error: Error | None = None  # why the wait ended, when not in a slot
        self.wake: Wakeup | None = None  # set by GateRuntime on a change, while queued
        self.gate: Gate | None = None  # the gate it queued at (a tree admits across gates)
        # the query's runner, while queued: whoever gives a slot to this ticket may
        # hand it a free worker too, so that the woken query has nothing left to take
        # (Dispatcher.leave)
        self.runner: Runner | None = None

    def __repr__(self) -> str:
        return f"<Ticket #{self.seq} {self.user} {self.state.value}>"


@dataclass(frozen=True)
class GateConfig:
    """The admission settings of a group (a copy of its catalog definition)."""

    name: str
    max_active: int | None = None
    max_queued: int | None = None
    queue_timeout_ms: int = 30_000
    policy: str = "fifo"
    max_per_user: int | None = None  # max_active_queries_per_user: one user's slots (subtree)


def _by_arrival(ticket: Ticket) -> int:
    return ticket.arrival


def _first_deadline(ticket: Ticket) -> float:
    return min(ticket.queue_deadline, ticket.query_deadline)
