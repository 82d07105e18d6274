"""Memory budgets: batched accounting, ceilings, failures, conservation (SPEC §8)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import resgroups
from resgroups.query import Task
from resgroups.sched.memory import CHUNK, MemoryCounter, MemoryLedger, QueryMemory

KIB = 1024


def group_row(engine: resgroups.Engine, name: str) -> dict[str, object]:
    return next(r for r in engine.resource_groups() if r["name"] == name)


def in_group(engine: resgroups.Engine, group: str, user: str = "u") -> resgroups.Session:
    session = engine.connect(user)
    session.execute(f"SET RESOURCE GROUP {group}")
    return session


# ---- overshoot ------------------------------------------------------------------------


def test_threads_overshoot_a_group_by_less_than_64_kib_each_and_all_fail() -> None:
    k, limit = 6, 4 * 1024 * KIB
    with resgroups.Engine(workers=k) as engine:
        engine.connect().execute(f"CREATE RESOURCE GROUP g WITH (memory_limit = {limit})")
        ledger = engine.memory_ledger
        budget = ledger.groups[engine.snapshot.groups[1].id]
        peak = 0
        failures: list[BaseException] = []
        start = threading.Barrier(k)
        done = threading.Barrier(k)

        def body() -> None:
            nonlocal peak
            with in_group(engine, "g").query() as q:
                start.wait(10)
                try:
                    while True:
                        q.memory.allocate(3 * KIB + 17)
                        peak = max(peak, budget.used)
                        time.sleep(0)  # let the threads interleave
                except resgroups.MemoryLimitExceeded as exc:
                    failures.append(exc)
                done.wait(10)  # hold the bytes until every thread has failed

        threads = [threading.Thread(target=body) for _ in range(k)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(failures) == k  # every thread saw it
        assert peak <= limit + k * CHUNK
        assert all("query memory limit exceeded" in str(f) for f in failures)
        assert any("scope=group" in str(f) for f in failures)
        assert budget.used == 0  # all returned at the end
        assert ledger.leaks == k  # they ended holding bytes: counted


def _allocate_until_refused(counter: MemoryCounter) -> None:
    for _ in range(10_000):
        counter.allocate(8 * KIB)


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(1, 6),
    limit_kib=st.integers(1, 2048),
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 40 * KIB)), min_size=1, max_size=400
    ),
)
def test_overshoot_bound_holds_for_any_interleaving(
    k: int, limit_kib: int, steps: list[tuple[int, int]]
) -> None:
    ledger = MemoryLedger(0)
    budget = ledger.group(1, "g")
    budget.limit = limit_kib * KIB
    failed: set[int] = set()
    queries = [QueryMemory(ledger, 1, budget, None, f"q{i}", lambda e: None) for i in range(k)]
    counters = [MemoryCounter(q) for q in queries]
    for who, size in steps:
        i = who % k
        if i in failed:
            continue
        try:
            counters[i].allocate(size)
        except resgroups.MemoryLimitExceeded:
            failed.add(i)
        assert budget.used <= budget.limit + k * CHUNK
        assert ledger.process.used == budget.used
    # keep allocating: every counter fails eventually
    for i, counter in enumerate(counters):
        if i in failed:
            continue
        with pytest.raises(resgroups.MemoryLimitExceeded):
            _allocate_until_refused(counter)
    ledger._check_invariants(queries)


# ---- conservation ----------------------------------------------------------------------


class MemoryMachine(RuleBasedStateMachine):
    """allocate / release / task end / query end / failures across groups and queries.

    A thread releases what it allocated, and a query's own thread may release
    what its ended tasks allocated (their bytes were published when they ended).
    """

    def __init__(self) -> None:
        super().__init__()
        self.ledger = MemoryLedger(process_limit=600 * KIB)
        for gid, limit in ((1, 300 * KIB), (2, 0)):
            self.ledger.set_group_limit(gid, f"g{gid}", limit)
        self.queries: list[QueryMemory] = []
        self.main: dict[int, MemoryCounter] = {}  # id(query) -> its own thread's counter
        self.tasks: list[tuple[QueryMemory, MemoryCounter]] = []
        self.held: dict[int, int] = {}  # id(counter) -> bytes it may release

    def _counters(self) -> list[tuple[QueryMemory, MemoryCounter]]:
        return [(q, self.main[id(q)]) for q in self.queries] + self.tasks

    @rule(gid=st.sampled_from([1, 2]), ceiling=st.sampled_from([None, 100 * KIB, 200 * KIB]))
    def start_query(self, gid: int, ceiling: int | None) -> None:
        q = QueryMemory(self.ledger, gid, self.ledger.groups[gid], ceiling, "q", lambda e: None)
        self.queries.append(q)
        c = MemoryCounter(q)
        self.main[id(q)] = c
        self.held[id(c)] = 0

    @precondition(lambda self: self.queries)
    @rule(data=st.data())
    def start_task(self, data: st.DataObject) -> None:
        q = data.draw(st.sampled_from(self.queries))
        c = MemoryCounter(q)
        self.tasks.append((q, c))
        self.held[id(c)] = 0

    @precondition(lambda self: self.queries)
    @rule(data=st.data(), size=st.integers(1, 90 * KIB))
    def allocate(self, data: st.DataObject, size: int) -> None:
        _, c = data.draw(st.sampled_from(self._counters()))
        try:
            c.allocate(size)
        except resgroups.MemoryLimitExceeded:
            return  # the failing request is not counted
        self.held[id(c)] += size

    @precondition(lambda self: any(self.held[id(c)] for _, c in self._counters()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        _, c = data.draw(st.sampled_from([qc for qc in self._counters() if self.held[id(qc[1])]]))
        size = data.draw(st.integers(1, self.held[id(c)]))
        c.release(size)
        self.held[id(c)] -= size

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def task_ends(self, data: st.DataObject) -> None:
        q, c = data.draw(st.sampled_from(self.tasks))
        c.flush()
        self.tasks.remove((q, c))
        self.held[id(self.main[id(q)])] += self.held.pop(id(c))

    @precondition(lambda self: self.queries)
    @rule(data=st.data())
    def query_ends(self, data: st.DataObject) -> None:
        q = data.draw(st.sampled_from(self.queries))
        for qc in [qc for qc in self.tasks if qc[0] is q]:
            qc[1].flush()
            self.tasks.remove(qc)
        self.main.pop(id(q)).flush()
        q.finish()  # every byte returned; what was left is counted as a leak
        self.queries.remove(q)

    @rule()
    def quiesce(self) -> None:
        """Every thread publishes: each query's bytes are exactly what it holds."""
        for _, c in self._counters():
            c.flush()
        for q in self.queries:
            holders = [self.main[id(q)]] + [c for qq, c in self.tasks if qq is q]
            assert q.published == sum(self.held[id(c)] for c in holders)

    @invariant()
    def conserved(self) -> None:
        self.ledger._check_invariants(self.queries)
        if not self.queries:
            assert self.ledger.process.used == 0
            assert all(b.used == 0 for b in self.ledger.groups.values())


MemoryMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestMemoryConservation = MemoryMachine.TestCase


# ---- ceilings --------------------------------------------------------------------------


@pytest.fixture
def ac() -> resgroups.Engine:
    engine = resgroups.Engine(access_control=True, query_memory_limit=64 * 1024 * KIB)
    admin = engine.connect()
    admin.execute_script(
        "CREATE RESOURCE GROUP small WITH (memory_limit = '1M');"
        "CREATE RESOURCE GROUP big WITH (memory_limit = '1G');"
        "CREATE USER u; CREATE GROUP team_a; CREATE GROUP team_b; ADD USER u TO team_a, team_b;"
        "CREATE SERVICE ACCOUNT bot; GRANT ASSUME SERVICE ACCOUNT bot TO u;"
        "GRANT USE RESOURCE GROUP TO u; GRANT USE RESOURCE GROUP TO bot;"
    )
    return engine


def ceiling(
    engine: resgroups.Engine, user: str, group: str, assume: str | None = None
) -> int | None:
    session = engine.connect(user)
    if assume:
        session.execute(f"ASSUME SERVICE ACCOUNT {assume}")
    session.execute(f"SET RESOURCE GROUP {group}")
    with session.query() as q:
        return q.memory_ceiling


def test_ceiling_instance_default(ac: resgroups.Engine) -> None:
    assert ceiling(ac, "u", "big") == 64 * 1024 * KIB
    ac.close()


def test_ceiling_own_limit_capped_by_the_group(ac: resgroups.Engine) -> None:
    ac.connect().execute("ALTER USER u SET MEMORY LIMIT '10M'")
    assert ceiling(ac, "u", "big") == 10 * 1024 * KIB  # own limit beats the instance default
    assert ceiling(ac, "u", "small") == 1024 * KIB  # larger than the group's: capped
    ac.close()


def test_ceiling_smallest_acl_group_limit(ac: resgroups.Engine) -> None:
    ac.connect().execute_script(
        "ALTER GROUP team_a SET MEMORY LIMIT '30M'; ALTER GROUP team_b SET MEMORY LIMIT '20M'"
    )
    assert ceiling(ac, "u", "big") == 20 * 1024 * KIB
    ac.connect().execute("ALTER USER u SET MEMORY LIMIT '50M'")  # own limit comes first
    assert ceiling(ac, "u", "big") == 50 * 1024 * KIB
    ac.close()


def test_ceiling_of_an_assumed_service_account(ac: resgroups.Engine) -> None:
    ac.connect().execute_script(
        "ALTER USER u SET MEMORY LIMIT '50M'; ALTER SERVICE ACCOUNT bot SET MEMORY LIMIT '5M'"
    )
    assert ceiling(ac, "u", "big", assume="bot") == 5 * 1024 * KIB
    ac.close()


def test_ceiling_capped_by_the_process_budget() -> None:
    with resgroups.Engine(process_memory_limit=2 * 1024 * KIB) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP big WITH (memory_limit = '1G')")
        assert ceiling(engine, "x", "big") == 2 * 1024 * KIB
        assert ceiling(engine, "x", "DEFAULT") == 2 * 1024 * KIB


def test_no_limits_at_all_still_accounts() -> None:
    with resgroups.Engine() as engine:
        with engine.connect().query() as q:
            assert q.memory_ceiling is None
            q.memory.allocate(10 * 1024 * KIB)
            assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 10 * 1024 * KIB
        assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 0


# ---- failures ------------------------------------------------------------------------------


def test_exceeding_the_query_ceiling_fails_that_request_only() -> None:
    with resgroups.Engine(query_memory_limit=1024 * KIB) as engine, engine.connect().query() as q:
        q.memory.allocate(900 * KIB)
        started = time.monotonic()
        with pytest.raises(resgroups.MemoryLimitExceeded) as info:
            q.memory.allocate(200 * KIB)
        assert time.monotonic() - started < 0.1  # it never waits for memory
        err = info.value
        assert err.sqlstate == "53200"
        text = str(err)
        assert "query memory limit exceeded" in text
        assert "scope=query" in text
        assert f"limit={1024 * KIB}" in text
        assert f"used={900 * KIB}" in text
        assert f"request={200 * KIB}" in text
        assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 900 * KIB  # not counted
        with pytest.raises(resgroups.MemoryLimitExceeded):
            q.checkpoint()  # the query is failed


def test_the_other_tasks_see_the_failure_at_their_next_checkpoint() -> None:
    with resgroups.Engine(workers=4) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (memory_limit = '1M')")
        seen: list[str] = []
        all_running = threading.Barrier(4, timeout=10)  # a broken pool fails, never hangs
        failed = threading.Event()

        def work(task: Task, i: int) -> int:
            all_running.wait()
            if i == 0:
                try:
                    task.memory.allocate(2 * 1024 * KIB)  # fails
                finally:
                    failed.set()
            assert failed.wait(10)
            try:
                task.checkpoint()  # the first checkpoint after the failure stops it
            except (resgroups.MemoryLimitExceeded, resgroups.QueryCancelled):
                seen.append(f"task{i}")
                raise
            return i

        with in_group(engine, "g").query() as q, pytest.raises(resgroups.MemoryLimitExceeded):
            q.map(work, range(4))
        assert sorted(seen) == ["task1", "task2", "task3"]  # each stopped at its checkpoint
        assert group_row(engine, "g")["memory_used_bytes"] == 0


def test_process_budget_bounds_all_groups() -> None:
    with resgroups.Engine(process_memory_limit=1024 * KIB) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g")
        with in_group(engine, "g").query() as a, engine.connect().query() as b:
            a.memory.allocate(700 * KIB)
            with pytest.raises(resgroups.MemoryLimitExceeded, match="scope=process"):
                b.memory.allocate(400 * KIB)


def test_lowering_a_group_limit_fails_nothing_at_once() -> None:
    with resgroups.Engine() as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP g WITH (memory_limit = '10M')")
        with in_group(engine, "g").query() as q:
            q.memory.allocate(5 * 1024 * KIB)
            admin.execute("ALTER RESOURCE GROUP g SET (memory_limit = '1M')")
            q.checkpoint()  # nothing failed
            assert group_row(engine, "g")["memory_used_bytes"] == 5 * 1024 * KIB
            q.memory.release(1024 * KIB)
            with pytest.raises(resgroups.MemoryLimitExceeded, match="scope=group"):
                q.memory.allocate(100 * KIB)  # later allocations see the new limit
            q.memory.release(4 * 1024 * KIB)


def _leaky_query(engine: resgroups.Engine) -> None:
    with engine.connect().query() as q:
        q.memory.allocate(200 * KIB)
        raise ValueError("boom")


def test_every_byte_comes_back_and_leaks_are_counted() -> None:
    with resgroups.Engine() as engine:
        with engine.connect().query() as q:
            q.memory.allocate(10_000)
            q.memory.release(10_000)
        assert engine.memory_ledger.leaks == 0
        with pytest.raises(ValueError, match="boom"):
            _leaky_query(engine)
        assert engine.memory_ledger.leaks == 1
        assert engine.memory_ledger.leaked_bytes == 200 * KIB
        assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 0
        assert "resgroups_resource_groups_memory_leaks_total 1.0" in engine.metrics_text()


def test_suspended_cursor_keeps_its_memory_charged() -> None:
    with resgroups.Engine() as engine, engine.connect().query() as q:
        q.memory.allocate(100)
        q.suspend()
        assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 100
        q.resume()


def test_track_accounts_a_numpy_array_for_its_lifetime() -> None:
    with resgroups.Engine() as engine, engine.connect().query() as q:
        array = np.zeros(1_000_000)
        with q.memory.track(array) as tracked:
            assert tracked is array
            assert group_row(engine, "DEFAULT")["memory_used_bytes"] == array.nbytes
        q.memory.flush()
        assert group_row(engine, "DEFAULT")["memory_used_bytes"] == 0


def test_group_memory_gauges() -> None:
    with resgroups.Engine() as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (memory_limit = '2M')")
        with in_group(engine, "g").query() as q:
            q.memory.allocate(100 * KIB)
            text = engine.metrics_text()
        assert f'resgroups_resource_group_memory_bytes{{resource_group="g"}} {100 * KIB}.0' in text
        assert (
            'resgroups_resource_group_memory_limit_bytes{resource_group="g"} 2.097152e+06' in text
        )
