"""The catalog (pg_catalog, information_schema) and the relational engine that
answers it: joins, subqueries, CASE, regular expressions, GROUP BY, and the
errors a wrong name gets."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import resgroups
from resgroups.sql import ast
from resgroups.sql.expr import EvalContext, PgArray, regex_pattern
from resgroups.sql.parser import parse_one
from resgroups.sql.relational import run_query
from resgroups.sql.select import Relation
from resgroups.statements.pg_catalog import table_oid


def rows(session: resgroups.Session, sql: str) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in session.execute(sql).rows]


# ---- the catalog's rows -------------------------------------------------------------


def test_pg_class_lists_tables_views_and_the_catalog(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute("CREATE TABLE t AS SELECT x, x * 0.5 AS y FROM long_sequence(3)")
    listed = rows(
        s,
        "SELECT n.nspname, c.relname, c.relkind FROM pg_catalog.pg_class c "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'public' ORDER BY 2",
    )
    assert listed == [
        ("public", "resource_group_instances", "v"),
        ("public", "resource_group_queries", "v"),
        ("public", "resource_group_rules", "v"),
        ("public", "resource_group_watches", "v"),
        ("public", "resource_groups", "v"),
        ("public", "resource_selectors", "v"),
        ("public", "t", "r"),
    ]
    # the oids are stable: PostgreSQL's own for its catalogs, a name's hash for a table
    assert rows(s, "SELECT oid FROM pg_class WHERE relname = 'pg_class'") == [(1259,)]
    assert rows(s, "SELECT oid FROM pg_class WHERE relname = 't'") == [(table_oid("t"),)]
    assert rows(s, "SELECT 't'::regclass, 'pg_catalog.pg_type'::regclass") == [
        (table_oid("t"), 1247)
    ]


def test_pg_attribute_and_format_type_describe_columns(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute("CREATE TABLE t AS SELECT x, x * 0.5 AS y FROM long_sequence(3)")
    described = rows(
        s,
        "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) "
        "FROM pg_catalog.pg_attribute a WHERE a.attrelid = 't'::regclass AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
    )
    assert described == [("x", "bigint"), ("y", "double precision")]
    # real type oids, as drivers expect
    types = dict(rows(s, "SELECT typname, oid FROM pg_type"))
    assert {types[n] for n in ("bool", "int8", "text", "float8")} == {16, 20, 25, 701}
    assert rows(
        s,
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = 't' ORDER BY ordinal_position",
    ) == [("x", "bigint"), ("y", "double precision")]
    assert ("public", "t", "BASE TABLE") in rows(
        s, "SELECT table_schema, table_name, table_type FROM information_schema.tables"
    )


def test_pg_proc_lists_the_table_functions(engine: resgroups.Engine) -> None:
    s = engine.connect()
    names = rows(s, "SELECT proname FROM pg_proc ORDER BY 1")
    assert ("resource_groups",) in names
    assert ("long_sequence",) in names
    (result,) = rows(
        s,
        "SELECT pg_get_function_result(oid) FROM pg_proc WHERE proname = 'resource_groups'",
    )
    assert result[0].startswith("TABLE(name text, memory_limit_bytes bigint")


def test_roles_are_the_principals_to_the_admin(ac_engine: resgroups.Engine) -> None:
    admin = ac_engine.connect("admin", "admin")
    admin.execute("CREATE USER alice WITH PASSWORD 'pw'")
    admin.execute("CREATE GROUP analysts")
    admin.execute("ADD USER alice TO analysts")
    memberof = rows(
        admin,
        "SELECT r.rolname, ARRAY(SELECT b.rolname FROM pg_catalog.pg_auth_members m "
        "JOIN pg_catalog.pg_roles b ON (m.roleid = b.oid) WHERE m.member = r.oid) "
        "FROM pg_catalog.pg_roles r WHERE r.rolname !~ '^pg_' ORDER BY 1",
    )
    assert [(n, str(a)) for n, a in memberof] == [
        ("admin", "{}"),
        ("alice", "{analysts}"),
        ("analysts", "{}"),
    ]
    alice = ac_engine.connect("alice", "pw")
    assert rows(alice, "SELECT rolname FROM pg_roles ORDER BY 1") == [("admin",), ("alice",)]
    assert rows(alice, "SELECT count(*) FROM pg_auth_members") == [(0,)]


def test_search_path_and_schemas(engine: resgroups.Engine) -> None:
    s = engine.connect()
    # an unqualified pg_* name is pg_catalog's, as with PostgreSQL's search_path
    assert rows(s, "SELECT count(*) FROM pg_namespace") == rows(
        s, "SELECT count(*) FROM pg_catalog.pg_namespace"
    )
    # a table function's view reads like the function
    assert rows(s, "SELECT name FROM resource_groups") == rows(
        s, "SELECT name FROM resource_groups()"
    )
    with pytest.raises(resgroups.UndefinedTable, match=re.escape("information_schema.pg_class")):
        s.execute("SELECT * FROM information_schema.pg_class")


# ---- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "error", "sqlstate", "message"),
    [
        ("SELECT * FROM pg_clas", resgroups.UndefinedTable, "42P01", 'Did you mean "pg_class"'),
        (
            "SELECT oid FROM pg_class c, pg_namespace n",
            resgroups.AmbiguousColumn,
            "42702",
            'column reference "oid" is ambiguous',
        ),
        (
            "SELECT x.relname FROM pg_class c",
            resgroups.UndefinedTable,
            "42P01",
            'missing FROM-clause entry for table "x"',
        ),
        (
            "SELECT c.relnam FROM pg_class c",
            resgroups.UndefinedColumn,
            "42703",
            'Did you mean "relname"',
        ),
        (
            "SELECT (SELECT oid FROM pg_namespace)",
            resgroups.CardinalityViolation,
            "21000",
            "more than one row",
        ),
        ("SELECT 'a' ~ '('", resgroups.InvalidRegularExpression, "2201B", "invalid regular"),
        ("SELECT 'nope'::regclass", resgroups.UndefinedTable, "42P01", '"nope" does not exist'),
    ],
)
def test_bad_names_get_clear_errors(
    engine: resgroups.Engine, sql: str, error: type[Exception], sqlstate: str, message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)) as raised:
        engine.connect().execute(sql)
    assert getattr(raised.value, "sqlstate", None) == sqlstate


# ---- the expressions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("CASE 2 WHEN 1 THEN 'a' WHEN 2 THEN 'b' END", "b"),
        ("CASE 3 WHEN 1 THEN 'a' END", None),
        ("CASE WHEN 1 > 2 THEN 1 ELSE 2 END", 2),
        ("CASE WHEN NULL THEN 1 ELSE 0 END", 0),
        ("NULL IS NOT DISTINCT FROM NULL", True),
        ("1 IS DISTINCT FROM NULL", True),
        ("1 IS DISTINCT FROM 1", False),
        ("'pg_toast' ~ '^pg_'", True),
        ("'public' !~ '^pg_'", True),
        ("'ABC' ~* 'b'", True),
        ("'abc' OPERATOR(pg_catalog.~) '^(abc)$' COLLATE pg_catalog.default", True),
        ("'a1' ~ '^[[:alpha:]][[:digit:]]$'", True),
        ("'x' || 1 || TRUE", "x1true"),
        ("'50%' LIKE '50/%' ESCAPE '/'", True),
        ("'a_b' LIKE 'a\\_b'", True),
        ("'axb' LIKE 'a\\_b'", False),
        ("E'a\\tb'", "a\tb"),
        ("2 = ANY (ARRAY[1, 2])", True),
        ("3 <> ALL (ARRAY[1, 2])", True),
        ("EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'public')", True),
        ("(SELECT nspname FROM pg_namespace WHERE oid = '2200')", "public"),
        ("pg_catalog.pg_encoding_to_char(6)", "UTF8"),
        ("nullif('', '')", None),
        ("nullif('a', '')", "a"),
        ("replace('pg_temp_1', 'pg_temp_', 'pg_toast_temp_')", "pg_toast_temp_1"),
        ("current_catalog", "resgroups"),
        ("20::regtype::text", "bigint"),
        (
            "array_to_string(ARRAY(SELECT nspname FROM pg_namespace ORDER BY 1), ',')",
            "information_schema,pg_catalog,public",
        ),
    ],
)
def test_expression_values(engine: resgroups.Engine, expr: str, value: object) -> None:
    ((got,),) = rows(engine.connect(), f"SELECT {expr}")
    assert got == value


def test_regex_reads_posix_classes() -> None:
    assert regex_pattern("^[[:upper:]]+$").search("ABC")
    assert not regex_pattern("^[[:upper:]]+$").search("AbC")


def test_arrays_have_postgresql_text_form() -> None:
    assert str(PgArray(["a", "b c", None, ""])) == '{a,"b c",NULL,""}'


def test_group_by_array_agg_derived_tables_and_offset(engine: resgroups.Engine) -> None:
    s = engine.connect()
    got = rows(
        s,
        "SELECT d.kind, count(*), array_agg(d.name ORDER BY d.name DESC) FROM "
        "(SELECT relkind AS kind, relname AS name FROM pg_class "
        " WHERE relnamespace = 2200) AS d GROUP BY d.kind ORDER BY 1",
    )
    assert [(k, n, str(a)) for k, n, a in got] == [
        (
            "v",
            6,
            "{resource_selectors,resource_groups,resource_group_watches,resource_group_rules,"
            "resource_group_queries,resource_group_instances}",
        )
    ]
    assert rows(s, "SELECT relkind, count(*) FROM pg_class GROUP BY 1 ORDER BY 2 DESC LIMIT 1")[0][
        0
    ] == ("r")
    names = [n for (n,) in rows(s, "SELECT nspname FROM pg_namespace ORDER BY 1")]
    assert rows(s, "SELECT nspname FROM pg_namespace ORDER BY 1 LIMIT 1 OFFSET 1") == [(names[1],)]


def test_joins_over_executor_tables_are_managed(engine: resgroups.Engine) -> None:
    s = engine.connect()
    s.execute("CREATE TABLE c AS SELECT x FROM long_sequence(3)")
    # one table with its own qualifiers stays in the executor
    assert rows(s, "SELECT t.x FROM c AS t WHERE t.x > 2") == [(3,)]
    with pytest.raises(resgroups.UndefinedTable, match="missing FROM-clause entry"):
        s.execute("SELECT z.x FROM c")
    s.execute("CREATE TABLE a AS SELECT x FROM long_sequence(3)")
    s.execute("CREATE TABLE b AS SELECT x, x * 10 AS y FROM long_sequence(2)")
    result = s.execute("SELECT a.x, b.y FROM a LEFT JOIN b ON a.x = b.x ORDER BY a.x")
    assert [tuple(r) for r in result.rows] == [(1, 10), (2, 20), (3, None)]
    assert result.group is not None  # the workload's tables: a managed query


def test_row_number_over_partitions(engine: resgroups.Engine) -> None:
    s = engine.connect()
    got = rows(
        s,
        "SELECT relname, row_number() OVER (PARTITION BY attrelid ORDER BY attnum DESC) AS n "
        "FROM pg_attribute a JOIN pg_class c ON a.attrelid = c.oid "
        "WHERE c.relname = 'pg_namespace' ORDER BY n",
    )
    assert got == [
        ("pg_namespace", 1),
        ("pg_namespace", 2),
        ("pg_namespace", 3),
        ("pg_namespace", 4),
    ]
    names = rows(
        s,
        "SELECT attname FROM (SELECT attname, row_number() OVER (ORDER BY attnum DESC) AS n "
        "FROM pg_attribute WHERE attrelid = 2615) AS d WHERE n = 1",
    )
    assert names == [("nspacl",)]  # the last column of pg_namespace


def test_union_and_arrays(engine: resgroups.Engine) -> None:
    s = engine.connect()
    assert rows(s, "SELECT 1 AS a UNION SELECT 1 UNION ALL SELECT 2 ORDER BY 1 DESC") == [
        (2,),
        (1,),
    ]
    assert rows(s, "SELECT 'b', NULL UNION SELECT 'a', NULL ORDER BY 1 LIMIT 1") == [("a", None)]
    with pytest.raises(resgroups.DatatypeMismatch, match="same number of columns"):
        s.execute("SELECT 1 UNION SELECT 1, 2")
    got = rows(
        s,
        "SELECT s, (ARRAY(SELECT nspname FROM pg_namespace ORDER BY 1))[s] "
        "FROM pg_catalog.generate_series(1, 4) s",
    )
    assert got == [(1, "information_schema"), (2, "pg_catalog"), (3, "public"), (4, None)]
    assert rows(s, "SELECT 'd' = ANY ('{a,d}'::text[]), 'x' = ANY ('{a,NULL}'::text[])") == [
        (True, None)
    ]
    assert rows(s, "SELECT string_agg(nspname, ', ') FROM pg_namespace WHERE oid < 3000") == [
        ("pg_catalog, public",)
    ]
    # a subquery's FROM function may read the enclosing row
    assert rows(
        s,
        "SELECT n, (SELECT count(*) FROM generate_series(1, n) g) FROM (SELECT 2 AS n) AS d",
    ) == [(2, 2)]


# ---- joins equal nested loops over Python lists -------------------------------------------

_ROWS = st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=6)


def _relation(data: list[tuple[int, int]]) -> Relation:
    return Relation(("k", "v"), [tuple(r) for r in data], ("int", "int"))


@settings(max_examples=60, deadline=None)
@given(left=_ROWS, right=_ROWS, kind=st.sampled_from(["INNER", "LEFT", "CROSS"]))
def test_joins_equal_a_nested_loop(
    left: list[tuple[int, int]], right: list[tuple[int, int]], kind: str
) -> None:
    tables = {"l": _relation(left), "r": _relation(right)}
    if kind == "CROSS":
        sql = "SELECT l.k, l.v, r.k, r.v FROM l, r WHERE l.v <= r.v"
    else:
        sql = f"SELECT l.k, l.v, r.k, r.v FROM l {kind} JOIN r ON l.k = r.k AND l.v <= r.v"
    select = parse_one(sql)
    assert isinstance(select, ast.Select)
    out = run_query(select, lambda ref, args: tables[ref.name.text], EvalContext())  # type: ignore[union-attr]
    expected: list[tuple[Any, ...]] = []
    for a in left:
        matched = False
        for b in right:
            if (kind == "CROSS" or a[0] == b[0]) and a[1] <= b[1]:
                expected.append((*a, *b))
                matched = True
        if kind == "LEFT" and not matched:
            expected.append((*a, None, None))
    assert out.rows == expected


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT c.relname, CASE c.relkind WHEN 'r' THEN 'table' ELSE 'x' END AS t "
        "FROM pg_catalog.pg_class c LEFT JOIN pg_namespace n ON n.oid = c.relnamespace, pg_am "
        "WHERE c.relname OPERATOR(pg_catalog.~) '^x$' AND n.nspname IS NOT DISTINCT FROM 'a' "
        "AND EXISTS (SELECT 1) GROUP BY 1 ORDER BY 1 LIMIT 2 OFFSET 1",
        "SELECT array_agg(x ORDER BY y DESC), (SELECT 1), ARRAY(SELECT 2) "
        "FROM (SELECT 1 AS x, 2 AS y) AS d",
        "SELECT 'a' LIKE 'b' ESCAPE '/', E'\\n' || 'x'",
        "SELECT row_number() OVER (PARTITION BY a.x ORDER BY a.y DESC) AS n FROM t a",
        "SELECT 1 UNION ALL SELECT 2 UNION SELECT 3 ORDER BY 1 LIMIT 2",
        "SELECT x::int2[], a[1], 'd' = ANY (k) FROM unnest('{1}'::text[]) u, "
        "pg_catalog.generate_series(1, 2) s",
    ],
)
def test_new_forms_round_trip_through_format_sql(sql: str) -> None:
    from resgroups.sql.format import format_sql

    tree = parse_one(sql)
    assert parse_one(format_sql(tree)) == tree
