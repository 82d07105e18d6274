"""The fast path's entry points, kept for their callers: a query's slot and worker
in one step are :meth:`resgroups.sched.pool.Dispatcher.admit_at_once` and
:meth:`~resgroups.sched.pool.Dispatcher.leave`, each half a method of the state
machine it changes (``Gate.take_slot``, ``CpuScheduler.grant_at_once``,
``CpuScheduler.release_running``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from resgroups.sched.admission import Gate, Ticket
    from resgroups.sched.cpu import Runner
    from resgroups.sched.pool import Dispatcher


def admit(dispatcher: Dispatcher, gate: Gate, ticket: Ticket, runner: Runner) -> bool:
    return dispatcher.admit_at_once(gate, ticket, runner)


def leave(dispatcher: Dispatcher, gate: Gate, ticket: Ticket, runner: Runner, cpu_ns: int) -> None:
    dispatcher.leave(gate, ticket, runner, cpu_ns)
