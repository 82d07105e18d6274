"""Selectors (SPEC §15): routing a query by what it is. The DDL and its
refusals, each condition, the precedence order (session choice > selectors by
priority > mappings > ACL groups > DEFAULT), no USE needed, EXPLAIN with
attributes, resource_selectors(), the executor's estimates, the records in
every backend, and a property test that the group a query runs in is the one
EXPLAIN names."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from waiting import wait_until

import resgroups
from resgroups.access import Identity, explain, resolve
from resgroups.catalog.records import Record, apply
from resgroups.catalog.selectors import Attributes, LikeMatcher, holds
from resgroups.sql import ast
from resgroups.sql.format import format_sql
from resgroups.sql.parser import parse_one

Estimate = resgroups.Estimate


def _selectors(session: resgroups.Session) -> list[tuple[object, ...]]:
    return session.execute("SELECT * FROM resource_selectors()").rows


def _group_of(session: resgroups.Session, **query: object) -> str | None:
    with session.query(**query) as q:  # type: ignore[arg-type]
        return q.group


@pytest.mark.parametrize(
    "text",
    [
        "CREATE RESOURCE SELECTOR s WHEN application = 'superset' THEN RESOURCE GROUP g",
        "CREATE RESOURCE SELECTOR IF NOT EXISTS \"S x\" WHEN application LIKE 'dbt%' AND "
        "tag = 'etl' AND kind = 'ctas' AND user LIKE 'svc\\_%' AND statement LIKE 'SELECT 1%' "
        "AND estimated_rows > 5 AND estimated_memory < '2G' THEN RESOURCE GROUP g::v "
        "WITH (priority = 7)",
        "CREATE RESOURCE SELECTOR s WHEN user = 'Bob' THEN RESOURCE GROUP DEFAULT",
        "ALTER RESOURCE SELECTOR s RENAME TO t",
        "DROP RESOURCE SELECTOR IF EXISTS t",
    ],
)
def test_selector_statements_round_trip_through_format(text: str) -> None:
    stmt = parse_one(text)
    assert parse_one(format_sql(stmt)) == stmt


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [
        ("app = 'x'", resgroups.InvalidParameter, "unknown selector condition 'app'"),
        ("tag LIKE 'x%'", resgroups.InvalidParameter, "tag takes ="),
        ("application < 'x'", resgroups.InvalidParameter, "application takes = or LIKE"),
        ("kind = 'update'", resgroups.InvalidParameter, "select, ctas, insert_select, export"),
        ("estimated_rows < 'many'", resgroups.InvalidParameter, "estimated_rows"),
        ("estimated_rows = 5", resgroups.InvalidParameter, "estimated_rows takes < or >"),
        ("estimated_memory > UNLIMITED", resgroups.InvalidParameter, "estimated_memory"),
        ("application = superset", resgroups.InvalidParameter, "quoted string"),
        ("statement = 'SELECT 1'", resgroups.InvalidParameter, "statement takes LIKE"),
    ],
)
def test_bad_selectors_say_what_is_wrong(
    engine: resgroups.Engine, text: str, error: type[Exception], needle: str
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    with pytest.raises(error, match=needle):
        session.execute(f"CREATE RESOURCE SELECTOR s WHEN {text} THEN RESOURCE GROUP g")
    assert _selectors(session) == []


def test_selector_ddl_and_its_refusals(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(
        """CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP tenants VARIANTS (acme);
        CREATE RESOURCE SELECTOR s WHEN tag = 'x' THEN RESOURCE GROUP g WITH (priority = 3)"""
    )
    version = engine.catalog_version
    cases = [
        ("CREATE RESOURCE SELECTOR S WHEN tag = 'y' THEN RESOURCE GROUP g", "42710"),
        ("CREATE RESOURCE SELECTOR t WHEN tag = 'y' THEN RESOURCE GROUP nope", "42704"),
        ("CREATE RESOURCE SELECTOR t WHEN tag = 'y' THEN RESOURCE GROUP tenants", "42809"),
        ("DROP RESOURCE GROUP g", "42809"),  # a selector routes to it
        ("ALTER RESOURCE GROUP g ADD VARIANT v", "42809"),
        ("DROP RESOURCE SELECTOR nope", "42704"),
        ("ALTER RESOURCE SELECTOR nope RENAME TO t", "42704"),
        ("CREATE RESOURCE SELECTOR t WHEN tag = 'y' THEN RESOURCE GROUP g "
         "WITH (priority = -1)", "22023"),
        ("CREATE RESOURCE SELECTOR t WHEN tag = 'y' THEN RESOURCE GROUP g "
         "WITH (priority = 1, priority = 2)", "22023"),
    ]  # fmt: skip
    for text, sqlstate in cases:
        with pytest.raises(resgroups.Error) as caught:
            session.execute(text)
        assert caught.value.sqlstate == sqlstate, text
    assert engine.catalog_version == version
    with pytest.raises(resgroups.CatalogError, match=r"\[selector=s\]"):
        session.execute("DROP RESOURCE GROUP g")
    session.execute("CREATE RESOURCE SELECTOR v WHEN tag = 'y' THEN RESOURCE GROUP tenants::acme")
    session.execute("ALTER RESOURCE GROUP g RENAME TO h")
    session.execute('ALTER RESOURCE SELECTOR s RENAME TO "S2"')
    assert _selectors(session) == [
        ("S2", "tag = 'x'", "h", 3, 0),
        ("v", "tag = 'y'", "tenants::acme", 0, 0),
    ]
    session.execute('DROP RESOURCE SELECTOR "S2"')
    session.execute("DROP RESOURCE GROUP h")  # free now
    session.execute('DROP RESOURCE SELECTOR IF EXISTS "S2"')


@pytest.mark.parametrize(
    ("condition", "routed", "not_routed"),
    [
        ("application = 'superset'", {"application": "superset"}, {"application": "supersetx"}),
        ("application LIKE 'dbt-%'", {"application": "dbt-run"}, {"application": "dbt"}),
        ("tag = 'export'", {"tags": ("a", "export")}, {"tags": ("exports",)}),
        ("kind = 'ctas'", {"kind": "ctas"}, {"kind": "select"}),
        ("user = 'BI'", {"user": "bi"}, {"user": "bix"}),
        ("user LIKE 'svc\\_%'", {"user": "svc_etl"}, {"user": "svcetl"}),
        ("statement LIKE 'SELECT 1%'", {"statement": "SELECT 1"}, {"statement": "select 1"}),
        ("estimated_rows < 1000", {"estimate": Estimate(rows=999)}, {"estimate": Estimate()}),
        ("estimated_memory > 1M", {"estimate": Estimate(memory=2**21)}, {}),
    ],
)
def test_each_condition_routes_what_it_names(
    condition: str, routed: dict[str, object], not_routed: dict[str, object]
) -> None:
    def group_for(spec: dict[str, object]) -> str | None:
        session = engine.connect(
            str(spec.get("user", "ann")),
            application=spec.get("application"),  # type: ignore[arg-type]
            tags=spec.get("tags", ()),  # type: ignore[arg-type]
        )
        query = {k: spec[k] for k in ("kind", "statement", "estimate") if k in spec}
        return _group_of(session, **query)

    with resgroups.Engine() as engine:
        engine.connect().execute_script(
            f"CREATE RESOURCE GROUP lane; "
            f"CREATE RESOURCE SELECTOR s WHEN {condition} THEN RESOURCE GROUP lane"
        )
        assert group_for(routed) == "lane"
        assert group_for(not_routed) == "DEFAULT"


def test_precedence_choice_selectors_by_priority_mappings_acl_groups_default(
    ac_engine: resgroups.Engine,
) -> None:
    admin = ac_engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP mapped; CREATE RESOURCE GROUP acl; CREATE RESOURCE GROUP chosen;
        CREATE RESOURCE GROUP low; CREATE RESOURCE GROUP high; CREATE RESOURCE GROUP tie;
        CREATE USER ann WITH PASSWORD 'pw'; CREATE GROUP team; ADD USER ann TO team;
        ALTER GROUP team SET RESOURCE GROUP acl;
        GRANT USE ON RESOURCE GROUP chosen TO ann"""
    )
    ann = ac_engine.connect("ann", "pw", application="app", tags=("t",))
    assert _group_of(ann) == "acl"  # ACL group, before any mapping of her own
    admin.execute("ALTER USER ann SET RESOURCE GROUP mapped")
    assert _group_of(ann) == "mapped"
    admin.execute("CREATE RESOURCE SELECTOR s1 WHEN application = 'app' THEN RESOURCE GROUP low")
    assert _group_of(ann) == "low"  # a selector before her mapping, with no USE on low
    admin.execute(
        "CREATE RESOURCE SELECTOR s2 WHEN tag = 't' THEN RESOURCE GROUP high WITH (priority = 5)"
    )
    admin.execute(
        "CREATE RESOURCE SELECTOR s3 WHEN user = 'ann' THEN RESOURCE GROUP tie WITH (priority = 5)"
    )
    assert _group_of(ann) == "high"  # the highest priority; s3 ties and came later
    ann.execute("SET RESOURCE GROUP chosen")
    assert _group_of(ann) == "chosen"  # the session's choice first
    assert _group_of(ann, kind="export") == "high"  # an export ignores the choice
    ann.execute("RESET RESOURCE GROUP")
    assert _selectors(admin)[1][4] >= 2  # matches_total counts what it routed
    rows = admin.execute(
        "EXPLAIN RESOURCE GROUP FOR USER ann APPLICATION 'app' TAGS ('t') KIND select"
    ).rows
    assert [(r[0], r[1], r[3], r[5]) for r in rows[:3]] == [
        ("high", "selector", True, True),
        ("tie", "selector", True, False),
        ("low", "selector", True, False),
    ]
    rows = admin.execute("EXPLAIN RESOURCE GROUP FOR USER ann APPLICATION 'other'").rows
    failing = {r[0]: r[4] for r in rows if r[1] == "selector"}
    assert "tag = 't' does not hold (no tags)" in failing["high"]
    assert "application = 'app' does not hold (application is 'other')" in failing["low"]
    assert next(r for r in rows if r[5])[:2] == ("tie", "selector")  # user = 'ann' holds


def test_the_built_in_executor_gives_the_statement_and_its_estimate(
    engine: resgroups.Engine,
) -> None:
    session = engine.connect()
    session.execute_script(
        """CREATE RESOURCE GROUP fast; CREATE RESOURCE GROUP big;
        CREATE RESOURCE SELECTOR lane WHEN estimated_rows < 100000 THEN RESOURCE GROUP fast;
        CREATE RESOURCE SELECTOR scans WHEN estimated_memory > 100M THEN RESOURCE GROUP big;
        CREATE RESOURCE SELECTOR health WHEN statement LIKE 'SELECT 1%'
            THEN RESOURCE GROUP fast WITH (priority = 9)"""
    )
    # the bounded scans are of the very rows that go to big unbounded: only the
    # bound on x can bring their estimate under 100000 rows
    cases = {
        "SELECT count(*) FROM long_sequence(50)": "fast",
        "SELECT count(*) FROM long_sequence(20000000) WHERE x > 10 AND x <= 500": "fast",
        "SELECT count(*) FROM long_sequence(20000000) WHERE 100 >= x": "fast",
        "SELECT count(*) FROM long_sequence(20000000)": "big",  # 160 MB of x
        "SELECT count(*) FROM long_sequence(5000000)": "DEFAULT",
        "SELECT count(*) FROM long_sequence(20000000) WHERE x % 2 = 0 AND x < 50": "fast",
    }
    for text, group in cases.items():
        assert session.execute(text).group == group, text
    session.execute("CREATE TABLE t AS SELECT x FROM long_sequence(200000)")
    assert session.execute("SELECT count(*) FROM t").group == "DEFAULT"  # 200,000 rows
    assert session.execute("SELECT count(*) FROM t WHERE x < 5").group == "DEFAULT"  # a table


def test_selectors_survive_a_restart_and_replicate(tmp_path: Path, pg_catalog: str) -> None:
    script = (
        "CREATE RESOURCE GROUP g;"
        "CREATE RESOURCE SELECTOR s WHEN application LIKE 'a%' AND estimated_rows < 10 "
        "THEN RESOURCE GROUP g WITH (priority = 2)"
    )
    with resgroups.Engine(catalog=tmp_path) as engine:
        engine.connect().execute_script(script)
        before = _selectors(engine.connect())
    with resgroups.Engine(catalog=tmp_path) as engine:
        assert _selectors(engine.connect()) == before
        session = engine.connect(application="abc")
        assert _group_of(session, estimate=Estimate(rows=1)) == "g"
    with (
        resgroups.Engine(catalog=pg_catalog) as a,
        resgroups.Engine(catalog=pg_catalog) as b,
    ):
        a.connect().execute_script(script)
        wait_until(lambda: len(b.snapshot.selectors) == 1, timeout=10)
        assert _group_of(b.connect(application="abc"), estimate=Estimate(rows=1)) == "g"


def test_session_attributes_are_checked() -> None:
    with resgroups.Engine() as engine:
        with pytest.raises(resgroups.InvalidParameter, match="tags=\\('a', 'b'\\)"):
            engine.connect(tags="a,b")
        with pytest.raises(resgroups.InvalidParameter, match="at most 63"):
            engine.connect(application="x" * 64)
        with pytest.raises(resgroups.InvalidParameter, match="client tag ''"):
            engine.connect(tags=("",))
        with pytest.raises(resgroups.InvalidParameter, match=r"resgroups\.Estimate"):
            engine.connect().query(estimate=10)  # type: ignore[arg-type]
        with pytest.raises(resgroups.InvalidParameter, match=r"Estimate\.rows"):
            Estimate(rows=-1)


@pytest.mark.parametrize(
    ("pattern", "text", "expected"),
    [
        ("a%b_", "a..bc", True),
        ("a%b_", "a..b", False),
        ("100\\%", "100%", True),
        ("100\\%", "1000", False),
        ("(.*)", "(.*)", True),  # regex characters are literal
        ("%", "", True),
        ("%%%", "abc", True),
        ("_", "", False),
        ("a%", "A", False),  # case-sensitive
        ("%ab%ab%", "abab", True),
        ("%ab%ab%", "aba", False),
        ("%a_c%", "xxabcxx", True),
        ("SELECT % FROM % WHERE %", "SELECT x FROM t WHERE y", True),
        ("ab", "ab\n", False),
    ],
)
def test_like_matches_as_sql_does(pattern: str, text: str, expected: bool) -> None:
    assert LikeMatcher(pattern).matches(text) is expected


def test_like_is_linear_on_what_makes_a_regex_backtrack() -> None:
    """'%a%a%a%a%a%a%b' against 100 'a' took 38 s as a regular expression with .*;
    the matcher answers in one pass per segment (bounded by the test's timeout)."""
    assert not LikeMatcher("%a%a%a%a%a%a%b").matches("a" * 100_000)
    statement = "SELECT x FROM t WHERE " + " AND ".join(["a = 1"] * 2000)
    pattern = "SELECT % FROM % WHERE % AND % AND % AND % LIMIT 10"
    assert not LikeMatcher(pattern).matches(statement)


def test_conditions_hold_as_documented() -> None:
    attrs = Attributes("Ann", application=None)
    assert not holds(("application", "like", "%"), attrs, {})  # no application: no match
    assert holds(("user", "=", "ANN"), attrs, {})


# ---- the group a query runs in is the one EXPLAIN names ------------------------------------

_GROUPS = ["g0", "g1", "g2"]
_APPS = [None, "superset", "dbt-run", "notebook"]
_TAGS = ["dash", "etl", "export"]
_CONDITIONS = st.sampled_from(
    [
        "application = 'superset'",
        "application LIKE 'dbt%'",
        "tag = 'dash'",
        "tag = 'export'",
        "kind = 'export'",
        "user = 'ann'",
        "user LIKE 'b%'",
        "statement LIKE 'SELECT 1%'",
        "estimated_rows < 100",
        "estimated_rows > 10000",
    ]
)
_SELECTOR = st.tuples(
    st.lists(_CONDITIONS, min_size=1, max_size=3), st.sampled_from(_GROUPS), st.integers(0, 3)
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    selectors=st.lists(_SELECTOR, max_size=6),
    mapping=st.sampled_from([None, *_GROUPS]),
    user=st.sampled_from(["ann", "bob"]),
    application=st.sampled_from(_APPS),
    tags=st.sets(st.sampled_from(_TAGS), max_size=2),
    kind=st.sampled_from(["select", "export"]),
    statement=st.sampled_from([None, "SELECT 1", "SELECT 2"]),
    rows=st.sampled_from([None, 5, 50_000]),
)
def test_the_group_a_query_runs_in_is_the_one_explain_names(
    selectors: list[tuple[list[str], str, int]],
    mapping: str | None,
    user: str,
    application: str | None,
    tags: set[str],
    kind: str,
    statement: str | None,
    rows: int | None,
) -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE RESOURCE GROUP g0; CREATE RESOURCE GROUP g1; CREATE RESOURCE GROUP g2;"
            "CREATE USER ann; CREATE USER bob"
        )
        if mapping is not None:
            admin.execute(f"ALTER USER {user} SET RESOURCE GROUP {mapping}")
        for i, (conditions, group, priority) in enumerate(selectors):
            admin.execute(
                f"CREATE RESOURCE SELECTOR s{i} WHEN {' AND '.join(conditions)} "
                f"THEN RESOURCE GROUP {group} WITH (priority = {priority})"
            )
        session = engine.connect(user, application=application, tags=tags)
        with session.query(kind=kind, statement=statement, estimate=Estimate(rows=rows)) as q:
            ran_in = q.group
        snap = engine.snapshot
        attrs = session.attributes(kind, statement, Estimate(rows=rows))
        who = Identity(user, login_id=snap.find_principal(ast.Ident(user)).id)  # type: ignore[union-attr]
        assert resolve(snap, who, None, access_control=True, attributes=attrs).name == ran_in
        (winner,) = [c for c in explain(snap, who, None, access_control=True, attributes=attrs)
                     if c.chosen]  # fmt: skip
        assert winner.candidate == ran_in


def test_any_selector_record_is_applied_whole_or_refused() -> None:
    with resgroups.Engine() as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g")
        base = engine.snapshot
    good = {"id": base.next_id, "name": "s", "quoted": False, "group": 1, "priority": 0,
            "conditions": [["tag", "=", "x"]]}  # fmt: skip
    assert apply(base, Record(base.version + 1, "create_selector", good)).selectors
    bad = [
        {**good, "conditions": []},
        {**good, "conditions": [["tag", "like", "x"]]},
        {**good, "conditions": [["kind", "=", "nope"]]},
        {**good, "conditions": [["estimated_rows", "<", "5"]]},
        {**good, "conditions": [["estimated_rows", "<", True]]},
        {**good, "group": 99},
        {**good, "priority": -1},
        {**good, "id": 0},
        {**good, "name": ""},
    ]
    for args in bad:
        with pytest.raises(resgroups.CatalogError) as caught:
            apply(base, Record(base.version + 1, "create_selector", args))
        assert caught.value.sqlstate == "XX001", args
    made = apply(base, Record(base.version + 1, "create_selector", good))
    with pytest.raises(resgroups.CatalogError, match="missing selector"):  # never a boolean
        apply(made, Record(made.version + 1, "drop_selector", {"id": True}))
    other = {**good, "id": made.next_id, "name": "t"}
    both = apply(made, Record(made.version + 1, "create_selector", other))
    rename = {"id": good["id"], "name": "T", "quoted": False}
    with pytest.raises(resgroups.CatalogError, match="taken"):
        apply(both, Record(both.version + 1, "rename_selector", rename))


# ---- found by review ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "needle"),
    [
        ("application = ''", "never holds"),
        ("tag = ''", "never holds"),
        (f"tag = '{'t' * 64}'", "never holds"),
        ("estimated_rows < 0", "never holds"),
        ("statement LIKE 'abc\\'", "must not end with the escape character"),
    ],
)
def test_selectors_that_can_never_match_are_refused(
    engine: resgroups.Engine, condition: str, needle: str
) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    with pytest.raises(resgroups.InvalidParameter, match=needle):
        session.execute(f"CREATE RESOURCE SELECTOR s WHEN {condition} THEN RESOURCE GROUP g")


def test_kind_select_may_be_written_bare(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    session.execute("CREATE RESOURCE SELECTOR s WHEN kind = select THEN RESOURCE GROUP g")
    assert _selectors(session)[0][1] == "kind = 'select'"


def test_explain_leaves_per_query_conditions_to_each_query(engine: resgroups.Engine) -> None:
    session = engine.connect(application="superset")
    session.execute_script(
        """CREATE RESOURCE GROUP dashboards;
        CREATE RESOURCE SELECTOR short WHEN application = 'superset' AND estimated_rows < 100000
            THEN RESOURCE GROUP dashboards"""
    )
    rows = session.execute("EXPLAIN RESOURCE GROUP").rows
    (selector,) = [r for r in rows if r[1] == "selector"]
    assert selector[3] is False
    assert "estimated_rows < 100000 is decided by each query" in selector[4]
    assert session.execute("SELECT count(*) FROM long_sequence(5)").group == "dashboards"


def test_explain_shows_other_users_selectors_to_admins_only(ac_engine: resgroups.Engine) -> None:
    admin = ac_engine.connect()
    admin.execute_script(
        """CREATE RESOURCE GROUP vip; CREATE RESOURCE GROUP bi; CREATE USER ann WITH PASSWORD 'p';
        CREATE RESOURCE SELECTOR ceo WHEN user = 'ceo' THEN RESOURCE GROUP vip;
        CREATE RESOURCE SELECTOR tools WHEN application = 'superset' THEN RESOURCE GROUP bi"""
    )
    ann = ac_engine.connect("ann", "p", application="superset")
    shown = {r[4].split(":")[0] for r in ann.execute("EXPLAIN RESOURCE GROUP").rows
             if r[1] == "selector"}  # fmt: skip
    assert shown == {"selector tools"}  # the one that routes her, not the others
    rows = admin.execute("EXPLAIN RESOURCE GROUP FOR USER ann APPLICATION 'superset'").rows
    assert len([r for r in rows if r[1] == "selector"]) == 2


def test_explain_and_sessions_refuse_attributes_no_session_can_have(
    engine: resgroups.Engine,
) -> None:
    session = engine.connect()
    with pytest.raises(resgroups.InvalidParameter, match="at most 63"):
        session.execute(f"EXPLAIN RESOURCE GROUP APPLICATION '{'b' * 64}'")
    with pytest.raises(resgroups.InvalidParameter, match=r"1\.\.63 characters"):
        session.execute("EXPLAIN RESOURCE GROUP TAGS ('')")
    with pytest.raises(resgroups.InvalidParameter, match="collection of text"):
        engine.connect(tags=None)  # type: ignore[arg-type]
    with pytest.raises(resgroups.InvalidParameter, match=r"Estimate\.memory"):
        Estimate(memory=2**63)


def test_the_index_files_a_selector_under_its_rarest_equality(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g")
    for i in range(50):
        session.execute(
            f"CREATE RESOURCE SELECTOR s{i} WHEN kind = 'select' AND tag = 't{i}' "
            "THEN RESOURCE GROUP g"
        )
    index = engine.snapshot.selector_index
    assert ("kind", "select") not in index.by_value  # filed under their tags
    assert len(index.candidates(Attributes("u", tags=frozenset({"t7"})))) == 1
    assert _group_of(engine.connect(tags=("t7",))) == "g"


def test_joins_unions_and_subqueries_carry_an_upper_bound(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute_script(
        """CREATE RESOURCE GROUP small; CREATE RESOURCE GROUP big;
        CREATE RESOURCE SELECTOR a WHEN estimated_rows < 100000 THEN RESOURCE GROUP small;
        CREATE RESOURCE SELECTOR b WHEN estimated_rows > 1000000 THEN RESOURCE GROUP big;
        CREATE TABLE t AS SELECT x FROM long_sequence(2000)"""
    )
    cases = {
        "SELECT count(*) FROM t a JOIN t b ON a.x = b.x": "big",  # 4,000,000 at most
        "SELECT x FROM t UNION ALL SELECT x FROM t LIMIT 1": "small",  # 4,000
        "SELECT count(*) FROM (SELECT x FROM t) AS d": "small",
    }
    for text, group in cases.items():
        assert session.execute(text).group == group, text
