"""Facts of a statement's tree kept per statement object (statements/dispatch.py)."""

from __future__ import annotations

import gc
import weakref

import pytest

import resgroups
from resgroups.sql import ast
from resgroups.sql.memo import PerStatement, remember_bound
from resgroups.sql.params import binder
from resgroups.sql.parser import parse_one, placeholders_allowed
from resgroups.statements import dispatch


def test_a_fact_is_walked_once_per_statement_and_again_for_another() -> None:
    walks: list[ast.Statement] = []

    def walk(stmt: ast.Statement) -> str:
        walks.append(stmt)
        return type(stmt).__name__

    facts = PerStatement(walk)
    first, second = parse_one("SELECT 1"), parse_one("SELECT 1")
    assert [facts(first), facts(first), facts(second)] == ["Select"] * 3
    assert walks == [first, second]  # equal statements, two objects: two walks


def test_a_statement_is_not_kept_alive_and_a_reused_id_is_not_mistaken() -> None:
    facts = PerStatement(lambda stmt: stmt.items[0].expr.value)
    stmt = parse_one("SELECT 1")
    assert facts(stmt) == 1
    ref = weakref.ref(stmt)
    del stmt
    gc.collect()
    assert ref() is None  # the cache held it weakly
    assert not facts._seen  # and forgot it when it died
    for n in range(200):  # new objects, some at the address of an old one
        assert facts(parse_one(f"SELECT {n}")) == n


def test_the_facts_kept_are_bounded() -> None:
    facts = PerStatement(lambda stmt: 0, size=8)
    kept = [parse_one(f"SELECT {n}") for n in range(50)]
    for stmt in kept:
        facts(stmt)
        assert len(facts._seen) <= 8


def test_a_fact_no_value_changes_is_read_off_the_template() -> None:
    """A tree bound from a statement parsed with its placeholders (the wire's
    Bind) takes the template's fact when no value can change it, and is
    walked itself otherwise (a table function's argument bound to a value)."""
    with placeholders_allowed():
        template = parse_one("SELECT x + $1 FROM long_sequence($2) WHERE x > 1")
    made = binder(template)
    assert made is not None
    tree = made([5, 3])
    remember_bound(tree, template)
    walked: list[object] = []

    def walk(stmt: object) -> int:
        walked.append(stmt)
        return len(walked)

    always = PerStatement(walk, same_when_bound=lambda fact: True)
    assert always(tree) == always(template) == 1
    assert walked == [template]
    walked.clear()
    never = PerStatement(walk, same_when_bound=lambda fact: False)
    assert never(tree) == 2  # the template's, then the tree's own walk
    assert walked == [template, tree]
    # the sources hold the bound argument, not the placeholder
    (source,) = dispatch._sources(tree)
    assert source.args == (ast.Literal(3),)
    assert dispatch._needs_rows(tree) is dispatch._needs_rows(template) is False


def test_a_constant_select_is_folded_once_and_what_depends_on_the_session_is_not() -> None:
    for text in (
        "SELECT 1",
        "SELECT 7::bigint + 2 * 3 AS n, 'a' = 'a', 1.5::text, NOT true WHERE 1 < 2",
        "SELECT (9223372036854775807)::float, -(-3)",
    ):
        folded = dispatch._folded(parse_one(text))
        assert folded is not None, text
    for text in (
        "SELECT current_user",  # the session's
        "SELECT now()",  # the statement's time
        "SELECT '2026-01-01 00:00'::timestamptz",  # read in the session's TimeZone
        "SELECT 'pg_class'::regclass",  # the catalog's
        "SELECT (SELECT 1)",
        "SELECT 1 / 0",  # raises: raised at every execution
        "SELECT x FROM long_sequence(2)",
    ):
        assert dispatch._folded(parse_one(text)) is None, text
    with resgroups.Engine() as engine:
        session = engine.connect()
        stmt = parse_one("SELECT 1 + 1 AS two, 'x' = 'y'")
        first, second = session.run(stmt), session.run(stmt)
        assert dispatch._folded(stmt) is not None
        assert first.rows == second.rows == [(2, False)]
        assert first.rows is not second.rows  # a caller may change its own list
        assert first.columns == ["two", "?column?"]
        rows = [r for r in engine.resource_groups() if r["name"] == "DEFAULT"]
        assert rows[0]["admitted_total"] == 2  # each execution is still a managed query
        for _ in range(2):
            with pytest.raises(resgroups.DivisionByZero):
                session.execute("SELECT 1 / 0")
