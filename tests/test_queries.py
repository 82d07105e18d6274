"""Managed queries on real threads: the gate, workers, cursors, cancellation, close."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
from waiting import wait_until

import resgroups
import resgroups.query
from resgroups.clock import ManualClock
from resgroups.query import Task
from resgroups.sql.parser import parse_one


@pytest.fixture
def wide() -> Iterator[resgroups.Engine]:
    """Eight workers, so admission (not the pool) is what limits concurrency."""
    with resgroups.Engine(workers=8) as e:
        yield e


def row(engine: resgroups.Engine, name: str) -> dict[str, object]:
    return next(r for r in engine.resource_groups() if r["name"] == name)


def _queued_is(engine: resgroups.Engine, group: str, n: int) -> bool:
    return row(engine, group)["queued_queries"] == n


def attempt(session: resgroups.Session, kind: str = "select") -> None:
    """Run an empty query (for pytest.raises around the entry)."""
    with session.query(kind=kind):
        pass


def in_group(engine: resgroups.Engine, group: str, user: str = "u") -> resgroups.Session:
    session = engine.connect(user)
    session.execute(f"SET RESOURCE GROUP {group}")
    return session


def test_fifty_queries_never_see_a_fifth(wide: resgroups.Engine) -> None:
    wide.connect().execute("CREATE RESOURCE GROUP r WITH (max_active_queries = 4)")
    lock = threading.Lock()
    inside = peak = 0
    finished: list[int] = []

    def body(i: int) -> None:
        nonlocal inside, peak
        session = in_group(wide, "r", f"user{i % 5}")
        with session.query() as q:
            with lock:
                inside += 1
                peak = max(peak, inside)
            for _ in range(3):
                q.checkpoint()
                time.sleep(0.002)
            with lock:
                inside -= 1
        finished.append(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(finished) == list(range(50))
    assert peak == 4
    stats = row(wide, "r")
    assert (stats["active_queries"], stats["queued_queries"]) == (0, 0)
    assert stats["admitted_total"] == 50


class Boom(BaseException):
    """Not even an Exception: the slot must come back all the same."""


def test_bodies_raising_at_random_leave_no_slot_behind(wide: resgroups.Engine) -> None:
    wide.connect().execute("CREATE RESOURCE GROUP r WITH (max_active_queries = 3)")
    rng = random.Random(7)
    plans = [rng.choice(["ok", "error", "base", "checkpoint"]) for _ in range(40)]
    outcomes: list[str] = []

    def body(plan: str) -> None:
        session = in_group(wide, "r")
        try:
            with session.query() as q:
                q.memory.allocate(1000)
                time.sleep(0.001)
                if plan == "error":
                    raise ValueError("body failed")
                if plan == "base":
                    raise Boom()
                if plan == "checkpoint":
                    q.cancel()
                    q.checkpoint()
            outcomes.append("ok")
        except (ValueError, Boom, resgroups.QueryCancelled) as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=body, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 40
    stats = row(wide, "r")
    assert (stats["active_queries"], stats["queued_queries"], stats["memory_used_bytes"]) == (
        0,
        0,
        0,
    )
    assert wide.pool("default").free == 8


def test_the_seed_example_four_active_thirty_two_queued(wide: resgroups.Engine) -> None:
    """4 running, 32 waiting, the 37th refused at once; the wait ends at queue_timeout."""
    wide.connect().execute(
        "CREATE RESOURCE GROUP reporting WITH (max_active_queries = 4, max_queued_queries = 32,"
        " queue_timeout = '15s')"
    )
    # the timeout shortened for the test, online, as ALTER does
    wide.connect().execute("ALTER RESOURCE GROUP reporting SET (queue_timeout = '300ms')")
    release = threading.Event()
    errors: list[BaseException] = []
    started = threading.Barrier(5)

    def running() -> None:
        with in_group(wide, "reporting").query():
            started.wait(10)
            release.wait(30)

    def waiting() -> None:
        try:
            with in_group(wide, "reporting").query():
                pass
        except resgroups.Error as exc:
            errors.append(exc)

    runners = [threading.Thread(target=running) for _ in range(4)]
    for t in runners:
        t.start()
    started.wait(10)
    waiters = [threading.Thread(target=waiting) for _ in range(32)]
    for t in waiters:
        t.start()
    wait_until(lambda: row(wide, "reporting")["queued_queries"] == 32)
    assert row(wide, "reporting")["active_queries"] == 4
    with pytest.raises(resgroups.AdmissionRejected) as refused:
        attempt(in_group(wide, "reporting"))
    assert refused.value.sqlstate == "53400"
    assert "Resource Group admission queue is full" in str(refused.value)
    assert "reporting" in str(refused.value)
    for t in waiters:
        t.join(30)
    assert len(errors) == 32
    assert all(isinstance(e, resgroups.QueueTimeout) for e in errors)
    assert "Resource Group admission queue timeout" in str(errors[0])
    stats = row(wide, "reporting")
    assert stats["admission_rejections"] == 1
    assert stats["admission_timeouts"] == 32
    release.set()
    for t in runners:
        t.join(30)
    assert row(wide, "reporting")["active_queries"] == 0


def test_first_deadline_wins() -> None:
    with resgroups.Engine(workers=4, query_timeout=0.2) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP slow_q WITH (max_active_queries = 1, queue_timeout = '10s');"
            "CREATE RESOURCE GROUP fast_q WITH (max_active_queries = 1, queue_timeout = 50)"
        )
        release = threading.Event()
        holders = []
        for group in ("slow_q", "fast_q"):
            holder = threading.Thread(target=lambda g=group: _hold(engine, g, release), daemon=True)
            holder.start()
            holders.append(holder)
        wait_until(lambda: all(row(engine, g)["active_queries"] == 1 for g in ("slow_q", "fast_q")))
        with pytest.raises(resgroups.QueryTimeout, match="while queued for Resource Group"):
            attempt(in_group(engine, "slow_q"))
        with pytest.raises(resgroups.QueueTimeout):
            attempt(in_group(engine, "fast_q"))
        assert row(engine, "slow_q")["admission_timeouts"] == 1
        assert row(engine, "fast_q")["admission_timeouts"] == 1
        release.set()
        for h in holders:
            h.join(10)


def _hold(engine: resgroups.Engine, group: str, release: threading.Event) -> None:
    session = in_group(engine, group)
    with session.query(kind="other") if group == "" else session.query():
        release.wait(30)


def test_fair_admission_takes_turns(wide: resgroups.Engine) -> None:
    wide.connect().execute(
        "CREATE RESOURCE GROUP research WITH (max_active_queries = 1, scheduling_policy = 'fair')"
    )
    order: list[str] = []
    gate = threading.Event()
    first = in_group(wide, "research", "ann")
    q0 = first.query()
    q0.__enter__()
    threads = []
    # ann queues three queries first, then bob two: fair alternates users
    for user in ["ann", "ann", "ann", "bob", "bob"]:

        def body(u: str = user) -> None:
            with in_group(wide, "research", u).query():
                order.append(u)
                gate.wait(10)

        t = threading.Thread(target=body)
        t.start()
        threads.append(t)
        wait_until(partial(_queued_is, wide, "research", len(threads)))
    gate.set()
    q0.__exit__(None, None, None)
    for t in threads:
        t.join(30)
    assert order == ["bob", "ann", "bob", "ann", "ann"]


def test_alter_online_lowering_and_raising_the_limit(wide: resgroups.Engine) -> None:
    admin = wide.connect()
    admin.execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 3)")
    holders = [in_group(wide, "g").query() for _ in range(3)]
    for q in holders:
        q.__enter__()
    admin.execute("ALTER RESOURCE GROUP g SET (max_active_queries = 1)")
    assert row(wide, "g")["active_queries"] == 3  # held slots are kept
    admitted = threading.Event()

    def waiter() -> None:
        with in_group(wide, "g").query():
            admitted.set()

    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: row(wide, "g")["queued_queries"] == 1)
    holders[0].__exit__(None, None, None)
    holders[1].__exit__(None, None, None)
    # a negative can only be watched for a while: it stays queued
    assert not admitted.wait(0.1)  # 1 active is not below the new limit of 1
    assert row(wide, "g")["queued_queries"] == 1
    admin.execute("ALTER RESOURCE GROUP g SET (max_active_queries = 2)")
    assert admitted.wait(10)
    t.join(10)
    holders[2].__exit__(None, None, None)


def test_a_query_waiting_for_a_worker_keeps_its_slot() -> None:
    with resgroups.Engine(workers=1) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 5)")
        holder = in_group(engine, "g").query()
        holder.__enter__()
        entered = threading.Event()

        def second() -> None:
            with in_group(engine, "g").query():
                entered.set()

        t = threading.Thread(target=second)
        t.start()
        wait_until(lambda: engine.pool("default").waiting == 1)
        assert row(engine, "g")["active_queries"] == 2  # the waiter holds its slot
        assert not entered.is_set()
        holder.__exit__(None, None, None)
        assert entered.wait(10)
        t.join(10)


def test_cursor_suspend_returns_slot_and_worker_resume_passes_the_gate() -> None:
    with resgroups.Engine(workers=1) as engine:
        engine.connect().execute(
            "CREATE RESOURCE GROUP pages WITH (max_active_queries = 1, max_queued_queries = 0)"
        )
        session = in_group(engine, "pages")
        with session.query() as cursor:
            cursor.memory.allocate(4096)
            cursor.suspend()
            stats = row(engine, "pages")
            assert stats["active_queries"] == 0
            assert stats["memory_used_bytes"] == 4096  # memory stays charged
            assert engine.pool("default").free == 1
            other = in_group(engine, "pages").query()
            other.__enter__()  # takes the slot the cursor gave back
            with pytest.raises(resgroups.AdmissionRejected):
                cursor.resume()
            assert cursor.state.value == "suspended"  # refused: still suspended, retryable
            other.__exit__(None, None, None)
            cursor.resume()
            cursor.checkpoint()
        stats = row(engine, "pages")
        assert stats["admitted_total"] == 3  # entry, the other query, the resume
        assert (stats["active_queries"], stats["memory_used_bytes"]) == (0, 0)
        assert stats["admission_rejections"] == 1


def test_cancel_a_queued_query_leaves_the_queue_at_once(wide: resgroups.Engine) -> None:
    wide.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
    holder = in_group(wide, "g").query()
    holder.__enter__()
    queued = in_group(wide, "g").query()
    failure: list[BaseException] = []

    def enter() -> None:
        try:
            queued.__enter__()
        except resgroups.Error as exc:
            failure.append(exc)

    t = threading.Thread(target=enter)
    t.start()
    wait_until(lambda: row(wide, "g")["queued_queries"] == 1)
    started = time.monotonic()
    queued.cancel()
    t.join(10)
    assert time.monotonic() - started < 1.0
    assert isinstance(failure[0], resgroups.QueryCancelled)
    assert row(wide, "g")["queued_queries"] == 0
    holder.__exit__(None, None, None)


def test_cancel_a_running_query_from_another_thread(engine: resgroups.Engine) -> None:
    session = engine.connect()
    spinning = threading.Event()

    def spin(q: resgroups.query.Query) -> None:
        deadline = time.monotonic() + 10  # a broken cancel fails, never hangs
        while time.monotonic() < deadline:
            q.checkpoint()
            spinning.set()
            time.sleep(0.001)
        raise AssertionError("cancel() from another thread never reached the checkpoint")

    def cancel_once_spinning(q: resgroups.query.Query) -> None:
        if spinning.wait(10):
            q.cancel()

    with session.query() as q:
        threading.Thread(target=cancel_once_spinning, args=(q,), daemon=True).start()
        with pytest.raises(resgroups.QueryCancelled):
            spin(q)


def test_query_timeout_surfaces_at_a_checkpoint() -> None:
    clock = ManualClock()
    engine = resgroups.Engine(query_timeout=0.05, clock=clock)
    with engine, engine.connect().query() as q:
        q.checkpoint()  # not yet
        clock.advance(0.08)
        with pytest.raises(resgroups.QueryTimeout, match="query timeout"):
            q.checkpoint()


def test_unmanaged_kind_takes_nothing_but_observes_cancel_and_timeout() -> None:
    clock = ManualClock()
    with resgroups.Engine(workers=1, query_timeout=0.05, clock=clock) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        holder = in_group(engine, "g").query()
        holder.__enter__()  # the only worker and the only slot
        with in_group(engine, "g").query(kind="other") as q:
            assert q.group is None
            assert row(engine, "g")["active_queries"] == 1
            clock.advance(0.06)
            with pytest.raises(resgroups.QueryTimeout):
                q.checkpoint()
        with in_group(engine, "g").query(kind="other") as q:
            q.cancel()
            with pytest.raises(resgroups.QueryCancelled):
                q.checkpoint()
        holder.__exit__(None, None, None)


def test_feature_disabled_runs_every_query_unmanaged() -> None:
    with resgroups.Engine(enabled=False) as engine:
        with engine.connect().query() as q:
            assert q.group is None
        assert engine.resource_groups()[0]["admitted_total"] == 0


def test_exports_keep_the_mapped_group() -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE RESOURCE GROUP mapped; CREATE RESOURCE GROUP chosen; CREATE USER u;"
            "ALTER USER u SET RESOURCE GROUP mapped; GRANT USE ON RESOURCE GROUP chosen TO u"
        )
        user = engine.connect("u")
        user.execute("SET RESOURCE GROUP chosen")
        with user.query(kind="select") as q:
            assert q.group == "chosen"
        with user.query(kind="export") as q:
            assert q.group == "mapped"


def test_map_runs_in_order_and_the_caller_helps() -> None:
    # the query holds the only worker: its caller must run every task itself
    with resgroups.Engine(workers=1) as engine, engine.connect().query() as q:
        threads: set[str] = set()

        def square(task: Task, x: int) -> int:
            task.checkpoint()
            threads.add(threading.current_thread().name)
            return x * x

        assert q.map(square, range(20)) == [x * x for x in range(20)]
        assert threads == {threading.current_thread().name}
        assert q.map(square, []) == []


def test_map_uses_pool_workers_and_raises_the_first_error(wide: resgroups.Engine) -> None:
    with wide.connect().query() as q:
        names: set[str] = set()

        def slow(task: Task, x: int) -> int:
            names.add(threading.current_thread().name)
            time.sleep(0.01)
            return x

        assert q.map(slow, range(16)) == list(range(16))
        assert len(names) > 1  # pool threads took part

        def failing(task: Task, x: int) -> int:
            task.checkpoint()
            if x == 3:
                raise KeyError(x)
            time.sleep(0.005)
            return x

        with pytest.raises(KeyError):
            q.map(failing, range(12))
    assert wide.pool("default").free == 8


def test_dropped_group_finishes_its_queries_and_leaves_resource_groups(
    wide: resgroups.Engine,
) -> None:
    admin = wide.connect()
    admin.execute("CREATE RESOURCE GROUP tmp WITH (max_active_queries = 1)")
    session = in_group(wide, "tmp")
    with session.query() as q:
        admin.execute("DROP RESOURCE GROUP tmp")
        assert [r["name"] for r in wide.resource_groups()] == ["DEFAULT"]
        q.checkpoint()
        assert q.group == "tmp"
    with pytest.raises(resgroups.CatalogError, match="no longer exists"):
        session.query().__enter__()
    admin.execute("CREATE RESOURCE GROUP tmp")
    assert row(wide, "tmp")["admitted_total"] == 0  # a new group, fresh counters


def test_close_refuses_new_fails_queued_and_waits_for_running() -> None:
    engine = resgroups.Engine(workers=2)
    engine.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
    release = threading.Event()
    outcomes: dict[str, object] = {}

    def running() -> None:
        with in_group(engine, "g").query() as q:
            outcomes["running_started"] = True
            release.wait(10)
            q.checkpoint()
        outcomes["running"] = "finished"

    def queued() -> None:
        try:
            with in_group(engine, "g").query():
                outcomes["queued"] = "ran"
        except resgroups.Error as exc:
            outcomes["queued"] = exc

    r = threading.Thread(target=running)
    r.start()
    wait_until(lambda: "running_started" in outcomes)
    session = in_group(engine, "g")
    q = threading.Thread(target=queued)
    q.start()
    wait_until(lambda: row(engine, "g")["queued_queries"] == 1)
    threading.Timer(0.1, release.set).start()
    engine.close(grace=10)
    q.join(10)
    r.join(10)
    assert isinstance(outcomes["queued"], resgroups.EngineClosed)
    assert outcomes["running"] == "finished"
    with pytest.raises(resgroups.EngineClosed):
        session.query().__enter__()


def test_close_cancels_a_cursor_between_pages_instead_of_waiting_for_it() -> None:
    """A paging cursor nobody reads holds no slot and cannot end by itself: the
    close cancels it at once (its next fetch raises) rather than waiting out a
    grace for it, while a query that runs is still waited for."""
    engine = resgroups.Engine(workers=2)
    session = engine.connect()
    cursor = session.open_cursor(parse_one("SELECT x FROM long_sequence(1000000)"))
    assert cursor.fetch(2) == [(1,), (2,)]
    release = threading.Event()
    outcomes: dict[str, object] = {}

    def running() -> None:
        with engine.connect().query() as q:
            outcomes["started"] = True
            release.wait(30)
            q.checkpoint()
        outcomes["running"] = "finished"

    r = threading.Thread(target=running)
    r.start()
    wait_until(lambda: "started" in outcomes)
    # a daemon: were the close to wait out its grace, the test fails, never hangs
    closer = threading.Thread(target=engine.close, kwargs={"grace": 3600}, daemon=True)
    closer.start()
    try:
        wait_until(lambda: cursor.query.cancelled)  # at once, before any grace passed
        assert closer.is_alive()  # the running query is still waited for
    finally:
        release.set()
    closer.join(30)
    r.join(30)
    assert not closer.is_alive(), "the close waited for the cursor nobody reads"
    assert outcomes["running"] == "finished"
    with pytest.raises(resgroups.QueryCancelled):
        cursor.fetch(2)


def test_select_statements_pass_the_gate(wide: resgroups.Engine) -> None:
    session = wide.connect()
    session.execute_script(
        "CREATE RESOURCE GROUP g WITH (max_active_queries = 1, max_queued_queries = 0);"
        "SET RESOURCE GROUP g"
    )
    assert session.execute("SELECT current_resource_group()").rows == [("g",)]
    assert row(wide, "g")["admitted_total"] == 1
    holder = in_group(wide, "g").query()
    holder.__enter__()
    with pytest.raises(resgroups.AdmissionRejected):
        session.execute("SELECT 1")
    # monitoring is unmanaged: it never queues behind the workload
    assert session.execute("SELECT count(*) FROM resource_groups()").rows == [(2,)]
    holder.__exit__(None, None, None)


def test_metrics_text_names_and_values(wide: resgroups.Engine) -> None:
    wide.connect().execute("CREATE RESOURCE GROUP reporting WITH (memory_limit = '1M')")
    with in_group(wide, "reporting").query() as q:
        q.memory.allocate(100_000)  # above 64 KiB: published at once
        text = wide.metrics_text()
    expected = [
        'resgroups_resource_group_active_queries{resource_group="reporting"} 1.0',
        'resgroups_resource_group_queued_queries{resource_group="reporting"} 0.0',
        'resgroups_resource_group_oldest_queue_wait_millis{resource_group="DEFAULT"} 0.0',
        'resgroups_resource_group_memory_bytes{resource_group="reporting"} 100000.0',
        'resgroups_resource_group_memory_limit_bytes{resource_group="reporting"} 1.048576e+06',
        'resgroups_resource_group_admission_rejections_total{resource_group="reporting"} 0.0',
        'resgroups_resource_group_admission_timeouts_total{resource_group="reporting"} 0.0',
        'resgroups_resource_group_admitted_total{resource_group="reporting"} 1.0',
        "resgroups_resource_groups_enabled 1.0",
        "resgroups_resource_groups_catalog_current 1.0",
        "resgroups_resource_groups_catalog_lag_unmanaged_queries_total 0.0",
        "resgroups_resource_groups_cpu_managed_dispatch 1.0",  # two groups: engaged
        "resgroups_resource_groups_cpu_scheduler_degraded 0.0",
    ]
    lines = text.splitlines()
    for line in expected:
        assert line in lines, line
    for counter in ("cpu_nanos_total", "cpu_wait_nanos_total"):
        prefix = f'resgroups_resource_group_{counter}{{resource_group="reporting"}} '
        assert any(line.startswith(prefix) for line in lines), counter
    # one registry per engine: a second engine does not clash
    with resgroups.Engine() as other:
        assert "resgroups_resource_groups_enabled 1.0" in other.metrics_text()


def test_bad_query_arguments(engine: resgroups.Engine) -> None:
    session = engine.connect()
    with pytest.raises(resgroups.InvalidParameter, match="kind"):
        session.query(kind="update")
    with pytest.raises(resgroups.InvalidParameter, match="no worker pool 'exprot'"):
        session.query(pool="exprot")
    with session.query() as q:
        with pytest.raises(resgroups.InvalidParameter, match="exceeds"):
            q.memory.release(100_000)  # more than the query holds, past 64 KiB: refused
        with pytest.raises(resgroups.InvalidParameter, match=">= 0"):
            q.memory.allocate(-1)


def test_named_pools() -> None:
    with (
        resgroups.Engine(workers=2, pools={"export": 1}) as engine,
        engine.connect().query(kind="export", pool="export"),
    ):
        assert engine.pool("export").free == 0
        assert engine.pool("default").free == 2
