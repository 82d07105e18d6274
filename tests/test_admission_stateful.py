"""A stateful property test of the admission gate against a reference model.

Several groups and users; submit / finish / cancel / suspend / resume / time
passing / ALTER, on a manual clock. After every step the gate's own
invariants hold, and its active set, queue order and counters equal those of
a plain model written independently from the rules of SPEC §6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from resgroups.errors import AdmissionRejected, QueryTimeout, QueueTimeout
from resgroups.sched.admission import Gate, GateConfig, Ticket, TicketState

GROUPS = ("g0", "g1")
USERS = ("ann", "bob", "cy")
FEW_USERS = ("ann", "bob")

configs = st.builds(
    GateConfig,
    name=st.just("?"),
    max_active=st.one_of(st.none(), st.integers(1, 2), st.just(1)),
    max_queued=st.one_of(st.none(), st.integers(0, 3)),
    queue_timeout_ms=st.integers(2, 20).map(lambda t: t * 1000),
    policy=st.sampled_from(["fifo", "fair", "fair"]),
)


@dataclass
class Model:
    """The rules of §6, written as plainly as possible."""

    config: GateConfig
    active: list[Ticket] = field(default_factory=list)
    queue: list[Ticket] = field(default_factory=list)
    last_admitted: dict[str, float] = field(default_factory=dict)
    admitted_total: int = 0
    rejections: int = 0
    timeouts: int = 0
    active_ceiling: float = math.inf  # while a lowered limit still has queries above it
    queue_ceiling: float = math.inf

    def limit(self) -> float:
        return math.inf if self.config.max_active is None else self.config.max_active

    def held(self, user: str) -> int:
        return sum(1 for t in self.active if t.user == user)

    def admit(self, ticket: Ticket, now: float) -> None:
        self.active.append(ticket)
        self.last_admitted[ticket.user] = now
        self.admitted_total += 1

    def next_in_line(self) -> Ticket:
        if self.config.policy == "fifo":
            return self.queue[0]
        users = {t.user for t in self.queue}
        best_user = min(
            users,
            key=lambda u: (
                self.held(u),
                self.last_admitted.get(u, -math.inf),
                min(t.enqueued_at for t in self.queue if t.user == u),
                min(t.seq for t in self.queue if t.user == u),  # then arrival order
            ),
        )
        return next(t for t in self.queue if t.user == best_user)

    def admit_waiting(self, now: float) -> list[Ticket]:
        admitted = []
        while self.queue and len(self.active) < self.limit():
            ticket = self.next_in_line()
            self.queue.remove(ticket)
            self.admit(ticket, now)
            admitted.append(ticket)
        return admitted


class GateMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gates: dict[str, Gate] = {}
        self.models: dict[str, Model] = {}
        self.where: dict[Ticket, str] = {}
        self.suspended: list[tuple[str, str, float]] = []  # (group, user, query deadline)

    @initialize(cfgs=st.tuples(configs, configs))
    def start(self, cfgs: tuple[GateConfig, ...]) -> None:
        for name, cfg in zip(GROUPS, cfgs, strict=True):
            cfg = GateConfig(name, cfg.max_active, cfg.max_queued, cfg.queue_timeout_ms, cfg.policy)
            self.gates[name] = Gate(cfg)
            self.models[name] = Model(cfg)
        self.gates[GROUPS[1]].slack = 0  # its queue views are rebuilt at every chance

    # ---- helpers
    def _tickets(self, group: str | None, state: TicketState) -> list[Ticket]:
        return [
            t for t, g in self.where.items() if t.state is state and (group is None or g == group)
        ]

    def _submit(self, group: str, user: str, query_deadline: float) -> None:
        gate, model = self.gates[group], self.models[group]
        ticket = Ticket(user, query_deadline=query_deadline)
        self.where[ticket] = group
        max_queued = model.config.max_queued
        if len(model.active) < model.limit() and not model.queue:
            expected = "admitted"
        elif max_queued is not None and len(model.queue) >= max_queued:
            expected = "rejected"
        else:
            expected = "queued"
        if expected == "rejected":
            with pytest.raises(AdmissionRejected, match="Resource Group admission queue is full"):
                gate.submit(ticket, self.now)
            model.rejections += 1
            return
        admitted = gate.submit(ticket, self.now)
        if admitted:
            assert expected == "admitted"
            model.admit(ticket, self.now)
        else:
            assert expected == "queued"
            ticket_deadline = self.now + model.config.queue_timeout_ms / 1000
            assert ticket.queue_deadline == ticket_deadline
            model.queue.append(ticket)

    def _leave(self, ticket: Ticket) -> None:
        group = self.where[ticket]
        admitted = self.gates[group].release(ticket, self.now)
        model = self.models[group]
        model.active.remove(ticket)
        assert admitted == model.admit_waiting(self.now)

    # ---- rules
    @rule(
        group=st.sampled_from(GROUPS),
        user=st.sampled_from(USERS),
        timeout=st.one_of(st.none(), st.integers(1, 8)),
    )
    def submit(self, group: str, user: str, timeout: int | None) -> None:
        self._submit(group, user, math.inf if timeout is None else self.now + timeout)

    @rule(users=st.lists(st.sampled_from(FEW_USERS), min_size=2, max_size=4))
    def burst(self, users: list[str]) -> None:
        """Several queries of a few users into one group at once: queues form."""
        for user in users:
            self._submit(GROUPS[0], user, math.inf)

    @precondition(lambda self: self._tickets(None, TicketState.ACTIVE))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        active = sorted(self._tickets(None, TicketState.ACTIVE), key=lambda t: t.seq)
        self._leave(data.draw(st.sampled_from(active)))

    @precondition(lambda self: self._tickets(None, TicketState.ACTIVE))
    @rule(data=st.data())
    def suspend(self, data: st.DataObject) -> None:
        active = sorted(self._tickets(None, TicketState.ACTIVE), key=lambda t: t.seq)
        ticket = data.draw(st.sampled_from(active))
        self._leave(ticket)
        self.suspended.append((self.where[ticket], ticket.user, ticket.query_deadline))

    @precondition(lambda self: self.suspended)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.suspended) - 1))
        group, user, deadline = self.suspended.pop(index)
        self._submit(group, user, deadline)

    @precondition(lambda self: self._tickets(None, TicketState.QUEUED))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        queued = sorted(self._tickets(None, TicketState.QUEUED), key=lambda t: t.seq)
        ticket = data.draw(st.sampled_from(queued))
        group = self.where[ticket]
        assert self.gates[group].withdraw(ticket, QueueTimeout("cancelled"))
        self.models[group].queue.remove(ticket)
        assert ticket.state is TicketState.WITHDRAWN

    @rule(seconds=st.sampled_from([0.5, 1.0, 2.5, 6.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        for group, gate in self.gates.items():
            model = self.models[group]
            due = [t for t in model.queue if min(t.queue_deadline, t.query_deadline) <= self.now]
            expired = gate.expire(self.now)
            assert set(expired) == set(due)
            for ticket in due:
                model.queue.remove(ticket)
                model.timeouts += 1
                expected = (
                    QueryTimeout if ticket.query_deadline < ticket.queue_deadline else QueueTimeout
                )
                assert type(ticket.error) is expected
                assert ticket.state is TicketState.EXPIRED

    @rule(group=st.sampled_from(GROUPS), cfg=configs)
    def alter(self, group: str, cfg: GateConfig) -> None:
        cfg = GateConfig(group, cfg.max_active, cfg.max_queued, cfg.queue_timeout_ms, cfg.policy)
        gate, model = self.gates[group], self.models[group]
        deadlines = {t: t.queue_deadline for t in model.queue}
        model.config = cfg
        admitted = gate.configure(cfg, self.now)
        assert admitted == model.admit_waiting(self.now)
        for ticket in model.queue:  # queued queries keep their deadlines
            assert ticket.queue_deadline == deadlines[ticket]

    # ---- invariants
    @invariant()
    def gate_matches_model(self) -> None:
        for group, gate in self.gates.items():
            gate._check_invariants()
            model = self.models[group]
            assert gate.queued_tickets() == model.queue
            assert [gate.position(t) for t in model.queue] == list(range(1, len(model.queue) + 1))
            deadlines = [min(t.queue_deadline, t.query_deadline) for t in model.queue]
            assert gate.next_deadline() == min(deadlines, default=math.inf)
            oldest = max((self.now - t.enqueued_at for t in model.queue), default=0.0)
            assert gate.oldest_wait(self.now) == max(0.0, oldest)
            # the lazy views drop what has left: they never hold much more than the queue
            assert len(gate._queue) <= 2 * gate.waiting + gate.slack
            assert len(gate._deadlines) <= 2 * gate.waiting + gate.slack
            assert gate.active == len(model.active)
            assert set(self._tickets(group, TicketState.ACTIVE)) == set(model.active)
            assert gate.admitted_total == model.admitted_total
            assert gate.admission_rejections == model.rejections
            assert gate.admission_timeouts == model.timeouts
            # every ticket is in exactly one state, and only active/queued are in the gate
            for ticket, g in self.where.items():
                if g != group:
                    continue
                in_gate = (ticket in model.active) + (ticket in model.queue)
                assert in_gate == (ticket.state in (TicketState.ACTIVE, TicketState.QUEUED))
            limit = model.config.max_active
            if limit is not None and len(model.active) > limit:
                # only a lowered limit leaves more active than allowed, and then
                # nothing new was admitted (nobody may wait while a slot is free)
                assert gate._grandfathered >= len(model.active)


GateMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=50, deadline=None)
TestGate = GateMachine.TestCase


def _bounded(gate: Gate) -> bool:
    most = 2 * gate.waiting + gate.slack
    return len(gate._queue) <= most and len(gate._deadlines) <= most


def test_the_queue_views_stay_bounded_when_the_middle_leaves() -> None:
    """Cancelled waiters are dropped lazily, but never pile up: withdrawing all
    but the first of 2,000 queued tickets leaves views the size of the queue."""
    gate = Gate(GateConfig("g", max_active=1, queue_timeout_ms=3_600_000))
    assert gate.submit(Ticket("holder"), 0.0)
    queued = [Ticket(USERS[i % 3], query_deadline=100.0 + i) for i in range(2000)]
    for ticket in queued:
        assert not gate.submit(ticket, 0.0)
    for ticket in reversed(queued[1:]):
        assert gate.withdraw(ticket, QueueTimeout("cancelled"))
        assert _bounded(gate)
    gate._check_invariants()
    assert gate.queued_tickets() == [queued[0]]
    assert gate.position(queued[0]) == 1
    assert gate.next_deadline() == 100.0  # its query deadline, before its queue timeout


def test_the_queue_views_stay_bounded_under_fifo_churn() -> None:
    """Admitted in arrival order, tickets leave the deadline heap lazily too: after
    20,000 passes through a queue of five, the heap holds tens of entries, not
    thousands, and the next deadline is the queued tickets' own."""
    gate = Gate(GateConfig("g", max_active=1, queue_timeout_ms=60_000))
    now = 0.0
    holder = Ticket("holder")
    assert gate.submit(holder, now)
    line = [Ticket("ann") for _ in range(5)]
    for ticket in line:
        assert not gate.submit(ticket, now)
    for _ in range(20_000):
        now += 0.001
        (admitted,) = gate.release(holder, now)
        holder = admitted
        fresh = Ticket("ann")
        assert not gate.submit(fresh, now)
        assert _bounded(gate)
    gate._check_invariants()
    assert gate.waiting == 5
    assert len(gate._deadlines) <= 2 * 5 + gate.slack
    oldest = min(t.queue_deadline for t in gate.queued_tickets())
    assert gate.next_deadline() == oldest
