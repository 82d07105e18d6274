"""A stateful property test of the scheduling core: any sequence of arrivals,
slice ends, releases, ALTERs, engagement flips and a degradation keeps every
invariant of ``CpuScheduler._check_invariants`` (work conservation, caps,
budgets, one place per runner), and all work eventually drains."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resgroups.sched.cpu import CpuScheduler, Runner, RunnerState

MS = 1_000_000
GROUPS = (0, 1, 2)
POOLS = {"default": 2, "export": 1}


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = CpuScheduler(POOLS, slice_ms=10, granularity_ns=50 * MS)
        self.s.engaged = True
        self.now = 0.0
        self.runners: list[Runner] = []
        self.queries = 0
        for gid in GROUPS:
            self.s.configure(gid, f"g{gid}", 100, None, "fifo", self.now)

    def _live(self, state: RunnerState) -> list[Runner]:
        return [r for r in self.runners if r.state is state]

    @rule(
        gid=st.sampled_from(GROUPS),
        weight=st.sampled_from([1, 50, 100, 400]),
        limit=st.sampled_from([None, 0.3, 1.0, 1.5, 2.0]),
        policy=st.sampled_from(["fifo", "fair"]),
    )
    def alter(self, gid: int, weight: int, limit: float | None, policy: str) -> None:
        self.s.configure(gid, f"g{gid}", weight, limit, policy, self.now)

    @rule(
        gid=st.sampled_from(GROUPS),
        user=st.sampled_from(["ann", "bob"]),
        pool=st.sampled_from(list(POOLS)),
        kind=st.sampled_from(["select", "select", "ctas"]),
    )
    def arrive(self, gid: int, user: str, pool: str, kind: str) -> None:
        self.queries += 1
        r = Runner(self.s.groups[gid], pool, user, self.queries, kind)
        self.runners.append(r)
        self.s.submit(r, self.now)

    @precondition(lambda self: self.runners)
    @rule(data=st.data())
    def task(self, data: st.DataObject) -> None:
        parent = data.draw(st.sampled_from(self.runners))
        r = Runner(parent.group, parent.pool, parent.user, parent.query_id, parent.kind, True)
        self.runners.append(r)
        self.s.submit(r, self.now)

    @precondition(lambda self: self._live(RunnerState.RUNNING))
    @rule(data=st.data(), cpu_ms=st.integers(0, 200))
    def slice_end(self, data: st.DataObject, cpu_ms: int) -> None:
        r = data.draw(st.sampled_from(self._live(RunnerState.RUNNING)))
        self.s.slice_end(r, cpu_ms * MS, self.now)

    @precondition(lambda self: self._live(RunnerState.RUNNING) or self._live(RunnerState.WAITING))
    @rule(data=st.data(), cpu_ms=st.integers(0, 50))
    def leave(self, data: st.DataObject, cpu_ms: int) -> None:
        live = self._live(RunnerState.RUNNING) + self._live(RunnerState.WAITING)
        r = data.draw(st.sampled_from(live))
        self.s.release(r, cpu_ms * MS, self.now)

    @rule(ms=st.sampled_from([1, 10, 100, 1000]))
    def time_passes(self, ms: int) -> None:
        self.now += ms / 1000
        self.s.dispatch(self.now)  # what waiting threads do when they wake

    @rule()
    def flip_engagement(self) -> None:
        self.s.engaged = not self.s.engaged
        self.s.dispatch(self.now)

    @rule()
    def degrade(self) -> None:
        self.s.degraded = True
        self.s.dispatch(self.now)

    @invariant()
    def invariants_hold(self) -> None:
        self.s._check_invariants(self.now)

    def teardown(self) -> None:
        # everything drains: finish what runs, let budgets refill, until nothing waits
        for _ in range(10_000):
            running = self._live(RunnerState.RUNNING)
            if not running and not self._live(RunnerState.WAITING):
                break
            for r in running:
                self.s.release(r, 0, self.now)
            self.now += 1.0
            self.s.dispatch(self.now)
            self.s._check_invariants(self.now)
        assert not self._live(RunnerState.WAITING)
        assert all(v == POOLS[p] for p, v in self.s.free.items())


CoreMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestCoreStateful = CoreMachine.TestCase
