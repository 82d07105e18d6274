"""Engagement, degraded mode, limits on map, and the CPU columns, through the engine."""

from __future__ import annotations

import threading
import time

import pytest

import resgroups
from resgroups.query import Task


def metric(engine: resgroups.Engine, name: str) -> float:
    for line in engine.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exposed")


def spin(q: resgroups.query.Query, seconds: float) -> None:
    stop = time.monotonic() + seconds
    x = 0
    while time.monotonic() < stop:
        q.checkpoint()
        x += sum(range(200))


def test_engagement_follows_the_catalog(engine: resgroups.Engine) -> None:
    session = engine.connect()
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 0
    with session.query() as q:
        spin(q, 0.05)
    assert engine.resource_groups()[0]["cpu_nanos_total"] == 0  # disengaged: no sampling
    session.execute("ALTER RESOURCE GROUP default SET (scheduling_policy = 'fair')")
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 1
    session.execute("ALTER RESOURCE GROUP default RESET (scheduling_policy)")
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 0
    session.execute("CREATE RESOURCE GROUP second")
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 1
    with session.query() as q:
        spin(q, 0.05)
    assert engine.resource_groups()[0]["cpu_nanos_total"] > 0
    session.execute("DROP RESOURCE GROUP second")
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 0


def test_dropped_groups_keep_scheduling_engaged_until_their_queries_finish(
    engine: resgroups.Engine,
) -> None:
    admin = engine.connect()
    admin.execute("CREATE RESOURCE GROUP tmp")
    session = engine.connect("u")
    session.execute("SET RESOURCE GROUP tmp")
    with session.query():
        admin.execute("DROP RESOURCE GROUP tmp")
        assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 1
    assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 0


def test_a_scheduler_fault_degrades_cpu_but_not_admission() -> None:
    with resgroups.Engine(workers=4) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP capped WITH (cpu_limit = '1%', max_active_queries = 2);"
        )
        engine._inject_scheduler_fault()
        inside = peak = 0
        lock = threading.Lock()

        def body() -> None:
            nonlocal inside, peak
            session = engine.connect("u")
            session.execute("SET RESOURCE GROUP capped")
            with session.query() as q:
                with lock:
                    inside += 1
                    peak = max(peak, inside)
                q.memory.allocate(100)
                spin(q, 0.1)
                with lock:
                    inside -= 1

        threads = [threading.Thread(target=body) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert metric(engine, "resgroups_resource_groups_cpu_scheduler_degraded") == 1
        assert metric(engine, "resgroups_resource_groups_cpu_managed_dispatch") == 0
        assert peak == 2  # admission still exact; the 1% limit no longer caps workers
        row = engine.resource_groups()[1]
        assert row["admitted_total"] == 6
        assert row["memory_used_bytes"] == 0
        engine.dispatcher.check_invariants()


def test_a_query_behind_a_cap_runs_as_soon_as_a_fault_lifts_the_caps() -> None:
    """A half-core group's second query waits for the group's one worker (its
    budget positive: no clock wakes it). A fault at the first query's slice end
    degrades the scheduler, which lifts caps: the waiter is granted a free
    worker in the same step, not at its wait's 0.25 s fallback."""
    with resgroups.Engine(workers=2) as engine:
        pct = round(0.5 / engine.cpus * 100, 2)
        engine.connect().execute_script(
            f"CREATE RESOURCE GROUP half WITH (cpu_limit = '{pct}%');CREATE RESOURCE GROUP other;"
        )
        running, release = threading.Event(), threading.Event()
        granted = threading.Event()

        def first() -> None:
            session = engine.connect("u")
            session.execute("SET RESOURCE GROUP half")
            with session.query() as q:
                running.set()
                while not release.is_set():  # a light body: the budget stays positive
                    q.checkpoint()
                    release.wait(0.001)

        def behind() -> None:
            session = engine.connect("v")
            session.execute("SET RESOURCE GROUP half")
            with session.query():
                granted.set()
                release.wait(30)  # it holds its worker until the test has looked

        holder = threading.Thread(target=first)
        holder.start()
        assert running.wait(10)
        waiter = threading.Thread(target=behind)
        waiter.start()
        group = next(g for g in engine.dispatcher.core.groups.values() if g.name == "half")
        deadline = time.monotonic() + 10
        while not sum(len(q) for q in group.waiting.values()) and time.monotonic() < deadline:
            time.sleep(0.001)  # until the second query waits for the worker
        assert not granted.is_set()
        engine._inject_scheduler_fault()
        while not engine.dispatcher.degraded and time.monotonic() < deadline:
            time.sleep(0.0005)  # the first query's next slice end raises it
        with engine.dispatcher.lock:  # the degrading step has ended
            assert engine.dispatcher.degraded
            assert len(group.running) == 2  # the waiter holds a worker already
        release.set()
        for t in (holder, waiter):
            t.join(30)
        assert granted.is_set()


@pytest.mark.parametrize(("limit", "single"), [("'1%'", True), (None, False)])
def test_map_runs_on_the_query_thread_in_a_group_limited_to_one_core(
    limit: str | None, single: bool
) -> None:
    with resgroups.Engine(workers=2) as engine:
        params = f" WITH (cpu_limit = {limit})" if limit else ""
        engine.connect().execute(f"CREATE RESOURCE GROUP g{params}")
        session = engine.connect("u")
        session.execute("SET RESOURCE GROUP g")
        names: set[str] = set()

        def work(task: Task, i: int) -> int:
            names.add(threading.current_thread().name)
            time.sleep(0.005)
            task.checkpoint()
            return i

        with session.query() as q:
            assert q.map(work, range(12)) == list(range(12))
        assert (names == {threading.current_thread().name}) == single


def test_ctas_in_a_limited_group_runs_single_threaded_and_keeps_its_worker() -> None:
    with resgroups.Engine(workers=2) as engine:
        pct = round(1.5 / engine.cpus * 100, 2)
        engine.connect().execute(f"CREATE RESOURCE GROUP copy WITH (cpu_limit = '{pct}%')")
        session = engine.connect("u")
        session.execute("SET RESOURCE GROUP copy")
        names: set[str] = set()

        def work(task: Task, i: int) -> int:
            names.add(threading.current_thread().name)
            task.checkpoint()
            return i

        with session.query(kind="ctas") as q:
            assert q.map(work, range(8)) == list(range(8))
            spin(q, 0.3)  # well past its budget: it never yields its worker
        assert names == {threading.current_thread().name}


def test_parallel_tasks_are_charged_to_the_group(engine: resgroups.Engine) -> None:
    engine.connect().execute("CREATE RESOURCE GROUP g")
    session = engine.connect("u")
    session.execute("SET RESOURCE GROUP g")

    def work(task: Task, i: int) -> int:
        stop = time.thread_time() + 0.02
        while time.thread_time() < stop:
            task.checkpoint()
        return i

    with session.query() as q:
        q.map(work, range(8))
    charged = engine.resource_groups()[1]["cpu_nanos_total"]
    assert charged >= 8 * 0.02e9 * 0.9
    engine.dispatcher.check_invariants()


def test_granularity_is_configurable() -> None:
    with resgroups.Engine(granularity_ms=5) as engine:
        assert engine.dispatcher.core.granularity_ns == 5_000_000
    with pytest.raises(resgroups.InvalidParameter):
        resgroups.Engine(granularity_ms=0)
