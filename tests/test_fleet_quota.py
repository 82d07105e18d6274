"""Fleet quotas (fleet_admission='quota', docs/fleet.md): each process admits
locally within its share of a limit, and the limit still holds across the
fleet. Each test has a coordination database of its own (the pg_catalog
fixture); remote engines are real processes (tests/programs/quota_node.py)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from nodes import Node, bodies, max_overlap
from waiting import wait_until

import resgroups

QUOTA_NODE = Path(__file__).parent / "programs" / "quota_node.py"


def _quotas(dsn: str) -> dict[str, int]:
    """Quota rows of group capped, by instance."""
    with psycopg.connect(dsn) as conn:
        try:
            rows = conn.execute(
                "SELECT instance_id, quota FROM resgroups_fleet_quotas WHERE group_name = 'capped'"
            ).fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {str(i): int(q) for i, q in rows}


def _engine(dsn: str, limit: int = 4, **kwargs: Any) -> resgroups.Engine:
    engine = resgroups.Engine(coordination=dsn, fleet_admission="quota", workers=8, **kwargs)
    engine.connect().execute(
        "CREATE RESOURCE GROUP IF NOT EXISTS capped WITH "
        f"(max_active_queries = {limit}, queue_timeout = '30s')"
    )
    return engine


def _row(engine: resgroups.Engine) -> dict[str, Any]:
    return next(r for r in engine.resource_groups() if r["name"] == "capped")


def _hold_queries(engine: resgroups.Engine, count: int) -> tuple[threading.Event, list[Any]]:
    """``count`` threads each holding a query of ``capped`` until the event is set;
    the list collects (admitted monotonic time or the error) per thread."""
    release = threading.Event()
    outcome: list[Any] = []

    def hold() -> None:
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        try:
            with session.query():
                outcome.append(time.monotonic())
                release.wait(30)
        except resgroups.Error as exc:
            outcome.append(exc)

    for _ in range(count):
        threading.Thread(target=hold, daemon=True).start()
    return release, outcome


def test_the_limit_holds_across_three_processes_and_none_starves(pg_catalog: str) -> None:
    nodes = [
        Node(pg_catalog, "--threads", "8", "--seconds", "4", "--hold", "0.003", program=QUOTA_NODE)
        for _ in range(3)
    ]
    try:
        done = [node.wait_for(lambda m: m.get("done", False), timeout=120) for node in nodes]
        intervals = [b for node in nodes for b in bodies(node)]
    finally:
        for node in nodes:
            node.kill()
    assert [d["errors"] for d in done] == [[], [], []]
    assert all(d["completed"] > 0 for d in done), done  # every process completed queries
    assert max_overlap(intervals) <= 4  # never above the fleet limit
    assert _quotas(pg_catalog) == {}  # a clean shutdown gives every slot back


def test_idle_quota_moves_to_a_waiting_process_within_200ms(pg_catalog: str) -> None:
    # A takes the whole limit, then goes idle, keeping it (a long quota_hold)
    with Node(
        pg_catalog, "--threads", "4", "--idle-after", "1.5", "--hold", "0.05",
        "--quota-hold", "60", program=QUOTA_NODE,
    ) as a:  # fmt: skip
        idle = a.wait_for(lambda m: "idle" in m, timeout=60)
        assert idle["idle"] == 4
        b = _engine(pg_catalog)
        try:
            session = b.connect()
            session.execute("SELECT 1")  # warm: the session and its parse caches
            session.execute("SET RESOURCE GROUP capped")
            started = time.monotonic()
            with session.query():
                waited = time.monotonic() - started
            assert waited < 0.2, f"waited {waited * 1000:.0f} ms"
            assert sum(_quotas(pg_catalog).values()) <= 4
        finally:
            b.close()


def test_a_killed_process_quota_is_reclaimed_after_expiry(pg_catalog: str) -> None:
    with Node(
        pg_catalog, "--threads", "4", "--forever", "--hold", "0.5",
        "--heartbeat", "0.5", "--expiry", "2", program=QUOTA_NODE,
    ) as a:  # fmt: skip
        a.wait_for(lambda m: "start" in m, timeout=60)
        wait_until(lambda: sum(_quotas(pg_catalog).values()) == 4, timeout=30)
        a.kill()  # SIGKILL: no release, no cleanup
    b = _engine(pg_catalog, lease_heartbeat=0.5, lease_expiry=2.0, sweep_interval=0.5)
    try:
        release, admitted = _hold_queries(b, 4)
        started = time.monotonic()
        wait_until(lambda: len(admitted) == 4, timeout=30)  # once the sweep reclaims A's
        assert all(isinstance(t, float) for t in admitted), admitted
        assert min(admitted) - started > 0.5  # nothing over-admitted while A's quota stood
        assert _row(b)["fleet_quota"] == 4
        assert list(_quotas(pg_catalog).values()) == [4]
        release.set()
    finally:
        b.close()


def test_a_paused_process_fails_its_queries_and_nothing_runs_past_the_limit(
    pg_catalog: str,
) -> None:
    args = ("--threads", "4", "--forever", "--hold", "0.3", "--heartbeat", "0.3")
    with Node(pg_catalog, *args, "--expiry", "1.5", program=QUOTA_NODE) as a:
        a.wait_for(lambda m: "start" in m, timeout=60)
        wait_until(lambda: sum(_quotas(pg_catalog).values()) == 4, timeout=30)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            with Node(pg_catalog, *args, "--expiry", "1.5", program=QUOTA_NODE) as b:
                # B gets the slots once the sweep reclaims the stopped A's quota
                b.wait_for(lambda m: "start" in m, timeout=30)
                b.wait_for(lambda m: "start" in m, timeout=30)
                a.proc.send_signal(signal.SIGCONT)
                failed = a.wait_for(lambda m: m.get("error") is not None, timeout=30)
                assert failed["error"] == "CoordinationUnavailable"
                # both go on sharing the limit for a while
                a.wait_for(lambda m: "start" in m and m["error"] is None, timeout=30)
                b.wait_for(lambda m: "start" in m, timeout=30)
                intervals = bodies(a) + bodies(b)
        finally:
            a.proc.send_signal(signal.SIGCONT)
    assert max_overlap(intervals) <= 4


def test_a_lowered_limit_is_reached_once_queries_finish_and_never_exceeded(
    pg_catalog: str,
) -> None:
    """Two engines share a catalog and a coordination database: ALTER on one
    lowers the limit for both; the quotas shrink as queries finish."""
    a = resgroups.Engine(catalog=pg_catalog, coordination=pg_catalog, fleet_admission="quota")
    b = resgroups.Engine(catalog=pg_catalog, coordination=pg_catalog, fleet_admission="quota")
    a.connect().execute("CREATE RESOURCE GROUP capped WITH (max_active_queries = 4)")
    try:
        wait_until(lambda: any(r["name"] == "capped" for r in b.resource_groups()))
        release_a, admitted_a = _hold_queries(a, 2)
        wait_until(lambda: len(admitted_a) == 2, timeout=30)
        release_b, admitted_b = _hold_queries(b, 2)
        wait_until(lambda: len(admitted_b) == 2, timeout=30)
        a.connect().execute("ALTER RESOURCE GROUP capped SET (max_active_queries = 2)")
        wait_until(lambda: _row(b)["max_active_queries"] == 2)
        running: list[int] = []  # fleet-wide, sampled from the ALTER on
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                running.append(_row(a)["active_queries"] + _row(b)["active_queries"])
                stop.wait(0.005)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        more_a, late_a = _hold_queries(a, 2)  # they wait: the fleet runs 4 > 2
        more_b, late_b = _hold_queries(b, 2)
        try:
            # both keepers checked their quotas against the new limit: none is usable
            wait_until(lambda: _row(a)["fleet_quota"] == 0 and _row(b)["fleet_quota"] == 0)
            wait_until(lambda: _row(a)["queued_queries"] + _row(b)["queued_queries"] == 4)
            assert late_a == []
            assert late_b == []
            release_a.set()  # A's two finish: 2 run, the lowered limit is reached
            wait_until(lambda: _row(a)["active_queries"] + _row(b)["active_queries"] == 2)
            release_b.set()  # B's two finish: two of the late ones take their places
            wait_until(lambda: len(late_a) + len(late_b) == 2, timeout=30)
            wait_until(lambda: _row(a)["queued_queries"] + _row(b)["queued_queries"] == 2)
        finally:
            stop.set()
            sampler.join(5)
            more_a.set()
            more_b.set()
        assert max(running) <= 4  # the four running at the ALTER, never more
        reached = running.index(next(n for n in running if n <= 2))
        assert max(running[reached:]) <= 2  # once reached, the lowered limit holds
        assert sum(_quotas(pg_catalog).values()) <= 4
    finally:
        a.close()
        b.close()


def test_while_the_store_is_unreachable_a_process_admits_within_its_quota_only(
    pg_catalog: str,
) -> None:
    engine = _engine(pg_catalog, limit=4)
    name = pg_catalog.rsplit("/", 1)[1]
    admin_dsn = pg_catalog.rsplit("/", 1)[0] + "/postgres"
    try:
        release, admitted = _hold_queries(engine, 2)  # this process takes a quota of 2
        wait_until(lambda: len(admitted) == 2, timeout=30)
        release.set()
        wait_until(lambda: _row(engine)["active_queries"] == 0)
        assert _row(engine)["fleet_quota"] == 2
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                [name],
            )
        try:
            session = engine.connect()
            session.execute("ALTER RESOURCE GROUP capped SET (queue_timeout = '1s')")
            wait_until(lambda: _row(engine)["queue_timeout_millis"] == 1000)
            release, admitted = _hold_queries(engine, 3)
            # two run on the quota held; the third cannot get more and times out
            wait_until(lambda: len(admitted) == 3, timeout=30)
            assert sum(isinstance(t, float) for t in admitted) == 2
            assert [type(e).__name__ for e in admitted if not isinstance(e, float)] == [
                "QueueTimeout"
            ]
            release.set()
        finally:
            with psycopg.connect(admin_dsn, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        release, admitted = _hold_queries(engine, 3)  # back: the quota grows again
        wait_until(lambda: len(admitted) == 3, timeout=30)
        assert all(isinstance(t, float) for t in admitted), admitted
        release.set()
        assert engine.fleet is not None
        assert engine.fleet.quotas is not None
        assert engine.fleet.quotas.errors > 0
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        engine.close()
