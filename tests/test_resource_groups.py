"""resource_groups(): its columns, values, and the WHERE / ORDER BY / LIMIT layer."""

from __future__ import annotations

from pathlib import Path

import pytest

import resgroups
from resgroups import cpus
from resgroups.sched.stats import COLUMNS

EXPECTED_COLUMNS = [
    ("name", "text"),
    ("memory_limit_bytes", "int"),
    ("max_active_queries", "int"),
    ("max_queued_queries", "int"),
    ("queue_timeout_millis", "int"),
    ("cpu_weight", "int"),
    ("active_queries", "int"),
    ("queued_queries", "int"),
    ("oldest_queue_wait_millis", "int"),
    ("memory_used_bytes", "int"),
    ("cpu_nanos_total", "int"),
    ("cpu_wait_nanos_total", "int"),
    ("admission_rejections", "int"),
    ("admission_timeouts", "int"),
    ("cpu_min_share_pct", "float"),
    ("cpu_limit_pct", "float"),
    ("cpu_limit_cores", "float"),
    ("scheduling_policy", "text"),
    ("admitted_total", "int"),
    ("fleet_active_queries", "int"),
    ("cpu_entitled_pct", "float"),
    ("cpu_used_pct", "float"),
    ("cpu_share_error_pct", "float"),
    ("cpu_budget_millis", "float"),
    ("cpu_refill_cores", "float"),
    ("cpu_burst_millis", "float"),
    ("base_group", "text"),
    ("fleet_quota", "int"),
    ("parent_group", "text"),
    ("max_active_queries_per_user", "int"),
    ("cpu_lane", "int"),
]


def test_columns_in_order_with_types(engine: resgroups.Engine) -> None:
    result = engine.connect().execute("SELECT * FROM resource_groups()")
    assert list(zip(result.columns, result.types, strict=True)) == EXPECTED_COLUMNS
    assert list(COLUMNS) == EXPECTED_COLUMNS
    assert result.status == "SELECT 1"


def test_default_row_shows_the_unset_values(engine: resgroups.Engine) -> None:
    (row,) = engine.resource_groups()
    assert row == {
        "name": "DEFAULT",
        "memory_limit_bytes": 0,
        "max_active_queries": None,
        "max_queued_queries": None,
        "queue_timeout_millis": 30000,
        "cpu_weight": 100,
        "active_queries": 0,
        "queued_queries": 0,
        "oldest_queue_wait_millis": 0,
        "memory_used_bytes": 0,
        "cpu_nanos_total": 0,
        "cpu_wait_nanos_total": 0,
        "admission_rejections": 0,
        "admission_timeouts": 0,
        "cpu_min_share_pct": 100.0,
        "cpu_limit_pct": None,
        "cpu_limit_cores": None,
        "scheduling_policy": "fifo",
        "admitted_total": 0,
        "fleet_active_queries": None,  # not in fleet mode
        "cpu_entitled_pct": 0.0,  # nothing has wanted CPU yet
        "cpu_used_pct": 0.0,
        "cpu_share_error_pct": 0.0,
        "cpu_budget_millis": None,  # no fractional CPU limit: no token bucket
        "cpu_refill_cores": None,
        "cpu_burst_millis": None,
        "base_group": None,  # not a variant
        "fleet_quota": None,  # not in fleet quota mode
        "parent_group": None,  # top level
        "max_active_queries_per_user": None,
        "cpu_lane": None,  # one group: scheduling (and so lanes) not engaged
    }


def test_values_shares_and_limits(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(
        "CREATE RESOURCE GROUP reporting WITH (cpu_weight = 50, max_active_queries = 4,"
        " max_queued_queries = 32, queue_timeout = '15s', memory_limit = '2G');"
        "CREATE RESOURCE GROUP tenant WITH (cpu_weight = 200, cpu_limit = '12.5%',"
        " scheduling_policy = 'fair');"
    )
    rows = {r["name"]: r for r in engine.resource_groups()}
    assert list(rows) == ["DEFAULT", "reporting", "tenant"]
    reporting, tenant = rows["reporting"], rows["tenant"]
    assert reporting["max_active_queries"] == 4
    assert reporting["max_queued_queries"] == 32
    assert reporting["queue_timeout_millis"] == 15000
    assert reporting["memory_limit_bytes"] == 2 * 1024**3
    assert reporting["cpu_min_share_pct"] == 50 / 350 * 100  # unrounded
    assert rows["DEFAULT"]["cpu_min_share_pct"] == 100 / 350 * 100
    assert tenant["cpu_min_share_pct"] == 12.5  # 57.1% by weight, capped at the limit
    assert tenant["cpu_limit_pct"] == 12.5
    assert tenant["cpu_limit_cores"] == 0.125 * engine.cpus
    assert tenant["scheduling_policy"] == "fair"
    session.execute("ALTER RESOURCE GROUP tenant RESET (cpu_limit, scheduling_policy)")
    tenant = engine.resource_groups()[2]
    assert (tenant["cpu_limit_pct"], tenant["cpu_limit_cores"]) == (None, None)
    assert tenant["scheduling_policy"] == "fifo"


def test_memory_limit_is_capped_by_the_process_budget() -> None:
    with resgroups.Engine(process_memory_limit=1024**3) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP big WITH (memory_limit = '2G');"
            "CREATE RESOURCE GROUP small WITH (memory_limit = '1M');"
        )
        limits = [r["memory_limit_bytes"] for r in engine.resource_groups()]
        assert limits == [1024**3, 1024**3, 1024**2]


def test_rows_are_plain_python_values(engine: resgroups.Engine) -> None:
    engine.connect().execute("CREATE RESOURCE GROUP g WITH (cpu_limit = '50%')")
    for row in engine.connect().execute("SELECT * FROM resource_groups()").rows:
        for value in row:
            assert type(value) in (int, float, str, type(None))


@pytest.fixture
def session(engine: resgroups.Engine) -> resgroups.Session:
    s = engine.connect()
    s.execute_script(
        "CREATE RESOURCE GROUP a WITH (cpu_weight = 300);"
        "CREATE RESOURCE GROUP b WITH (cpu_weight = 50, max_active_queries = 2);"
        "CREATE RESOURCE GROUP c WITH (cpu_weight = 50, max_active_queries = 9);"
    )
    return s


def test_where_order_by_limit(session: resgroups.Session) -> None:
    rows = session.execute(
        "SELECT name, cpu_weight FROM resource_groups() WHERE cpu_weight < 200 "
        "ORDER BY cpu_weight DESC, name DESC LIMIT 2"
    ).rows
    assert rows == [("DEFAULT", 100), ("c", 50)]
    assert session.execute(
        "SELECT name FROM resource_groups() WHERE name LIKE '_' AND NOT name IN ('b') ORDER BY 1"
    ).rows == [("a",), ("c",)]
    assert session.execute("SELECT name FROM resource_groups() LIMIT 0").rows == []


def test_order_by_alias_position_and_expression(session: resgroups.Session) -> None:
    q = "SELECT name, cpu_weight * 2 AS w FROM resource_groups() ORDER BY {} LIMIT 2"
    assert session.execute(q.format("w")).rows == [("b", 100), ("c", 100)]
    assert session.execute(q.format("2 DESC")).rows == [("a", 600), ("DEFAULT", 200)]
    assert session.execute(q.format("-cpu_weight, name DESC")).rows == [
        ("a", 600),
        ("DEFAULT", 200),
    ]


def test_nulls_sort_last_ascending_first_descending(session: resgroups.Session) -> None:
    q = (
        "SELECT name, max_active_queries FROM resource_groups() "
        "ORDER BY max_active_queries {}, name"
    )
    assert [r[1] for r in session.execute(q.format("ASC")).rows] == [2, 9, None, None]
    assert [r[1] for r in session.execute(q.format("DESC")).rows] == [None, None, 9, 2]
    assert session.execute(
        "SELECT name FROM resource_groups() WHERE max_active_queries IS NULL ORDER BY name"
    ).rows == [("DEFAULT",), ("a",)]  # code point order: upper case first


def test_aggregates(session: resgroups.Session) -> None:
    result = session.execute(
        "SELECT count(*), count(max_active_queries), sum(cpu_weight), avg(cpu_weight),"
        " min(name), max(max_active_queries), sum(cpu_weight) * 2 AS twice FROM resource_groups()"
    )
    assert result.columns == ["count", "count", "sum", "avg", "min", "max", "twice"]
    assert result.rows == [(4, 2, 500, 125.0, "DEFAULT", 9, 1000)]
    assert session.execute(
        "SELECT count(*), sum(cpu_weight) FROM resource_groups() WHERE name = 'none'"
    ).rows == [(0, None)]


@pytest.mark.parametrize(
    ("sql", "error", "needle"),
    [
        ("SELECT nme FROM resource_groups()", resgroups.UndefinedColumn, 'Did you mean "name"'),
        ("SELECT name + 1 FROM resource_groups()", resgroups.DatatypeMismatch, "needs numbers"),
        ("SELECT name, count(*) FROM resource_groups()", resgroups.GroupingError, "GROUP BY"),
        ("SELECT * FROM resource_groups() WHERE count(*) > 1", resgroups.GroupingError, "WHERE"),
        ("SELECT * FROM resource_group()", resgroups.UndefinedFunction, "resource_groups"),
        ("SELECT * FROM resource_groups(1)", resgroups.DatatypeMismatch, "no arguments"),
        ("SELECT * FROM trades", resgroups.UndefinedTable, "trades"),
        ("SELECT lowr('A')", resgroups.UndefinedFunction, 'Did you mean "lower"'),
        ("SELECT 1 / 0", resgroups.DivisionByZero, "division by zero"),
        ("SELECT * FROM resource_groups() WHERE name", resgroups.DatatypeMismatch, "boolean"),
        ("SELECT name FROM resource_groups() ORDER BY 3", resgroups.InvalidParameter, "1..1"),
        ("SELECT 1 < 'a'", resgroups.DatatypeMismatch, "cannot compare"),
    ],
)
def test_expression_errors(
    session: resgroups.Session, sql: str, error: type[resgroups.Error], needle: str
) -> None:
    with pytest.raises(error, match=needle):
        session.execute(sql)


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("7 / 2", 3),
        ("-7 / 2", -3),
        ("7 % -3", 1),
        ("-7 % 3", -1),
        ("7.0 / 2", 3.5),
        ("9223372036854775806 + 1", 9223372036854775807),
        ("1 + NULL", None),
        ("NULL = NULL", None),
        ("NULL AND FALSE", False),
        ("NULL OR TRUE", True),
        ("NULL AND TRUE", None),
        ("NOT NULL", None),
        ("2 IN (1, NULL)", None),
        ("2 NOT IN (1, 3)", True),
        ("'abc' LIKE 'a%'", True),
        ("'a.c' LIKE 'a_c'", True),
        ("'abc' NOT LIKE '%b'", True),
        ("coalesce(NULL, 2)", 2),
        ("abs(-3)", 3),
        ("upper('x') || 'y'", "Xy"),
        ("'a' || NULL IS NULL", True),
    ],
)
def test_expression_semantics(engine: resgroups.Engine, expr: str, value: object) -> None:
    session = engine.connect()
    (row,) = session.execute(f"SELECT {expr}").rows
    assert row == (value,)
    assert type(row[0]) is type(value)


def test_cpus_follow_a_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = tmp_path / "cg"
    (cg / "app").mkdir(parents=True)
    (cg / "cpu.max").write_text("max 100000\n")
    (cg / "app" / "cpu.max").write_text("150000 100000\n")
    proc = tmp_path / "cgroup"
    proc.write_text("0::/app\n")
    real = Path

    def fake_path(p: str) -> Path:
        return proc if p == "/proc/self/cgroup" else real(p)

    monkeypatch.setattr(cpus, "Path", fake_path)
    assert cpus._cgroup_quota(root=cg) == 1.5
    (cg / "app" / "cpu.max").write_text("max 100000\n")
    assert cpus._cgroup_quota(root=cg) is None
    assert cpus.available_cpus() >= 1
