"""The types of untyped parameters, inferred from their context (sql/param_types.py)."""

from __future__ import annotations

import pytest

from resgroups.sql.expr import Scope
from resgroups.sql.param_types import parameter_types
from resgroups.sql.params import UndefinedParameter
from resgroups.sql.parser import parse_one, placeholders_allowed

COLUMNS = Scope(("x", "ratio", "name", "ok"), ("int", "float", "text", "bool"))
ARGUMENTS = {"long_sequence": ("int",)}

CASES = [
    ("SELECT count(*) FROM long_sequence($1)", {1: "int"}),
    ("SELECT x FROM t WHERE x > $1 AND $2 < ratio", {1: "int", 2: "float"}),
    ("SELECT x * $1, $2 + ratio FROM t", {1: "int", 2: "float"}),
    ("SELECT x FROM t WHERE $1 AND NOT $2 OR ok = $3", {1: "bool", 2: "bool", 3: "bool"}),
    ("SELECT name LIKE $1, $2 ~ 'a', $3 || 'x', lower($4) FROM t",
     {1: "text", 2: "text", 3: "text", 4: "text"}),
    ("SELECT $1::float8, CAST($2 AS bigint), $3::varchar(3)", {1: "float", 2: "int", 3: "text"}),
    ("SELECT x FROM t WHERE x IN ($1, $2) OR $3 IS NULL", {1: "int", 2: "int"}),
    ("SELECT coalesce($1, x), nullif(name, $2) FROM t", {1: "int", 2: "text"}),
    ("SELECT CASE WHEN $1 THEN $2 ELSE ratio END FROM t", {1: "bool", 2: "float"}),
    ("SELECT CASE x WHEN $1 THEN 'one' END FROM t", {1: "int"}),
    ("SELECT x FROM t WHERE x > (SELECT max(x) FROM t WHERE name = $1)", {1: "text"}),
    ("SELECT -$1 + x FROM t", {1: "int"}),
    ("SELECT x FROM t WHERE $1 > x OR $1 = 'a'", {1: "int"}),  # the first context wins
    ("SELECT $1, $2 + $3", {}),  # nothing types them: described as text
    ("CREATE TABLE t2 AS SELECT x FROM t WHERE x < $1", {1: "int"}),
    ("SELECT x FROM t WHERE x > $1 UNION SELECT x FROM t WHERE x < $2", {}),  # columns unknown
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_parameter_types(text: str, expected: dict[int, str]) -> None:
    with placeholders_allowed():
        stmt = parse_one(text)
    assert parameter_types(stmt, COLUMNS.column_type, ARGUMENTS) == expected


def test_a_placeholder_runs_only_bound() -> None:
    with pytest.raises(UndefinedParameter, match=r"there is no parameter \$2") as info:
        parse_one("SELECT 1 +\n  $2")
    assert info.value.sqlstate == "42P02"
    assert "line 2, column 3" in info.value.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT x FROM t LIMIT $1 OFFSET $2", {1: "int", 2: "int"}),
        ("CREATE RESOURCE GROUP g WITH (cpu_weight = $1, memory_limit = $2)",
         {1: "int", 2: "text"}),
        ("ALTER RESOURCE GROUP g SET (max_queued_queries = $2, scheduling_policy = $1)",
         {2: "int", 1: "text"}),
    ],
)  # fmt: skip
def test_placeholders_where_only_a_literal_stands(text: str, expected: dict[int, str]) -> None:
    with placeholders_allowed() as literal_types:
        parse_one(text)
    assert literal_types == expected


def test_a_literal_placeholder_runs_only_bound() -> None:
    with pytest.raises(UndefinedParameter, match=r"there is no parameter \$1"):
        parse_one("SELECT x FROM t LIMIT $1")
    with pytest.raises(UndefinedParameter, match=r"there is no parameter \$3"):
        parse_one("CREATE RESOURCE GROUP g WITH (cpu_weight = $3)")
