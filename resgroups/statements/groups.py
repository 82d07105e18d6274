"""Resource group DDL (SPEC §4): each statement validates against the snapshot
and returns the one change record it makes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.access import find_group
from resgroups.catalog import GroupDef, Snapshot
from resgroups.catalog.model import MAX_TREE_DEPTH, VARIANT_SEPARATOR, conflicts, variant_name
from resgroups.catalog.params import parent_reference
from resgroups.errors import CatalogError, did_you_mean
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
        params = _with_parent_id(snap, None, stmt.name, dict(stmt.params), bool(variants))
        args: dict[str, object] = {
            "id": snap.next_id,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "params": params,
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


def _check_may_stop_running(snap: Snapshot, group: GroupDef, becoming: str) -> None:
    """A group that gains variants or a first child stops being one queries start
    in: refused (42809) while a mapping, a grant, a selector or a rule names it."""
    granted = sorted(snap.use_grants.left_of(group.id))
    holders = snap.mapped_to(group.id) + [snap.principals[i] for i in granted]
    if holders:
        names = ",".join(dict.fromkeys(p.name for p in holders))
        raise CatalogError(
            f"resource group {group.name} is mapped to or granted to [entity={names}], "
            f"and {becoming} it would no longer be a group queries run in; "
            "unset the mappings and revoke USE first",
            sqlstate=CatalogError.FORBIDDEN,
        )
    selected = snap.selectors_to(group.id)
    if selected:
        names = ",".join(r.name for r in selected)
        raise CatalogError(
            f"resource group {group.name} is the target of resource selectors "
            f"[selector={names}], and {becoming} it would no longer be a group "
            "queries run in; drop the selectors first",
            sqlstate=CatalogError.FORBIDDEN,
        )
    ruled = snap.rules_of(group.id) + snap.rules_moving_to(group.id)
    if ruled:
        names = ",".join(r.name for r in ruled)
        raise CatalogError(
            f"resource group {group.name} is named by resource rules [rule={names}], "
            f"and {becoming} it would no longer be a group queries run in; "
            "drop the rules first",
            sqlstate=CatalogError.FORBIDDEN,
        )


def _path_text(snap: Snapshot, group: GroupDef) -> str:
    return " > ".join(g.name for g in snap.path(group))


def _with_parent_id(
    snap: Snapshot,
    group: GroupDef | None,
    name: ast.Ident,
    params: dict[str, object],
    has_variants: bool = False,
) -> dict[str, object]:
    """``params`` with ``parent``'s name resolved to the parent's id, after the
    refusals of SPEC §14 (``group`` None: the group is being created)."""
    parent_name = params.get("parent")
    if parent_name is None:
        return params
    assert isinstance(parent_name, str)
    parent_name, quoted = parent_reference(parent_name)
    parent = snap.find_group(ast.Ident(parent_name, quoted))
    if parent is None:
        raise CatalogError(
            f"resource group {parent_name} named as the parent of {name.text} does not exist."
            + did_you_mean(parent_name, snap.group_names()),
            sqlstate=CatalogError.UNDEFINED,
        )
    if group is not None and group.is_default:
        raise CatalogError(
            "built-in Resource Group cannot have a parent [name=DEFAULT]",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if parent.is_default:
        raise CatalogError(
            f"built-in Resource Group cannot be a parent [name=DEFAULT]; {name.text} "
            "stays at the top level unless another group is named",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if has_variants or (group is not None and (group.is_base or group.is_variant)):
        what = "a variant" if group is not None and group.is_variant else "a base with variants"
        raise CatalogError(
            f"resource group {name.text} is {what}, which cannot be nested in a parent",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if parent.is_base or parent.is_variant:
        what = "a variant" if parent.is_variant else "a base with variants"
        raise CatalogError(
            f"resource group {parent.name} is {what}, which cannot be a parent",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if group is not None and parent.id == group.id:
        raise CatalogError(
            f"resource group {group.name} cannot be its own parent",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if group is not None and snap.would_cycle(group.id, parent.id):
        raise CatalogError(
            f"resource group {parent.name} is nested in {group.name} "
            f"({_path_text(snap, parent)}): making it {group.name}'s parent would be a cycle",
            sqlstate=CatalogError.FORBIDDEN,
        )
    levels = len(snap.path(parent)) + (snap.height(group.id) if group is not None else 1)
    if levels > MAX_TREE_DEPTH:
        raise CatalogError(
            f"nesting {name.text} in {parent.name} ({_path_text(snap, parent)}) would make "
            f"a path of {levels} levels; at most {MAX_TREE_DEPTH} are allowed",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if not snap.is_inner(parent.id):
        _check_may_stop_running(snap, parent, "with children")
    return {**params, "parent": parent.id}


def add_variant(session: Session, stmt: ast.AddVariant) -> Result:
    def build(snap: Snapshot) -> Change:
        base = _base(snap, stmt.group)
        if base.parent_id is not None or snap.is_inner(base.id):
            raise CatalogError(
                f"resource group {base.name} is in a tree of groups "
                f"({_path_text(snap, base)}), and a base with variants cannot be: "
                "variants and nesting are two ways to split one share; use one",
                sqlstate=CatalogError.FORBIDDEN,
            )
        if not base.is_base:  # its first variant: it stops being a runtime group
            _check_may_stop_running(snap, base, "with variants")
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
        params = _with_parent_id(snap, group, stmt.name, dict(stmt.params))
        return "alter_group", {"id": group.id, "set": params, "reset": []}

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
        children = snap.children_of(group.id)
        if children:
            names = ",".join(c.name for c in children)
            raise CatalogError(
                f"resource group {group.name} has children [group={names}]; drop them "
                f"or move them (ALTER RESOURCE GROUP ... SET (parent = ...) or RESET "
                f"(parent)) before dropping {group.name}",
                sqlstate=CatalogError.FORBIDDEN,
            )
        family = {group.id, *group.variants}
        check_not_a_rule_target(snap, family, group.name)
        check_not_selected(snap, family, group.name)
        return "drop_group", {"id": group.id}

    session.engine.write_catalog(build)
    return Result.command("DROP RESOURCE GROUP")
