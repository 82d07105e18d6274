"""Nested groups and per-user limits (SPEC §14): the DDL and its refusals, the
catalog across a restart, and admission exact at every level on real threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from waiting import wait_until

import resgroups
from resgroups.errors import CatalogError


@pytest.fixture
def wide() -> Iterator[resgroups.Engine]:
    """Eight workers, so admission (not the pool) is what limits concurrency."""
    with resgroups.Engine(workers=8) as e:
        yield e


def rows(engine: resgroups.Engine) -> dict[str, dict[str, object]]:
    return {r["name"]: r for r in engine.resource_groups()}


def refused(session: resgroups.Session, sql: str, sqlstate: str = "42809") -> str:
    with pytest.raises(CatalogError) as info:
        session.execute(sql)
    assert info.value.sqlstate == sqlstate, info.value
    return str(info.value)


# ---- the DDL ------------------------------------------------------------------------


def test_a_tree_is_created_altered_and_listed(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP etl WITH (max_active_queries = 10, cpu_limit = '60%');"
        "CREATE RESOURCE GROUP nightly WITH (parent = 'etl', cpu_weight = 300);"
        "CREATE RESOURCE GROUP backfill WITH (parent = etl, max_active_queries = 2);"
        "CREATE RESOURCE GROUP other;"
        "CREATE RESOURCE GROUP adhoc WITH (max_active_queries = 20,"
        " max_active_queries_per_user = 2)"
    )
    listed = rows(engine)
    assert listed["nightly"]["parent_group"] == "etl"
    assert listed["backfill"]["parent_group"] == "etl"
    assert listed["etl"]["parent_group"] is None
    assert listed["adhoc"]["max_active_queries_per_user"] == 2
    # level by level: etl has a quarter of the CPUs (DEFAULT, etl, other and adhoc
    # at the top, weight 100 each), its children 3:1 of that
    assert listed["etl"]["cpu_min_share_pct"] == pytest.approx(25.0)
    assert listed["nightly"]["cpu_min_share_pct"] == pytest.approx(18.75)
    assert listed["backfill"]["cpu_min_share_pct"] == pytest.approx(6.25)

    s.execute("ALTER RESOURCE GROUP backfill SET (parent = 'other')")
    assert rows(engine)["backfill"]["parent_group"] == "other"
    s.execute("ALTER RESOURCE GROUP backfill RESET (parent)")
    assert rows(engine)["backfill"]["parent_group"] is None
    s.execute("ALTER RESOURCE GROUP nightly RESET (parent)")
    # etl has no children now: queries start in it again
    s.execute("SET RESOURCE GROUP etl")


def test_a_rename_keeps_the_children(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP team; CREATE RESOURCE GROUP lane WITH (parent = team);"
        "ALTER RESOURCE GROUP team RENAME TO tenant"
    )
    assert rows(engine)["lane"]["parent_group"] == "tenant"


def test_the_refusals_of_the_tree(ac_engine: resgroups.Engine) -> None:
    s = ac_engine.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP a; CREATE RESOURCE GROUP b WITH (parent = a);"
        "CREATE RESOURCE GROUP c WITH (parent = b);"
        "CREATE RESOURCE GROUP tenants VARIANTS (acme);"
        "CREATE RESOURCE GROUP mapped; CREATE USER alice;"
        "ALTER USER alice SET RESOURCE GROUP mapped"
    )
    assert "cycle" in refused(s, "ALTER RESOURCE GROUP a SET (parent = c)")
    assert "its own parent" in refused(s, "ALTER RESOURCE GROUP a SET (parent = a)")
    assert "DEFAULT" in refused(s, "CREATE RESOURCE GROUP x WITH (parent = 'DEFAULT')")
    assert "DEFAULT" in refused(s, "ALTER RESOURCE GROUP DEFAULT SET (parent = a)")
    assert "variant" in refused(s, "CREATE RESOURCE GROUP x WITH (parent = 'tenants::acme')")
    assert "variants" in refused(s, "CREATE RESOURCE GROUP x WITH (parent = tenants)")
    assert "variants" in refused(s, "ALTER RESOURCE GROUP tenants SET (parent = a)")
    assert "variant" in refused(s, 'ALTER RESOURCE GROUP "tenants::acme" SET (parent = a)')
    assert "tree" in refused(s, "ALTER RESOURCE GROUP b ADD VARIANT v")
    assert "variants" in refused(s, "CREATE RESOURCE GROUP y WITH (parent = a) VARIANTS (v)")
    message = refused(s, "CREATE RESOURCE GROUP x WITH (parent = nope)", "42704")
    assert "nope" in message
    # a mapped group cannot become a parent, nor can an inner group be mapped,
    # granted, chosen, selected or ruled
    assert "alice" in refused(s, "CREATE RESOURCE GROUP x WITH (parent = mapped)")
    assert '"b"' in refused(s, "ALTER USER alice SET RESOURCE GROUP a")
    assert '"c"' in refused(s, "GRANT USE ON RESOURCE GROUP b TO alice")
    assert '"b"' in refused(s, "SET RESOURCE GROUP a")
    assert "children" in refused(
        s, "CREATE RESOURCE SELECTOR sel WHEN application = 'x' THEN RESOURCE GROUP a"
    )
    assert "children" in refused(
        s, "CREATE RESOURCE RULE r ON RESOURCE GROUP a WHEN elapsed > '1s' THEN KILL"
    )
    assert "children" in refused(
        s,
        "CREATE RESOURCE RULE r ON RESOURCE GROUP c WHEN elapsed > '1s' THEN MOVE TO "
        "RESOURCE GROUP b",
    )
    message = refused(s, "DROP RESOURCE GROUP a")
    assert "[group=b]" in message
    assert "children" in message
    s.execute_script("DROP RESOURCE GROUP c; DROP RESOURCE GROUP b; DROP RESOURCE GROUP a")


def test_a_group_that_gains_a_child_while_running_finishes_its_queries(
    wide: resgroups.Engine,
) -> None:
    s = wide.connect()
    s.execute("CREATE RESOURCE GROUP team WITH (max_active_queries = 1)")
    runner = wide.connect()
    runner.execute("SET RESOURCE GROUP team")
    with runner.query():
        s.execute("CREATE RESOURCE GROUP lane WITH (parent = team)")
        # the running query keeps its slot at team, which now counts for the subtree
        assert rows(wide)["team"]["active_queries"] == 1
    with pytest.raises(CatalogError, match="has children now") as info, runner.query():
        pass
    assert info.value.sqlstate == "42809"  # it exists: refused, not undefined
    assert rows(wide)["team"]["active_queries"] == 0


def test_a_quoted_parent_names_a_group_exactly(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute_script(
        'CREATE RESOURCE GROUP "Mixed"; CREATE RESOURCE GROUP "MIXED";'
        'CREATE RESOURCE GROUP lane WITH (parent = "Mixed")'
    )
    assert rows(engine)["lane"]["parent_group"] == "Mixed"
    s.execute('ALTER RESOURCE GROUP lane SET (parent = "MIXED")')
    assert rows(engine)["lane"]["parent_group"] == "MIXED"
    # an unquoted name matches unquoted names only, as everywhere
    assert "does not exist" in refused(s, "ALTER RESOURCE GROUP lane SET (parent = mixed)", "42704")


def test_a_tree_has_at_most_sixteen_levels(engine: resgroups.Engine) -> None:
    from resgroups.catalog.model import MAX_TREE_DEPTH

    s = engine.connect()
    s.execute("CREATE RESOURCE GROUP l1")
    for level in range(2, MAX_TREE_DEPTH + 1):
        s.execute(f"CREATE RESOURCE GROUP l{level} WITH (parent = l{level - 1})")
    message = refused(s, f"CREATE RESOURCE GROUP deeper WITH (parent = l{MAX_TREE_DEPTH})")
    assert f"at most {MAX_TREE_DEPTH}" in message
    # nor by moving a subtree of two levels under the tenth level... of sixteen
    s.execute_script("CREATE RESOURCE GROUP top; CREATE RESOURCE GROUP under WITH (parent = top)")
    assert "levels" in refused(s, f"ALTER RESOURCE GROUP top SET (parent = l{MAX_TREE_DEPTH - 1})")
    s.execute(f"ALTER RESOURCE GROUP top SET (parent = l{MAX_TREE_DEPTH - 2})")
    assert rows(engine)["under"]["active_queries"] == 0


def test_the_tree_survives_a_restart(tmp_path: Path) -> None:
    directory = tmp_path / "catalog"
    with resgroups.Engine(catalog=str(directory)) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP etl WITH (max_active_queries = 3);"
            "CREATE RESOURCE GROUP nightly WITH (parent = etl,"
            " max_active_queries_per_user = 1);"
            "ALTER RESOURCE GROUP etl RENAME TO batch"
        )
    with resgroups.Engine(catalog=str(directory)) as engine:
        listed = rows(engine)
        assert listed["nightly"]["parent_group"] == "batch"
        assert listed["nightly"]["max_active_queries_per_user"] == 1


def test_explain_shows_the_path(ac_engine: resgroups.Engine) -> None:
    s = ac_engine.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP etl; CREATE RESOURCE GROUP nightly WITH (parent = etl);"
        "CREATE USER bob; ALTER USER bob SET RESOURCE GROUP nightly"
    )
    result = s.execute("EXPLAIN RESOURCE GROUP FOR USER bob")
    path = [r for r in result.rows if r[1] == "group_path"]
    assert len(path) == 1
    assert "etl > nightly" in str(path[0][4])


# ---- admission at every level on real threads -------------------------------------


class Holder:
    """Queries that enter, signal, and wait to be let go (every wait bounded)."""

    def __init__(self, engine: resgroups.Engine) -> None:
        self.engine = engine
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self, group: str, user: str = "u") -> tuple[threading.Event, threading.Event]:
        entered, release = threading.Event(), threading.Event()
        session = self.engine.connect(user)
        session.execute(f"SET RESOURCE GROUP {group}")

        def body() -> None:
            try:
                with session.query():
                    entered.set()
                    assert release.wait(30), "never let go"
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)
                entered.set()

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        self.threads.append(thread)
        return entered, release

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)
        assert not [t for t in self.threads if t.is_alive()]
        assert not self.errors, self.errors


def _blocked(engine: resgroups.Engine, group: str) -> list[object]:
    queries = engine.connect().execute(
        f"SELECT blocked_by FROM resource_group_queries() WHERE resource_group = '{group}'"
        " AND state = 'queued'"
    )
    return [r[0] for r in queries.rows]


def test_a_full_parent_holds_back_a_child_with_room(wide: resgroups.Engine) -> None:
    wide.connect().execute_script(
        "CREATE RESOURCE GROUP team WITH (max_active_queries = 2);"
        "CREATE RESOURCE GROUP a WITH (parent = team, max_active_queries = 2);"
        "CREATE RESOURCE GROUP b WITH (parent = team, max_active_queries = 2)"
    )
    holder = Holder(wide)
    first = [holder.start("a") for _ in range(2)]
    for entered, _ in first:
        assert entered.wait(10)
    waiting_b, release_b = holder.start("b")
    waiting_a, release_a = holder.start("a")
    wait_until(lambda: rows(wide)["team"]["queued_queries"] == 2)
    assert _blocked(wide, "b") == ["parent:team"]
    assert _blocked(wide, "a") == ["group_queue"]
    listed = rows(wide)
    assert (listed["team"]["active_queries"], listed["a"]["active_queries"]) == (2, 2)
    # a slot of team comes back: fifo across the subtree, b arrived first
    first[0][1].set()
    assert waiting_b.wait(10)
    assert not waiting_a.is_set()
    assert rows(wide)["team"]["active_queries"] == 2
    first[1][1].set()
    assert waiting_a.wait(10)
    release_a.set()
    release_b.set()
    holder.join()
    listed = rows(wide)
    assert [listed[g]["active_queries"] for g in ("team", "a", "b")] == [0, 0, 0]


def test_a_user_at_the_cap_waits_while_others_pass(wide: resgroups.Engine) -> None:
    wide.connect().execute_script(
        "CREATE RESOURCE GROUP team WITH (max_active_queries = 4,"
        " max_active_queries_per_user = 1);"
        "CREATE RESOURCE GROUP lane WITH (parent = team)"
    )
    holder = Holder(wide)
    alice_1, release_1 = holder.start("lane", "alice")
    assert alice_1.wait(10)
    alice_2, release_2 = holder.start("lane", "alice")
    wait_until(lambda: _blocked(wide, "lane") == ["user_limit"])
    bob, release_bob = holder.start("lane", "bob")
    assert bob.wait(10)  # admitted past alice's waiting query
    assert not alice_2.is_set()
    release_1.set()
    assert alice_2.wait(10)
    for release in (release_2, release_bob):
        release.set()
    holder.join()


def test_reparenting_online_moves_what_a_subtree_holds(wide: resgroups.Engine) -> None:
    s = wide.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP one WITH (max_active_queries = 1);"
        "CREATE RESOURCE GROUP two WITH (max_active_queries = 1);"
        "CREATE RESOURCE GROUP lane WITH (parent = one)"
    )
    holder = Holder(wide)
    entered, release = holder.start("lane")
    assert entered.wait(10)
    blocked, release_blocked = holder.start("lane")
    wait_until(lambda: _blocked(wide, "lane") == ["parent:one"])
    s.execute("ALTER RESOURCE GROUP lane SET (parent = two)")
    listed = rows(wide)
    assert (listed["one"]["active_queries"], listed["two"]["active_queries"]) == (0, 1)
    assert _blocked(wide, "lane") == ["parent:two"]  # two is full now: it kept the slot
    s.execute("ALTER RESOURCE GROUP lane RESET (parent)")
    assert blocked.wait(10)  # lane itself has no limit
    release.set()
    release_blocked.set()
    holder.join()


def test_one_alter_that_moves_a_group_and_raises_its_limit_admits_in_the_new_tree(
    wide: resgroups.Engine,
) -> None:
    s = wide.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP p WITH (max_active_queries = 1);"
        "CREATE RESOURCE GROUP k WITH (parent = p);"
        "CREATE RESOURCE GROUP c WITH (max_active_queries = 1)"
    )
    holder = Holder(wide)
    in_k, release_k = holder.start("k")
    in_c, release_c = holder.start("c")
    assert in_k.wait(10)
    assert in_c.wait(10)
    queued = [holder.start("c") for _ in range(3)]
    wait_until(lambda: rows(wide)["c"]["queued_queries"] == 3)
    s.execute("ALTER RESOURCE GROUP c SET (parent = p, max_active_queries = 4)")
    listed = rows(wide)
    # p kept what c and k held (2, above its 1) and admitted nobody of c's queue
    assert (listed["p"]["active_queries"], listed["c"]["queued_queries"]) == (2, 3)
    assert _blocked(wide, "c") == ["parent:p"] * 3
    assert listed["p"]["oldest_queue_wait_millis"] == listed["c"]["oldest_queue_wait_millis"]
    for release in (release_k, release_c):
        release.set()
    for _, release in queued:  # one at a time through p
        release.set()
    for entered, _ in queued:
        assert entered.wait(10)
    holder.join()


def test_dropping_the_groups_of_a_running_subtree_keeps_its_slots_and_bytes(
    wide: resgroups.Engine,
) -> None:
    s = wide.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP g WITH (max_active_queries = 1, memory_limit = '1M');"
        "CREATE RESOURCE GROUP p WITH (parent = g);"
        "CREATE RESOURCE GROUP c WITH (parent = p);"
        "CREATE RESOURCE GROUP d WITH (parent = g, queue_timeout = '300ms')"
    )
    running = wide.connect()
    running.execute("SET RESOURCE GROUP c")
    other = wide.connect()
    other.execute("SET RESOURCE GROUP d")
    with running.query() as q:
        q.memory.allocate(900 * 1024)
        s.execute_script("DROP RESOURCE GROUP c; DROP RESOURCE GROUP p")
        listed = rows(wide)
        assert (listed["g"]["active_queries"], listed["g"]["memory_used_bytes"]) == (
            1,
            900 * 1024,
        )
        with pytest.raises(resgroups.QueueTimeout), other.query():
            pass  # g's one slot is still c's query's
    listed = rows(wide)
    assert (listed["g"]["active_queries"], listed["g"]["memory_used_bytes"]) == (0, 0)
    with other.query():  # given back: d runs
        pass


def test_raising_a_parent_limit_admits_its_subtree(wide: resgroups.Engine) -> None:
    s = wide.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP team WITH (max_active_queries = 1);"
        "CREATE RESOURCE GROUP a WITH (parent = team);"
        "CREATE RESOURCE GROUP b WITH (parent = team)"
    )
    holder = Holder(wide)
    started = [holder.start(g) for g in ("a", "b", "a")]
    assert started[0][0].wait(10)
    wait_until(lambda: rows(wide)["team"]["queued_queries"] == 2)
    s.execute("ALTER RESOURCE GROUP team SET (max_active_queries = 3)")
    for entered, _ in started:
        assert entered.wait(10)
    for _, release in started:
        release.set()
    holder.join()


def test_many_threads_never_exceed_any_level(wide: resgroups.Engine) -> None:
    wide.connect().execute_script(
        "CREATE RESOURCE GROUP team WITH (max_active_queries = 3,"
        " max_active_queries_per_user = 2);"
        "CREATE RESOURCE GROUP a WITH (parent = team, max_active_queries = 2);"
        "CREATE RESOURCE GROUP b WITH (parent = team, scheduling_policy = 'fair');"
        "CREATE RESOURCE GROUP c WITH (parent = b, max_active_queries = 1);"
        "CREATE RESOURCE GROUP d WITH (parent = b)"
    )
    lock = threading.Lock()
    inside: dict[str, int] = {}
    peak: dict[str, int] = {}
    by_user: dict[str, int] = {}
    user_peak = 0
    parents = {"a": ["team"], "c": ["b", "team"], "d": ["b", "team"]}
    done: list[int] = []

    def count(group: str, user: str, delta: int) -> None:
        nonlocal user_peak
        with lock:
            for level in (group, *parents[group]):
                inside[level] = inside.get(level, 0) + delta
                peak[level] = max(peak.get(level, 0), inside[level])
            by_user[user] = by_user.get(user, 0) + delta
            user_peak = max(user_peak, by_user[user])

    def body(i: int, checkpoint: Callable[[], None]) -> None:
        group, user = "acd"[i % 3], f"user{i % 4}"
        session = wide.connect(user)
        session.execute(f"SET RESOURCE GROUP {group}")
        with session.query() as q:
            count(group, user, 1)
            for _ in range(3):
                q.checkpoint()
                checkpoint()
            count(group, user, -1)
        done.append(i)

    gate = threading.Event()
    threads = [
        threading.Thread(target=body, args=(i, lambda: gate.wait(0.002)), daemon=True)
        for i in range(60)
    ]
    with ExitStack():
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(done) == list(range(60))
    assert peak["team"] <= 3
    assert peak["a"] <= 2
    assert peak["c"] <= 1
    assert user_peak <= 2
    listed = rows(wide)
    assert all(listed[g]["active_queries"] == 0 for g in ("team", "a", "b", "c", "d"))
    assert all(listed[g]["queued_queries"] == 0 for g in ("team", "a", "b", "c", "d"))


# ---- memory: a parent's limit bounds its subtree ----------------------------------


def test_a_parent_memory_limit_bounds_its_subtree(wide: resgroups.Engine) -> None:
    from resgroups.errors import MemoryLimitExceeded

    wide.connect().execute_script(
        "CREATE RESOURCE GROUP team WITH (memory_limit = '1M');"
        "CREATE RESOURCE GROUP a WITH (parent = team, memory_limit = '2M');"
        "CREATE RESOURCE GROUP b WITH (parent = team)"
    )
    in_a, in_b = wide.connect("u"), wide.connect("v")
    in_a.execute("SET RESOURCE GROUP a")
    in_b.execute("SET RESOURCE GROUP b")
    with in_a.query() as qa:
        qa.memory.allocate(600 * 1024)
        listed = rows(wide)
        assert listed["team"]["memory_used_bytes"] == 600 * 1024
        assert listed["a"]["memory_used_bytes"] == 600 * 1024
        with (
            pytest.raises(MemoryLimitExceeded, match="parent=team") as info,
            in_b.query() as qb,
        ):
            qb.memory.allocate(600 * 1024)
        assert "limit=1048576" in str(info.value)
        # a's own limit is 2M, but the smallest on its path is its ceiling
        with pytest.raises(MemoryLimitExceeded):
            qa.memory.allocate(600 * 1024)
    listed = rows(wide)
    assert [listed[g]["memory_used_bytes"] for g in ("team", "a", "b")] == [0, 0, 0]
    assert wide.statistics()  # the ledger's own invariants
    wide.memory_ledger._check_invariants([])
