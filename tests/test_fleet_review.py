"""Fleet defects found by a hostile review, one regression test each (SPEC §11):
the fence holds for a query's parallel tasks, a waiter sees a limit change, a
lapse fails only what held a slot, mixed admission modes and mixed expiries
never add up to more than the limit. Two engines in this process share one
PostgreSQL catalog and coordination database (the pg_catalog fixture)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from waiting import wait_until

import resgroups
from resgroups.fleet.store import StoreUnavailable
from resgroups.query import Task

FAST = {"lease_heartbeat": 0.3, "lease_expiry": 1.5, "sweep_interval": 0.3}


@contextmanager
def _engines(dsn: str, *modes: str, **kwargs: Any) -> Iterator[list[resgroups.Engine]]:
    engines: list[resgroups.Engine] = []
    try:
        for mode in modes:
            options = {**FAST, "workers": 8, **kwargs.get(mode, {})}
            engines.append(
                resgroups.Engine(catalog=dsn, coordination=dsn, fleet_admission=mode, **options)
            )
        yield engines
    finally:
        for engine in engines:
            engine.close(grace=0.5)


def _group(engines: list[resgroups.Engine], ddl: str) -> None:
    engines[0].connect().execute(ddl)
    for engine in engines:
        wait_until(lambda engine=engine: "g" in engine.snapshot.group_names(), timeout=10)


def _partition(engine: resgroups.Engine) -> None:
    """Every renewal of ``engine`` fails from now on, as if cut off."""

    def down(*args: object, **kwargs: object) -> Any:
        raise StoreUnavailable("injected: partitioned")

    fleet = engine.fleet
    assert fleet is not None
    fleet.store.renew = down  # type: ignore[method-assign]
    if fleet.quotas is not None:
        fleet.quotas.store.renew_quotas = down  # type: ignore[method-assign]


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_parallel_tasks_stop_at_the_fence(pg_catalog: str, mode: str) -> None:
    """A task of q.map on a pool worker checkpoints past the instance's fence: it
    fails there, and its query with it, before another engine admits."""
    with _engines(pg_catalog, mode, mode) as (a, b):
        _group([a, b], "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        in_task = threading.Event()
        passed: list[float] = []  # time.monotonic() of every passing task checkpoint
        outcome: list[BaseException | None] = []

        def work(task: Task, item: int) -> int:
            if task._runner is None:  # the query's own thread: a short item, so that
                time.sleep(0.05)  # the pool's workers take the others
                return item
            in_task.set()
            end = time.monotonic() + 6
            while time.monotonic() < end:
                time.sleep(0.01)
                task.checkpoint()
                passed.append(time.monotonic())
            return item

        def run() -> None:
            session = a.connect()
            session.execute("SET RESOURCE GROUP g")
            try:
                with session.query() as q:
                    q.map(work, range(4))
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert in_task.wait(10)
        _partition(a)
        other = b.connect()
        other.execute("SET RESOURCE GROUP g")
        with other.query():
            admitted = time.monotonic()
        thread.join(15)
        assert len(outcome) == 1
        assert isinstance(outcome[0], resgroups.CoordinationUnavailable), outcome
        assert max(passed) < admitted  # no task of A went on once B held the slot


@pytest.mark.parametrize("change", ["SET (max_active_queries = 2)", "RESET (max_active_queries)"])
def test_a_lease_waiter_sees_the_limit_raised_or_removed(pg_catalog: str, change: str) -> None:
    """B waits for a lease while A holds the only one; a raised limit (and a RESET)
    admits B at once, not when A's query ends."""
    with _engines(pg_catalog, "lease", "lease") as (a, b):
        _group([a, b], "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        release, holding, admitted = threading.Event(), threading.Event(), threading.Event()

        def hold() -> None:
            session = a.connect()
            session.execute("SET RESOURCE GROUP g")
            with session.query():
                holding.set()
                release.wait(20)

        def wait_for_slot() -> None:
            session = b.connect()
            session.execute("SET RESOURCE GROUP g")
            with session.query():
                admitted.set()

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        assert holding.wait(10)
        waiter = threading.Thread(target=wait_for_slot, daemon=True)
        waiter.start()
        try:
            wait_until(lambda: row(b)["queued_queries"] == 1, timeout=10)
            a.connect().execute(f"ALTER RESOURCE GROUP g {change}")
            assert admitted.wait(5), f"B still waits after {change}"
        finally:
            release.set()
            holder.join(10)
            waiter.join(10)


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_a_lapse_fails_what_held_a_slot_only(pg_catalog: str, mode: str) -> None:
    """After a lapse past the fence, a cursor that was suspended is served once the
    heartbeat is back, and so is (lease mode) a query that was only queued: it
    takes its lease after the renewal. In quota mode the queued query is handed
    a slot of the quota whose renewal is overdue, so the renewal that finds the
    lapse fails it too (the quota may have been given to another process)."""
    with _engines(pg_catalog, mode) as (a,):
        _group([a], "CREATE RESOURCE GROUP g WITH (max_active_queries = 1, queue_timeout = '30s')")
        session = a.connect()
        session.execute("SET RESOURCE GROUP g")
        cursor = session.query()
        cursor.__enter__()
        cursor.suspend()
        fleet = a.fleet
        assert fleet is not None
        renew = fleet.store.renew
        quota_renew = fleet.quotas.store.renew_quotas if fleet.quotas is not None else None
        holder_failed: list[BaseException] = []
        holding, release = threading.Event(), threading.Event()

        def hold() -> None:
            s = a.connect()
            s.execute("SET RESOURCE GROUP g")
            try:
                with s.query() as q:
                    holding.set()
                    release.wait(20)
                    q.checkpoint()
            except resgroups.Error as exc:
                holder_failed.append(exc)

        holder = threading.Thread(target=hold, daemon=True)
        holder.start()
        assert holding.wait(10)
        queued: list[object] = []

        def wait_in_queue() -> None:
            s = a.connect()
            s.execute("SET RESOURCE GROUP g")
            try:
                with s.query() as q:
                    q.checkpoint()
                queued.append("served")
            except resgroups.Error as exc:
                queued.append(exc)

        waiter = threading.Thread(target=wait_in_queue, daemon=True)
        waiter.start()
        wait_until(lambda: row(a)["queued_queries"] == 1, timeout=10)
        _partition(a)
        wait_until(lambda: time.monotonic() > a.admission.valid_until + 0.3, timeout=10)
        fleet.store.renew = renew  # type: ignore[method-assign]
        if quota_renew is not None and fleet.quotas is not None:
            fleet.quotas.store.renew_quotas = quota_renew  # type: ignore[method-assign]
        release.set()
        holder.join(15)
        waiter.join(15)
        assert [type(e) for e in holder_failed] == [resgroups.CoordinationUnavailable]
        if mode == "lease":
            assert queued == ["served"]
        else:
            assert [type(e) for e in queued] == [resgroups.CoordinationUnavailable]
        cursor.resume()  # the cursor passes the gate again
        cursor.checkpoint()
        cursor.__exit__(None, None, None)


def row(engine: resgroups.Engine) -> dict[str, Any]:
    return next(r for r in engine.resource_groups() if r["name"] == "g")


def test_an_engine_in_another_admission_mode_than_an_older_one_admits_nothing(
    pg_catalog: str,
) -> None:
    """Leases and quotas do not see each other: a quota engine joining a lease
    fleet refuses to admit, saying why, instead of doubling the limit."""
    with _engines(pg_catalog, "lease") as (a,):
        _group([a], "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        session = a.connect()
        session.execute("SET RESOURCE GROUP g")
        with session.query(), _engines(pg_catalog, "quota") as (b,):
            wait_until(lambda: "g" in b.snapshot.group_names(), timeout=10)
            other = b.connect()
            other.execute("SET RESOURCE GROUP g")
            refused = pytest.raises(resgroups.CoordinationUnavailable, match="admission mode")
            with refused, other.query():
                pass


def test_rows_are_reclaimed_only_past_their_owner_s_expiry(pg_catalog: str) -> None:
    """A sweeper with a short expiry does not reclaim the lease of an instance whose
    own expiry is longer (its heartbeat is not late yet)."""
    slow = {"lease_heartbeat": 2.0, "lease_expiry": 10.0, "sweep_interval": 2.0}
    a = resgroups.Engine(
        catalog=pg_catalog, coordination=pg_catalog, workers=2, fleet_admission="lease", **slow
    )
    try:
        with _engines(pg_catalog, "lease") as (b,):
            _group([a, b], "CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
            session = a.connect()
            session.execute("SET RESOURCE GROUP g")
            other = b.connect()
            other.execute("SET RESOURCE GROUP g")
            with session.query() as q:
                admitted: list[float] = []

                def wait_for_slot() -> None:
                    try:
                        with other.query():
                            admitted.append(time.monotonic())
                    except resgroups.Error:
                        pass

                waiter = threading.Thread(target=wait_for_slot, daemon=True)
                started = time.monotonic()
                waiter.start()
                while time.monotonic() < started + 4.0:  # past B's expiry, not A's
                    time.sleep(0.05)
                    q.checkpoint()
                assert admitted == []  # B's sweep left A's lease alone
            waiter.join(10)
            assert len(admitted) == 1
    finally:
        a.close(grace=0.5)


def test_close_with_a_suspended_cursor_releases_everything(pg_catalog: str) -> None:
    """A suspended cursor holds no slot: close() releases this instance's rows and
    its row goes, so a limit that appears later is not held back by it."""
    import psycopg

    with _engines(pg_catalog, "lease") as (b,):
        a = resgroups.Engine(
            catalog=pg_catalog, coordination=pg_catalog, workers=2, **{**FAST, "lease_expiry": 20.0}
        )
        cursor = a.connect().query()
        cursor.__enter__()
        cursor.suspend()
        a.close(grace=0.2)
        with psycopg.connect(pg_catalog) as conn:
            rows = conn.execute("SELECT instance_id FROM resgroups_fleet_instances").fetchall()
        assert [r[0] for r in rows] == [b.instance_id]
        b.connect().execute("CREATE RESOURCE GROUP g")
        b.connect().execute("ALTER RESOURCE GROUP g SET (max_active_queries = 1)")
        session = b.connect()
        session.execute("SET RESOURCE GROUP g")
        with session.query() as q:  # not held back by the closed engine's row
            q.checkpoint()


def _read_pages(cursor: Any, pages: list[int], outcome: list[str]) -> None:
    """Fetch a row at a time (resumed, a page, suspended: on this thread) until the
    cursor raises; count the pages and keep the error's name."""
    try:
        while True:
            cursor.fetch(1)
            pages[0] += 1
    except resgroups.Error as exc:
        outcome.append(type(exc).__name__)


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_close_while_a_cursor_is_being_resumed_leaves_no_row_behind(
    pg_catalog: str, mode: str
) -> None:
    """A cursor read page after page on another thread as the engine closes: a
    resume in flight holds a lease (or its share of the quota) while the query
    still reads as suspended, and the close waits for it to give that back
    before it releases the instance's rows; none is left to expire."""
    import psycopg

    from resgroups.sql.parser import parse_one

    def rows() -> int:
        with psycopg.connect(pg_catalog) as conn:
            table = "resgroups_fleet_leases" if mode == "lease" else "resgroups_fleet_quotas"
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]

    for landing in range(8):
        engine = resgroups.Engine(coordination=pg_catalog, fleet_admission=mode, workers=4)
        session = engine.connect()
        session.execute(
            "CREATE RESOURCE GROUP capped WITH (max_active_queries = 3);SET RESOURCE GROUP capped"
        )
        cursor = session.open_cursor(parse_one("SELECT x FROM long_sequence(50000000)"))
        pages = [0]
        outcome: list[str] = []
        reader = threading.Thread(target=_read_pages, args=(cursor, pages, outcome), daemon=True)
        reader.start()
        wait_until(lambda pages=pages, landing=landing: pages[0] > landing)  # lands anywhere
        engine.close(grace=5)
        reader.join(30)
        assert outcome in (["QueryCancelled"], ["EngineClosed"]), outcome
        assert rows() == 0, f"round {landing}: a row left to expire"


def test_a_default_query_does_not_wait_for_the_quota_keeper(pg_catalog: str) -> None:
    """Quota mode: a query of a group without a limit runs on the heartbeat's fence
    only, so a late first quota renewal does not fail it."""
    from resgroups.fleet import quotas

    real = quotas.LeaseStore.renew_quotas
    late = threading.Event()

    def slow(self: Any) -> dict[str, int]:
        late.wait(1.0)  # the first renewal of the keeper is late
        return real(self)

    quotas.LeaseStore.renew_quotas = slow  # type: ignore[method-assign]
    try:
        with _engines(pg_catalog, "quota") as (a,):
            session = a.connect()
            with session.query() as q:
                q.checkpoint()
            assert a.admission.fence_for(a.snapshot.default_group).valid_until > time.monotonic()
    finally:
        late.set()
        quotas.LeaseStore.renew_quotas = real  # type: ignore[method-assign]


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_close_during_a_renewal_leaves_no_row_behind(pg_catalog: str, mode: str) -> None:
    """A heartbeat in flight while close() deletes the instance's rows must not
    write its row back: the heartbeat stops before the rows go (before, a closed
    engine's row could outlive it and hold back a limit that appears)."""
    import psycopg

    engine = resgroups.Engine(
        catalog=pg_catalog, coordination=pg_catalog, fleet_admission=mode, workers=2, **FAST
    )
    assert engine.fleet is not None
    store = engine.fleet.store
    real_renew, real_release = store.renew, store.release_instance
    renewing, proceed, released = threading.Event(), threading.Event(), threading.Event()

    def slow_renew(*args: Any, **kwargs: Any) -> Any:
        renewing.set()
        proceed.wait(10)
        return real_renew(*args, **kwargs)

    def release() -> int:
        released.set()
        return real_release()

    store.renew = slow_renew  # type: ignore[method-assign]
    store.release_instance = release  # type: ignore[method-assign]
    assert renewing.wait(10)  # a renewal is in flight
    closer = threading.Thread(target=engine.close, kwargs={"grace": 0.2}, daemon=True)
    closer.start()
    released.wait(1.0)  # the old order deleted the rows here, with the renewal in flight
    proceed.set()
    closer.join(15)
    assert not closer.is_alive()
    assert released.is_set()
    with psycopg.connect(pg_catalog) as conn:
        rows = conn.execute("SELECT instance_id FROM resgroups_fleet_instances").fetchall()
    assert rows == []
