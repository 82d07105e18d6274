"""Fleet mode (SPEC §11): max_active_queries across processes, on PostgreSQL.
Each test has a coordination database of its own (the pg_catalog fixture);
remote engines are real processes (tests/programs/fleet_node.py)."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nodes import Node, bodies, max_overlap
from waiting import wait_until

import resgroups

FLEET_NODE = Path(__file__).parent / "programs" / "fleet_node.py"


def _leases(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        try:
            row = conn.execute("SELECT count(*) FROM resgroups_fleet_leases").fetchone()
        except psycopg.errors.UndefinedTable:
            return 0  # no engine has opened the database yet
        assert row is not None
        return int(row[0])


def _engine(dsn: str, **kwargs: Any) -> resgroups.Engine:
    engine = resgroups.Engine(coordination=dsn, workers=4, **kwargs)
    engine.connect().execute(
        "CREATE RESOURCE GROUP capped WITH (max_active_queries = 3, queue_timeout = '30s')"
    )
    return engine


def test_the_limit_holds_across_three_processes(pg_catalog: str) -> None:
    nodes = [Node(pg_catalog, program=FLEET_NODE) for _ in range(3)]
    try:
        for node in nodes:
            done = node.wait_for(lambda m: m.get("done", False), timeout=180)
            assert done["errors"] == []
        intervals = [b for node in nodes for b in bodies(node)]
    finally:
        for node in nodes:
            node.kill()
    assert len(intervals) == 3 * 6 * 4  # everything finished
    assert max_overlap(intervals) == 3  # never above the fleet limit, and it was reached
    assert _leases(pg_catalog) == 0  # every lease released


def test_a_killed_process_leases_are_reclaimed_after_expiry(pg_catalog: str) -> None:
    with Node(pg_catalog, "--forever", "--hold", "5", "--expiry", "2", program=FLEET_NODE) as a:
        wait_until(lambda: _leases(pg_catalog) == 3, timeout=30)  # A holds every slot
        a.kill()  # SIGKILL: no release, no cleanup
    engine = _engine(pg_catalog, lease_heartbeat=0.5, lease_expiry=2.0, sweep_interval=0.5)
    try:
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        started = time.monotonic()
        with session.query():  # waits until the sweep reclaims A's leases
            waited = time.monotonic() - started
            assert _leases(pg_catalog) <= 3
        assert waited > 0.5  # nothing was over-admitted while A's leases stood
    finally:
        engine.close()


def test_groups_without_a_limit_take_no_lease(pg_catalog: str) -> None:
    engine = _engine(pg_catalog)
    try:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP free WITH (cpu_weight = 10)")
        session.execute("SET RESOURCE GROUP free")
        with session.query():
            assert _leases(pg_catalog) == 0
        session.execute("SET RESOURCE GROUP capped")
        with session.query():
            assert _leases(pg_catalog) == 1
        wait_until(lambda: _leases(pg_catalog) == 0)  # released by the batcher
    finally:
        engine.close()


def test_a_query_waiting_for_a_fleet_lease_is_queued_cancellable_and_times_out(
    pg_catalog: str,
) -> None:
    a, b = _engine(pg_catalog), _engine(pg_catalog)
    try:
        holders = []
        for _ in range(3):  # A holds the three fleet slots
            s = a.connect()
            s.execute("SET RESOURCE GROUP capped")
            q = s.query()
            q.__enter__()
            holders.append(q)
        waiter = b.connect()
        waiter.execute("SET RESOURCE GROUP capped")
        q = waiter.query()
        errors: list[BaseException] = []

        def enter() -> None:
            try:
                q.__enter__()
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=enter)
        t.start()
        row = lambda: next(r for r in b.resource_groups() if r["name"] == "capped")  # noqa: E731
        wait_until(lambda: row()["queued_queries"] == 1)
        q.cancel()
        t.join(10)
        assert isinstance(errors[0], resgroups.QueryCancelled)
        assert row()["queued_queries"] == 0
        b.connect().execute("ALTER RESOURCE GROUP capped SET (queue_timeout = '300ms')")
        late = b.connect()
        late.execute("SET RESOURCE GROUP capped")
        with pytest.raises(resgroups.QueueTimeout, match="fleet-wide"), late.query():
            pass
        for holder in holders:
            holder.__exit__(None, None, None)
    finally:
        a.close()
        b.close()


def test_the_store_unreachable_fails_closed_and_admission_resumes(pg_catalog: str) -> None:
    engine = _engine(pg_catalog)
    name = pg_catalog.rsplit("/", 1)[1]
    admin_dsn = pg_catalog.rsplit("/", 1)[0] + "/postgres"
    try:
        session = engine.connect()
        session.execute("ALTER RESOURCE GROUP capped SET (queue_timeout = '1s')")
        session.execute("SET RESOURCE GROUP capped")
        # nothing is valid before the instance's first heartbeat (docs/fleet.md), which
        # its maintenance thread sends: a query waits for it before the store goes away,
        # or on a loaded machine the cut can come first and no group could ever run
        with session.query():
            pass
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [name],
            )
        with pytest.raises(resgroups.CoordinationUnavailable) as failed, session.query():
            pytest.fail("admitted while the store was unreachable")
        assert failed.value.sqlstate == "08006"
        free = engine.connect()
        free.execute("CREATE RESOURCE GROUP free")
        free.execute("SET RESOURCE GROUP free")
        with free.query():  # groups without a limit keep running
            pass
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        with session.query():  # admission resumes
            pass
        wait_until(lambda: _leases(pg_catalog) == 0, timeout=30)  # queued releases delivered
        assert engine.fleet is not None
        assert engine.fleet.errors > 0
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        engine.close()


def test_drift_is_repaired_by_the_next_sweep(pg_catalog: str) -> None:
    engine = _engine(pg_catalog, lease_heartbeat=0.5, lease_expiry=60.0, sweep_interval=0.5)
    try:
        with psycopg.connect(pg_catalog, autocommit=True) as conn:
            key = next(g.uid for g in engine.snapshot.groups if g.name == "capped")
            conn.execute(
                "INSERT INTO resgroups_fleet_leases (query_id, group_key, instance_id) "
                "SELECT 'x' || i, %s, 'ghost' FROM generate_series(1, 3) AS i",
                [key],
            )
            with conn.transaction():
                conn.execute("ALTER TABLE resgroups_fleet_leases DISABLE TRIGGER USER")
                conn.execute("DELETE FROM resgroups_fleet_leases WHERE instance_id = 'ghost'")
                conn.execute("ALTER TABLE resgroups_fleet_leases ENABLE TRIGGER USER")
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        with session.query():  # the counter said 3 (full); the sweep recounts it to 0
            pass
    finally:
        engine.close()


def test_a_waiter_in_one_engine_starts_soon_after_a_release_in_another(pg_catalog: str) -> None:
    a = resgroups.Engine(coordination=pg_catalog, workers=2)
    b = resgroups.Engine(coordination=pg_catalog, workers=2)
    try:
        for engine in (a, b):
            engine.connect().execute(
                "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, queue_timeout = '30s')"
            )
        holder, waiter = a.connect(), b.connect()
        holder.execute("SET RESOURCE GROUP one")
        waiter.execute("SET RESOURCE GROUP one")
        row = lambda: next(r for r in b.resource_groups() if r["name"] == "one")  # noqa: E731

        def one_try() -> float:
            q = holder.query()
            q.__enter__()
            started: list[float] = []

            def wait() -> None:
                with waiter.query():
                    started.append(time.monotonic())

            t = threading.Thread(target=wait)
            t.start()
            wait_until(lambda: row()["queued_queries"] == 1)
            released = time.monotonic()
            q.__exit__(None, None, None)
            t.join(10)
            assert started, "the waiter never started"
            return started[0] - released

        delays = [one_try() for _ in range(50)]
        assert statistics.median(delays) < 0.1, sorted(delays)
    finally:
        a.close()
        b.close()


def test_the_heartbeat_keeps_a_long_query_s_lease_past_the_expiry(pg_catalog: str) -> None:
    engine = _engine(pg_catalog, lease_heartbeat=0.2, lease_expiry=1.0, sweep_interval=0.2)
    try:
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        with session.query():
            deadline = time.monotonic() + 2.5  # well past the expiry, several sweeps
            while time.monotonic() < deadline:
                assert _leases(pg_catalog) == 1
                time.sleep(0.1)
    finally:
        engine.close()
    assert _leases(pg_catalog) == 0  # close() released everything of the instance


def test_a_waiter_in_another_process_starts_within_tens_of_milliseconds(pg_catalog: str) -> None:
    """Process A holds the one slot; B (this process) waits; A's query ends: B
    starts within 100 ms, median over 50 tries (the batcher's NOTIFY)."""
    with Node(pg_catalog, "--holder", program=FLEET_NODE) as a:
        a.wait_for(lambda m: m.get("ready", False))
        b = resgroups.Engine(coordination=pg_catalog, workers=2)
        try:
            b.connect().execute(
                "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, queue_timeout = '30s')"
            )
            waiter = b.connect()
            waiter.execute("SET RESOURCE GROUP one")
            row = lambda: next(r for r in b.resource_groups() if r["name"] == "one")  # noqa: E731

            def one_try() -> float:
                a.send("enter")
                a.wait_for(lambda m: m.get("holding", False))
                started: list[float] = []

                def wait() -> None:
                    with waiter.query():
                        started.append(time.time())

                t = threading.Thread(target=wait)
                t.start()
                wait_until(lambda: row()["queued_queries"] == 1)
                a.send("exit")
                released = a.wait_for(lambda m: "released" in m)["released"]
                t.join(10)
                assert started, "the waiter never started"
                return started[0] - released

            delays = [one_try() for _ in range(50)]
        finally:
            b.close()
        a.send("quit")
    assert statistics.median(delays) < 0.1, sorted(delays)


def test_an_unreachable_coordination_database_refuses_to_start_and_masks_the_password() -> None:
    with pytest.raises(resgroups.CoordinationUnavailable) as refused:
        resgroups.Engine(coordination="postgresql://postgres:hunter2@127.0.0.1:1/nowhere")
    assert "hunter2" not in str(refused.value)
    assert refused.value.sqlstate == "08006"
    with pytest.raises(resgroups.InvalidParameter, match="postgresql://"):
        resgroups.Engine(coordination="mysql://somewhere")
    with pytest.raises(resgroups.InvalidParameter, match="coordination="):
        resgroups.Engine(fleet_admission="quota")  # quotas are shares of a fleet's limits
    with pytest.raises(resgroups.InvalidParameter, match="'lease' or 'quota'"):
        resgroups.Engine(coordination="postgresql://x/y", fleet_admission="quotas")
    with pytest.raises(resgroups.InvalidParameter, match="longer than"):
        resgroups.Engine(coordination="postgresql://x/y", lease_heartbeat=10, lease_expiry=5)


def test_a_mode_that_takes_something_after_the_slot_says_so() -> None:
    """The query path calls ``after_slot`` only where ``after_slot_holds`` says it
    takes something: every mode that overrides it must say so."""
    from resgroups.fleet import modes

    found = [
        cls
        for cls in vars(modes).values()
        if isinstance(cls, type) and issubclass(cls, modes.AdmissionMode)
    ]
    assert modes.LeaseAdmission in found
    for cls in found:
        overrides = cls.after_slot is not modes.AdmissionMode.after_slot
        assert cls.after_slot_holds is overrides, cls
