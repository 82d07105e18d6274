"""Fleet mode is exact under change and faults (SPEC §11, "Exact under change
and faults"), in both fleet modes: a RENAME under running queries changes
nothing about who holds what; a cut-off process fails its queries before any
other process can be given its slots; a limit that appears or is lowered
admits nothing new anywhere until the fleet runs below it, counting the
queries admitted before the change; reconcile never removes what a live
query holds.

Each test has a PostgreSQL database of its own (the pg_catalog fixture).
The engines of a fleet run in this process (several engines share one
PostgreSQL catalog and one coordination database), so that one counter, under
one lock, sees every running query body of the fleet, and one monotonic clock
orders them."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from waiting import wait_until

import resgroups

MODES = ("lease", "quota")
ADMIN_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


# ---- the fleet's running bodies, counted across engines --------------------------------


class Body:
    """One query held open on a daemon thread: admitted, then running until
    ``release`` is set (checkpointing every ``step`` seconds when given)."""

    def __init__(
        self, fleet: Bodies, engine: resgroups.Engine, group: str, step: float | None
    ) -> None:
        self.fleet, self.step = fleet, step
        self.release = threading.Event()
        self.done = threading.Event()
        self.admitted: float | None = None  # time.monotonic() once __enter__ returned
        self.running_at_admission = 0  # fleet-wide running bodies, this one included
        self.last_pass: float | None = None  # the last checkpoint that passed
        self.group_seen: str | None = None  # q.group
        self.error: BaseException | None = None
        self.session = engine.connect()  # the group chosen here, before start()
        self.session.execute(f"SET RESOURCE GROUP {group}")
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.session.query() as q:
                with self.fleet.lock:
                    self.admitted = time.monotonic()
                    self.fleet.running += 1
                    self.running_at_admission = self.fleet.running
                    self.fleet.peak = max(self.fleet.peak, self.fleet.running)
                self.group_seen = q.group
                try:
                    if self.step is None:
                        self.release.wait(60.0)  # a bound: the test is long over by then
                    else:
                        while not self.release.wait(self.step):
                            q.checkpoint()
                            self.last_pass = time.monotonic()
                finally:
                    with self.fleet.lock:  # the body ends here, before __exit__
                        self.fleet.running -= 1
        except BaseException as exc:  # resgroups.Error expected; anything else fails the test
            self.error = exc
        finally:
            self.done.set()


class Bodies:
    """Every query body of a test's fleet: how many run now, the most at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.all: list[Body] = []

    def prepare(
        self, engine: resgroups.Engine, group: str, count: int = 1, step: float | None = None
    ) -> list[Body]:
        """``count`` sessions of ``engine`` that chose ``group``, their queries not begun."""
        bodies = [Body(self, engine, group, step) for _ in range(count)]
        self.all.extend(bodies)
        return bodies

    def hold(
        self, engine: resgroups.Engine, group: str, count: int = 1, step: float | None = None
    ) -> list[Body]:
        """``count`` queries of ``group`` begun (admitted, or waiting) on ``engine``."""
        return self.start(self.prepare(engine, group, count, step))

    @staticmethod
    def start(bodies: list[Body]) -> list[Body]:
        for body in bodies:
            body.thread.start()
        return bodies

    def release_all(self) -> None:
        for body in self.all:
            body.release.set()

    def errors(self) -> list[BaseException]:
        return [b.error for b in self.all if b.error is not None]


def _admitted(bodies: list[Body]) -> list[Body]:
    return [b for b in bodies if b.admitted is not None]


def _release(bodies: list[Body]) -> None:
    for body in bodies:
        body.release.set()
    wait_until(lambda: all(b.done.is_set() for b in bodies), timeout=30)


def _holds(predicate: Callable[[], bool], seconds: float) -> bool:
    """Whether ``predicate`` holds throughout the next ``seconds`` (an observation
    window: what must not happen does not, for that long)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.005)
    return predicate()


def _settle(predicate: Callable[[], bool], seconds: float = 1.0) -> None:
    """A test that has failed already: let what goes wrong go on until ``predicate``
    (at most ``seconds``), so that its message shows how far it goes."""
    with contextlib.suppress(AssertionError):
        wait_until(predicate, timeout=seconds)


# ---- engines ---------------------------------------------------------------------------


def _row(engine: resgroups.Engine, name: str) -> dict[str, Any] | None:
    return next((r for r in engine.resource_groups() if r["name"] == name), None)


def _queued(engine: resgroups.Engine, name: str) -> int:
    row = _row(engine, name)
    return 0 if row is None else int(row["queued_queries"])


def _wait_queued(engine: resgroups.Engine, name: str, bodies: list[Body]) -> None:
    """Until every one of ``bodies`` (queries of ``engine``) is counted queued in
    group ``name``, or one of them is admitted."""
    wait_until(lambda: _queued(engine, name) == len(bodies) or bool(_admitted(bodies)))


@contextmanager
def _shared_fleet(
    dsn: str, mode: str, count: int = 2, **kwargs: Any
) -> Iterator[list[resgroups.Engine]]:
    """``count`` engines sharing one PostgreSQL catalog and coordination database;
    DDL on one reaches the others by the log."""
    engines: list[resgroups.Engine] = []
    try:
        for _ in range(count):
            engines.append(
                resgroups.Engine(
                    catalog=dsn,
                    coordination=dsn,
                    fleet_admission=mode,
                    workers=12,
                    query_timeout=120.0,
                    **kwargs,
                )
            )
        yield engines
    finally:
        for engine in engines:
            engine.close(grace=2.0)


def _everyone_sees(engines: list[resgroups.Engine], name: str, **fields: object) -> None:
    def seen(engine: resgroups.Engine) -> bool:
        row = _row(engine, name)
        return row is not None and all(row[k] == v for k, v in fields.items())

    wait_until(lambda: all(seen(e) for e in engines), timeout=15)


# ---- 1. RENAME under running queries ---------------------------------------------------


@pytest.mark.parametrize(("mode", "limit"), [("lease", 2), ("quota", 4)])
def test_a_rename_under_running_queries_changes_nothing_about_who_holds_what(
    pg_catalog: str, mode: str, limit: int
) -> None:
    """A holds every slot of g. B renames g to h, and at once B's sessions that
    chose g (a choice follows a rename) begin queries, now of h; then h is
    renamed k and the same again. While A's queries of g run, every query of
    B waits, and nothing ever runs past the limit."""
    fleet = Bodies()
    with _shared_fleet(pg_catalog, mode) as (a, b):
        try:
            a.connect().execute(
                "CREATE RESOURCE GROUP IF NOT EXISTS g WITH "
                f"(max_active_queries = {limit}, queue_timeout = '60s')"
            )
            _everyone_sees([a, b], "g", max_active_queries=limit)
            holders = fleet.hold(a, "g", limit)
            wait_until(lambda: len(_admitted(holders)) == limit, timeout=30)

            waiting: list[Body] = []
            for old, new in (("g", "h"), ("h", "k")):
                ready = fleet.prepare(b, old, limit)
                b.connect().execute(f"ALTER RESOURCE GROUP {old} RENAME TO {new}")
                waiting.extend(fleet.start(ready))  # before A has even heard of the rename
                _everyone_sees([a, b], new, max_active_queries=limit)
                assert _row(a, old) is None
                _wait_queued(b, new, waiting)
                # the keepers' ticks, heartbeats, the counts' refresh: all had their turn
                calm = _holds(lambda: not _admitted(waiting), 1.0)
                if not calm:  # for the message: how far it goes
                    _settle(lambda: len(_admitted(waiting)) >= limit)
                assert calm, (
                    f"after RENAME {old} TO {new}, B admitted {len(_admitted(waiting))} "
                    f"queries while A's {limit} still ran: {fleet.peak} ran at once, "
                    f"limit {limit}"
                )
                assert fleet.peak <= limit

            _release(holders)  # A's end: B's take the slots, never more than the limit
            wait_until(lambda: len(_admitted(waiting)) >= limit, timeout=30)
            # the sessions' choice of g followed the renames
            assert {body.group_seen for body in _admitted(waiting)} <= {"h", "k"}
            _release(waiting)
            assert fleet.errors() == []
            assert fleet.peak == limit
        finally:
            fleet.release_all()


# ---- 2. fencing: a process cut off from PostgreSQL -------------------------------------


@contextmanager
def _own_role(dsn: str) -> Iterator[tuple[str, str]]:
    """A PostgreSQL role of this test's own (roles are cluster-wide) and ``dsn``
    as that role; the role is dropped at the end, its backends terminated."""
    role = f"rg_part_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN SUPERUSER')
    params = conninfo_to_dict(dsn)
    where = f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    try:
        yield role, f"postgresql://{quote(role)}@{where}/{params['dbname']}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'ALTER ROLE "{role}" NOLOGIN')
            _terminate(admin, role)
            wait_until(lambda: _backends(admin, role) == 0, timeout=10)
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _terminate(admin: psycopg.Connection[Any], role: str) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
    )


def _backends(admin: psycopg.Connection[Any], role: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [role]
    ).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.parametrize("mode", MODES)
def test_a_process_cut_off_from_postgresql_fails_its_queries_before_another_gets_its_slots(
    pg_catalog: str, mode: str
) -> None:
    """A (its own role) holds both slots, its queries checkpointing; B's two
    wait. A is cut off (its role NOLOGIN, its backends terminated: a network
    partition). Once A's leases (quota) lapse, B's sweep reclaims them and B
    admits; by then every query of A has failed at a checkpoint with
    CoordinationUnavailable: A's last checkpoint that passed is strictly
    before B's first admission."""
    limit, fleet = 2, Bodies()
    timing = {"lease_heartbeat": 0.3, "lease_expiry": 1.5, "sweep_interval": 0.3}
    create = (
        "CREATE RESOURCE GROUP IF NOT EXISTS capped WITH "
        f"(max_active_queries = {limit}, queue_timeout = '60s')"
    )
    with _own_role(pg_catalog) as (role, a_dsn):
        # B first: the schema is migrated (and owned) by the test's own role
        b = resgroups.Engine(coordination=pg_catalog, fleet_admission=mode, workers=4, **timing)
        a: resgroups.Engine | None = None
        partitioned = False
        try:
            b.connect().execute(create)
            a = resgroups.Engine(coordination=a_dsn, fleet_admission=mode, workers=4, **timing)
            a.connect().execute(create)
            a_bodies = fleet.hold(a, "capped", limit, step=0.01)
            wait_until(lambda: len(_admitted(a_bodies)) == limit, timeout=30)
            b_bodies = fleet.hold(b, "capped", limit)
            wait_until(lambda: _queued(b, "capped") == limit or bool(_admitted(b_bodies)))
            assert _admitted(b_bodies) == []

            with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
                admin.execute(f'ALTER ROLE "{role}" NOLOGIN')
                partitioned = True
                _terminate(admin, role)
            cut = time.monotonic()
            wait_until(lambda: bool(_admitted(b_bodies)), timeout=20)  # after the expiry
            first_b = min(body.admitted for body in _admitted(b_bodies))  # type: ignore[type-var]
            try:  # a fenced A has failed them already; a broken one goes on
                wait_until(lambda: all(x.done.is_set() for x in a_bodies), timeout=2)
            except AssertionError:
                for body in a_bodies:
                    body.release.set()
                wait_until(lambda: all(x.done.is_set() for x in a_bodies), timeout=10)
            last_a = max(x.last_pass or x.admitted or 0.0 for x in a_bodies)
            assert [type(x.error).__name__ for x in a_bodies] == [
                "CoordinationUnavailable"
            ] * limit, (
                f"A's queries went on after the partition: their last checkpoint passed "
                f"{last_a - cut:.2f} s after it, B admitted {first_b - cut:.2f} s after it"
            )
            assert last_a < first_b, (
                f"A's last checkpoint passed {last_a - first_b:.3f} s after B's first "
                "admission on the same slots"
            )
            assert fleet.peak <= limit
        finally:
            fleet.release_all()
            if partitioned:  # A may reconnect and give back what it can: a prompt close
                with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
                    admin.execute(f'ALTER ROLE "{role}" LOGIN')
            if a is not None:
                a.close(grace=2.0)
            b.close(grace=2.0)


# ---- 3. a limit that appears (ALTER from unlimited) or is lowered ----------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("before", "each"), [(None, 3), (4, 2)], ids=["appears", "lowered"])
def test_a_new_limit_admits_nothing_until_the_fleet_runs_below_it(
    pg_catalog: str, mode: str, before: int | None, each: int
) -> None:
    """Two engines each run ``each`` queries of g; g's limit becomes 2 (from
    none, or from 4). Each engine then runs fewer than 2 itself while the
    fleet still runs 2: nothing new is admitted anywhere. Once the fleet runs
    below 2, the waiting queries are admitted, never more than 2 at once."""
    limit, fleet = 2, Bodies()
    with _shared_fleet(pg_catalog, mode) as (a, b):
        try:
            params = "queue_timeout = '60s'" + (
                "" if before is None else f", max_active_queries = {before}"
            )
            a.connect().execute(f"CREATE RESOURCE GROUP IF NOT EXISTS g WITH ({params})")
            _everyone_sees([a, b], "g", max_active_queries=before)
            early_a, early_b = fleet.hold(a, "g", each), fleet.hold(b, "g", each)
            wait_until(lambda: len(_admitted(early_a + early_b)) == 2 * each, timeout=30)

            a.connect().execute(f"ALTER RESOURCE GROUP g SET (max_active_queries = {limit})")
            _everyone_sees([a, b], "g", max_active_queries=limit)
            late_a, late_b = fleet.hold(a, "g", 2), fleet.hold(b, "g", 2)
            late = late_a + late_b
            wait_until(
                lambda: (_queued(a, "g"), _queued(b, "g")) == (2, 2) or bool(_admitted(late))
            )
            assert _admitted(late) == [], f"admitted while {2 * each} ran, limit {limit}"

            # each engine now runs 1, below the limit; the fleet runs 2, not below it
            _release(early_a[1:] + early_b[1:])
            calm = _holds(lambda: not _admitted(late), 1.5)
            if not calm:
                _settle(lambda: len(_admitted(late)) >= 2)
            assert calm, (
                f"the fleet ran 2 at limit {limit}, each engine 1, and "
                f"{len(_admitted(late))} new queries were admitted: "
                f"{max(x.running_at_admission for x in _admitted(late))} ran at once"
            )

            _release(early_a[:1])  # the fleet runs 1: below the limit
            wait_until(lambda: len(_admitted(late)) >= 1, timeout=30)
            _release(early_b[:1])
            wait_until(lambda: len(_admitted(late)) >= 2, timeout=30)
            for body in _admitted(late):
                body.release.set()
            wait_until(lambda: len(_admitted(late)) == 4, timeout=30)
            _release(late)
            assert fleet.errors() == []
            after = [x.running_at_admission for x in late]
            assert max(after) <= limit, f"running at each admission after the ALTER: {after}"
        finally:
            fleet.release_all()


# ---- 4. reconcile never removes what a live query holds --------------------------------


def test_reconcile_never_deletes_the_lease_of_a_live_query(pg_catalog: str) -> None:
    """engine.reconcile() in tight loops (three threads) while eight threads
    run short queries of a limited group: every query body finds its lease row
    there after a few checkpoints, and no query fails (the short heartbeat
    would notice a lease deleted under it)."""
    threads, reconcilers, seconds = 8, 3, 3.0
    engine = resgroups.Engine(
        coordination=pg_catalog,
        workers=threads,
        lease_heartbeat=0.1,
        lease_expiry=60.0,
        sweep_interval=60.0,
    )
    stop = threading.Event()
    lock = threading.Lock()
    missing: list[str] = []
    failed: list[str] = []
    completed = [0]
    reconciles = [0, 0]  # calls, what they reported reclaimed

    def lease_id(q: resgroups.Query) -> str:
        lease = q.held.lease_id
        assert lease is not None, "a query of a limited group holds no lease in lease mode"
        return lease

    def run() -> None:
        try:
            session = engine.connect()
            session.execute("SET RESOURCE GROUP capped")
            with psycopg.connect(pg_catalog, autocommit=True) as conn:
                check = "SELECT 1 FROM resgroups_fleet_leases WHERE query_id = %s"
                while not stop.is_set():
                    try:
                        with session.query() as q:
                            lease = lease_id(q)
                            for _ in range(3):  # across a reconcile's round trip or two
                                time.sleep(0.002)
                                q.checkpoint()
                            if conn.execute(check, [lease]).fetchone() is None:
                                with lock:
                                    missing.append(lease)
                            q.checkpoint()
                        with lock:
                            completed[0] += 1
                    except resgroups.Error as exc:
                        with lock:
                            failed.append(f"{type(exc).__name__}: {exc}")
        except BaseException as exc:
            with lock:
                failed.append(f"the thread failed: {exc!r}")

    def reconcile() -> None:
        try:
            while not stop.is_set():
                reclaimed = engine.reconcile()
                with lock:
                    reconciles[0] += 1
                    reconciles[1] += reclaimed
        except BaseException as exc:
            with lock:
                failed.append(f"reconcile failed: {exc!r}")

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    workers += [threading.Thread(target=reconcile, daemon=True) for _ in range(reconcilers)]
    try:
        engine.connect().execute(
            "CREATE RESOURCE GROUP capped WITH (max_active_queries = 1000, queue_timeout = '30s')"
        )
        for worker in workers:
            worker.start()
        stop.wait(seconds)  # the load runs for this long; then it is checked
    finally:
        stop.set()
        for worker in workers:
            worker.join(15)
        engine.close(grace=2.0)
    assert not any(w.is_alive() for w in workers), "a query thread is stuck"
    assert completed[0] > 200, f"only {completed[0]} queries completed: the race was not tried"
    assert reconciles[0] > 50, f"only {reconciles[0]} reconciles ran"
    summary = (
        f"{len(missing)} of {completed[0]} query bodies found their lease deleted under them "
        f"and {len(failed)} queries failed ({failed[:2]}); {reconciles[0]} reconciles "
        f"reported {reconciles[1]} zombies (there were none)"
    )
    assert missing == [], summary
    assert failed == [], summary
