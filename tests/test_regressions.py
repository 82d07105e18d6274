"""Defects found by trying resgroups as a new user would; each test failed before its fix."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resgroups
from resgroups.sched.groups import GroupRuntimes
from resgroups.sql.expr import EvalContext
from resgroups.sql.parser import parse_one
from resgroups.sql.select import Relation, run_select


def test_racing_alters_leave_the_live_gate_at_the_latest_catalog_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A's ALTER is held inside the step that brings the live gate up to date,
    # long enough for B's ALTER to finish if nothing orders the two.
    original = GroupRuntimes.apply
    a_applying, b_done = threading.Event(), threading.Event()

    def apply_slowly_in_a(self: GroupRuntimes, snapshot: resgroups.catalog.Snapshot) -> None:
        if threading.current_thread().name == "alter-a":
            a_applying.set()
            b_done.wait(1.0)  # bounded: with the fix B waits for A instead
        original(self, snapshot)

    monkeypatch.setattr(GroupRuntimes, "apply", apply_slowly_in_a)
    with resgroups.Engine() as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g")
        errors: list[BaseException] = []

        def alter(limit: int, before: threading.Event | None, after: threading.Event) -> None:
            try:
                if before is not None:
                    assert before.wait(5.0)
                engine.connect().execute(
                    f"ALTER RESOURCE GROUP g SET (max_active_queries = {limit})"
                )
            except BaseException as exc:
                errors.append(exc)
            finally:
                after.set()

        a = threading.Thread(target=alter, args=(1, None, threading.Event()), name="alter-a")
        b = threading.Thread(target=alter, args=(2, a_applying, b_done), name="alter-b")
        a.start()
        b.start()
        a.join(10)
        b.join(10)
        assert not a.is_alive()
        assert not b.is_alive()
        assert not errors
        catalog_value = engine.snapshot.find_group(resgroups.catalog.names.Ident("g"))
        assert catalog_value is not None
        live = engine.runtimes.get(catalog_value.id)
        assert live is not None
        assert live.gate.gate.config.max_active == catalog_value.max_active_queries
        row = next(r for r in engine.resource_groups() if r["name"] == "g")
        assert row["max_active_queries"] == catalog_value.max_active_queries


class _FailingMeter:
    """A CPU clock that raises once told to."""

    def __init__(self) -> None:
        self.fail = False
        self.now = 0

    def __call__(self) -> int:
        if self.fail:
            raise RuntimeError("CPU meter fault")
        self.now += 1_000
        return self.now


def test_a_meter_fault_at_exit_still_gives_the_worker_and_the_slot_back() -> None:
    meter = _FailingMeter()
    with resgroups.Engine(workers=1, cpu_meter=meter, query_timeout=5.0) as engine:
        session = engine.connect()
        session.execute(
            "CREATE RESOURCE GROUP g WITH (max_active_queries = 1); SET RESOURCE GROUP g"
        )
        assert engine.cpu_managed_dispatch  # two groups: scheduling engaged
        q = session.query()
        q.__enter__()
        q.checkpoint()
        meter.fail = True  # the charge at exit fails
        with pytest.raises(RuntimeError, match="CPU meter fault"):
            q.__exit__(None, None, None)
        meter.fail = False
        # the only worker and the only slot are free again: this query gets both
        with session.query() as again:
            assert again.group == "g"
        row = next(r for r in engine.resource_groups() if r["name"] == "g")
        assert row["active_queries"] == 0


def test_a_meter_fault_in_a_parallel_task_fails_the_query_not_the_pool() -> None:
    meter = _FailingMeter()
    with resgroups.Engine(workers=2, cpu_meter=meter, query_timeout=5.0) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g; SET RESOURCE GROUP g")
        started = threading.Barrier(2, timeout=5.0)

        def task(t: resgroups.query.Task, i: int) -> int:
            if i < 2:
                started.wait()
                meter.fail = True  # both tasks end with the meter failing
            return i

        outcome: list[BaseException] = []

        def run() -> None:
            try:
                with session.query() as q:
                    q.map(task, range(2))
            except BaseException as exc:
                outcome.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        runner.join(10)
        assert not runner.is_alive(), "map() never returned after its tasks' meter failed"
        assert len(outcome) == 1
        assert "CPU meter fault" in str(outcome[0])
        meter.fail = False
        with session.query() as q:  # both workers are back
            assert q.map(lambda t, i: i, range(4)) == [0, 1, 2, 3]


def _admin_engine() -> resgroups.Engine:
    return resgroups.Engine(access_control=True)


def _ann_chose_g(engine: resgroups.Engine) -> tuple[resgroups.Session, resgroups.Session]:
    """The admin's session, and ann's, which chose group g (with USE on it)."""
    admin = engine.connect()
    admin.execute_script(
        "CREATE USER ann; CREATE RESOURCE GROUP g; GRANT USE ON RESOURCE GROUP g TO ann"
    )
    ann = engine.connect("ann")
    ann.execute("SET RESOURCE GROUP g")
    return admin, ann


@pytest.mark.parametrize(
    ("change", "managed_error", "match"),
    [
        ("DROP RESOURCE GROUP g", resgroups.CatalogError, "no longer exists"),
        ("REVOKE USE ON RESOURCE GROUP g FROM ann", resgroups.PermissionDenied, "USE ON"),
    ],
)
def test_unmanaged_queries_resolve_nothing_so_a_lost_choice_cannot_fail_them(
    change: str, managed_error: type[resgroups.Error], match: str
) -> None:
    with _admin_engine() as engine:
        admin, ann = _ann_chose_g(engine)
        admin.execute(change)
        with ann.query(kind="other") as q:
            assert q.group is None
        with pytest.raises(managed_error, match=match):
            ann.query().__enter__()  # a managed query still fails (SPEC §5)


def test_errors_about_a_session_choice_name_the_group_as_it_is_now() -> None:
    with _admin_engine() as engine:
        admin, ann = _ann_chose_g(engine)
        admin.execute("ALTER RESOURCE GROUP g RENAME TO h")
        assert ann.execute("SELECT current_resource_group()").rows == [("h",)]
        admin.execute("REVOKE USE ON RESOURCE GROUP h FROM ann")
        with pytest.raises(resgroups.PermissionDenied) as denied:
            ann.execute("SELECT current_resource_group()")
        assert "RESOURCE GROUP h" in denied.value.message
        assert " g " not in denied.value.message
        assert "[USE ON RESOURCE GROUP g]" not in str(denied.value)
        admin.execute("GRANT USE ON RESOURCE GROUP h TO ann")
        admin.execute("ALTER RESOURCE GROUP h RENAME TO k")
        admin.execute("DROP RESOURCE GROUP k")
        with pytest.raises(resgroups.CatalogError) as gone:
            ann.execute("SELECT current_resource_group()")
        assert "resource group k chosen by SET RESOURCE GROUP no longer exists" in str(gone.value)


# ---- the executor: empty sources, int64 everywhere, typed empty aggregates ----------------


@pytest.fixture
def session() -> resgroups.Session:
    return resgroups.Engine().connect()


def test_an_empty_sequence_gives_zero_typed_rows(session: resgroups.Session) -> None:
    result = session.execute("SELECT x, x * 2.5 AS y, x > 1 AS z FROM long_sequence(0)")
    assert result.rows == []
    assert result.columns == ["x", "y", "z"]
    assert result.types == ["int", "float", "bool"]
    assert session.execute("SELECT x FROM long_sequence(0) ORDER BY x LIMIT 3").rows == []


def test_a_ctas_over_an_empty_source_creates_an_empty_table(session: resgroups.Session) -> None:
    assert session.execute(
        "CREATE TABLE t AS (SELECT x, x / 2 AS h FROM long_sequence(0))"
    ).status == ("SELECT 0")
    result = session.execute("SELECT * FROM t")
    assert result.rows == []
    assert result.columns == ["x", "h"]
    assert result.types == ["int", "int"]
    session.execute("INSERT INTO t SELECT x, x FROM long_sequence(2)")
    assert session.execute("SELECT count(*), sum(h) FROM t").rows == [(2, 3)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT sum(x) * 1000000000000000000 FROM long_sequence(10)",
        "SELECT count(*) + 9223372036854775807 FROM long_sequence(10)",
        "SELECT 9223372036854775807 + 1",
        "SELECT -9223372036854775807 - 2",
        "SELECT abs(-9223372036854775807 - 1)",
        "SELECT -(-9223372036854775807 - 1)",
        "SELECT (-9223372036854775807 - 1) / -1",
        "SELECT 4611686018427387904 * 2 FROM long_sequence(1)",
        "SELECT max(x) + 9223372036854775807 FROM long_sequence(3)",
        "SELECT 9223372036854775808",
        "SELECT x FROM long_sequence(2) WHERE x + 9223372036854775807 > 0",
    ],
)
def test_every_integer_result_outside_int64_overflows(session: resgroups.Session, sql: str) -> None:
    with pytest.raises(resgroups.NumericOverflow):
        session.execute(sql)


def test_the_smallest_int64_is_a_literal_like_any_other(session: resgroups.Session) -> None:
    assert session.execute("SELECT -9223372036854775808 FROM long_sequence(1)").rows == [
        (-(2**63),)
    ]
    assert session.execute("SELECT -9223372036854775808").rows == [(-(2**63),)]
    assert session.execute("SELECT 9223372036854775807 + 0 FROM long_sequence(1)").rows == [
        (2**63 - 1,)
    ]


def test_aggregates_over_no_rows_are_null_of_their_type(session: resgroups.Session) -> None:
    result = session.execute(
        "SELECT sum(x), max(x), min(x * 1.5), avg(x), count(*), count(x) FROM long_sequence(0)"
    )
    assert result.rows == [(None, None, None, None, 0, 0)]
    assert result.types == ["int", "int", "float", "float", "int", "int"]
    over_rows = session.execute(
        "SELECT sum(cpu_weight), max(name) FROM resource_groups() WHERE false"
    )
    assert over_rows.rows == [(None, None)]
    assert over_rows.types == ["int", "text"]


# ---- one semantics: the row and the vectorised evaluator agree ----------------------------


_INTS = st.sampled_from(
    [0, 1, 2, 3, 7, -1, -7, 1000, 2**31, 2**62, 2**63 - 1, -(2**63) + 1, 3037000500]
)


def _exprs() -> st.SearchStrategy[str]:
    leaves = st.one_of(st.just("x"), _INTS.map(lambda v: f"({v})"), st.just("2.5"))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            inner.map(lambda e: f"(-{e})"),
            inner.map(lambda e: f"abs({e})"),
        ),
        max_leaves=6,
    )


def _outcome(run: Callable[[], object]) -> tuple[str, object]:
    try:
        return "ok", run()
    except resgroups.Error as exc:
        return type(exc).__name__, None


@settings(max_examples=300, deadline=None)
@given(expr=_exprs(), n=st.integers(min_value=0, max_value=4))
def test_row_and_vector_evaluators_agree(expr: str, n: int) -> None:
    session = resgroups.Engine().connect()
    sql = f"SELECT {expr} AS v FROM long_sequence({n})"
    vector = _outcome(lambda: session.execute(sql))
    stmt = parse_one(f"SELECT {expr} AS v FROM t")
    relation = Relation(("x",), [(i,) for i in range(1, n + 1)], ("int",))
    row = _outcome(lambda: run_select(stmt, relation, EvalContext()))
    assert vector[0] == row[0], (sql, vector, row)
    if vector[0] == "ok":
        got_vector, got_row = vector[1], row[1]
        assert isinstance(got_vector, resgroups.Result)
        assert isinstance(got_row, Relation)
        assert got_vector.types == list(got_row.types)
        for a, b in zip(got_vector.rows, got_row.rows, strict=True):
            assert a == pytest.approx(b, rel=1e-12, nan_ok=True), sql


# ---- QuestDB parity (SPEC §4) ---------------------------------------------------------------


def test_the_built_in_group_shows_as_default_and_answers_to_either_case() -> None:
    with resgroups.Engine() as engine:
        session = engine.connect()
        assert [r["name"] for r in engine.resource_groups()] == ["DEFAULT"]
        assert session.execute("SELECT current_resource_group()").rows == [("DEFAULT",)]
        session.execute("ALTER RESOURCE GROUP default SET (cpu_weight = 7)")
        session.execute('ALTER RESOURCE GROUP "default" SET (max_active_queries = 3)')
        session.execute("ALTER RESOURCE GROUP DEFAULT SET (queue_timeout = 5s)")
        (row,) = engine.resource_groups()
        assert (row["cpu_weight"], row["max_active_queries"], row["queue_timeout_millis"]) == (
            7,
            3,
            5000,
        )
        session.execute("CREATE RESOURCE GROUP g; SET RESOURCE GROUP g; SET RESOURCE GROUP default")
        assert session.execute("SELECT current_resource_group()").rows == [("DEFAULT",)]
        with pytest.raises(resgroups.CatalogError, match="already exists"):
            session.execute("CREATE RESOURCE GROUP Default")
        with pytest.raises(resgroups.CatalogError, match=r"cannot be dropped \[name=DEFAULT\]"):
            session.execute("DROP RESOURCE GROUP default")


@pytest.mark.parametrize(
    ("bare", "quoted"),
    [
        ("memory_limit = 2G", "memory_limit = '2G'"),
        ("memory_limit = 512K", "memory_limit = '512K'"),
        ("memory_limit = 64MB", "memory_limit = '64MB'"),
        ("memory_limit = 1t", "memory_limit = '1T'"),
        ("queue_timeout = 15s", "queue_timeout = '15s'"),
        ("queue_timeout = 250ms", "queue_timeout = '250ms'"),
        ("queue_timeout = 2m", "queue_timeout = '2m'"),
        ("queue_timeout = 1h", "queue_timeout = '1h'"),
    ],
)
def test_sizes_and_durations_may_be_written_bare(bare: str, quoted: str) -> None:
    with resgroups.Engine() as engine:
        session = engine.connect()
        session.execute(f"CREATE RESOURCE GROUP a WITH ({bare})")
        session.execute(f"CREATE RESOURCE GROUP b WITH ({quoted})")
        session.execute("CREATE RESOURCE GROUP c")
        session.execute(f"ALTER RESOURCE GROUP c SET ({bare})")
        rows = {r["name"]: r for r in engine.resource_groups()}
        for column in ("memory_limit_bytes", "queue_timeout_millis"):
            assert rows["a"][column] == rows["b"][column] == rows["c"][column]


def test_set_memory_limit_takes_a_bare_size() -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        admin.execute("CREATE USER u; CREATE USER v")
        admin.execute("ALTER USER u SET MEMORY LIMIT 512M")
        admin.execute("ALTER USER v SET MEMORY LIMIT '512M'")
        assert sorted(admin.execute("SHOW USERS").rows) == [
            ("u", 512 * 1024**2, None),
            ("v", 512 * 1024**2, None),
        ]


@pytest.mark.parametrize(
    ("sql", "needle"),
    [
        ("CREATE RESOURCE GROUP x WITH (cpu_weight = 15s)", "invalid value 15s for cpu_weight"),
        ("CREATE RESOURCE GROUP x WITH (queue_timeout = 2G)", "invalid value 2G for queue_timeout"),
        ("CREATE RESOURCE GROUP x WITH (memory_limit = 2Q)", "invalid value 2Q for memory_limit"),
    ],
)
def test_a_bare_quantity_in_the_wrong_place_names_what_is_allowed(sql: str, needle: str) -> None:
    with pytest.raises(resgroups.InvalidParameter, match=needle):
        resgroups.Engine().connect().execute(sql)


# ---- psutil: what the process really holds, and where it may run ----------------------------


def test_metrics_show_the_process_rss_beside_tracked_memory() -> None:
    with resgroups.Engine() as engine:
        lines = engine.metrics_text().splitlines()
        (sample,) = [
            line
            for line in lines
            if line.startswith("resgroups_resource_groups_process_rss_bytes ")
        ]
        rss = float(sample.split()[1])
        now = psutil.Process().memory_info().rss
        assert 0.5 * now <= rss <= 2 * now


def test_available_cpus_follow_the_process_affinity() -> None:
    code = (
        "import os, resgroups; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "print(resgroups.Engine().cpus)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert float(out) == 1.0
