"""Every SQL statement of the reference document parses verbatim and takes effect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import resgroups
from resgroups.sql import ast
from resgroups.sql.parser import parse_one

HERE = Path(__file__).resolve().parent
STATEMENTS = [
    block.strip()
    for block in re.split(r"\n\s*\n", (HERE / "seed_statements.sql").read_text())
    if block.strip() and not block.lstrip().startswith("--")
]
SEED = HERE.parent.parent / "shared" / "seeds" / "questdb-resource-groups.txt"

# what each parameter shows as in resource_groups(), with the typed value's display
SHOWN = {
    "cpu_weight": ("cpu_weight", lambda v: v),
    "max_active_queries": ("max_active_queries", lambda v: v),
    "max_queued_queries": ("max_queued_queries", lambda v: v),
    "queue_timeout": ("queue_timeout_millis", lambda v: v),
    "memory_limit": ("memory_limit_bytes", lambda v: v),
    "cpu_limit": ("cpu_limit_pct", lambda v: None if v is None else v / 100),
    "scheduling_policy": ("scheduling_policy", lambda v: v),
}


def test_the_statement_file_holds_the_seed_statements() -> None:
    assert len(STATEMENTS) == 14
    if not SEED.exists():
        pytest.skip(
            f"{SEED} is missing: this check compares tests/seed_statements.sql with the "
            "seed document, which lives in the project's shared/ folder beside the "
            "checkout; copy shared/ beside the repository to run it (the statements "
            "themselves are tested by the other tests of this file)"
        )
    seed = SEED.read_text()
    for statement in STATEMENTS:
        assert statement in seed


def _prepare(session: resgroups.Session, stmt: ast.Statement) -> None:
    """Create the principals and groups the statement refers to (not the one it creates)."""
    session.execute_script(
        "CREATE USER analyst; CREATE GROUP analysts; CREATE GROUP oncall;"
        "CREATE SERVICE ACCOUNT ingest_bot; CREATE USER member;"
        "ADD USER member TO analysts;"
    )
    created = stmt.name.text if isinstance(stmt, ast.CreateResourceGroup) else None
    for group in ("reporting", "adhoc", "dashboards", "alerts"):
        if group != created:
            session.execute(f"CREATE RESOURCE GROUP {group}")


def _group_of(engine: resgroups.Engine, user: str) -> str:
    rows = engine.connect(user).execute("SELECT current_resource_group()").rows
    return str(rows[0][0])


@pytest.mark.parametrize("sql", STATEMENTS)
def test_seed_statement_parses_and_takes_effect(sql: str) -> None:
    stmt = parse_one(sql)
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        _prepare(admin, stmt)
        version = engine.catalog_version
        result = admin.execute(sql)
        records = 0 if isinstance(stmt, ast.SetResourceGroup) else 1
        assert engine.catalog_version == version + records  # one record per DDL
        match stmt:
            case ast.CreateResourceGroup(name=name, params=params):
                assert result.status == "CREATE RESOURCE GROUP"
                row = next(r for r in engine.resource_groups() if r["name"] == name.text)
                assert params
                for param, value in params:
                    column, shown = SHOWN[param]
                    assert row[column] == shown(value), (param, row)
            case ast.SetMapping(kind=ast.PrincipalKind.USER, name=name, group=group):
                assert group is not None
                assert _group_of(engine, name.text) == group.text
            case ast.SetMapping(kind=ast.PrincipalKind.SERVICE_ACCOUNT, name=name, group=group):
                assert group is not None
                assert _group_of(engine, name.text) == group.text
            case ast.SetMapping(kind=ast.PrincipalKind.GROUP, name=name, group=group):
                assert group is not None
                admin.execute(f"ADD USER analyst TO {name.text}")
                assert _group_of(engine, "analyst") == group.text
                shown = admin.execute("SHOW GROUPS").rows
                assert (name.text, None, group.text, stmt.priority) in shown
            case ast.SetResourceGroup(group=group):
                assert result.status == "SET"
                current = admin.execute("SELECT current_resource_group()").rows
                assert current == [(group.text,)]
            case _:
                pytest.fail(f"no effect check for {type(stmt).__name__}")
