"""Scenario tests of the scheduling core on a hand-driven clock and CPU meter.

Each test drives :class:`CpuScheduler` by hand and asserts exact grant
orders and states; ``_check_invariants`` runs after every step.
"""

from __future__ import annotations

import math

import pytest

from resgroups.sched.cpu import BURST_S, NS, CpuScheduler, GroupCpu, Runner, RunnerState

MS = 1_000_000


class Sim:
    """A scheduler, its groups, and a clock moved by hand."""

    def __init__(self, workers: int = 2, *, granularity_ms: float = 50, engaged: bool = True):
        self.s = CpuScheduler(
            {"default": workers}, slice_ms=10, granularity_ns=round(granularity_ms * MS)
        )
        self.s.engaged = engaged
        self.now = 0.0
        self.groups: dict[str, GroupCpu] = {}
        self._queries = 0

    def group(
        self, name: str, weight: int = 100, limit: float | None = None, policy: str = "fifo"
    ) -> GroupCpu:
        gid = len(self.groups)
        g = self.s.group(gid, name)
        self.s.configure(gid, name, weight, limit, policy, self.now)
        self.groups[name] = g
        self.check()
        return g

    def query(self, group: str, user: str = "u", kind: str = "select") -> Runner:
        self._queries += 1
        r = Runner(self.groups[group], "default", user, self._queries, kind)
        self.s.submit(r, self.now)
        self.check()
        return r

    def task(self, of: Runner) -> Runner:
        r = Runner(of.group, "default", of.user, of.query_id, of.kind, is_task=True)
        self.s.submit(r, self.now)
        self.check()
        return r

    def tick(self, ms: float = 10, cpu_ms: float | None = None) -> list[tuple[Runner, str]]:
        """Time passes; every running scheduled runner reaches its slice end having
        used ``cpu_ms`` of CPU (default: all of it). Returns the yields."""
        self.now += ms / 1000
        used = round((ms if cpu_ms is None else cpu_ms) * MS)
        yields = []
        for r in sorted(self.running(), key=lambda r: r.seq):
            if r.state is not RunnerState.RUNNING:
                continue
            d = self.s.slice_end(r, used, self.now)
            if not d.renew:
                yields.append((r, d.reason))
            self.check()
        self.s.dispatch(self.now)
        self.check()
        return yields

    def finish(self, r: Runner, cpu_ms: float = 0) -> None:
        self.s.release(r, round(cpu_ms * MS), self.now)
        self.check()

    def running(self) -> list[Runner]:
        return [r for g in self.groups.values() for r in g.running]

    def holders(self) -> list[int]:
        return sorted(r.seq for r in self.running())

    def check(self) -> None:
        self.s._check_invariants(self.now)


def test_weights_converge_to_the_ratio_without_ping_pong() -> None:
    sim = Sim()
    sim.group("a", 100)
    sim.group("b", 50)
    for _ in range(3):
        sim.query("a")
        sim.query("b")
    switches = 0
    for _ in range(1000):
        switches += len(sim.tick())
    a, b = sim.groups["a"].cpu_ns_total, sim.groups["b"].cpu_ns_total
    assert a / b == pytest.approx(2.0, abs=0.02)
    # hand-overs happen about once per granularity of lag, not every slice
    assert switches < 0.4 * 1000


def test_weights_are_relative() -> None:
    ratios = []
    for wa, wb in ((100, 50), (2, 1)):
        sim = Sim()
        sim.group("a", wa)
        sim.group("b", wb)
        for _ in range(3):
            sim.query("a")
            sim.query("b")
        for _ in range(600):
            sim.tick()
        ratios.append(sim.groups["a"].cpu_ns_total / sim.groups["b"].cpu_ns_total)
    assert ratios[0] == pytest.approx(ratios[1], abs=0.01)


def test_a_lone_group_uses_everything_whatever_its_weight() -> None:
    sim = Sim()
    sim.group("tiny", 1)
    sim.group("idle", 10000)
    for _ in range(3):
        sim.query("tiny")
    for _ in range(100):
        assert sim.tick() == []  # nobody else wants a worker: it renews in place
    assert sim.groups["tiny"].cpu_ns_total == 2 * 100 * 10 * MS  # both workers, always


def test_new_work_of_an_entitled_group_goes_first_at_the_next_slice_end() -> None:
    sim = Sim()
    sim.group("reporting", 25)
    sim.group("dashboards", 400)
    scans = [sim.query("reporting") for _ in range(2)]
    for _ in range(50):
        sim.tick()
    sim.now += 0.003  # mid-slice
    dash = sim.query("dashboards")
    assert dash.state is RunnerState.WAITING
    yields = sim.tick()
    assert [r for r, _ in yields] == [scans[0]]  # one worker handed over, not both
    assert "fresh work of dashboards" in yields[0][1]
    assert dash.state is RunnerState.RUNNING
    sim.finish(dash, 1)
    assert sorted(r.state.value for r in scans) == ["running", "running"]


def test_no_banking_after_idle_and_a_busy_group_keeps_its_lead() -> None:
    sim = Sim()
    sim.group("a", 100)
    sim.group("b", 100)
    a = [sim.query("a") for _ in range(2)]
    for _ in range(200):  # b idle for 2 s while a uses both workers
        sim.tick()
    b = [sim.query("b") for _ in range(2)]
    # b was placed level with a: it gets its share from now on, not 2 s of catch-up
    assert sim.groups["b"].vtime == sim.groups["a"].vtime
    before_a, before_b = sim.groups["a"].cpu_ns_total, sim.groups["b"].cpu_ns_total
    for _ in range(400):
        sim.tick()
    got_a = sim.groups["a"].cpu_ns_total - before_a
    got_b = sim.groups["b"].cpu_ns_total - before_b
    assert got_a / got_b == pytest.approx(1.0, abs=0.05)
    assert all(r.state is not RunnerState.DONE for r in a + b)


def test_no_banking_is_only_for_idle_groups() -> None:
    """A group whose runners all wait (none running) is runnable, not idle."""
    sim = Sim(workers=1)
    sim.group("a", 100)
    sim.group("b", 100)
    sim.query("a")
    b = sim.query("b")
    for _ in range(30):
        sim.tick()
    assert b.state in (RunnerState.WAITING, RunnerState.RUNNING)
    assert abs(sim.groups["a"].vtime - sim.groups["b"].vtime) <= 50 * MS + 10 * MS


def test_whole_core_limit_caps_workers_without_budget() -> None:
    sim = Sim(workers=4)
    sim.group("capped", 100, limit=2.0)
    runners = [sim.query("capped") for _ in range(4)]
    assert [r.state for r in runners].count(RunnerState.RUNNING) == 2
    for _ in range(100):
        sim.tick()
    assert sim.s.free["default"] == 2  # the rest stays idle: a ceiling, not a share
    assert sim.groups["capped"].cpu_ns_total == 2 * 100 * 10 * MS


@pytest.mark.parametrize(
    ("limit", "cap", "fractional", "single_threaded"),
    [(None, math.inf, False, False), (0.5, 1, True, True), (1.0, 1, False, True),
     (2.0, 2, False, False), (2.5, 3, True, False)],
)  # fmt: skip
def test_what_follows_from_a_cpu_limit_follows_every_alter(
    limit: float | None, cap: float, fractional: bool, single_threaded: bool
) -> None:
    """cap, fractional, rate and burst are computed when limit_cores is set, so an
    ALTER (configure) from any limit to any other leaves them as a new group's."""
    for before in (None, 0.5, 1.0, 2.0, 2.5):
        sim = Sim()
        sim.group("g", 100, limit=before)
        g = sim.groups["g"]
        sim.s.configure(0, "g", 100, limit, "fifo", sim.now)
        fresh = GroupCpu(1, "fresh", 100, limit)
        for group in (g, fresh):
            assert group.limit_cores == limit
            assert (group.cap, group.fractional, group.single_threaded) == (
                cap,
                fractional,
                single_threaded,
            )
            assert group.rate == (0.0 if limit is None else limit * NS)
            assert group.burst == group.rate * BURST_S
            assert group.limited is (limit is not None)
        sim.check()


def test_fractional_limit_budget_burst_and_refill() -> None:
    sim = Sim()
    sim.group("half", 100, limit=0.5)
    g = sim.groups["half"]
    assert (g.cap, g.burst) == (1, 0.05 * NS)  # 0.5 core: 1 worker, 50 ms of burst
    r = sim.query("half")
    other = sim.query("half")
    assert other.state is RunnerState.WAITING  # one worker at most
    # 100 ms of CPU in one slice: budget 50 ms - 100 ms < 0 -> yields, waits for budget
    yields = sim.tick(ms=100, cpu_ms=100)
    assert yields == [(r, "budget")]
    assert r.state is RunnerState.WAITING
    assert other.state is RunnerState.WAITING
    assert sim.s.next_wakeup(sim.now) == pytest.approx(sim.now + 0.1, abs=1e-6)
    sim.now += 0.099
    assert sim.s.dispatch(sim.now) == []  # not refilled yet
    sim.now += 0.002
    assert sim.s.dispatch(sim.now) == [r]  # refilled: the older query first (fifo)
    sim.check()


def test_a_runner_behind_the_cap_with_budget_left_is_not_woken_by_the_clock() -> None:
    """It waits for the capped worker, not for budget: the worker's return wakes it
    (dispatch), so the wait has no timed wake-up (a timed one polled every 0.5 ms
    and burned a tenth of a core per waiting query)."""
    sim = Sim()
    sim.group("half", 100, limit=0.5)
    sim.group("other", 100)
    r = sim.query("half")
    other = sim.query("half")
    assert other.state is RunnerState.WAITING  # behind the one worker of the cap
    sim.tick(ms=10, cpu_ms=10)  # 10 ms of the 50 ms burst spent: budget left
    assert sim.groups["half"].budget_ns > 0
    assert r.state is RunnerState.RUNNING
    assert math.isinf(sim.s.next_wakeup(sim.now))
    sim.tick(ms=60, cpu_ms=60)  # spent: both now wait for the refill
    assert r.state is RunnerState.WAITING
    assert sim.s.next_wakeup(sim.now) > sim.now


def test_a_hand_over_in_an_oversubscribed_pool_adds_no_thread() -> None:
    """Oversubscribed (configured 2, 5 workers), a and b each hold the configured
    count and one worker is free. b lags, but a's yield would not make room: the
    free worker is there already, and b may not take it past its count. So a
    renews and nobody is handed a worker past the count: the threads holding
    workers stay 4 (a hand-over is for a pool with no worker free)."""
    sim = Sim(workers=2)
    a, b = sim.group("a"), sim.group("b")
    sim.s.resize("default", 5, sim.now)
    for name in ("a", "a", "a", "b", "b", "b"):
        sim.query(name)
    assert (len(a.running), len(b.running), sim.s.free["default"]) == (2, 2, 1)
    sim.now += 0.2
    first = min(a.running, key=lambda r: r.seq)
    decision = sim.s.slice_end(first, 200 * MS, sim.now)  # a leads by 200 ms: b lags
    sim.check()
    assert decision.renew
    assert (len(a.running), len(b.running), sim.s.free["default"]) == (2, 2, 1)


def test_a_hand_over_goes_to_the_group_a_pick_would_choose() -> None:
    """Oversubscribed (configured 1, 3 workers, each group at its count): a leads,
    b lags by more than the granularity, c by far more. The worker a yields goes
    to c, the least virtual time, as a free worker's pick would give it."""
    sim = Sim(workers=1)
    a, b, c = sim.group("a"), sim.group("b"), sim.group("c")
    sim.s.resize("default", 3, sim.now)
    for name in ("a", "a", "b", "b", "c", "c"):
        sim.query(name)
    a.vtime, b.vtime, c.vtime = 1000 * MS, 940 * MS, 500 * MS
    holder = next(iter(a.running))
    decision = sim.s.slice_end(holder, 0, sim.now + 0.01)
    sim.check()
    assert not decision.renew
    assert decision.reason == "c lags"  # the reason names the group given the worker
    assert [r.group.name for r in decision.granted] == ["c"]
    assert len(c.running) == 2  # past its configured count: handed a's worker


def test_fractional_limit_holds_on_average() -> None:
    sim = Sim()
    sim.group("half", 100, limit=0.5)
    sim.group("other", 100)
    for _ in range(3):
        sim.query("half")
    for _ in range(1000):  # 10 s
        sim.tick()
    cores = sim.groups["half"].cpu_ns_total / (10 * NS)
    assert cores == pytest.approx(0.5, abs=0.02)


def test_tasks_above_one_core_do_not_wait_for_budget_and_the_query_repays() -> None:
    sim = Sim(workers=3)
    sim.group("g", 100, limit=1.5)
    q = sim.query("g")
    sim.tick(ms=100, cpu_ms=400)  # 150 ms of burst spent: the query yields
    assert q.state is RunnerState.WAITING
    t = sim.task(q)
    assert t.state is RunnerState.RUNNING  # a task does not wait for budget
    sim.finish(t, cpu_ms=50)
    assert sim.groups["g"].budget_ns < 0
    wake = sim.s.next_wakeup(sim.now)
    sim.now = wake + 0.001
    assert sim.s.dispatch(sim.now) == [q]  # repaid, the query continues


def test_ctas_keeps_its_worker_and_its_debt_is_capped() -> None:
    sim = Sim()
    sim.group("copy", 100, limit=0.1)
    sim.group("other", 100)
    ctas = sim.query("copy", kind="ctas")
    sel = sim.query("copy")
    assert sel.state is RunnerState.WAITING  # cap 1 worker: behind the copy
    assert sim.tick(ms=20_000, cpu_ms=20_000) == []  # a CTAS never yields
    g = sim.groups["copy"]
    assert g.budget_ns == pytest.approx(-10 * g.rate)  # 200 s of refill capped at 10 s
    sim.finish(ctas, cpu_ms=0)
    sim.now += 9.9
    assert sim.s.dispatch(sim.now) == []
    sim.now += 0.2
    assert sim.s.dispatch(sim.now) == [sel]


def test_one_task_beyond_the_cap_while_every_running_query_is_a_ctas() -> None:
    sim = Sim(workers=3)
    sim.group("g", 100, limit=1.0)
    sel = sim.query("g")
    t1 = sim.task(sel)
    assert t1.state is RunnerState.WAITING  # cap 1: the select holds it
    sim.finish(sel)  # (its thread waits elsewhere; its task is still queued)
    ctas = sim.query("g", kind="ctas")
    assert ctas.state is RunnerState.WAITING or t1.state is RunnerState.RUNNING
    if t1.state is RunnerState.RUNNING:
        sim.finish(t1)
    assert ctas.state is RunnerState.RUNNING
    t2 = sim.task(sel)
    assert t2.state is RunnerState.RUNNING
    assert t2.extra  # the one exception
    t3 = sim.task(sel)
    assert t3.state is RunnerState.WAITING  # only one


def test_fifo_serves_arrival_order_inside_a_group() -> None:
    sim = Sim(workers=1)
    sim.group("batch", 100, policy="fifo")
    sim.group("other", 100)
    first = sim.query("batch", "ann")
    later = [sim.query("batch", u) for u in ("bob", "cy")]
    for _ in range(50):
        assert sim.tick() == []  # a long query keeps its worker; later ones wait
    sim.finish(first)
    assert later[0].state is RunnerState.RUNNING
    assert later[1].state is RunnerState.WAITING


def test_fair_splits_by_user_then_by_query() -> None:
    sim = Sim(workers=2)
    sim.group("research", 100, policy="fair")
    sim.group("other", 100)
    ann = [sim.query("research", "ann") for _ in range(6)]
    sim.now += 0.001
    bob = sim.query("research", "bob")
    assert bob.state is RunnerState.WAITING  # ann's first two hold both workers
    yields = sim.tick()
    assert bob.state is RunnerState.RUNNING  # fresh, and bob held fewer than ann
    assert [r for r, _ in yields] == [ann[0]]  # then ann holds 1 and bob 1: even
    for _ in range(600):
        sim.tick()
    by_user = sim.groups["research"].cpu_by_user
    assert by_user["ann"] / by_user["bob"] == pytest.approx(1.0, abs=0.05)
    # inside ann's part, her queries take turns (fewest workers held first)
    ann_cpu = [r.cpu_since_grant_ns for r in ann]
    assert all(r.ran_in_pools for r in ann)
    assert len(ann_cpu) == 6


def test_fair_ties_go_to_a_query_that_has_not_run_yet() -> None:
    sim = Sim(workers=1)
    sim.group("f", 100, policy="fair")
    sim.group("other", 100)
    a1 = sim.query("f", "ann")
    a2 = sim.query("f", "ann")
    for _ in range(6):  # past the granularity: a1 yields to a2 (her query holding fewer)
        sim.tick()
    assert a2.ran_in_pools == ("default",)
    assert a1.state is RunnerState.WAITING or a2.state is RunnerState.WAITING


def test_granularity_trades_latency_for_fewer_hand_overs() -> None:
    counts = {}
    for granularity in (10, 50, 200):
        sim = Sim(workers=1, granularity_ms=granularity)
        sim.group("a", 100)
        sim.group("b", 100)
        for _ in range(3):
            sim.query("a")
            sim.query("b")
        counts[granularity] = sum(len(sim.tick()) for _ in range(500))
        ratio = sim.groups["a"].cpu_ns_total / sim.groups["b"].cpu_ns_total
        assert ratio == pytest.approx(1.0, abs=0.1)
    assert counts[10] > counts[50] > counts[200]


def test_disengaged_grants_in_arrival_order_and_charges_nothing() -> None:
    sim = Sim(workers=1, engaged=False)
    sim.group("default", 100)
    first = sim.query("default")
    second = sim.query("default")
    assert not first.scheduled
    for _ in range(10):
        assert sim.tick() == []
    assert sim.groups["default"].cpu_ns_total == 0
    assert sim.groups["default"].wait_ns_total == 0
    sim.finish(first)
    assert second.state is RunnerState.RUNNING


def test_a_runner_granted_while_disengaged_stays_outside_until_it_waits_again() -> None:
    sim = Sim(workers=1, engaged=False)
    sim.group("a", 100)
    early = sim.query("a")
    sim.s.engaged = True
    sim.group("b", 100)
    b = sim.query("b")
    for _ in range(20):
        assert sim.tick() == []  # never sliced, never yields
    assert sim.groups["a"].cpu_ns_total == 0
    sim.finish(early)
    assert b.state is RunnerState.RUNNING
    assert b.scheduled


def test_degraded_grants_in_arrival_order_and_slices_nobody() -> None:
    sim = Sim(workers=1)
    sim.group("a", 100, limit=0.1)
    sim.group("b", 100)
    a = sim.query("a")
    b = sim.query("b")
    sim.s.degraded = True
    for _ in range(20):
        assert sim.tick(ms=100, cpu_ms=100) == []  # no limit, no yielding
    sim.finish(a)
    assert b.state is RunnerState.RUNNING


def test_wait_time_is_counted_while_engaged() -> None:
    sim = Sim(workers=1)
    sim.group("a", 100)
    sim.group("b", 100)
    sim.query("a")
    sim.now += 0.5
    b = sim.query("b")
    sim.tick()
    assert b.state is RunnerState.RUNNING  # fresh and entitled: it went first
    assert sim.groups["b"].wait_ns_total == 10 * MS  # runnable, waiting one slice
    assert math.isinf(sim.s.next_wakeup(sim.now))


def _core_state(sim: Sim) -> tuple[object, ...]:
    """Everything of the core a hand-over may change (arrival numbers aside)."""
    s = sim.s
    groups = tuple(
        (
            g.name,
            g.held,
            g.held_over_cap,
            sorted(g.held_by.items()),
            sorted(g.held_by_query.items()),
            sorted(r.query_id for r in g.running),
            g.vtime,
            g.own_vtime,
            g.cpu_ns_total,
            sorted(g.cpu_by_user.items()),
            g.wait_ns_total,
            g.budget_ns,
            g.active_children,
        )
        for g in [*s.groups.values(), s.outside]
    )
    runners = tuple(
        (
            r.query_id,
            r.state,
            r.scheduled,
            r.extra,
            r.fresh,
            r.runnable_since,
            r.granted_at,
            r.cpu_since_grant_ns,
            r.ran_in_pools,
        )
        for r in sorted(sim.running(), key=lambda r: r.query_id)
    )
    busy = sorted(g.name for g in s.busy)
    return dict(s.free), dict(s.waiting_in), dict(s.owed), busy, groups, runners


def _hand_over_scene(case: str) -> tuple[Sim, Runner, Runner]:
    """A running query of group a whose slot goes to a new query of a."""
    sim = Sim(workers=3)
    if case == "nested":
        sim.group("top")
        sim.group("a")
        sim.s.configure(1, "a", 100, None, "fifo", sim.now, parent=0)
    else:
        sim.group("a", limit=2 if case == "limited" else None)
    sim.group("b")
    sim.s.engaged = case != "disengaged"
    old = sim.query("a", "ann")
    if case != "alone":
        sim.query("a", "ann")
    if case == "someone waits":
        sim.query("b")
        sim.query("b")
    sim.now += 0.01
    new = Runner(sim.groups["a"], "default", "bob" if case == "other user" else "ann", 99)
    return sim, old, new


@pytest.mark.parametrize(
    ("case", "handed"),
    [
        ("same user", True),
        ("other user", True),
        ("nested", True),
        ("alone", False),  # the group would go idle, then busy again: placed
        ("limited", False),  # a cap on the path: the release may unblock another pool
        ("someone waits", False),  # the freed worker is dispatched to them
        ("disengaged", False),
    ],
)
def test_hand_over_is_a_release_then_a_grant_now(case: str, handed: bool) -> None:
    """``hand_over`` ends where ``release_running`` then ``grant_now`` end, or
    changes nothing."""
    sim, old, new = _hand_over_scene(case)
    before = _core_state(sim)
    assert sim.s.hand_over(old, 3 * MS, new, sim.now) is handed
    sim.check()
    if not handed:
        assert _core_state(sim) == before
        return
    expected, old_there, new_there = _hand_over_scene(case)
    assert expected.s.release_running(old_there, 3 * MS, expected.now) == []
    assert expected.s.grant_now(new_there, expected.now)
    assert _core_state(sim) == _core_state(expected)
    assert old.state is RunnerState.DONE
    assert new.state is RunnerState.RUNNING
