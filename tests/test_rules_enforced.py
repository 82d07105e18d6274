"""Runaway-query rules acting on queries (SPEC §16): KILL, MOVE and LOG on each
condition, through SQL on the built-in executor and through the Python API;
the watch list; nothing held after kills and moves (a stateful test); MOVE in
fleet mode keeps the target's limit across processes."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from waiting import wait_until

import resgroups

NOT_INSTALLED = (
    'in the test extra: pip install -e ".[test]" (the README\'s test command) installs it'
)

SCAN = "SELECT sum(x % 7) FROM long_sequence(4000000000)"  # ~25 s alone here: a rule ends it


def _queries(session: resgroups.Session) -> list[dict[str, Any]]:
    result = session.execute("SELECT * FROM resource_group_queries()")
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def _groups(engine: resgroups.Engine) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in engine.resource_groups()}


def _idle(engine: resgroups.Engine) -> None:
    """Every slot, queue place and tracked byte is back."""
    for name, row in _groups(engine).items():
        assert (row["active_queries"], row["queued_queries"], row["memory_used_bytes"]) == (
            0,
            0,
            0,
        ), name
    assert engine.live_queries() == []
    assert all(engine.pool(name).free == size for name, size in engine.pools.items())


def _hits(session: resgroups.Session, name: str) -> int:
    rows = session.execute("SELECT name, hits_total FROM resource_group_rules()").rows
    return dict(rows)[name]


class Spinner:
    """A managed query on a thread of its own that checkpoints between bursts of
    real CPU (numpy releases the GIL) until ``finish`` is set or a rule acts."""

    def __init__(
        self,
        session: resgroups.Session,
        body: Callable[[Any], None] | None = None,
        after: Callable[[Any], None] | None = None,
    ):
        self.query = session.query(kind="select", statement="SELECT spin()")
        self._after = after
        self.entered = threading.Event()
        self.finish = threading.Event()
        self.error: BaseException | None = None
        self.group_at_end: str | None = None
        self._body = body
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        data = np.arange(100_000, dtype=np.float64)
        try:
            with self.query as q:
                self.entered.set()
                if self._body is not None:
                    self._body(q)
                while not self.finish.is_set():
                    q.checkpoint()
                    float(np.sqrt(data).sum())
                self.group_at_end = q.group
                if self._after is not None:
                    self._after(q)
        except BaseException as exc:
            self.error = exc
        finally:
            self.entered.set()

    def join(self) -> None:
        self.finish.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


# ---- KILL and LOG on every condition ------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "needle"),
    [
        ("cpu_time > 150ms", "cpu_time"),
        ("elapsed > 150ms", "elapsed"),
        ("rows > 20000000", "rows"),
        ("bytes > 100M", "bytes"),
        ("memory > 1K", "memory"),  # each morsel tracks its columns' bytes
    ],
)
def test_a_kill_ends_a_scan_on_each_condition(
    engine: resgroups.Engine, condition: str, needle: str
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute(f"CREATE RESOURCE RULE stop ON RESOURCE GROUP g WHEN {condition} THEN KILL")
    session.execute("SET RESOURCE GROUP g")
    with pytest.raises(resgroups.RunawayQuery) as caught:
        session.execute(SCAN)
    error = caught.value
    assert error.sqlstate == "57014"
    assert "resource rule stop" in error.message
    assert needle in error.message
    assert "[group=g, user=admin]" in error.message
    assert _hits(session, "stop") == 1
    _idle(engine)


def test_a_kill_reports_the_value_reached_and_lands_within_a_slice(
    engine: resgroups.Engine,
) -> None:
    """The Python API: the body checkpoints every millisecond; the rule on
    elapsed fires at the first check past its threshold (checks run once a
    slice, 10 ms): the value reached is the threshold plus at most a slice
    and a checkpoint interval, with room for a loaded machine."""
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE slow ON RESOURCE GROUP g WHEN elapsed > 100ms THEN KILL")
    session.execute("SET RESOURCE GROUP g")
    with pytest.raises(resgroups.RunawayQuery) as caught:
        _checkpoint_for(session, seconds=30)
    reached = int(caught.value.message.split("elapsed ")[1].split("ms")[0])
    assert 100 < reached < 2000
    _idle(engine)


def test_memory_rules_read_the_high_water_mark(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE fat ON RESOURCE GROUP g WHEN memory > 1M THEN KILL")
    session.execute("SET RESOURCE GROUP g")
    with session.query() as q:  # 512 KiB at a time never crosses it
        for _ in range(50):
            q.memory.allocate(512 * 1024)
            q.checkpoint()
            q.memory.release(512 * 1024)
    with pytest.raises(resgroups.RunawayQuery, match="memory 2M > 1M"):
        _checkpoint_for(session, seconds=10, allocate=2 * 1024 * 1024)  # then released
    _idle(engine)


def _checkpoint_for(session: resgroups.Session, seconds: float, allocate: int = 0) -> None:
    """A query that allocates and releases ``allocate`` bytes, then checkpoints every
    millisecond for ``seconds``."""
    with session.query() as q:
        q.memory.allocate(allocate)
        q.memory.release(allocate)  # gone again: the high-water mark stays
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            q.checkpoint()
            time.sleep(0.001)


def test_log_counts_and_logs_and_the_query_goes_on(
    engine: resgroups.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE big ON RESOURCE GROUP g WHEN rows > 1000000 THEN LOG")
    session.execute("SET RESOURCE GROUP g")
    with caplog.at_level(logging.WARNING, logger="resgroups.rules"):
        assert session.execute("SELECT count(*) FROM long_sequence(3000000)").rows == [(3000000,)]
        assert session.execute("SELECT count(*) FROM long_sequence(100)").rows == [(100,)]
    assert _hits(session, "big") == 1  # once per query, and only the big one
    assert "resource rule big" in caplog.text
    # the rows seen when the rule was checked: past the threshold, at most the scan's
    # (a slice boundary, so where depends on how fast the machine is at that moment)
    logged = re.search(r"rows (\d+) > 1000000", caplog.text)
    assert logged is not None, caplog.text
    assert 1_000_000 < int(logged.group(1)) <= 3_000_000, caplog.text
    metrics = engine.metrics_text()
    assert 'resgroups_resource_rule_hits_total{action="LOG",rule="big"} 1.0' in metrics
    _idle(engine)


def test_rules_of_other_groups_do_not_act(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 10 THEN KILL")
    assert session.execute("SELECT count(*) FROM long_sequence(1000)").rows == [(1000,)]
    assert _hits(session, "r") == 0


def test_scanned_rows_and_the_statement_show_in_resource_group_queries(
    engine: resgroups.Engine,
) -> None:
    session = engine.connect()
    seen: list[dict[str, Any]] = []

    def body(q: Any) -> None:
        q.scanned(1000, 8000)
        q.scanned(24)
        q.checkpoint()
        seen.extend(r for r in _queries(engine.connect()) if r["query_id"] == q.id)
        with pytest.raises(resgroups.InvalidParameter):
            q.scanned(-1)
        with pytest.raises(resgroups.InvalidParameter):
            q.scanned(1, 2.5)  # type: ignore[arg-type]

    spinner = Spinner(session, body)
    assert spinner.entered.wait(10)
    spinner.join()
    assert spinner.error is None
    (row,) = seen
    assert (row["rows_scanned"], row["bytes_scanned"], row["statement"]) == (
        1024,
        8000,
        "SELECT spin()",
    )
    assert (row["rule"], row["moved_from"]) == (None, None)
    assert row["cpu_time_millis"] >= 0


# ---- the watch list ------------------------------------------------------------------------


def test_a_watched_statement_is_refused_at_once_until_the_watch_ends(
    engine: resgroups.Engine,
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute(
        "CREATE RESOURCE RULE hog ON RESOURCE GROUP g WHEN rows > 20000000 THEN KILL "
        "WITH (watch = '10m')"
    )
    session.execute("SET RESOURCE GROUP g")
    with pytest.raises(resgroups.RunawayQuery, match="killed"):
        session.execute(SCAN)
    started = time.monotonic()
    with pytest.raises(resgroups.RunawayQuery, match="watched"):
        session.execute("select SUM(x % 9) from long_sequence(5)")  # other literals
    assert time.monotonic() - started < 5  # refused, not run
    assert session.execute("SELECT count(*) FROM long_sequence(5)").rows == [(5,)]
    (watch,) = session.execute("SELECT * FROM resource_group_watches()").rows
    assert watch[0] == "select sum((x % ?)) from long_sequence(?)"
    assert (watch[1], watch[2], watch[4]) == ("hog", "KILL", 1)
    session.execute("RESET RESOURCE GROUP")  # a watch is its rule's group's
    assert session.execute("SELECT sum(x % 9) FROM long_sequence(5)").rows == [(15,)]
    session.execute("SET RESOURCE GROUP g")
    session.execute("DROP RESOURCE RULE hog")  # a dropped rule's watch catches nothing
    assert session.execute("SELECT sum(x % 9) FROM long_sequence(5)").rows == [(15,)]
    assert session.execute("SELECT * FROM resource_group_watches()").rows == []
    _idle(engine)


# ---- MOVE ------------------------------------------------------------------------------------


def test_a_move_frees_the_slot_at_once_and_parks_at_the_head_of_a_full_target() -> None:
    with resgroups.Engine(workers=4) as engine:
        admin = engine.connect()
        admin.execute_script(
            """CREATE RESOURCE GROUP g WITH (max_active_queries = 1);
            CREATE RESOURCE GROUP slow WITH (max_active_queries = 1, queue_timeout = '60s');
            CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN rows > 100
                THEN MOVE TO RESOURCE GROUP slow;"""
        )

        def session_in(group: str) -> resgroups.Session:
            session = engine.connect()
            session.execute(f"SET RESOURCE GROUP {group}")
            return session

        occupant = Spinner(session_in("slow"))  # slow is full
        assert occupant.entered.wait(10)
        mover = Spinner(session_in("g"), lambda q: q.scanned(101))
        assert mover.entered.wait(10)
        wait_until(lambda: any(r["moved_from"] == "g" for r in _queries(admin)))
        (moved,) = [r for r in _queries(admin) if r["moved_from"] == "g"]
        assert (moved["resource_group"], moved["state"], moved["blocked_by"]) == (
            "slow",
            "queued",
            "group_queue",
        )
        assert (moved["rule"], moved["workers_held"]) == ("demote", 0)
        # g's slot is free at once: a new query of g runs while the moved one waits
        newcomer = Spinner(session_in("g"))
        assert newcomer.entered.wait(10)
        assert newcomer.error is None
        # a later arrival in slow queues behind the moved query
        late = Spinner(session_in("slow"))
        wait_until(lambda: len([r for r in _queries(admin) if r["state"] == "queued"]) == 2)
        positions = {r["query_id"]: r["queue_position"] for r in _queries(admin)}
        assert (positions[mover.query.id], positions[late.query.id]) == (1, 2)
        assert _groups(engine)["slow"]["active_queries"] == 1  # never over its limit
        occupant.join()
        wait_until(lambda: mover.query.progress() is not None
                   and mover.query.progress().state == "running")  # type: ignore[union-attr]  # fmt: skip
        for spinner in (mover, newcomer, late):
            spinner.join()
            assert spinner.error is None
        assert mover.group_at_end == "slow"
        _idle(engine)


def test_a_moved_query_fails_with_the_targets_queue_timeout(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g;
        CREATE RESOURCE GROUP slow WITH (max_active_queries = 1, queue_timeout = '300ms');
        CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN elapsed > 50ms
            THEN MOVE TO RESOURCE GROUP slow;"""
    )
    occupant_session = engine.connect()
    occupant_session.execute("SET RESOURCE GROUP slow")
    occupant = Spinner(occupant_session)
    assert occupant.entered.wait(10)
    admin.execute("SET RESOURCE GROUP g")
    with pytest.raises(resgroups.QueueTimeout, match=r"group=slow, queue_timeout=300ms"):
        admin.execute(SCAN)
    occupant.join()
    _idle(engine)


def test_a_move_found_due_by_tasks_is_taken_at_the_next_checkpoint_of_the_query(
    engine: resgroups.Engine,
) -> None:
    """Tasks of a ``map`` reach the rule check first and cannot move the query;
    the query's own thread takes the MOVE at its next checkpoint, however
    recently a task checked (a scan spending its time in ``map`` was never
    moved: each task's check put the next one a slice away)."""
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g;
        CREATE RESOURCE GROUP slow;
        CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN elapsed > 20ms
            THEN MOVE TO RESOURCE GROUP slow;"""
    )
    admin.execute("SET RESOURCE GROUP g")
    data = np.arange(50_000, dtype=np.float64)
    with admin.query() as q:
        passed = threading.Event()

        def body(task: Any, _: int) -> None:
            # checkpoints until the rule has been found due (and left) by a task,
            # then a few slices more of task checks
            while not passed.is_set():
                task.checkpoint()
                np.sqrt(data).sum()
                if engine.now() - q.admitted_at > (20 + 5 * engine.slice_ms) / 1000:
                    passed.set()

        q.map(body, range(2))
        assert q.group == "g"  # nothing moved it inside the map
        q.checkpoint()
        assert (q.group, q.moved_from) == ("slow", "g")
    _idle(engine)


def test_a_move_takes_the_memory_to_the_target_budget(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g;
        CREATE RESOURCE GROUP slow WITH (memory_limit = '64M');
        CREATE RESOURCE GROUP tiny WITH (memory_limit = '1M');
        CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN rows > 10
            THEN MOVE TO RESOURCE GROUP slow;
        CREATE RESOURCE RULE squeeze ON RESOURCE GROUP slow WHEN rows > 20
            THEN MOVE TO RESOURCE GROUP tiny;"""
    )
    admin.execute("SET RESOURCE GROUP g")
    seen: dict[str, int] = {}

    def moved_twice() -> None:
        with admin.query() as q:
            q.memory.allocate(8 * 1024 * 1024)
            q.scanned(11)
            wait_until(lambda: (q.checkpoint(), q.group == "slow")[1])
            used = _groups(engine)
            seen.update({name: used[name]["memory_used_bytes"] for name in ("g", "slow")})
            q.scanned(10)  # tiny (1M) cannot take 8M: the move fails, the query with it
            wait_until(lambda: (q.checkpoint(), False)[1], timeout=10)

    with pytest.raises(resgroups.MemoryLimitExceeded, match="scope=group") as caught:
        moved_twice()
    assert seen == {"g": 0, "slow": 8 * 1024 * 1024}
    assert "tiny" in caught.value.message
    _idle(engine)


def test_a_watched_move_admits_straight_to_the_target(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP slow;
        CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN rows > 1000
            THEN MOVE TO RESOURCE GROUP slow WITH (watch = '1h');"""
    )
    admin.execute("SET RESOURCE GROUP g")
    with admin.query(statement="SELECT big FROM t WHERE x = 1") as q:
        assert q.group == "g"
        q.scanned(1001)
        wait_until(lambda: (q.checkpoint(), q.group == "slow")[1])  # moved while it ran
    with admin.query(statement="select big from t where x = 2") as q:  # the same fingerprint
        assert q.group == "slow"  # watched: admitted there at once
        assert q.progress().moved_from == "g"  # type: ignore[union-attr]
    with admin.query(statement="SELECT small FROM t") as q:
        assert q.group == "g"
    (watch,) = admin.execute("SELECT * FROM resource_group_watches()").rows
    assert (watch[0], watch[2], watch[4]) == ("select big from t where x = ?", "MOVE", 1)
    _idle(engine)


def test_the_targets_rules_apply_after_a_move(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP slow;
        CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN rows > 1000
            THEN MOVE TO RESOURCE GROUP slow;
        CREATE RESOURCE RULE cap ON RESOURCE GROUP slow WHEN rows > 30000000 THEN KILL;"""
    )
    admin.execute("SET RESOURCE GROUP g")
    with pytest.raises(resgroups.RunawayQuery, match=r"rule cap \[group=slow"):
        admin.execute(SCAN)
    assert (_hits(admin, "demote"), _hits(admin, "cap")) == (1, 1)
    _idle(engine)


# ---- nothing held after kills and moves ----------------------------------------------------


class RulesAndQueries(RuleBasedStateMachine):
    """Random rules on three groups and random queries (scans that report rows
    and allocate memory, with and without map): after every step no slot, queue
    place, worker or tracked byte is held, whatever the rules did."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = resgroups.Engine(workers=2)
        self.admin = self.engine.connect()
        self.admin.execute_script(
            "CREATE RESOURCE GROUP a WITH (max_active_queries = 1, queue_timeout = '2s');"
            "CREATE RESOURCE GROUP b WITH (memory_limit = '4M', queue_timeout = '2s');"
            "CREATE RESOURCE GROUP c WITH (max_active_queries = 2, queue_timeout = '2s')"
        )
        self.count = 0

    @rule(
        group=st.sampled_from(["a", "b", "c"]),
        metric=st.sampled_from(["rows > 50", "memory > 1M", "elapsed > 20ms", "bytes > 1000"]),
        action=st.sampled_from(["KILL", "LOG", "MOVE TO RESOURCE GROUP a",
                                "MOVE TO RESOURCE GROUP b", "MOVE TO RESOURCE GROUP c"]),
    )  # fmt: skip
    def create_rule(self, group: str, metric: str, action: str) -> None:
        self.count += 1
        if action.endswith(f" {group}"):
            return  # a move to its own group is refused (tested elsewhere)
        self.admin.execute(
            f"CREATE RESOURCE RULE r{self.count} ON RESOURCE GROUP {group} "
            f"WHEN {metric} THEN {action}"
        )

    @rule(data=st.data())
    def drop_rule(self, data: st.DataObject) -> None:
        names = [r.name for r in self.engine.snapshot.all_rules]
        if names:
            self.admin.execute(f"DROP RESOURCE RULE {data.draw(st.sampled_from(names))}")

    @rule(
        groups=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
        rows=st.integers(0, 200),
        memory=st.sampled_from([0, 512 * 1024, 3 * 1024 * 1024]),
        parallel=st.booleans(),
    )
    def run_queries(self, groups: list[str], rows: int, memory: int, parallel: bool) -> None:
        errors: list[BaseException] = []

        def one(group: str) -> None:
            session = self.engine.connect()
            session.execute(f"SET RESOURCE GROUP {group}")
            try:
                with session.query(statement=f"SELECT {rows}") as q:
                    q.memory.allocate(memory)
                    if parallel:
                        q.map(lambda task, i: (task.checkpoint(), q.scanned(i)), range(rows // 20))
                    for _ in range(rows):
                        q.scanned(1, 8)
                        q.checkpoint()
                    time.sleep(0.03)
                    q.checkpoint()
                    q.memory.release(memory)
            except resgroups.Error as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(g,), daemon=True) for g in groups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()
        allowed = (resgroups.RunawayQuery, resgroups.QueueTimeout, resgroups.MemoryLimitExceeded,
                   resgroups.AdmissionRejected)  # fmt: skip
        assert all(isinstance(e, allowed) for e in errors), errors

    @invariant()
    def nothing_is_held(self) -> None:
        _idle(self.engine)
        engine = self.engine
        assert all(engine.pool(name).free == size for name, size in engine.pools.items())

    def teardown(self) -> None:
        self.engine.close()


RulesAndQueries.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_nothing_is_held_after_kills_and_moves = RulesAndQueries.TestCase


# ---- MOVE in fleet mode: the target's limit holds across processes -------------------------

FLEET = {"lease_heartbeat": 0.3, "lease_expiry": 1.5, "sweep_interval": 0.3, "workers": 4}


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_a_move_takes_the_targets_fleet_slot_like_any_admission(pg_catalog: str, mode: str) -> None:
    """Engine A runs a query in ``slow`` (limit 1 fleet-wide); engine B's query of
    ``g`` is moved to ``slow`` by a rule: it waits until A's query ends, and from
    then on runs in ``slow`` alone: never two in ``slow`` across the fleet."""
    options = {**FLEET, "fleet_admission": mode}
    with (
        resgroups.Engine(catalog=pg_catalog, coordination=pg_catalog, **options) as a,
        resgroups.Engine(catalog=pg_catalog, coordination=pg_catalog, **options) as b,
    ):
        a.connect().execute_script(
            """CREATE RESOURCE GROUP g;
            CREATE RESOURCE GROUP slow WITH (max_active_queries = 1, queue_timeout = '60s');
            CREATE RESOURCE RULE demote ON RESOURCE GROUP g WHEN rows > 10
                THEN MOVE TO RESOURCE GROUP slow;"""
        )
        wait_until(lambda: len(b.snapshot.rules) == 1, timeout=10)
        running = [0]
        peak = [0]
        lock = threading.Lock()

        def in_slow(q: Any) -> None:
            while q.group != "slow":
                q.checkpoint()
                time.sleep(0.001)
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])

        def out_of_slow(q: Any) -> None:
            q.checkpoint()  # still holding its slot in slow
            with lock:
                running[0] -= 1

        session_a = a.connect()
        session_a.execute("SET RESOURCE GROUP slow")
        holder = Spinner(session_a, in_slow, out_of_slow)
        assert holder.entered.wait(20)
        wait_until(lambda: running[0] == 1, timeout=20)
        session_b = b.connect()
        session_b.execute("SET RESOURCE GROUP g")
        mover = Spinner(session_b, lambda q: (q.scanned(11), in_slow(q)), out_of_slow)
        assert mover.entered.wait(20)
        # its fleet slot is A's: it waits (shown parked for a moment first, between
        # taking its local slot and waiting for the fleet's)
        wait_until(
            lambda: any(
                r["moved_from"] == "g" and r["state"] == "queued" for r in _queries(b.connect())
            ),
            20,
        )
        (row,) = [r for r in _queries(b.connect()) if r["moved_from"] == "g"]
        assert row["resource_group"] == "slow"
        assert running[0] == 1
        holder.join()
        wait_until(lambda: mover.query.group == "slow" and running[0] == 1, timeout=30)
        mover.join()
        assert (holder.error, mover.error) == (None, None)
        assert mover.group_at_end == "slow"
        assert peak[0] == 1
        _idle(a)
        _idle(b)


# ---- found by review: each a regression test ----------------------------------------------


def test_a_kill_on_elapsed_interrupts_native_work() -> None:
    """A body inside one long native call (a DuckDB aggregation) is interrupted
    through q.on_cancel when an elapsed KILL comes due, as at its query timeout."""
    duckdb = pytest.importorskip("duckdb", reason=NOT_INSTALLED)
    from resgroups.integrations import duckdb as integration

    with resgroups.Engine(workers=2, query_timeout=60) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g")
        session.execute(
            "CREATE RESOURCE RULE slow ON RESOURCE GROUP g WHEN elapsed > 300ms THEN KILL"
        )
        session.execute("SET RESOURCE GROUP g")
        con = duckdb.connect()
        with pytest.raises(resgroups.RunawayQuery, match="rule slow"):  # not QueryTimeout
            integration.execute(session, con, "SELECT sum(hash(i)) FROM range(100000000000) t(i)")
        _idle(engine)


def test_moves_between_two_groups_act_once_each(engine: resgroups.Engine) -> None:
    """Two groups whose rules move queries to each other: each rule acts once."""
    session = engine.connect()
    session.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP h;
        CREATE RESOURCE RULE a ON RESOURCE GROUP g WHEN rows > 0 THEN MOVE TO RESOURCE GROUP h;
        CREATE RESOURCE RULE b ON RESOURCE GROUP h WHEN rows > 0 THEN MOVE TO RESOURCE GROUP g"""
    )
    session.execute("SET RESOURCE GROUP g")
    seen: list[str | None] = []
    with session.query() as q:
        q.scanned(1)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            q.checkpoint()
            if not seen or seen[-1] != q.group:
                seen.append(q.group)
            time.sleep(0.001)
    assert seen == ["g", "h", "g"]
    assert (_hits(session, "a"), _hits(session, "b")) == (1, 1)
    _idle(engine)


def test_a_watch_is_its_groups_alone(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP h; CREATE RESOURCE GROUP p;
        CREATE RESOURCE RULE gk ON RESOURCE GROUP g WHEN rows > 10 THEN KILL WITH (watch = '1h');
        CREATE RESOURCE RULE hm ON RESOURCE GROUP h WHEN rows > 10
            THEN MOVE TO RESOURCE GROUP p WITH (watch = '1h')"""
    )

    def run(group: str, rows: int) -> str | None:
        session.execute(f"SET RESOURCE GROUP {group}")
        with session.query(statement="SELECT big FROM t WHERE x = 1") as q:
            q.scanned(rows)
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:
                q.checkpoint()
                time.sleep(0.001)
            return q.group

    with pytest.raises(resgroups.RunawayQuery, match="killed"):
        run("g", 11)
    assert run("DEFAULT", 11) == "DEFAULT"  # another group's statement: not caught, not counted
    assert run("h", 11) == "p"  # h's own MOVE, and a watch of h's
    with pytest.raises(resgroups.RunawayQuery, match="watched"):  # g's watch still stands
        run("g", 0)
    watches = {
        (w[1], w[2], w[4]) for w in session.execute("SELECT * FROM resource_group_watches()").rows
    }
    assert watches == {("gk", "KILL", 1), ("hm", "MOVE", 0)}
    _idle(engine)


def test_a_rule_dropped_while_a_query_runs_stops_acting(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE k ON RESOURCE GROUP g WHEN rows > 100 THEN KILL")
    session.execute("SET RESOURCE GROUP g")
    with session.query() as q:
        engine.connect().execute("DROP RESOURCE RULE k")
        q.scanned(1000)
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            q.checkpoint()
            time.sleep(0.001)
    _idle(engine)


def test_queries_moved_into_a_full_group_keep_their_order(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP h WITH (max_active_queries = 1);
        CREATE RESOURCE RULE m ON RESOURCE GROUP g WHEN rows > 10 THEN MOVE TO RESOURCE GROUP h"""
    )
    holder_session = engine.connect()
    holder_session.execute("SET RESOURCE GROUP h")
    holder = Spinner(holder_session)
    assert holder.entered.wait(10)
    movers = []
    for _ in range(3):
        session = engine.connect()
        session.execute("SET RESOURCE GROUP g")
        mover = Spinner(session, lambda q: q.scanned(11))
        movers.append(mover)
        n = len(movers)
        wait_until(lambda n=n: sum(r["moved_from"] == "g" for r in _queries(admin)) == n)
    late_session = engine.connect()
    late_session.execute("SET RESOURCE GROUP h")
    late = Spinner(late_session)
    wait_until(lambda: sum(r["state"] == "queued" for r in _queries(admin)) == 4)
    places = {r["query_id"]: r["queue_position"] for r in _queries(admin)}
    assert [places[m.query.id] for m in movers] == [1, 2, 3]  # first moved, first served
    assert places[late.query.id] == 4
    for spinner in (holder, *movers, late):
        spinner.join()
        assert spinner.error is None
    _idle(engine)


def test_a_cursor_suspended_at_its_end_still_counts_for_log_rules(
    engine: resgroups.Engine,
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE RULE l ON RESOURCE GROUP g WHEN rows > 1000 THEN LOG")
    session.execute("SET RESOURCE GROUP g")
    with session.query() as q:
        q.scanned(5000)
        q.suspend()
    assert _hits(session, "l") == 1
    _idle(engine)


def test_rule_words_stay_names_and_options_are_checked(engine: resgroups.Engine) -> None:
    session = engine.connect()
    assert session.execute("SELECT x AS rule FROM long_sequence(1)").columns == ["rule"]
    session.execute("CREATE RESOURCE GROUP g")
    with pytest.raises(resgroups.InvalidParameter, match="watch applies to KILL and MOVE"):
        session.execute(
            "CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 1 THEN LOG WITH (watch = 1s)"
        )
    session.execute("CREATE RESOURCE RULE z ON RESOURCE GROUP g WHEN cpu_time > '0ms' THEN LOG")
    (conditions,) = session.execute("SELECT conditions FROM resource_group_rules()").rows[0]
    session.execute(f"CREATE RESOURCE RULE z2 ON RESOURCE GROUP g WHEN {conditions} THEN LOG")
    with pytest.raises(resgroups.InvalidParameter, match=r"optional B\)$"):
        session.execute("CREATE RESOURCE RULE m ON RESOURCE GROUP g WHEN memory > 'lots' THEN LOG")
    with pytest.raises(resgroups.SqlSyntaxError, match="expected RESOURCE GROUP, RESOURCE RULE"):
        session.execute("DROP RESOURCE RULES z")


def test_explain_shows_rules_to_group_admins_only(ac_engine: resgroups.Engine) -> None:
    admin = ac_engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP g; CREATE USER ann WITH PASSWORD 'pw';
        ALTER USER ann SET RESOURCE GROUP g;
        CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 1 THEN KILL"""
    )
    ann = ac_engine.connect("ann", "pw")
    assert all(row[1] != "resource_rule" for row in ann.execute("EXPLAIN RESOURCE GROUP").rows)
    rows = admin.execute("EXPLAIN RESOURCE GROUP FOR USER ann").rows
    (rule,) = [row for row in rows if row[1] == "resource_rule"]
    assert (rule[0], rule[3]) == ("g", False)
    assert "resource rule r" in rule[4]
