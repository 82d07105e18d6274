"""Runaway-query rules as catalog objects (SPEC §16): the DDL, its refusals,
what RENAME and DROP of groups do to rules, resource_group_rules(), and the
records in every backend (replayed, replicated, validated on open)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from waiting import wait_until

import resgroups
from resgroups.catalog.model import RuleDef
from resgroups.catalog.records import Record, apply
from resgroups.catalog.rules import METRICS, format_conditions
from resgroups.sched.rules import QueryRules, describe_hit
from resgroups.sql import ast
from resgroups.sql.fingerprint import fingerprint
from resgroups.sql.format import format_sql
from resgroups.sql.parser import parse_one, parse_script

SETUP = """
CREATE RESOURCE GROUP etl WITH (max_active_queries = 4);
CREATE RESOURCE GROUP slow WITH (max_active_queries = 1, cpu_limit = '10%');
CREATE RESOURCE RULE runaway ON RESOURCE GROUP etl WHEN cpu_time > 30s AND memory > 2G THEN KILL;
CREATE RESOURCE RULE demote ON RESOURCE GROUP etl WHEN elapsed > '90s'
    THEN MOVE TO RESOURCE GROUP slow WITH (watch = '10m');
CREATE RESOURCE RULE big ON RESOURCE GROUP DEFAULT WHEN rows > 1000000 AND bytes > 1500 THEN LOG;
"""

RULE_STATEMENTS = [
    "CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN cpu_time > 30s THEN KILL",
    'CREATE RESOURCE RULE IF NOT EXISTS "R x" ON RESOURCE GROUP g::v WHEN elapsed > 1500 '
    "AND memory > '512K' AND rows > 0 AND bytes > 7 THEN MOVE TO RESOURCE GROUP DEFAULT "
    "WITH (watch = 250ms)",
    "CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN bytes > 1T THEN LOG",
    'ALTER RESOURCE RULE r RENAME TO "s"',
    "DROP RESOURCE RULE IF EXISTS r",
    "DROP RESOURCE RULE r",
]


def _rules(session: resgroups.Session) -> list[tuple[object, ...]]:
    return session.execute(
        'SELECT name, "group", conditions, action, target_group, watch_millis, hits_total, '
        "last_hit_at FROM resource_group_rules()"
    ).rows


@pytest.mark.parametrize("text", RULE_STATEMENTS)
def test_rule_statements_round_trip_through_format(text: str) -> None:
    stmt = parse_one(text)
    assert parse_one(format_sql(stmt)) == stmt


def test_a_rule_parses_into_thresholds_in_base_units() -> None:
    (stmt,) = parse_script(
        "CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN cpu_time > 2m AND memory > 2G "
        "AND elapsed > '1500ms' AND rows > 10 AND bytes > '1K' THEN MOVE TO RESOURCE GROUP h "
        "WITH (watch = '1h')"
    )
    assert isinstance(stmt, ast.CreateResourceRule)
    assert stmt.conditions == (
        ("cpu_time", 120_000),
        ("memory", 2 * 1024**3),
        ("elapsed", 1500),
        ("rows", 10),
        ("bytes", 1024),
    )
    assert (stmt.action, stmt.target, stmt.watch_ms) == ("move", ast.Ident("h"), 3_600_000)
    assert parse_one("SELECT log(2)") is not None  # KILL, MOVE and LOG stay names


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [
        ("WHEN cpu > 3s THEN KILL", resgroups.InvalidParameter, "unknown rule condition 'cpu'"),
        ("WHEN cpu_time > 3s THEN STOP", resgroups.SqlSyntaxError, "unknown rule action 'STOP'"),
        ("WHEN cpu_time > 3s THEN MOVE", resgroups.SqlSyntaxError, "MOVE TO RESOURCE GROUP"),
        ("WHEN rows > 1 AND rows > 2 THEN LOG", resgroups.InvalidParameter, "two conditions"),
        ("WHEN cpu_time < 3s THEN KILL", resgroups.SqlSyntaxError, "expected one of: '>'"),
        ("WHEN rows > 1.5 THEN KILL", resgroups.InvalidParameter, "threshold 1.5 for rows"),
        ("WHEN rows > -1 THEN KILL", resgroups.InvalidParameter, "threshold -1 for rows"),
        ("WHEN memory > 2Q THEN KILL", resgroups.InvalidParameter, "2Q for memory"),
        ("WHEN memory > UNLIMITED THEN KILL", resgroups.InvalidParameter, "for memory"),
        ("WHEN elapsed > '1 week' THEN KILL", resgroups.InvalidParameter, "for elapsed"),
        ("WHEN rows > 1 THEN LOG WITH (wach = 1s)", resgroups.InvalidParameter, "Did you mean"),
        ("WHEN rows > 1 THEN LOG WITH (watch = 1s, watch = 2s)", resgroups.InvalidParameter, ""),
        ("WHEN rows > 1 THEN KILL WITH (watch = -1)", resgroups.InvalidParameter, "watch"),
    ],
)
def test_bad_rules_say_what_is_wrong(
    engine: resgroups.Engine, text: str, error: type[Exception], needle: str
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    with pytest.raises(error, match=needle or None):
        session.execute(f"CREATE RESOURCE RULE r ON RESOURCE GROUP g {text}")
    assert _rules(session) == []


def test_resource_group_rules_lists_rules_in_creation_order(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(SETUP)
    assert _rules(session) == [
        ("runaway", "etl", "cpu_time > '30s' AND memory > '2G'", "KILL", None, 0, 0, None),
        ("demote", "etl", "elapsed > '90s'", "MOVE", "slow", 600_000, 0, None),
        ("big", "DEFAULT", "rows > 1000000 AND bytes > 1500", "LOG", None, 0, 0, None),
    ]
    assert session.execute("SELECT * FROM resource_group_watches()").rows == []
    result = session.execute("CREATE RESOURCE RULE IF NOT EXISTS big ON RESOURCE GROUP etl "
                             "WHEN rows > 1 THEN KILL")  # fmt: skip
    assert result.status == "CREATE RESOURCE RULE"
    assert len(_rules(session)) == 3  # unchanged


def test_rule_ddl_refusals(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(SETUP)
    version = engine.catalog_version
    cases = [
        ("CREATE RESOURCE RULE RUNAWAY ON RESOURCE GROUP etl WHEN rows > 1 THEN LOG", "42710"),
        ("CREATE RESOURCE RULE x ON RESOURCE GROUP nope WHEN rows > 1 THEN LOG", "42704"),
        ("CREATE RESOURCE RULE x ON RESOURCE GROUP etl WHEN rows > 1 "
         "THEN MOVE TO RESOURCE GROUP nope", "42704"),
        ("CREATE RESOURCE RULE x ON RESOURCE GROUP etl WHEN rows > 1 "
         "THEN MOVE TO RESOURCE GROUP ETL", "42809"),
        ("DROP RESOURCE GROUP slow", "42809"),  # demote moves queries there
        ("ALTER RESOURCE GROUP etl ADD VARIANT v", "42809"),  # etl has rules
        ("ALTER RESOURCE GROUP slow ADD VARIANT v", "42809"),  # slow is a rule's target
        ("DROP RESOURCE RULE nope", "42704"),
        ("ALTER RESOURCE RULE nope RENAME TO x", "42704"),
        ("ALTER RESOURCE RULE runaway RENAME TO Demote", "42710"),
    ]  # fmt: skip
    for text, sqlstate in cases:
        with pytest.raises(resgroups.Error) as caught:
            session.execute(text)
        assert caught.value.sqlstate == sqlstate, text
    assert engine.catalog_version == version  # nothing was written
    with pytest.raises(resgroups.CatalogError, match=r"\[rule=demote\]"):
        session.execute("DROP RESOURCE GROUP slow")


def test_a_rule_on_a_base_with_variants_is_refused(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP tenants VARIANTS (acme)")
    with pytest.raises(resgroups.CatalogError, match="has variants") as caught:
        session.execute("CREATE RESOURCE RULE r ON RESOURCE GROUP tenants WHEN rows > 1 THEN LOG")
    assert caught.value.sqlstate == "42809"
    session.execute("CREATE RESOURCE RULE r ON RESOURCE GROUP tenants::acme WHEN rows > 1 THEN LOG")
    session.execute("ALTER RESOURCE GROUP tenants DROP VARIANT acme")  # its rules go with it
    assert _rules(session) == []


def test_rename_keeps_rules_and_drop_takes_a_groups_own_rules(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(SETUP)
    session.execute("ALTER RESOURCE GROUP etl RENAME TO pipelines")
    session.execute("ALTER RESOURCE GROUP slow RENAME TO penalty")
    session.execute('ALTER RESOURCE RULE demote RENAME TO "Demote"')
    rows = [(r[0], r[1], r[4]) for r in _rules(session)]
    assert rows == [("runaway", "pipelines", None), ("Demote", "pipelines", "penalty"),
                    ("big", "DEFAULT", None)]  # fmt: skip
    session.execute("DROP RESOURCE GROUP pipelines")  # its rules go, the target is free
    assert [r[0] for r in _rules(session)] == ["big"]
    session.execute("DROP RESOURCE GROUP penalty")
    session.execute("DROP RESOURCE RULE big")
    session.execute("DROP RESOURCE RULE IF EXISTS big")
    assert _rules(session) == []


def test_rule_ddl_needs_resource_group_admin(ac_engine: resgroups.Engine) -> None:
    admin = ac_engine.connect()
    admin.execute_script("CREATE RESOURCE GROUP g; CREATE USER bob WITH PASSWORD 'pw'")
    bob = ac_engine.connect("bob", "pw")
    for text in [
        "CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 1 THEN KILL",
        "SELECT * FROM resource_group_rules()",
        "SELECT * FROM resource_group_watches()",
    ]:
        with pytest.raises(resgroups.PermissionDenied):
            bob.execute(text)
    admin.execute("GRANT RESOURCE GROUP ADMIN TO bob")
    bob.execute("CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 1 THEN KILL")
    assert [r[0] for r in _rules(bob)] == ["r"]


def test_rules_survive_a_restart_of_a_directory_catalog(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=tmp_path) as engine:
        engine.connect().execute_script(SETUP)
        engine.connect().execute("ALTER RESOURCE RULE big RENAME TO bigger")
        before = _rules(engine.connect())
    with resgroups.Engine(catalog=tmp_path) as engine:
        assert _rules(engine.connect()) == before
        assert engine.snapshot.rules_of(engine.snapshot.find_group(ast.Ident("etl")).id)


def test_rules_replicate_through_postgresql(pg_catalog: str) -> None:
    with (
        resgroups.Engine(catalog=pg_catalog) as a,
        resgroups.Engine(catalog=pg_catalog) as b,
    ):
        a.connect().execute_script(SETUP)
        wait_until(lambda: len(b.snapshot.rules) == 3, timeout=10)
        assert _rules(b.connect()) == _rules(a.connect())
        b.connect().execute("DROP RESOURCE RULE runaway")
        wait_until(lambda: len(a.snapshot.rules) == 2, timeout=10)


def test_conditions_are_written_back_as_a_user_types_them() -> None:
    conditions = (("cpu_time", 1500), ("elapsed", 7_200_000), ("memory", 3 * 1024**2),
                  ("rows", 5), ("bytes", 1000))  # fmt: skip
    text = format_conditions(conditions)
    assert text == "cpu_time > '1500ms' AND elapsed > '2h' AND memory > '3M' AND rows > 5 " \
        "AND bytes > 1000"  # fmt: skip
    (stmt,) = parse_script(f"CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN {text} THEN LOG")
    assert isinstance(stmt, ast.CreateResourceRule)
    assert stmt.conditions == conditions


# ---- the records: whatever one carries is applied whole or refused as XX001 ----------------


def _base_snapshot() -> resgroups.catalog.Snapshot:
    with resgroups.Engine() as engine:
        engine.connect().execute_script(SETUP)
        engine.connect().execute("CREATE RESOURCE GROUP tenants VARIANTS (acme)")
        return engine.snapshot


_BASE = _base_snapshot()
_IDS = sorted({*(g.id for g in _BASE.all_groups), *_BASE.rules, _BASE.next_id, -1, 99})
_CONDITIONS = st.lists(
    st.tuples(st.sampled_from([*METRICS, "cpu", ""]), st.integers(-2, 2**64)), max_size=3
)


@st.composite
def _rule_records(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    op = draw(st.sampled_from(["create_rule", "rename_rule", "drop_rule"]))
    args: dict[str, object] = {"id": draw(st.sampled_from(_IDS))}
    if op != "drop_rule":
        args["name"] = draw(st.sampled_from(["r", "runaway", "Demote", "", "bad name"]))
        args["quoted"] = draw(st.booleans())
    if op == "create_rule":
        args["group"] = draw(st.sampled_from(_IDS))
        args["conditions"] = draw(_CONDITIONS)
        args["action"] = draw(st.sampled_from(["kill", "move", "log", "KILL", "nuke"]))
        if draw(st.booleans()):
            args["target"] = draw(st.sampled_from(_IDS))
        args["watch"] = draw(st.sampled_from([0, 1000, -1, 2**40, "1s"]))
    return op, args


_ETL, _SLOW = (_BASE.find_group(ast.Ident(n)).id for n in ("etl", "slow"))  # type: ignore[union-attr]
_VALID = [
    ("create_rule", {"id": _BASE.next_id, "name": "r", "quoted": False, "group": _ETL,
                     "conditions": [["rows", 1]], "action": "kill", "watch": 0}),
    ("create_rule", {"id": _BASE.next_id, "name": "r", "quoted": True, "group": _SLOW,
                     "conditions": [["cpu_time", 5], ["bytes", 9]], "action": "move",
                     "target": 0, "watch": 1000}),
    ("rename_rule", {"id": min(_BASE.rules), "name": "renamed", "quoted": False}),
    ("drop_rule", {"id": max(_BASE.rules)}),
    ("drop_group", {"id": _ETL}),
]  # fmt: skip


@st.composite
def _mutated(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    op, args = draw(st.sampled_from(_VALID))
    generated = draw(_rule_records())[1]
    key = draw(st.sampled_from(sorted(args)))
    return op, {**args, key: generated.get(key, args[key])}


@settings(max_examples=600, deadline=None)
@given(st.one_of(st.sampled_from(_VALID), _mutated(), _rule_records()))
def test_any_rule_record_is_applied_whole_or_refused(record: tuple[str, dict[str, object]]) -> None:
    op, args = record
    refused: resgroups.CatalogError | None = None
    try:
        new = apply(_BASE, Record(_BASE.version + 1, op, args))
    except resgroups.CatalogError as exc:
        refused = exc
    if refused is not None:
        assert refused.sqlstate == "XX001"
        event("refused")
        return
    event(f"applied {op}")
    new._check_invariants()
    for rule in new.rules.values():
        assert new.runtime_group(rule.group_id) is not None
        assert (rule.action == "move") == (rule.target_id is not None)


# ---- fingerprints and which rules are due ---------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (
            "SELECT sum(x)  FROM long_sequence(100000000) WHERE x > 5",
            "select SUM(x) from long_sequence(200) where x>7;",
        ),
        ("SELECT 'a''b', E'x\\'y' FROM t", "select 'other', e'' from t -- a comment"),
        ("SELECT $1::int8, 1.5e3", "select 7 :: int8 , .5"),
        ('SELECT "X" FROM t /* c */', 'select "X"\n\tfrom T'),
        ("SELECT * FROM t WHERE x > -5", "select * from t where x>-7"),
    ],
)
def test_the_same_statement_with_other_literals_has_one_fingerprint(a: str, b: str) -> None:
    assert fingerprint(a) == fingerprint(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ('SELECT "X" FROM t', 'SELECT "x" FROM t'),  # quoted names are exact
        ("SELECT x FROM t WHERE x > 1", "SELECT x FROM t WHERE x >= 1"),
        ("SELECT count(*) FROM long_sequence(5)", "SELECT sum(x) FROM long_sequence(5)"),
    ],
)
def test_different_statements_have_different_fingerprints(a: str, b: str) -> None:
    assert fingerprint(a) != fingerprint(b)


def test_fingerprint_is_linear_on_hostile_text() -> None:
    for text in ("/*" * 50_000, "'" + "''" * 50_000, "E'" + "\\" * 100_000, '"' * 100_001):
        assert isinstance(fingerprint(text), str)


def _rule(rule_id: int, action: str, **conditions: int) -> RuleDef:
    target = 0 if action == "move" else None
    return RuleDef(rule_id, f"r{rule_id}", False, 1, tuple(conditions.items()), action, target)


def test_a_rule_acts_once_when_every_condition_is_exceeded() -> None:
    rules = QueryRules([_rule(1, "log", rows=10, bytes=100), _rule(2, "kill", cpu_time=50)])
    assert rules.metrics == {"rows", "bytes", "cpu_time"}
    assert rules.due({"rows": 11, "bytes": 100}) == []  # bytes not exceeded
    assert [r.id for r in rules.due({"rows": 11, "bytes": 101})] == [1]
    assert rules.due({"rows": 99, "bytes": 999}) == []  # once per query
    assert [r.id for r in rules.due({"cpu_time": 51})] == [2]


def test_a_kill_wins_over_a_move_due_in_the_same_check() -> None:
    rules = QueryRules([_rule(1, "move", elapsed=5), _rule(2, "log", elapsed=5),
                        _rule(3, "kill", elapsed=5)])  # fmt: skip
    assert [r.id for r in rules.due({"elapsed": 6})] == [2, 3]
    hit = describe_hit(_rule(3, "kill", elapsed=5000, memory=2 * 1024**3),
                       {"elapsed": 6500, "memory": 3 * 1024**3})  # fmt: skip
    assert hit == "elapsed 6500ms > 5s, memory 3G > 2G"
