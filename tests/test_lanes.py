"""Priority lanes (sched/lanes.py): nice values from weights while engaged.

The mapping and the pool resizing are checked exactly; the nice values real
threads run at are read with ``os.getpriority`` on those threads; the CPU
split with lanes and oversubscription is checked on real numpy work with
the tolerances of test_cpu_real.py. One test runs as ``nobody`` in a child
process (tests run as root in CI) to show lanes degrade safely there.
"""

from __future__ import annotations

import json
import math
import os
import pwd
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule
from test_cpu_real import Load, cpu_of, run
from test_cpu_stateful import POOLS, CoreMachine
from waiting import wait_until

import resgroups
from resgroups.cpus import available_cpus
from resgroups.query.parallel import Task
from resgroups.sched.cpu import CpuScheduler, Runner, RunnerState
from resgroups.sched.lanes import NICE_WEIGHTS, Lanes, Privilege, lane_for, limit_lane, probe

LINUX = sys.platform.startswith("linux")
# two workers oversubscribed beyond the CPUs of whatever machine runs this
OVER = min(16.0, max(2.0, available_cpus() / 2 + 1))
OVERSIZED = math.ceil(2 * OVER)
PRIVILEGE = probe()
needs_full = pytest.mark.skipif(
    PRIVILEGE is not Privilege.FULL, reason="lowering a nice needs CAP_SYS_NICE or RLIMIT_NICE"
)
needs_lanes = pytest.mark.skipif(PRIVILEGE is Privilege.NONE, reason="no per-thread nice here")


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _row(engine: resgroups.Engine, name: str) -> dict[str, object]:
    return next(r for r in engine.resource_groups() if r["name"] == name)


# ---- the mapping ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weight", "heaviest", "lane"),
    [(100, 100, 0), (50, 100, 3), (25, 400, 12), (1, 10000, 19), (400, 100, 0), (80, 100, 1)],
)
def test_a_weight_maps_to_the_nice_of_the_nearest_cfs_ratio(
    weight: int, heaviest: int, lane: int
) -> None:
    assert lane_for(weight, heaviest) == lane


def test_each_step_of_the_table_is_its_own_lane() -> None:
    for n, k in enumerate(NICE_WEIGHTS):
        assert lane_for(k, NICE_WEIGHTS[0]) == n


def test_lanes_are_relative_to_the_heaviest_group_with_recent_work() -> None:
    lanes = Lanes(True, Privilege.RAISE)
    lanes.set_weights([(1, 400), (2, 25), (3, 100)])
    lanes.refresh(0.0, [(1, 1), (2, 1)])
    assert lanes.lane(2) == 0  # not engaged: everything at lane 0
    lanes.engage(True)
    assert [lanes.lane(g) for g in (1, 2, 3)] == [0, 12, 6]
    assert lanes.lane(-1) == 0  # the pseudo-group of uncharged tasks
    lanes.refresh(0.005, [(2, 1)])  # within REFRESH_S: nothing recomputed
    lanes.refresh(0.5, [(2, 1)])  # 1 is idle now, but had work within RECENT_S
    assert lanes.lane(2) == 12
    lanes.refresh(1.2, [(2, 1)])  # 1 idle for longer: 2 competes with nobody heavier
    assert [lanes.lane(g) for g in (1, 2, 3)] == [0, 0, 0]
    lanes.refresh(1.3, [(2, 1), (3, 1)])
    assert [lanes.lane(g) for g in (2, 3)] == [6, 0]
    lanes.set_weights([(2, 25)])  # 3 dropped: forgotten at once
    lanes.refresh(1.3, [(2, 1)])
    assert lanes.lane(2) == 0
    assert lanes.nice(30) == 19  # never beyond the weakest nice
    off = Lanes(True, Privilege.NONE)
    off.set_weights([(1, 400), (2, 25)])
    off.refresh(0.0, [(1, 1), (2, 1)])
    off.engage(True)
    assert (off.on, off.lane(2)) == (False, 0)  # collapsed to one lane


def test_a_limited_groups_lane_lets_the_kernel_share_near_its_limit() -> None:
    """Half a core for one thread among three on 2 CPUs: at nice 0 it would get 2/3;
    weight 2/3 of the others' (about 2 nice steps) gives it 0.5."""
    assert limit_lane(0.5, 1, 3, 2.0) == 2
    assert limit_lane(0.5, 1, 2, 2.0) == 0  # no more threads than CPUs: nice changes nothing
    assert limit_lane(0.5, 1, 1, 2.0) == 0  # nobody else to give the CPU to
    assert limit_lane(1.0, 1, 3, 2.0) == 0  # 2/3 of a CPU at nice 0 is within its limit
    assert limit_lane(0.1, 1, 3, 2.0) == 10  # x = 0.1 * 2 / 1.9, about 1/9.5: 1024 / 110
    lanes = Lanes(True, Privilege.RAISE, cpus=2.0)
    lanes.set_weights([(1, 100), (2, 100), (3, 400)], limits=[(1, 0.5)])
    lanes.engage(True)
    lanes.refresh(0.0, [(1, 1), (2, 2)])
    assert [lanes.lane(g) for g in (1, 2)] == [2, 0]
    lanes.refresh(0.1, [(1, 1), (2, 0)])  # alone now: its budget alone holds it
    assert lanes.lane(1) == 0
    lanes.refresh(0.2, [(1, 1), (2, 2), (3, 1)])  # by weight (400 / 100: 6) is lower still
    assert [lanes.lane(g) for g in (1, 2, 3)] == [6, 6, 0]


# ---- the core: a pool's size changes online -----------------------------------------


def test_a_pool_grows_at_once_and_shrinks_as_workers_come_back() -> None:
    core = CpuScheduler({"p": 2})
    core.set_engaged(True, 0.0)
    g, h = core.group(1, "g"), core.group(2, "h")
    held = [Runner(g, "p", "u", i) for i in range(3)]
    other = Runner(h, "p", "u", 7)
    assert core.submit(held[0], 0.0) == [held[0]]
    assert core.submit(held[1], 0.0) == [held[1]]
    assert core.submit(held[2], 0.0) == []  # waits: two workers
    assert core.submit(other, 0.0) == []
    # the new workers are room for other groups: g already holds the configured two
    assert core.resize("p", 4, 0.0) == [other]
    assert (core.sizes["p"], core.free["p"]) == (4, 1)
    assert held[2].state.value == "waiting"
    core._check_invariants(0.0)
    assert core.resize("p", 1, 0.0) == []  # one free taken back now, two owed
    assert (core.sizes["p"], core.free["p"], core.owed["p"]) == (3, 0, 2)
    core._check_invariants(0.0)
    core.release(held[0], 0, 0.1)
    core.release(held[1], 0, 0.1)
    assert (core.sizes["p"], core.free["p"], core.owed["p"]) == (1, 0, 0)
    core._check_invariants(0.1)
    core.release(other, 0, 0.2)  # the shrunk pool's one worker goes to g's waiter
    assert held[2].state.value == "running"
    assert core.resize("p", 2, 0.2) == []  # grown back: nobody waits
    core._check_invariants(0.2)


# ---- an engine: engagement, caller threads, task threads -------------------------------


def test_a_single_group_engine_has_no_lanes() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        assert not engine.dispatcher.lanes.on
        assert _row(engine, "DEFAULT")["cpu_lane"] is None
        with engine.connect().query() as q:
            assert q.held.counted  # the counted path: untouched
            assert q.held.nice is None
        assert engine.dispatcher.core.sizes == {"default": 2}


def _run_in(engine: resgroups.Engine, group: str) -> None:
    s = engine.connect()
    s.execute(f"SET RESOURCE GROUP {group}")
    with s.query():
        pass


@needs_lanes
def test_lanes_and_oversubscription_follow_engagement() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        session.execute("CREATE RESOURCE GROUP report WITH (cpu_weight = 25)")
        assert engine.dispatcher.core.sizes == {"default": OVERSIZED}
        _run_in(engine, "dash")  # dash has had work: the heaviest competing group
        assert [r["cpu_lane"] for r in engine.resource_groups()] == [6, 0, 12]
        session.execute("ALTER RESOURCE GROUP dash SET (cpu_weight = 100)")
        assert [r["cpu_lane"] for r in engine.resource_groups()] == [0, 0, 6]
        held = engine.connect()
        held.execute("SET RESOURCE GROUP report")
        with held.query():
            session.execute_script("DROP RESOURCE GROUP dash; DROP RESOURCE GROUP report")
            # the running query keeps its dropped group: engaged until it ends
            assert engine.dispatcher.lanes.on
            engine.dispatcher.check_invariants()
        assert not engine.dispatcher.lanes.on
        assert engine.dispatcher.core.sizes == {"default": 2}
        assert engine.pool("default").free == 2
        engine.dispatcher.check_invariants()


def test_lanes_stay_off_where_a_pool_has_no_more_workers_than_cpus() -> None:
    """With workers = CPUs the kernel never has more of the pool's threads than
    CPUs to choose among, and a low lane holding a worker a higher one waits for
    would only be slower to hand it over: lanes stay off there."""
    with resgroups.Engine(workers=1, pools={"wide": 4}, oversubscribe=1) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP dash WITH (cpu_weight = 400);"
            "CREATE RESOURCE GROUP report WITH (cpu_weight = 25);"
        )
        dispatcher = engine.dispatcher
        assert dispatcher.lanes.on is dispatcher.lanes.supported  # "wide" may oversubscribe
        report = engine.connect()
        report.execute("SET RESOURCE GROUP report")
        _run_in(engine, "dash")
        with report.query(pool="default") as q:
            assert q.held.nice is None  # one worker on a machine of more CPUs: lane 0
        assert dispatcher.lane_of(q.held.runtime.group_id, "default") == 0  # type: ignore[union-attr]
        if engine.cpus < 4 and dispatcher.lanes.supported:
            assert dispatcher.lane_of(q.held.runtime.group_id, "wide") == 12  # type: ignore[union-attr]


@needs_full
def test_a_query_thread_runs_at_its_lane_and_gets_its_own_nice_back() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        session.execute("CREATE RESOURCE GROUP report WITH (cpu_weight = 25)")
        _run_in(engine, "dash")
        base = engine.dispatcher.lanes.base
        seen: dict[str, int] = {}

        def in_group(group: str) -> None:
            s = engine.connect()
            s.execute(f"SET RESOURCE GROUP {group}")
            before = _nice()
            with s.query() as q:
                seen[group] = _nice()
                q.suspend()  # a cursor between pages runs at its own nice
                seen[group + " suspended"] = _nice()
                q.resume()
                seen[group + " resumed"] = _nice()
            seen[group + " after"] = _nice() - before

        for group in ("dash", "report"):
            thread = threading.Thread(target=in_group, args=(group,))
            thread.start()
            thread.join(30)
        assert seen == {
            "dash": base,
            "dash suspended": base,
            "dash resumed": base,
            "dash after": 0,
            "report": base + 12,
            "report suspended": base,
            "report resumed": base + 12,
            "report after": 0,
        }


@needs_full
def test_a_thread_already_weaker_than_its_lane_keeps_its_nice() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        session.execute("CREATE RESOURCE GROUP low WITH (cpu_weight = 200)")  # lane 3
        _run_in(engine, "dash")
        session.execute("SET RESOURCE GROUP low")
        seen: list[int] = []

        def weak() -> None:
            os.setpriority(os.PRIO_PROCESS, 0, engine.dispatcher.lanes.base + 10)
            with session.query():
                seen.append(_nice())
            seen.append(_nice())

        thread = threading.Thread(target=weak)
        thread.start()
        thread.join(30)
        assert seen == [engine.dispatcher.lanes.base + 10] * 2


@needs_lanes
def test_tasks_run_on_threads_of_their_groups_lane() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        session.execute("CREATE RESOURCE GROUP report WITH (cpu_weight = 25)")
        _run_in(engine, "dash")
        session.execute("SET RESOURCE GROUP report")
        base = engine.dispatcher.lanes.base
        on_pool = threading.Barrier(2, timeout=30)  # two items at once: one on a pool thread

        def where(task: Task, item: int) -> tuple[str, int]:
            on_pool.wait()
            return threading.current_thread().name, _nice()

        with session.query() as q:
            results = q.map(where, range(2))
        pool = [nice for name, nice in results if name.startswith("resgroups-default")]
        assert pool == [base + 12]
        names = [name for name, _ in results if name.startswith("resgroups-default")]
        assert names[0].endswith("-lane12")
        engine.dispatcher.check_invariants()


# ---- real CPU with lanes and oversubscription (tolerances of test_cpu_real.py) ------------


@needs_lanes
def test_oversubscribed_lanes_still_split_cpu_by_the_weights() -> None:
    """Oversubscribed, both groups hold their worker count at once and the kernel
    splits the CPUs by nice (2:1 weights are CFS weights 1024:526) as its per-CPU
    balancing allows (1.4-1.6 on a quiet 2-CPU machine); at slice ends the
    lagging group is handed a worker of the leading one past the configured
    count (docs/cpu.md), so the split follows the weights as without lanes
    (test_cpu_real's tolerance), and every nanosecond is charged to the group
    that used it."""
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP a WITH (cpu_weight = 100);"
            "CREATE RESOURCE GROUP b WITH (cpu_weight = 50);"
        )
        assert engine.dispatcher.core.sizes == {"default": OVERSIZED}
        load = Load()
        run(engine, [("a", "u")] * 3 + [("b", "u")] * 3, 4.0, load)
        measured = load.body_cpu["a"] / load.body_cpu["b"]
        charged = cpu_of(engine, "a") / cpu_of(engine, "b")
        assert measured == pytest.approx(2.0, abs=0.3), (measured, charged)
        assert charged == pytest.approx(measured, rel=0.05), (measured, charged)
        total_body = load.body_cpu["a"] + load.body_cpu["b"]
        assert cpu_of(engine, "a") + cpu_of(engine, "b") == pytest.approx(total_body, rel=0.1)


@needs_lanes
def test_a_limit_holds_its_worker_cap_and_budget_oversubscribed() -> None:
    with resgroups.Engine(workers=2, oversubscribe=OVER) as engine:
        engine.connect().execute_script(
            f"CREATE RESOURCE GROUP half WITH (cpu_limit = '{50 / engine.cpus:g}%');"
            "CREATE RESOURCE GROUP other WITH (cpu_weight = 100);"
        )
        load = Load()
        run(engine, [("half", "u")] * 3 + [("other", "u")] * 2, 3.0, load)
        assert load.peak["half"] == 1  # ceil(0.5 core) = one worker, however many there are
        # the budget: at most half a core plus its 100 ms burst, over 3 s
        assert load.body_cpu["half"] <= 0.5 * 3.0e9 + 0.05e9 + 0.1e9, load.body_cpu
        assert cpu_of(engine, "half") == pytest.approx(load.body_cpu["half"], rel=0.1)


# ---- without privilege ------------------------------------------------------------------

UNPRIVILEGED = textwrap.dedent(
    """
    import json, os, pwd, sys, threading
    import resgroups
    from resgroups.sched.lanes import probe
    from resgroups.sql.parser import parse_script

    parse_script("SELECT 1")  # the grammar and its cache are read as root too
    # imported as root (the interpreter may live where nobody cannot read); from
    # here this process is nobody's, with no capability
    nobody = pwd.getpwnam("nobody")
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    assert os.geteuid() == nobody.pw_uid

    out = {"privilege": probe().value}
    with resgroups.Engine(workers=2, oversubscribe=float(sys.argv[1])) as engine:
        s = engine.connect()
        s.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        s.execute("CREATE RESOURCE GROUP report WITH (cpu_weight = 25)")
        d = engine.connect()
        d.execute("SET RESOURCE GROUP dash")
        with d.query():
            pass
        s.execute("SET RESOURCE GROUP report")
        out["on"] = engine.dispatcher.lanes.on
        out["lanes"] = [r["cpu_lane"] for r in engine.resource_groups()]
        nices = []
        barrier = threading.Barrier(2, timeout=30)
        def item(task, i):
            barrier.wait()
            return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, 0)
        for _ in range(3):
            with s.query() as q:
                nices.append(os.getpriority(os.PRIO_PROCESS, 0))
                out["map"] = sorted(q.map(item, range(2)))
        nices.append(os.getpriority(os.PRIO_PROCESS, 0))
        out["caller"] = nices
        out["admitted"] = next(
            r for r in engine.resource_groups() if r["name"] == "report"
        )["admitted_total"]
        engine.dispatcher.check_invariants()
    print(json.dumps(out))
    """
)


@pytest.mark.skipif(not LINUX or os.geteuid() != 0, reason="needs root to become nobody")
def test_lanes_degrade_safely_for_an_unprivileged_user() -> None:
    pwd.getpwnam("nobody")  # KeyError: no such user here
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, str(OVER)],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["admitted"] == 3
    if out["privilege"] == "none":  # the kernel refuses even raising: one lane, as before
        assert (out["on"], out["lanes"]) == (False, [None, None, None])
        return
    # raise-only: tasks use lane threads; the caller's own thread is never touched,
    # since its nice could not come back
    assert out["privilege"] == "raise"
    assert out["on"] is True
    assert out["lanes"] == [6, 0, 12]
    assert out["caller"] == [out["caller"][-1]] * 4
    pool = [nice for name, nice in out["map"] if name.startswith("resgroups-default")]
    assert pool == [out["caller"][-1] + 12]


def test_a_probe_finds_what_this_process_may_do() -> None:
    found = probe()
    if not LINUX:
        assert found is Privilege.NONE
    elif os.geteuid() == 0:
        assert found is Privilege.FULL  # root has CAP_SYS_NICE
    before = _nice()
    assert probe() is found
    assert _nice() == before  # the probe touched only its own short-lived thread
    wait_until(lambda: not any(t.name == "resgroups-lane-probe" for t in threading.enumerate()))


@needs_lanes
def test_a_grant_costs_no_syscall_at_lane_zero() -> None:
    """The top lane and lanes off take the same path: enter() returns None at once."""
    lanes = Lanes(True, PRIVILEGE)
    assert lanes.enter(0, None) is None


# ---- the core under random sequences, pools resized among them ------------------------


class ResizingMachine(CoreMachine):
    """test_cpu_stateful's machine, plus pools oversubscribed and shrunk back at any
    step (as lanes turn on and off): every invariant holds after each step, one
    group never holds more than a pool's configured size while it is oversized,
    and everything drains back to the configured sizes."""

    @rule(pool=st.sampled_from(list(POOLS)), factor=st.sampled_from([1, 2, 3]))
    def resize(self, pool: str, factor: int) -> None:
        self.s.resize(pool, POOLS[pool] * factor, self.now)

    @invariant()
    def oversized_pools_are_room_for_others(self) -> None:
        """A runner granted in this step, in a pool oversized after it, leaves its
        group holding at most the configured size there, unless it was handed the
        worker of another group's runner that yielded to it in this step (a hand-
        over adds no thread: docs/cpu.md)."""
        s = self.s
        before = getattr(self, "_before", None)
        running = {id(r): r for r in self.runners if r.state is RunnerState.RUNNING}
        if before is not None and s.engaged and not s.degraded:
            for pool, size in s.sizes.items():
                if size <= POOLS[pool]:
                    continue
                for g in s.groups.values():
                    mine = [r for r in g.running if r.pool == pool and r.scheduled]
                    if any(id(r) not in before for r in mine) and len(mine) > POOLS[pool]:
                        yielded = [
                            r
                            for r in before.values()
                            if r.pool == pool
                            and r.group is not g
                            and r.state is RunnerState.WAITING
                        ]
                        assert yielded, (g, pool, mine, s.sizes)
                        # and the pool's threads holding workers did not grow
                        now_held = sum(1 for r in running.values() if r.pool == pool)
                        was_held = sum(1 for r in before.values() if r.pool == pool)
                        assert now_held <= was_held, (g, pool, now_held, was_held)
        self._before = running

    def teardown(self) -> None:
        for pool, size in POOLS.items():
            self.s.resize(pool, size, self.now)
        super().teardown()


ResizingMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None
)
TestResizingStateful = ResizingMachine.TestCase


@pytest.mark.parametrize("factor", [0.5, 0, 17, True, "2"])
def test_oversubscribe_takes_a_factor_from_one_to_sixteen(factor: object) -> None:
    with pytest.raises(resgroups.InvalidParameter, match="oversubscribe"):
        resgroups.Engine(oversubscribe=factor)  # type: ignore[arg-type]
