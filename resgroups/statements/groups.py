"""Resource group DDL (SPEC §4): each statement validates against the snapshot
and returns the one change record it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.access import find_group
from resgroups.catalog import GroupDef, Snapshot
from resgroups.catalog.model import VARIANT_SEPARATOR, conflicts, variant_name
from resgroups.errors import CatalogError
from resgroups.result import Result
from resgroups.sql import ast
from resgroups.statements.rules import check_not_a_rule_target
from resgroups.statements.selectors import check_not_selected

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


INVALID_NAME = "42602"


def _variant_args(
    snap: Snapshot, base: ast.Ident, variant: ast.Variant, new_id: int, siblings: list[ast.Ident]
) -> dict[str, object]:
    """The record of one new variant of ``base``, after the checks a user gets
    told about: no ``::`` in its name, unique in its base, and an expanded name
    that no other group has."""
    name = variant.name
    if VARIANT_SEPARATOR in name.text:
        raise CatalogError(
            f"variant name {name.text} contains {VARIANT_SEPARATOR!r}, which separates "
            f"a base from its variant ({variant_name(base.text, 'name')})",
            sqlstate=INVALID_NAME,
        )
    if any(conflicts(s.text, s.quoted, name) for s in siblings):
        raise CatalogError(
            f"variant {name.text} of resource group {base.text} already exists",
            sqlstate=CatalogError.DUPLICATE,
        )
    full = ast.Ident(variant_name(base.text, name.text), base.quoted or name.quoted)
    taken = snap.group_name_taken(full)
    if taken is not None:
        raise CatalogError(
            f"variant {name.text} of resource group {base.text} would be named {full.text}, "
            f"which collides with the existing resource group {taken.name}",
            sqlstate=CatalogError.DUPLICATE,
        )
    return {
        "id": new_id,
        "name": name.text,
        "quoted": name.quoted,
        "params": dict(variant.params),
    }


def create_resource_group(session: Session, stmt: ast.CreateResourceGroup) -> Result:
    def build(snap: Snapshot) -> Change:
        taken = snap.group_name_taken(stmt.name)
        if taken is not None:
            if stmt.if_not_exists:
                return None
            raise _duplicate(stmt.name, taken.name)
        variants: list[dict[str, object]] = []
        for i, variant in enumerate(stmt.variants):
            siblings = [v.name for v in stmt.variants[:i]]
            new_id = snap.next_id + 1 + i
            variants.append(_variant_args(snap, stmt.name, variant, new_id, siblings))
        args: dict[str, object] = {
            "id": snap.next_id,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "params": dict(stmt.params),
        }
        if variants:
            args["variants"] = variants
        return "create_group", args

    session.engine.write_catalog(build)
    return Result.command("CREATE RESOURCE GROUP")


def _base(snap: Snapshot, ref: ast.Ident) -> GroupDef:
    """The group an ADD or DROP VARIANT names: neither DEFAULT nor a variant."""
    group = find_group(snap, ref)
    if group.is_default or group.is_variant:
        what = "the built-in group" if group.is_default else "a variant"
        raise CatalogError(
            f"resource group {group.name} is {what} and cannot have variants",
            sqlstate=CatalogError.FORBIDDEN,
        )
    return group


def add_variant(session: Session, stmt: ast.AddVariant) -> Result:
    def build(snap: Snapshot) -> Change:
        base = _base(snap, stmt.group)
        if not base.is_base:  # its first variant: it stops being a runtime group
            granted = sorted(snap.use_grants.left_of(base.id))
            holders = snap.mapped_to(base.id) + [snap.principals[i] for i in granted]
            if holders:
                names = ",".join(dict.fromkeys(p.name for p in holders))
                raise CatalogError(
                    f"resource group {base.name} is mapped to or granted to [entity={names}], "
                    "and with variants it would no longer be a group queries run in; "
                    "unset the mappings and revoke USE first",
                    sqlstate=CatalogError.FORBIDDEN,
                )
            selected = snap.selectors_to(base.id)
            if selected:
                names = ",".join(r.name for r in selected)
                raise CatalogError(
                    f"resource group {base.name} is the target of resource selectors "
                    f"[selector={names}], and with variants it would no longer be a group "
                    "queries run in; drop the selectors first",
                    sqlstate=CatalogError.FORBIDDEN,
                )
            ruled = snap.rules_of(base.id) + snap.rules_moving_to(base.id)
            if ruled:
                names = ",".join(r.name for r in ruled)
                raise CatalogError(
                    f"resource group {base.name} is named by resource rules [rule={names}], "
                    "and with variants it would no longer be a group queries run in; "
                    "drop the rules first",
                    sqlstate=CatalogError.FORBIDDEN,
                )
        siblings = [v.variant for v in snap.variants_of(base) if v.variant is not None]
        name = ast.Ident(base.name, base.quoted)
        args = _variant_args(snap, name, stmt.variant, snap.next_id, siblings)
        return "add_variant", {**args, "base": base.id}

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE GROUP")


def drop_variant(session: Session, stmt: ast.DropVariant) -> Result:
    def build(snap: Snapshot) -> Change:
        base = _base(snap, stmt.group)
        variant = snap.find_variant(base, stmt.name)
        if variant is None:
            if stmt.if_exists:
                return None
            own = [v.variant.text for v in snap.variants_of(base) if v.variant is not None]
            raise CatalogError(
                f"resource group {base.name} has no variant {stmt.name.text}"
                + (f"; its variants: {', '.join(own)}" if own else "; it has none"),
                sqlstate=CatalogError.UNDEFINED,
            )
        _check_unmapped(snap, variant)
        check_not_a_rule_target(snap, {variant.id}, variant.name)
        check_not_selected(snap, {variant.id}, variant.name)
        return "drop_group", {"id": variant.id}

    session.engine.write_catalog(build)
    return Result.command("ALTER RESOURCE GROUP")


def _check_unmapped(snap: Snapshot, group: GroupDef) -> None:
    mapped = [p for g in (group, *snap.variants_of(group)) for p in snap.mapped_to(g.id)]
    if mapped:
        entities = ",".join(p.name for p in mapped)
        raise CatalogError(
            f"Resource Group is assigned to an ACL entity [entity={entities}]; "
            f"unset the mapping before dropping {group.name}",
            sqlstate=CatalogError.FORBIDDEN,
        )


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
        if group.is_variant:
            raise CatalogError(
                f"resource group {group.name} is a variant: its name follows its base's; "
                "DROP VARIANT and ADD VARIANT to give it another",
                sqlstate=CatalogError.FORBIDDEN,
            )
        taken = snap.group_name_taken(stmt.new_name)
        if taken is not None and taken.id != group.id:
            raise _duplicate(stmt.new_name, taken.name)
        for variant in snap.variants_of(group):
            assert variant.variant is not None
            own = variant.variant
            full = ast.Ident(
                variant_name(stmt.new_name.text, own.text), stmt.new_name.quoted or own.quoted
            )
            taken = snap.group_name_taken(full)
            if taken is not None and taken.id not in (group.id, *group.variants):
                raise CatalogError(
                    f"renaming {group.name} to {stmt.new_name.text} would name its variant "
                    f"{own.text} {full.text}, which collides with the existing resource "
                    f"group {taken.name}",
                    sqlstate=CatalogError.DUPLICATE,
                )
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
        _check_unmapped(snap, group)
        family = {group.id, *group.variants}
        check_not_a_rule_target(snap, family, group.name)
        check_not_selected(snap, family, group.name)
        return "drop_group", {"id": group.id}

    session.engine.write_catalog(build)
    return Result.command("DROP RESOURCE GROUP")
