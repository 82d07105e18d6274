"""Runaway-query rule DDL (SPEC §16): each statement validates against the
snapshot and returns the one change record it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.access import find_runtime_group
from resgroups.catalog import Snapshot
from resgroups.catalog.model import RuleDef
from resgroups.catalog.rules import MOVE
from resgroups.errors import CatalogError
from resgroups.result import Result
from resgroups.sql import ast
from resgroups.statements.named import duplicate, renamed, undefined

if TYPE_CHECKING:
    from resgroups.session import Session

Change = tuple[str, dict[str, object]] | None


def _duplicate(name: ast.Ident, existing: RuleDef) -> CatalogError:
    return duplicate("resource rule", name, existing.name)


def find_rule(snap: Snapshot, ref: ast.Ident) -> RuleDef:
    """The rule ``ref`` names, or CatalogError 42704 with a suggestion."""
    found = snap.find_rule(ref)
    if found is None:
        raise undefined("resource rule", ref, (r.name for r in snap.all_rules))
    return found


def create_resource_rule(session: Session, stmt: ast.CreateResourceRule) -> Result:
    def build(snap: Snapshot) -> Change:
        taken = snap.rule_name_taken(stmt.name)
        if taken is not None:
            if stmt.if_not_exists:
                return None
            raise _duplicate(stmt.name, taken)
        group = find_runtime_group(snap, stmt.group)
        args: dict[str, object] = {
            "id": snap.next_id,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "group": group.id,
            "conditions": [[metric, value] for metric, value in stmt.conditions],
            "action": stmt.action,
            "watch": stmt.watch_ms,
        }
        if stmt.action == MOVE:
            assert stmt.target is not None
            target = find_runtime_group(snap, stmt.target)
            if target.id == group.id:
                raise CatalogError(
                    f"resource rule {stmt.name.text} would move queries of {group.name} "
                    "to the group they are in; name another group",
                    sqlstate=CatalogError.FORBIDDEN,
                )
            args["target"] = target.id
        return "create_rule", args

    session.engine.write_catalog(build)
    return Result.command("CREATE RESOURCE RULE")


def rename_resource_rule(session: Session, stmt: ast.RenameResourceRule) -> Result:
    def build(snap: Snapshot) -> Change:
        found, taken = find_rule(snap, stmt.name), snap.rule_name_taken(stmt.new_name)
        return renamed("rename_rule", "resource rule", found, stmt.new_name, taken)

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE RULE")


def drop_resource_rule(session: Session, stmt: ast.DropResourceRule) -> Result:
    def build(snap: Snapshot) -> Change:
        if stmt.if_exists and snap.find_rule(stmt.name) is None:
            return None
        return "drop_rule", {"id": find_rule(snap, stmt.name).id}

    session.engine.write_catalog(build)
    return Result.command("DROP RESOURCE RULE")


def check_not_a_rule_target(snap: Snapshot, group_ids: set[int], dropping: str) -> None:
    """DROP of a group another group's rule moves queries to is refused (42809)."""
    rules = [
        r
        for gid in sorted(group_ids)
        for r in snap.rules_moving_to(gid)
        if r.group_id not in group_ids
    ]
    if rules:
        names = ",".join(r.name for r in rules)
        raise CatalogError(
            f"Resource Group is the target of a resource rule [rule={names}]; "
            f"drop the rule before dropping {dropping}",
            sqlstate=CatalogError.FORBIDDEN,
        )
