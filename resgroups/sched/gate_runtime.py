"""The admission gate for real threads (SPEC §6): :class:`GateRuntime` wraps a
:class:`~resgroups.sched.admission.Gate` (a pure state machine) with a lock
and a wake-up per waiting ticket; :func:`wake` wakes the tickets a change
admitted or ended. Both are importable from ``sched/admission.py`` too.

Waiting
    A queued ticket's thread waits at once; nothing runs on a timer: each
    waiter wakes by its own first deadline (or the 0.25 s poll for
    cancellation, ``_POLL_S``) and then expires whatever is due. Whoever
    changes the gate wakes the tickets it changed. A woken ticket's state is
    read once before the lock: it is set under the lock before the wake-up,
    and only its own query gives the slot back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from resgroups.errors import Error, QueryCancelled
from resgroups.sched.admission_records import (
    TICKET_ACTIVE,
    TICKET_QUEUED,
    GateConfig,
    Ticket,
)
from resgroups.sched.wakeup import Wakeup

_POLL_S: Final = 0.25  # a queued query looks at its cancellation at least this often


def wake(tickets: list[Ticket]) -> None:
    """Wake the waiters of tickets whose state changed."""
    for ticket in tickets:
        if ticket.wake is not None:
            ticket.wake.set()


class GateRuntime:
    """A :class:`Gate` for real threads: a lock, and an event per waiting ticket.

    ``enter`` blocks until the ticket is admitted or its wait ends (timeout,
    cancellation, rejection). Whoever changes the gate wakes the tickets it
    changed; a waiter whose deadline passes expires the due tickets itself,
    so no timer thread is needed.

    ``lock`` may be shared: an engine's gates all use its dispatcher's lock,
    so that a query's fast path takes a slot and a worker under one lock
    (``Dispatcher.admit_counted``, ``Dispatcher.admit_at_once``). Nothing here takes
    another lock while holding it.
    """

    def __init__(
        self, config: GateConfig, now: Callable[[], float], lock: threading.Lock | None = None
    ) -> None:
        # imported here: admission.py imports this module to re-export its names
        from resgroups.sched.admission import Gate

        self.gate = Gate(config)
        self.lock = lock if lock is not None else threading.Lock()
        self.now = now

    _wake = staticmethod(wake)

    def enter(
        self,
        ticket: Ticket,
        cancelled: Callable[[], bool] | None = None,
        queued: Callable[[], None] | None = None,
        *,
        front: bool = False,
    ) -> None:
        """Block until ``ticket`` holds a slot; raise why not otherwise. ``queued``
        is called once the ticket waits in the queue (fleet quota mode asks for
        more quota then); ``front`` queues it at the head."""
        lock, gate = self.lock, self.gate
        with lock:
            now = self.now()
            if gate.submit(ticket, now, front=front):
                return
            wake = ticket.wake = Wakeup()
        # queued: a cancel() from now on finds the wake-up set above, so one that
        # came earlier is the only one to look for before the first wait; nothing
        # is due yet (the ticket's own deadlines were checked as it queued, and
        # every other waiter expires what is due when its own wait ends)
        if queued is not None:
            queued()
        timeout = min(ticket.queue_deadline, ticket.query_deadline) - now
        if cancelled is not None and cancelled():
            timeout = 0.0  # cancelled before its wake-up was set: look at once
        while True:
            wake.wait(_POLL_S if timeout > _POLL_S else timeout if timeout > 0 else 0.0)
            state = ticket.state  # set under the lock before the wake-up, and only its
            if state is TICKET_ACTIVE:  # own query gives the slot back: seen without the lock
                return
            with lock:
                state = ticket.state
                if state is TICKET_ACTIVE:
                    return
                if state is TICKET_QUEUED:
                    if cancelled is not None and cancelled():
                        gate.withdraw(
                            ticket,
                            QueryCancelled(
                                f"query cancelled while queued for Resource Group admission "
                                f"[group={gate.config.name}]"
                            ),
                        )
                    else:
                        now = self.now()
                        self._wake(gate.expire(now))
                        timeout = min(ticket.queue_deadline, ticket.query_deadline) - now
                    state = ticket.state
                if state is not TICKET_QUEUED:
                    assert ticket.error is not None
                    raise ticket.error

    def leave(self, ticket: Ticket) -> None:
        """Give the slot back and wake whoever it admits."""
        with self.lock:
            admitted = self.gate.release(ticket, self.now())
        if admitted:
            self._wake(admitted)

    def withdraw(self, ticket: Ticket, error: Error) -> None:
        with self.lock:
            if self.gate.withdraw(ticket, error):
                self._wake([ticket])

    def configure(self, config: GateConfig) -> None:
        """Apply new settings (ALTER); wake whoever they admit."""
        with self.lock:
            if config == self.gate.config:
                return
            admitted = self.gate.configure(config, self.now())
        self._wake(admitted)

    @property
    def active(self) -> int:
        """The slots held now."""
        with self.lock:
            return self.gate.active

    def fail_queued(self, error: Error) -> None:
        """Fail every waiting ticket (the engine is closing)."""
        with self.lock:
            tickets = self.gate.queued_tickets()
            for ticket in tickets:
                self.gate.withdraw(ticket, error)
        self._wake(tickets)

    def position(self, ticket: Ticket) -> int | None:
        """The ticket's 1-based place in the queue, in arrival order (None: not queued)."""
        with self.lock:
            if ticket.state is not TICKET_QUEUED:
                return None
            return int(self.gate.position(ticket))

    def set_parent(self, parent: GateRuntime | None) -> None:
        """Nest this gate under ``parent``'s (None: top level); wake whoever that
        admits. Every gate of an engine shares one lock."""
        with self.lock:
            admitted = self.gate.set_parent(None if parent is None else parent.gate, self.now())
        self._wake(admitted)

    def blocked_by(self, ticket: Ticket) -> str | None:
        """Why a queued ticket waits (None: it does not)."""
        with self.lock:
            if ticket.state is not TICKET_QUEUED or ticket.gate is None:
                return None
            return ticket.gate.blocked_by(ticket)

    def wake_queued(self, ticket: Ticket) -> None:
        """Wake a waiter so it re-examines its state (it was cancelled)."""
        if ticket.wake is not None:
            ticket.wake.set()
