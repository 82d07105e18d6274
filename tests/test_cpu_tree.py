"""Hierarchical CPU (SPEC §14) through the engine: siblings share their parent's
CPU by weight on real numpy work, a parent's limit caps its subtree, a third
top-level group keeps its share, all measured side by side in one run; and a
reparent (ALTER SET/RESET parent) moves a group in the core's tree online."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from test_cpu_real import Load, scan, widened
from waiting import wait_until

import resgroups
from resgroups.query import Task
from resgroups.sched.cpu import CpuScheduler, Runner

WINDOW = 4.0  # seconds of the share window (the default is 10)


def rows(engine: resgroups.Engine) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in engine.resource_groups()}


def test_children_split_a_limited_parent_two_to_one_beside_a_top_level_group() -> None:
    """etl is limited to half the CPUs (one core of two); nightly and backfill,
    2:1 under it, take etl's core 2:1; adhoc, top level and of etl's weight,
    keeps the other core meanwhile. One run, every group at once: the body
    CPU is measured inside each query with the thread's own clock."""
    seconds = WINDOW + 2.0
    # a 10 ms granularity: on a loaded machine the subtree gets a fraction of a core,
    # and a lag of the default 50 ms is a large part of what it gets in a few seconds
    # (the split's error, not the level-by-level rule, would dominate)
    with resgroups.Engine(workers=2, cpu_share_window=WINDOW, granularity_ms=10) as engine:
        # one core: half the CPUs of the two-core machine this is written for
        one_core = round(100 / engine.cpus, 2)
        engine.connect().execute_script(
            f"CREATE RESOURCE GROUP etl WITH (cpu_limit = '{one_core}%');"
            "CREATE RESOURCE GROUP nightly WITH (parent = etl, cpu_weight = 200);"
            "CREATE RESOURCE GROUP backfill WITH (parent = etl, cpu_weight = 100);"
            "CREATE RESOURCE GROUP adhoc;"
        )
        # the load is filed by the top-level group (its peak is the subtree's
        # concurrency) and by "user" = the group the query runs in
        load = Load()
        specs = [("etl", "nightly")] * 3 + [("etl", "backfill")] * 3 + [("adhoc", "adhoc")] * 3
        ready = threading.Barrier(len(specs) + 1, timeout=30)
        errors: list[BaseException] = []
        stop = [0.0]

        def body(top: str, group: str) -> None:
            try:
                session = engine.connect("u")
                session.execute(f"SET RESOURCE GROUP {group}")
                ready.wait()  # every query starts at once
                with session.query() as q:
                    scan(q, stop[0], load, top, group)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=body, args=spec) for spec in specs]
        for t in threads:
            t.start()
        stop[0] = time.monotonic() + seconds
        ready.wait()
        # read the window while every group is still busy: it then holds only the
        # time all nine queries competed (they start within the first second)
        wait_until(lambda: time.monotonic() >= stop[0] - 0.3, timeout=seconds + 30)
        during = rows(engine)
        for t in threads:
            t.join(seconds + 30)
        assert not errors, errors
        core = engine.dispatcher.core
        engine.dispatcher.check_invariants()

    by_group = load.by_user
    children = by_group["nightly"] / by_group["backfill"]
    # tolerances of the flat tests (test_cpu_real): 2:1 within 0.3, a core within 0.1
    assert children == pytest.approx(2.0, abs=0.3), (by_group, during)
    etl_cores = load.body_cpu["etl"] / 1e9 / seconds
    assert etl_cores <= 1.0 + 0.1, (etl_cores, by_group)
    assert load.peak["etl"] == 1  # at most ceil(1 core) = 1 worker for the whole subtree
    # adhoc's share is etl's (equal weights, and etl's limit is exactly its half):
    # the ratio of the two, side by side, whatever the machine gave the process
    # Within 0.3 where the machine has the CPUs to spare; when other processes keep
    # more threads runnable than there are CPUs, etl's one worker loses more of its
    # turns between its two groups' queries to the kernel (1.39 seen at load 5 with
    # two CPU hogs), so the bound widens in proportion
    beside = load.body_cpu["adhoc"] / load.body_cpu["etl"]
    bound = widened(0.3, engine.cpus)
    assert beside == pytest.approx(1.0, abs=bound), (bound, load.body_cpu, during)
    # the same on the columns of resource_groups(): an inner group's are its subtree's
    etl, adhoc = during["etl"], during["adhoc"]
    etl_share = min(50.0, one_core)  # its weight's half, or its limit if lower
    assert etl["cpu_entitled_pct"] == pytest.approx(etl_share, abs=2.0), etl
    assert adhoc["cpu_entitled_pct"] == pytest.approx(100.0 - etl_share, abs=2.0), adhoc
    for child, part in (("nightly", 2 / 3), ("backfill", 1 / 3)):
        assert during[child]["cpu_entitled_pct"] == pytest.approx(etl_share * part, abs=2.0)
    subtree = during["nightly"]["cpu_used_pct"] + during["backfill"]["cpu_used_pct"]
    assert etl["cpu_used_pct"] == pytest.approx(subtree, abs=0.01), during
    assert etl["cpu_used_pct"] <= one_core + 5.0, etl  # within its limit
    used = etl["cpu_used_pct"] + adhoc["cpu_used_pct"]
    missing = max(0.0, 100.0 - used)  # CPU the machine gave other processes
    assert abs(adhoc["cpu_share_error_pct"]) <= 5.0 + missing, adhoc
    print(
        f"\nnightly:backfill = {children:.2f}; etl {etl_cores:.2f} cores "
        f"({etl['cpu_used_pct']:.1f} % used, limit {one_core} %); "
        f"adhoc {adhoc['cpu_used_pct']:.1f} % used of {adhoc['cpu_entitled_pct']:.1f} % "
        f"entitled; adhoc:etl = {beside:.2f}"
    )
    assert core.nested == 2


def test_a_reparent_moves_running_and_waiting_work_online() -> None:
    """ALTER SET (parent) while a query of the group holds the only worker and a
    second waits: the core's tree, the held workers and the waiting runner move
    with it; RESET (parent) moves them back, every invariant holding throughout."""
    with resgroups.Engine(workers=1) as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE RESOURCE GROUP etl WITH (cpu_limit = '25%'); CREATE RESOURCE GROUP backfill;"
        )
        core = engine.dispatcher.core
        etl, backfill = (
            next(g for g in core.groups.values() if g.name == n) for n in ("etl", "backfill")
        )
        session = engine.connect("u")
        session.execute("SET RESOURCE GROUP backfill")
        second_started = threading.Event()
        second_done = threading.Event()

        def second() -> None:
            other = engine.connect("u")
            other.execute("SET RESOURCE GROUP backfill")
            second_started.set()
            with other.query():
                pass
            second_done.set()

        with session.query():
            waiter = threading.Thread(target=second)
            waiter.start()
            assert second_started.wait(30)
            wait_until(lambda: any(backfill.waiting.values()), timeout=30)
            admin.execute("ALTER RESOURCE GROUP backfill SET (parent = etl)")
            assert backfill.parent is etl
            assert etl.children == [backfill]
            assert etl.held == 1  # the running query's worker counts against etl's cap
            assert backfill.path_limited
            assert backfill.single_threaded
            engine.dispatcher.check_invariants()
            admin.execute("ALTER RESOURCE GROUP backfill RESET (parent)")
            assert backfill.parent is None
            assert etl.children == []
            assert etl.held == 0
            assert not backfill.path_limited
            engine.dispatcher.check_invariants()
        assert second_done.wait(30)
        waiter.join(30)
        engine.dispatcher.check_invariants()


def test_map_runs_on_the_query_thread_under_a_parent_limited_to_one_core() -> None:
    """A limit above caps the subtree: a child of a group limited to one core or
    less runs a query's parallel work on the query's own thread."""
    with resgroups.Engine(workers=2) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP etl WITH (cpu_limit = '10%');"
            "CREATE RESOURCE GROUP nightly WITH (parent = etl);"
        )
        session = engine.connect("u")
        session.execute("SET RESOURCE GROUP nightly")
        names: set[str] = set()

        def work(task: Task, i: int) -> int:
            names.add(threading.current_thread().name)
            task.checkpoint()
            return i

        with session.query() as q:
            assert q.map(work, range(12)) == list(range(12))
        assert names == {threading.current_thread().name}


def test_a_parent_configured_after_its_child_and_one_never_configured() -> None:
    """A full sync configures groups in any order: a child naming a parent the
    core has not seen yet gets it under a placeholder, which the parent's own
    configure turns into the group; a parent never configured (a dropped group's
    late query) goes with its last child."""
    core = CpuScheduler({"default": 2}, slice_ms=10)
    core.engaged = True
    core.configure(2, "nightly", 200, None, "fifo", 0.0, parent=1)
    etl = core.groups[1]
    assert core.groups[2].parent is etl
    core._check_invariants(0.0)
    core.configure(1, "etl", 100, 1.0, "fifo", 0.0)
    assert core.groups[1] is etl
    assert etl.name == "etl"
    assert core.groups[2].path_limited
    core.forget(2)
    assert 1 in core.groups  # a configured parent stays when its last child goes
    core.configure(4, "late", 100, None, "fifo", 0.0, parent=3)
    runner = Runner(core.groups[4], "default", "u", 1)
    core.submit(runner, 0.0)
    core.forget(4)  # not idle: stays
    assert 4 in core.groups
    core.release(runner, 0, 0.01)
    core.forget(4)
    assert 3 not in core.groups
    assert 4 not in core.groups
    core._check_invariants(0.01)
