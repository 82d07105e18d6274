"""What a managed query holds, in one record, and the one way to give it back.

A query holds at most: a slot of its group's gate (or a place in its queue),
a worker of its pool (or a place in the line for one), a fleet lease (lease
mode), the memory it published, a count among the suspended cursors of its
group, and a count among the main thread's queries in flight (while the
program's signal handlers stay wrapped, resgroups.interrupts). Each of them
has exactly one owner, :class:`Holdings`: the query changes it as it takes
and gives back, the admission mode (fleet/modes.py) keeps its lease here,
and the engine's registry keeps it, so that a query whose handle is lost
without ``__exit__`` (a thread that died) can still give everything back:
the reconcile loop finds its weak reference dead and calls
:meth:`Holdings.give_back` (SPEC: reconcile).

A query holds only what it uses. One admitted at once holds a *counted*
slot and a *counted* worker (``counted``), and no ticket or runner exists for
it (``Dispatcher.admit_counted``). While CPU scheduling is engaged its CPU is
metered (``metered_at``) and charged to its group as it leaves; if it runs to
the end of a slice it is *promoted*: from there it holds a
:class:`~resgroups.sched.admission.Ticket` and a
:class:`~resgroups.sched.cpu.Runner`, sliced as any (``query.waiting.promote``).
A query that must wait holds those two from the moment it waits, with their
state machines; a suspended cursor holds neither, and takes either again
when it resumes.

Invariants (what :meth:`Holdings.release` relies on)
    H1 ``ticket`` is None or in one of the gate of ``runtime``'s states (NEW,
       QUEUED, ACTIVE, or ended), and only this record names it;
    H2 ``runner`` is None or in one of the CPU scheduler's states (WAITING,
       RUNNING, DONE), and only this record names it;
    H3 ``lease_id`` is set from the moment a lease is sought until the mode
       has handed it to the release batcher;
    H4 ``counted`` excludes a ticket, a runner, a lease and a lane (``nice``
       is None: only a scheduled worker's thread takes its group's lane): a
       counted query holds one slot of ``runtime``'s gate and one worker of
       ``pool``, by count, in ``runtime``'s group and for ``user``;
    H5 ``metered_at`` (the engine time it took a metered worker, else None)
       implies ``counted``: the query's CPU since its mark is charged with
       the counted worker (``Dispatcher.leave_counted``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from resgroups import interrupts
from resgroups.errors import QueryCancelled
from resgroups.sched.admission import TICKET_ACTIVE, TICKET_QUEUED, Ticket
from resgroups.sched.cpu import RUNNER_RUNNING, Runner
from resgroups.sched.lanes import Lanes, Restore

if TYPE_CHECKING:
    from resgroups.errors import Error
    from resgroups.fleet.modes import AdmissionMode
    from resgroups.query.lifecycle import Query
    from resgroups.sched.memory import QueryMemory
    from resgroups.sched.pool import Dispatcher
    from resgroups.sched.runtime import GroupRuntime


class Holdings:
    """What one managed query holds now (see the module's docstring)."""

    __slots__ = (
        "counted",
        "fenced",
        "group",
        "lease_id",
        "leased",
        "metered_at",
        "nice",
        "on_main_thread",
        "pool",
        "published",
        "query_id",
        "query_ref",
        "runner",
        "runtime",
        "seeking",
        "suspended",
        "ticket",
        "unleased",
        "user",
    )

    def __init__(self, query: Query) -> None:
        self.query_id = query.id
        self.user = query.user
        self.pool = query.pool_name
        self.query_ref = weakref.ref(query)  # dead: the handle is lost (a zombie)
        self.group: str | None = None  # the group it resolved to (managed queries)
        self.runtime: GroupRuntime | None = None  # that group's live state
        self.ticket: Ticket | None = None  # its pass through the gate (H1)
        self.runner: Runner | None = None  # its thread's claim on a worker (H2)
        self.counted = False  # a counted slot and a counted worker, no ticket or runner (H4)
        self.metered_at: float | None = None  # counted while engaged: charged as it leaves (H5)
        self.published: QueryMemory | None = None  # its memory, once it tracks a byte
        self.lease_id: str | None = None  # fleet lease mode: named before it is sought (H3)
        self.seeking = False  # waiting for the fleet lease
        self.leased = False  # the fleet lease is held (its row exists), not just sought
        self.unleased = False  # admitted while the group had no limit: holds no lease (yet)
        self.fenced = False  # fleet mode: runs on the instance's fence (a lapse fails it)
        self.suspended = False  # counted among its group's suspended cursors
        self.on_main_thread = False  # counted in interrupts.STATE.queries
        self.nice: Restore | None = None  # its thread runs at its group's lane (sched/lanes.py)

    @property
    def admitted(self) -> bool:
        """Holding a slot of its group now (not queued, not suspended)."""
        ticket = self.ticket
        return self.counted or (ticket is not None and ticket.state is TICKET_ACTIVE)

    def release(self, dispatcher: Dispatcher, mode: AdmissionMode, cpu_ns: int) -> None:
        """Give back the worker (charging its last ``cpu_ns``), the slot or the place
        in the queue, and what the admission mode took after the slot (a fleet
        lease), whatever state each is in, and its thread's own nice after its
        lane. Idempotent: what it gives back leaves the record first. O(1) when
        the slot goes to nobody waiting."""
        runtime = self.runtime
        if self.counted and runtime is not None:  # by count, and never in a lane (H4)
            metered = self.metered_at is not None
            self.counted, self.metered_at = False, None
            dispatcher.leave_counted(
                runtime.gate.gate, runtime.cpu, self.pool, self.user, cpu_ns, metered
            )
            return
        nice, self.nice = self.nice, None
        if nice is not None:  # its thread took its group's lane
            Lanes.leave(nice)
        runner, self.runner = self.runner, None
        ticket, self.ticket = self.ticket, None
        self.fenced = False
        if (
            runner is not None
            and ticket is not None
            and runtime is not None
            and self.lease_id is None
            and runner.state is RUNNER_RUNNING
            and ticket.state is TICKET_ACTIVE
        ):  # the worker and the slot back under the dispatcher's one lock
            dispatcher.leave(runtime.gate.gate, ticket, runner, cpu_ns)
            return
        try:
            if runner is not None:
                dispatcher.release(runner, cpu_ns)
        finally:
            try:
                mode.give_back(self)
            finally:
                if ticket is not None and runtime is not None:
                    if ticket.state is TICKET_ACTIVE:
                        runtime.gate.leave(ticket)
                    elif ticket.state is TICKET_QUEUED:
                        runtime.gate.withdraw(ticket, QueryCancelled("query left the queue"))

    def give_back(self, dispatcher: Dispatcher, mode: AdmissionMode) -> int:
        """Everything, for a query whose handle is lost (the reconcile loop): the
        worker, the slot, the lease, its count among the suspended cursors and
        every byte; the bytes it still held."""
        self.leave_main_thread()
        runtime = self.runtime
        self.release(dispatcher, mode, 0)
        if self.suspended and runtime is not None:
            runtime.suspend(-1)
            self.suspended = False
        published, self.published = self.published, None
        return published.finish() if published is not None else 0

    def leave_main_thread(self) -> None:
        """It was in flight on the main thread and is not any more, though its
        ``__exit__`` never ran (a zombie reclaimed, the engine closed beneath it):
        the program's handlers may go back (resgroups.interrupts)."""
        if self.on_main_thread:
            self.on_main_thread = False
            interrupts.query_lost()

    def fail(self, error: Error) -> None:
        """The query's memory failed for good: tell the query, if it still lives."""
        query = self.query_ref()
        if query is not None:
            query.fail(error)
