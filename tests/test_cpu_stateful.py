"""A stateful property test of the scheduling core: any sequence of arrivals,
slice ends, releases, ALTERs, engagement flips and a degradation keeps every
invariant of ``CpuScheduler._check_invariants`` (work conservation, caps,
budgets, one place per runner), and all work eventually drains.

Groups form random trees (SPEC §14): nesting and reparenting online with
runners waiting and running, limits at any level, drops of idle groups; the
tree's invariants (I6's busy paths, I7) are checked after every step, and a
cap at any level must hold for its whole subtree."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from resgroups.sched.cpu import METERED, CpuScheduler, Runner, RunnerState

MS = 1_000_000
GROUPS = (0, 1, 2, 3, 4)
POOLS = {"default": 2, "export": 1}


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.s = CpuScheduler(POOLS, slice_ms=10, granularity_ns=50 * MS)
        self.s.engaged = True
        self.now = 0.0
        self.runners: list[Runner] = []
        self.queries = 0
        self.dropped: set[int] = set()
        # counted workers held: (group, pool, COUNTED or METERED)
        self.counted: list[tuple[int, str, int]] = []
        self.settings: dict[int, tuple[int, float | None, str]] = {}
        for gid in GROUPS:
            self.settings[gid] = (100, None, "fifo")
            self.s.configure(gid, f"g{gid}", 100, None, "fifo", self.now)

    def _live(self, state: RunnerState) -> list[Runner]:
        return [r for r in self.runners if r.state is state]

    def _parent(self, gid: int) -> int | None:
        parent = self.s.groups[gid].parent
        return None if parent is None else parent.group_id

    def _configure(self, gid: int, parent: int | None) -> None:
        weight, limit, policy = self.settings[gid]
        self.s.configure(gid, f"g{gid}", weight, limit, policy, self.now, parent=parent)

    @rule(
        gid=st.sampled_from(GROUPS),
        weight=st.sampled_from([1, 50, 100, 400]),
        limit=st.sampled_from([None, 0.3, 1.0, 1.5, 2.0]),
        policy=st.sampled_from(["fifo", "fair"]),
    )
    def alter(self, gid: int, weight: int, limit: float | None, policy: str) -> None:
        if gid in self.dropped:
            return
        self.settings[gid] = (weight, limit, policy)
        self._configure(gid, self._parent(gid))  # an ALTER keeps the parent

    @rule(gid=st.sampled_from(GROUPS), parent=st.sampled_from([None, *GROUPS]))
    def nest(self, gid: int, parent: int | None) -> None:
        """ALTER ... SET (parent = p) / RESET (parent), with work waiting and running.
        A parent below gid (a cycle the catalog refuses, seen here as a full sync
        half-way through reshaping the tree) goes to the top first."""
        if gid in self.dropped or parent in self.dropped or parent == gid:
            return
        self._configure(gid, parent)
        assert self._parent(gid) == parent

    @rule(gid=st.sampled_from(GROUPS))
    def drop(self, gid: int) -> None:
        """DROP of a group without children: its state goes once it is idle."""
        if gid in self.dropped or any(self._parent(c) == gid for c in self.s.groups):
            return
        self.dropped.add(gid)
        self._forget_dropped()

    def _forget_dropped(self) -> None:
        """What GroupRuntimes does as the queries of dropped groups end."""
        for gid in self.dropped:
            g = self.s.groups.get(gid)
            if g is not None and g.own_idle:
                self.s.forget(gid)

    @rule(
        gid=st.sampled_from(GROUPS),
        user=st.sampled_from(["ann", "bob"]),
        pool=st.sampled_from(list(POOLS)),
        kind=st.sampled_from(["select", "select", "ctas"]),
    )
    def arrive(self, gid: int, user: str, pool: str, kind: str) -> None:
        if gid in self.dropped:
            return
        self.queries += 1
        r = Runner(self.s.groups[gid], pool, user, self.queries, kind)
        self.runners.append(r)
        self.s.submit(r, self.now)

    @precondition(lambda self: self.runners)
    @rule(data=st.data())
    def task(self, data: st.DataObject) -> None:
        # of a query whose group is still there (a dropped group's state goes once idle)
        known = [r for r in self.runners if self.s.groups.get(r.group.group_id) is r.group]
        if not known:
            return
        parent = data.draw(st.sampled_from(known))
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
        self._forget_dropped()

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

    @invariant()
    def a_cap_holds_for_the_whole_subtree(self) -> None:
        """Independently of the held counters: the scheduled workers running in a
        group's subtree and its metered counted ones, beyond-the-cap tasks aside,
        never exceed its cap (or what it held when an ALTER or a reparent lowered
        it)."""
        s = self.s
        if not s.engaged or s.degraded:
            return
        for g in s.groups.values():
            running = [r for h in g.subtree() for r in h.running if r.scheduled]
            plain = sum(1 for r in running if not r.extra) + sum(h.metered for h in g.subtree())
            assert plain <= max(g.cap, g.held_over_cap), (g, running)

    def teardown(self) -> None:
        # everything drains: counted workers come back, finish what runs, let budgets
        # refill, until nothing waits
        for gid, pool, taken in self.counted:
            self.s.count_out(self.s.groups[gid], pool, self.now, metered=taken == METERED)
        self.counted.clear()
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
        self._forget_dropped()
        assert not self.dropped & set(self.s.groups)  # dropped groups go once idle
        self.s._check_invariants(self.now)


class CountedCoreMachine(CoreMachine):
    """The same, with counted workers (the fast path's, SPEC §6) taken and given
    back in trees, and engagement flipped as the engine does."""

    @rule()
    def flip_engagement(self) -> None:
        """Engagement as the engine flips it: busy is rebuilt from the groups' own
        work (a counted worker given back while disengaged leaves its group busy)."""
        self.s.set_engaged(not self.s.engaged, self.now)
        self.s.dispatch(self.now)

    @rule(gid=st.sampled_from(GROUPS), pool=st.sampled_from(list(POOLS)))
    def count_in(self, gid: int, pool: str) -> None:
        """A query granted a counted worker: never sliced (not engaged, or degraded),
        or metered (engaged: in held, charged as it leaves, promoted at a slice end)."""
        if gid not in self.dropped:
            taken = self.s.count_in(self.s.groups[gid], pool, self.now)
            if taken:
                self.counted.append((gid, pool, taken))

    @precondition(lambda self: self.counted)
    @rule(data=st.data(), cpu_ms=st.integers(0, 50))
    def count_out(self, data: st.DataObject, cpu_ms: int) -> None:
        gid, pool, taken = data.draw(st.sampled_from(self.counted))
        self.counted.remove((gid, pool, taken))
        self.s.count_out(self.s.groups[gid], pool, self.now, cpu_ms * MS, "u", taken == METERED)
        self._forget_dropped()

    @precondition(lambda self: any(t == METERED for _, _, t in self.counted))
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        """A metered query reaches its first slice end: a runner from here, if still
        engaged and not degraded."""
        gid, pool, taken = data.draw(st.sampled_from([c for c in self.counted if c[2] == METERED]))
        self.queries += 1
        runner = Runner(self.s.groups[gid], pool, "u", self.queries, "query")
        if self.s.promote(self.s.groups[gid], runner, self.now):
            self.counted.remove((gid, pool, taken))
            self.runners.append(runner)


CoreMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
TestCoreStateful = CoreMachine.TestCase
CountedCoreMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestCountedCoreStateful = CountedCoreMachine.TestCase
