"""Facts of a statement's tree kept per statement object (statements/dispatch.py)."""

from __future__ import annotations

import gc
import weakref

from resgroups.sql import ast
from resgroups.sql.memo import PerStatement
from resgroups.sql.parser import parse_one


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
