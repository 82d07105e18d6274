"""Selector DDL (SPEC §15): each statement validates against the snapshot and
returns the one change record it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.access import find_runtime_group
from resgroups.catalog import Snapshot
from resgroups.catalog.model import SelectorDef
from resgroups.errors import CatalogError
from resgroups.result import Result
from resgroups.sql import ast
from resgroups.statements.named import duplicate, renamed, undefined

if TYPE_CHECKING:
    from resgroups.session import Session

Change = tuple[str, dict[str, object]] | None


def _duplicate(name: ast.Ident, existing: SelectorDef) -> CatalogError:
    return duplicate("resource selector", name, existing.name)


def find_selector(snap: Snapshot, ref: ast.Ident) -> SelectorDef:
    """The selector ``ref`` names, or CatalogError 42704 with a suggestion."""
    found = snap.find_selector(ref)
    if found is None:
        raise undefined("resource selector", ref, (r.name for r in snap.all_selectors))
    return found


def create_resource_selector(session: Session, stmt: ast.CreateResourceSelector) -> Result:
    def build(snap: Snapshot) -> Change:
        taken = snap.selector_name_taken(stmt.name)
        if taken is not None:
            if stmt.if_not_exists:
                return None
            raise _duplicate(stmt.name, taken)
        group = find_runtime_group(snap, stmt.group)
        return "create_selector", {
            "id": snap.next_id,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "conditions": [list(c) for c in stmt.conditions],
            "group": group.id,
            "priority": stmt.priority,
        }

    session.engine.write_catalog(build)
    return Result.command("CREATE RESOURCE SELECTOR")


def rename_resource_selector(session: Session, stmt: ast.RenameResourceSelector) -> Result:
    def build(snap: Snapshot) -> Change:
        found, taken = find_selector(snap, stmt.name), snap.selector_name_taken(stmt.new_name)
        return renamed("rename_selector", "resource selector", found, stmt.new_name, taken)

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE SELECTOR")


def drop_resource_selector(session: Session, stmt: ast.DropResourceSelector) -> Result:
    def build(snap: Snapshot) -> Change:
        if stmt.if_exists and snap.find_selector(stmt.name) is None:
            return None
        return "drop_selector", {"id": find_selector(snap, stmt.name).id}

    session.engine.write_catalog(build)
    return Result.command("DROP RESOURCE SELECTOR")


def check_not_selected(snap: Snapshot, group_ids: set[int], dropping: str) -> None:
    """DROP of a group a selector routes queries to is refused (42809), as for a mapping."""
    selectors = [s for gid in sorted(group_ids) for s in snap.selectors_to(gid)]
    if selectors:
        names = ",".join(s.name for s in selectors)
        raise CatalogError(
            f"Resource Group is the target of a resource selector [selector={names}]; "
            f"drop the selector before dropping {dropping}",
            sqlstate=CatalogError.FORBIDDEN,
        )
