"""Resource group DDL (SPEC §4): each statement validates against the snapshot
and returns the one change record it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.access import find_group
from resgroups.catalog import Snapshot
from resgroups.errors import CatalogError
from resgroups.result import Result
from resgroups.sql import ast

if TYPE_CHECKING:
    from resgroups.session import Session

Change = tuple[str, dict[str, object]] | None


def _duplicate(name: ast.Ident, existing: str) -> CatalogError:
    detail = " (the built-in group)" if existing.casefold() == "default" else ""
    shown = f" as {existing}" if existing != name.text else ""
    return CatalogError(
        f"resource group {name.text} already exists{shown}{detail}",
        sqlstate=CatalogError.DUPLICATE,
    )


def create_resource_group(session: Session, stmt: ast.CreateResourceGroup) -> Result:
    def build(snap: Snapshot) -> Change:
        taken = snap.group_name_taken(stmt.name)
        if taken is not None:
            if stmt.if_not_exists:
                return None
            raise _duplicate(stmt.name, taken.name)
        return "create_group", {
            "id": snap.next_id,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "params": dict(stmt.params),
        }

    session.engine.write_catalog(build)
    return Result.command("CREATE RESOURCE GROUP")


def alter_resource_group_set(session: Session, stmt: ast.AlterResourceGroupSet) -> Result:
    def build(snap: Snapshot) -> Change:
        group = find_group(snap, stmt.name)
        return "alter_group", {"id": group.id, "set": dict(stmt.params), "reset": []}

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE GROUP")


def alter_resource_group_reset(session: Session, stmt: ast.AlterResourceGroupReset) -> Result:
    def build(snap: Snapshot) -> Change:
        group = find_group(snap, stmt.name)
        return "alter_group", {"id": group.id, "set": {}, "reset": list(stmt.params)}

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE GROUP")


def rename_resource_group(session: Session, stmt: ast.RenameResourceGroup) -> Result:
    def build(snap: Snapshot) -> Change:
        group = find_group(snap, stmt.name)
        if group.is_default:
            raise CatalogError(
                "built-in Resource Group cannot be renamed [name=DEFAULT]",
                sqlstate=CatalogError.FORBIDDEN,
            )
        taken = snap.group_name_taken(stmt.new_name)
        if taken is not None and taken.id != group.id:
            raise _duplicate(stmt.new_name, taken.name)
        return "rename_group", {
            "id": group.id,
            "name": stmt.new_name.text,
            "quoted": stmt.new_name.quoted,
        }

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE GROUP")


def drop_resource_group(session: Session, stmt: ast.DropResourceGroup) -> Result:
    def build(snap: Snapshot) -> Change:
        if stmt.if_exists and snap.find_group(stmt.name) is None:
            return None
        group = find_group(snap, stmt.name)
        if group.is_default:
            raise CatalogError(
                "built-in Resource Group cannot be dropped [name=DEFAULT]",
                sqlstate=CatalogError.FORBIDDEN,
            )
        mapped = snap.mapped_to(group.id)
        if mapped:
            entities = ",".join(p.name for p in mapped)
            raise CatalogError(
                f"Resource Group is assigned to an ACL entity [entity={entities}]; "
                f"unset the mapping before dropping {group.name}",
                sqlstate=CatalogError.FORBIDDEN,
            )
        return "drop_group", {"id": group.id}

    session.engine.write_catalog(build)
    return Result.command("DROP RESOURCE GROUP")
