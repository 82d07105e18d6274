"""A stateful property test of admission in a tree of groups (SPEC §14).

Four gates whose parents change at random (never a cycle), with random
limits, per-user caps and policies; queries submitted with a ticket or taken
counted, finished, cancelled, expired, and ALTERed limits, on a manual clock.
A plain model of the tree (who holds what where) checks, at the moment of each
admission, that every level from the query's group to the root had room and
its user was under every cap on that path; and after every step, that the
gates' loads are the model's, that nobody waits who could be admitted at
every level, and that every gate's own invariants hold.
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resgroups.errors import AdmissionRejected, QueryCancelled
from resgroups.sched.admission import Gate, GateConfig, Ticket, TicketState

GATES = ("g0", "g1", "g2", "g3")
USERS = ("ann", "bob", "cy")

configs = st.builds(
    GateConfig,
    name=st.just("?"),
    max_active=st.one_of(st.none(), st.integers(1, 3)),
    max_queued=st.one_of(st.none(), st.integers(0, 4)),
    queue_timeout_ms=st.integers(2, 20).map(lambda t: t * 1000),
    policy=st.sampled_from(["fifo", "fair"]),
    max_per_user=st.one_of(st.none(), st.none(), st.integers(1, 2)),
)


class NestedAdmission(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.gates = {name: Gate(GateConfig(name=name)) for name in GATES}
        self.parent: dict[str, str | None] = dict.fromkeys(GATES)
        self.holds: list[tuple[str, str, Ticket | None]] = []  # (gate, user, ticket)
        self.queued: list[tuple[str, Ticket]] = []

    # ---- the model ------------------------------------------------------------------

    def path(self, name: str) -> list[str]:
        levels = [name]
        while (up := self.parent[levels[-1]]) is not None:
            levels.append(up)
        return levels

    def load(self, name: str) -> int:
        return sum(1 for gate, _, _ in self.holds if name in self.path(gate))

    def held(self, name: str, user: str) -> int:
        return sum(1 for gate, u, _ in self.holds if u == user and name in self.path(gate))

    def admissible(self, name: str, user: str) -> bool:
        for level in self.path(name):
            config = self.gates[level].config
            if config.max_active is not None and self.load(level) >= config.max_active:
                return False
            if config.max_per_user is not None and self.held(level, user) >= config.max_per_user:
                return False
        return True

    def admitted(self, name: str, user: str, ticket: Ticket | None) -> None:
        """A query took a slot: it must have had room at every level."""
        assert self.admissible(name, user), f"{user} admitted at {name} without room"
        self.holds.append((name, user, ticket))

    def took(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            entry = next(e for e in self.queued if e[1] is ticket)
            self.queued.remove(entry)
            assert ticket.state is TicketState.ACTIVE
            self.admitted(entry[0], ticket.user, ticket)

    # ---- steps -------------------------------------------------------------------------

    @rule(name=st.sampled_from(GATES), user=st.sampled_from(USERS))
    def submit(self, name: str, user: str) -> None:
        ticket = Ticket(user)
        try:
            if self.gates[name].submit(ticket, self.now):
                self.admitted(name, user, ticket)
            else:
                self.queued.append((name, ticket))
        except AdmissionRejected:
            pass

    @rule(name=st.sampled_from(GATES), user=st.sampled_from(USERS))
    def count_in(self, name: str, user: str) -> None:
        if self.gates[name].count_in(user, self.now):
            self.admitted(name, user, None)

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.holds))
        self.holds.remove(entry)
        name, user, ticket = entry
        gate = self.gates[name]
        self.took(gate.release(ticket, self.now) if ticket else gate.count_out(user, self.now))

    @precondition(lambda self: self.queued)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        name, ticket = data.draw(st.sampled_from(self.queued))
        assert self.gates[name].withdraw(ticket, QueryCancelled("cancelled"))
        self.queued.remove((name, ticket))

    @rule(seconds=st.sampled_from([1.0, 5.0, 12.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        for gate in self.gates.values():
            for ticket in gate.expire(self.now):
                self.queued.remove(next(e for e in self.queued if e[1] is ticket))

    @rule(name=st.sampled_from(GATES), config=configs)
    def alter(self, name: str, config: GateConfig) -> None:
        from dataclasses import replace

        self.took(self.gates[name].configure(replace(config, name=name), self.now))

    @rule(name=st.sampled_from(GATES), parent=st.one_of(st.none(), st.sampled_from(GATES)))
    def reparent(self, name: str, parent: str | None) -> None:
        if parent is not None and name in self.path(parent):
            return  # a cycle: the DDL refuses it before the gates see it
        gate = self.gates[name]
        admitted = gate.set_parent(None if parent is None else self.gates[parent], self.now)
        self.parent[name] = parent
        # a reparent keeps what the subtree holds even above the new ancestors'
        # limits: only the queries it admits are checked for room
        self.took(admitted)

    # ---- after every step ------------------------------------------------------------------

    @invariant()
    def gates_match_the_model(self) -> None:
        for name, gate in self.gates.items():
            gate._check_invariants()
            assert gate.load == self.load(name), name
            for user in USERS:
                assert gate.held_by(user) == self.held(name, user), (name, user)
            assert gate.parent is (
                None if self.parent[name] is None else self.gates[self.parent[name]]
            )
        for name, ticket in self.queued:
            assert ticket.state is TicketState.QUEUED
            assert not self.admissible(name, ticket.user), f"{ticket} waits with room"
        assert math.isfinite(self.now)


NestedAdmission.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_nested_admission = NestedAdmission.TestCase
