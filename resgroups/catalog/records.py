"""Change records: the catalog log's unit, and how each one changes a snapshot.

A record is ``{"v": version, "op": name, ...arguments}`` encoded as compact
JSON. Every DDL statement that changes the catalog becomes exactly one
record; ``apply`` is a pure function from (snapshot, record) to the next
snapshot, so replaying the log from version 1 rebuilds the same snapshot.
Records carry ids, never names, for everything they refer to.

``apply`` trusts nothing: a record is validated as the DDL that writes it is
(types, ranges, names, references), and one that fails raises
:class:`CatalogError` XX001 (the statements validate first and report user
errors; a failure here is a bug, or a log from elsewhere).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, TypeGuard, TypeVar

from resgroups.auth import is_md5_verifier, is_password_hash
from resgroups.catalog.model import (
    DEFAULT_GROUP_ID,
    MAX_TREE_DEPTH,
    VARIANT_SEPARATOR,
    GroupDef,
    Principal,
    RuleDef,
    SelectorDef,
    Snapshot,
    variant_name,
)
from resgroups.catalog.names import Ident, PrincipalKind, name_problem
from resgroups.catalog.params import INT32_MAX, INT64_MAX, PARAMETERS, ParamValue
from resgroups.catalog.rules import ACTIONS, KILL, MOVE, conditions_problem
from resgroups.catalog.selectors import conditions_problem as selector_problem
from resgroups.errors import CatalogError

LOG_FORMAT: Final = 1
CORRUPT: Final = "XX001"  # data_corrupted: a log this version cannot apply


@dataclass(frozen=True)
class Record:
    version: int
    op: str
    args: Mapping[str, Any]

    def encode(self) -> bytes:
        body = {"v": self.version, "op": self.op, **self.args}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def decode(cls, payload: bytes) -> Record:
        body = load_json(payload)
        if not isinstance(body, dict) or not isinstance(body.get("v"), int):
            raise ValueError("not a catalog record")
        version, op = body.pop("v"), body.pop("op", None)
        if not isinstance(op, str):
            raise ValueError("catalog record without an operation")
        return cls(version, op, body)


def load_json(document: bytes | str) -> Any:
    """A record's JSON, decoded; ValueError for anything that is not JSON it can
    take: bad UTF-8 or syntax, and what a pathological document costs the decoder
    (100,000 nested arrays: RecursionError; a huge one: MemoryError)."""
    try:
        return json.loads(document)
    except (RecursionError, MemoryError) as exc:
        raise ValueError(
            f"it is nested or sized beyond what can be decoded ({type(exc).__name__})"
        ) from None


class _Invalid(ValueError):
    """A record that SQL could not have written: refused, never applied."""


def _int(a: Mapping[str, Any], key: str, low: int = 0, high: int = INT64_MAX) -> int:
    value = a[key]
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _Invalid(f"{key} = {value!r}: expected an integer {low}..{high}")
    return value


def _flag(a: Mapping[str, Any], key: str) -> bool:
    value = a[key]
    if not isinstance(value, bool):
        raise _Invalid(f"{key} = {value!r}: expected true or false")
    return value


def _name(a: Mapping[str, Any]) -> tuple[str, bool]:
    problem = name_problem(a["name"], a["quoted"])
    if problem is not None:
        raise _Invalid(problem)
    return a["name"], a["quoted"]


def _params(a: Mapping[str, Any], key: str) -> dict[str, ParamValue]:
    params = a[key]
    if not isinstance(params, dict):
        raise _Invalid(f"{key} = {params!r}: expected an object of parameters")
    for name, value in params.items():
        param = PARAMETERS.get(name)
        if param is None:
            raise _Invalid(f"unknown resource group parameter {name!r}")
        if not param.valid(value):
            raise _Invalid(f"invalid value {value!r} for {name}")
    return dict(params)


def _is_id(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _group(snap: Snapshot, group_id: object) -> GroupDef:
    group = snap.group(group_id) if _is_id(group_id) else None
    if group is None:
        raise _Invalid(f"refers to missing resource group id {group_id!r}")
    return group


def _runtime_group(snap: Snapshot, group_id: object) -> GroupDef:
    group = _group(snap, group_id)
    if group.is_base:
        raise _Invalid(f"{group.name} has variants: only runtime groups are mapped or granted")
    if snap.is_inner(group.id):
        raise _Invalid(f"{group.name} has children: queries do not start in an inner group")
    return group


def _check_parent(snap: Snapshot, group: GroupDef) -> None:
    """Can ``group`` (as it is about to be) sit under its parent (SPEC §14)?"""
    parent_id = group.parent_id
    if parent_id is None:
        return
    parent = _group(snap, parent_id)
    if group.is_default or group.is_base or group.is_variant:
        raise _Invalid(f"{group.name} cannot have a parent: DEFAULT, a base or a variant")
    if parent.is_default or parent.is_base or parent.is_variant:
        raise _Invalid(f"{parent.name} cannot be a parent: DEFAULT, a base or a variant")
    if snap.would_cycle(group.id, parent_id):
        raise _Invalid(f"nesting {group.name} in {parent.name} makes a cycle")
    if len(snap.path(parent)) + snap.height(group.id) > MAX_TREE_DEPTH:
        raise _Invalid(f"nesting {group.name} in {parent.name}: deeper than {MAX_TREE_DEPTH}")
    if not snap.is_inner(parent_id) and (
        snap.mapped_to(parent_id)
        or snap.use_grants.left_of(parent_id)
        or snap.selectors_to(parent_id)
        or snap.rules_of(parent_id)
        or snap.rules_moving_to(parent_id)
    ):
        raise _Invalid(f"{parent.name} is mapped, granted, selected or ruled: not a parent")


def _principal(snap: Snapshot, principal_id: object, *kinds: PrincipalKind) -> Principal:
    principal = snap.principal(principal_id) if _is_id(principal_id) else None
    if principal is None:
        raise _Invalid(f"refers to missing principal id {principal_id!r}")
    if kinds and principal.kind not in kinds:
        allowed = " or ".join(k.value for k in kinds)
        raise _Invalid(f"principal {principal.name} is a {principal.kind.value}, not a {allowed}")
    return principal


def group_uid(version: int, group_id: int, name: str) -> str:
    """A group's fleet identity, from the record that creates it: its id, the
    version of that record and the name it was created with (``1@2:capped``).
    Every process replaying one log derives the same; a DROP and CREATE of the
    name gives a new one (a new id at a new version); RENAME keeps it. Engines
    with separate catalogs that ran the same DDL in the same order agree too."""
    return f"{group_id}@{version}:{name}"


def _uid(snap: Snapshot, a: Mapping[str, Any], group_id: int, name: str) -> str:
    uid = a.get("uid")
    if uid is None:  # records before the field: derived the same way
        return group_uid(snap.version + 1, group_id, name)
    if not isinstance(uid, str) or not uid:
        raise _Invalid(f"uid = {uid!r}: expected a non-empty string")
    return uid


def _new_id(snap: Snapshot, a: Mapping[str, Any]) -> int:
    if a["id"] != snap.next_id or isinstance(a["id"], bool):
        raise _Invalid(f"assigns id {a['id']!r}, expected {snap.next_id}")
    return snap.next_id


# ---- the operations ---------------------------------------------------------


def _genesis(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    if snap.version != 0:
        raise _Invalid("genesis record after the start of the log")
    if a.get("format") != LOG_FORMAT:
        raise _Invalid(f"catalog log format {a.get('format')!r} is not {LOG_FORMAT}")
    uid = a.get("catalog", "")
    if not isinstance(uid, str):
        raise _Invalid(f"catalog = {uid!r}: expected a string")
    return snap.evolve(catalog_uid=uid)


def _create_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    group_id = _new_id(snap, a)
    name, quoted = _name(a)
    if snap.group_name_taken(Ident(name, quoted)) is not None:
        raise _Invalid(f"resource group {name} already exists")
    group = GroupDef(
        group_id, name, quoted, _params(a, "params"), uid=_uid(snap, a, group_id, name)
    )
    _check_parent(snap, group)
    snap = snap.with_group(group).evolve(next_id=group_id + 1)
    variants = a.get("variants", [])
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        raise _Invalid(f"variants = {variants!r}: expected a list of variants")
    for variant in variants:
        snap = _add_variant(snap, {**variant, "base": group_id})
    return snap


def _add_variant(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    """A new variant of a base group; a plain group becomes a base with its first
    (it must then be neither mapped nor granted: only runtime groups are)."""
    base = _group(snap, a["base"])
    variant_id = _new_id(snap, a)
    name, quoted = _name(a)
    if base.id == DEFAULT_GROUP_ID or base.is_variant or VARIANT_SEPARATOR in name:
        raise _Invalid(f"variant {name!r} of {base.name}: not a variant SQL could create")
    if base.parent_id is not None or snap.is_inner(base.id):
        raise _Invalid(f"{base.name} is in a tree of groups, so it cannot have variants")
    if not base.is_base and (snap.mapped_to(base.id) or snap.use_grants.left_of(base.id)):
        raise _Invalid(f"{base.name} is mapped or granted, so it cannot become a base")
    if not base.is_base and (snap.rules_of(base.id) or snap.rules_moving_to(base.id)):
        raise _Invalid(f"{base.name} has rules or is a rule's target, so it cannot become a base")
    if not base.is_base and snap.selectors_to(base.id):
        raise _Invalid(f"{base.name} is a selector's group, so it cannot become a base")
    full, full_quoted = variant_name(base.name, name), base.quoted or quoted
    if snap.group_name_taken(Ident(full, full_quoted)) is not None:
        raise _Invalid(f"variant name {full} is taken")
    overrides = _params(a, "params")
    if "parent" in overrides:
        raise _Invalid(f"variant {name!r} of {base.name} cannot have a parent of its own")
    variant = GroupDef(
        variant_id,
        full,
        full_quoted,
        {**base.params, **overrides},
        base_id=base.id,
        variant=Ident(name, quoted),
        overrides=overrides,
        uid=_uid(snap, a, variant_id, full),
    )
    snap = snap.with_group(variant).evolve(next_id=variant_id + 1)
    return snap.with_group(replace(base, variants=(*base.variants, variant_id)))


def _with_variants_of(snap: Snapshot, base: GroupDef) -> Snapshot:
    """Every variant of ``base`` recomputed from the base as it is now (its
    parameters with the variant's overrides on top, its name after the base's)."""
    for variant in snap.variants_of(base):
        assert variant.variant is not None
        snap = snap.with_group(
            replace(
                variant,
                name=variant_name(base.name, variant.variant.text),
                quoted=base.quoted or variant.variant.quoted,
                params={**base.params, **variant.overrides},
            )
        )
    return snap


def _alter_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    """SET and RESET: of a variant, its overrides; of a base, what every variant
    that does not override a parameter inherits."""
    group = _group(snap, a["id"])
    reset, changes = a["reset"], _params(a, "set")
    if not isinstance(reset, list) or not set(reset) <= set(PARAMETERS):
        raise _Invalid(f"reset = {reset!r}: expected a list of parameter names")
    if group.is_variant:
        if "parent" in changes:
            raise _Invalid(f"variant {group.name} cannot have a parent of its own")
        base = _group(snap, group.base_id)
        overrides = {k: v for k, v in group.overrides.items() if k not in reset}
        overrides.update(changes)
        params = {**base.params, **overrides}
        return snap.with_group(replace(group, params=params, overrides=overrides))
    params = {k: v for k, v in group.params.items() if k not in reset}
    params.update(changes)
    changed = replace(group, params=params)
    _check_parent(snap, changed)
    return _with_variants_of(snap.with_group(changed), changed)


def _rename_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    """A rename; a base's variants follow it (``tenants::acme`` -> ``firms::acme``)."""
    group = _group(snap, a["id"])
    name, quoted = _name(a)
    if group.is_default or group.is_variant:
        raise _Invalid(f"cannot rename {group.name}: the built-in group or a variant")
    family = {group.id, *group.variants}
    new_names = [(name, quoted)] + [
        (variant_name(name, v.variant.text), quoted or v.variant.quoted)
        for v in snap.variants_of(group)
        if v.variant is not None
    ]
    for new_name, new_quoted in new_names:
        taken = snap.group_name_taken(Ident(new_name, new_quoted))
        if taken is not None and taken.id not in family:
            raise _Invalid(f"cannot rename {group.name} to {name}: {new_name} is taken")
    renamed = replace(group, name=name, quoted=quoted)
    return _with_variants_of(snap.with_group(renamed), renamed)


def _drop_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    """A drop: a base goes with its variants; a base whose last variant goes is a
    runtime group again, with its own parameters."""
    group = _group(snap, a["id"])
    family = [*snap.variants_of(group), group]
    if group.is_default or any(snap.mapped_to(g.id) for g in family):
        raise _Invalid(f"drops {group.name}, which must stay")
    members = {g.id for g in family}
    if any(r.group_id not in members for g in family for r in snap.rules_moving_to(g.id)):
        raise _Invalid(f"drops {group.name}, which a rule of another group moves queries to")
    if any(snap.selectors_to(g.id) for g in family):
        raise _Invalid(f"drops {group.name}, which a selector routes queries to")
    if snap.is_inner(group.id):
        raise _Invalid(f"drops {group.name}, which has children")
    for member in family:
        for rule in snap.rules_of(member.id):  # a group's rules go with it
            snap = snap.without_rule(rule.id)
        snap = snap.without_group(member.id)
    if group.base_id is not None:
        base = _group(snap, group.base_id)
        left = tuple(i for i in base.variants if i != group.id)
        snap = snap.with_group(replace(base, variants=left))
    return snap


def _create_principal(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    principal_id = _new_id(snap, a)
    name, quoted = _name(a)
    if snap.principal_name_taken(Ident(name, quoted)) is not None:
        raise _Invalid(f"principal {name} already exists")
    password_hash = a.get("password_hash")
    if password_hash is not None and not is_password_hash(password_hash):
        raise _Invalid("password_hash is not a resgroups password hash")
    kind = PrincipalKind(a["kind"])
    if password_hash is not None and kind is PrincipalKind.GROUP:
        raise _Invalid("an ACL group has no password")
    md5 = a.get("md5_verifier")
    if md5 is not None and (password_hash is None or not is_md5_verifier(md5)):
        raise _Invalid("md5_verifier is not an md5 verifier beside a password hash")
    principal = Principal(principal_id, kind, name, quoted, password_hash, md5_verifier=md5)
    return snap.with_principal(principal).evolve(next_id=principal_id + 1)


def _drop_principal(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    return snap.without_principal(_principal(snap, a["id"]).id)


def _membership(add: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_membership(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        user = _principal(snap, a["user"], PrincipalKind.USER).id
        if not isinstance(a["groups"], list):
            raise _Invalid(f"groups = {a['groups']!r}: expected a list of ACL group ids")
        pairs = [(user, _principal(snap, g, PrincipalKind.GROUP).id) for g in a["groups"]]
        members = snap.memberships.add(pairs) if add else snap.memberships.remove(pairs)
        return snap.evolve(memberships=members)

    return apply_membership


def _set_mapping(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    principal = _principal(snap, a["principal"])
    if a["group"] is not None:
        _runtime_group(snap, a["group"])
    priority = _int(a, "priority", 0, INT32_MAX) if "priority" in a else 0
    if priority and principal.kind is not PrincipalKind.GROUP:
        raise _Invalid(f"MAPPING PRIORITY on {principal.kind.value} {principal.name}")
    return snap.with_principal(replace(principal, group_id=a["group"], priority=priority))


def _set_memory_limit(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    principal = _principal(snap, a["principal"])
    limit = None if a["limit"] is None else _int(a, "limit")
    return snap.with_principal(replace(principal, memory_limit=limit))


def _set_admin(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    principal = _principal(snap, a["principal"])
    return snap.with_principal(replace(principal, admin=_flag(a, "value")))


def _use(grant: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_use(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        principal = _principal(snap, a["principal"])
        if a["group"] is None:
            changed = replace(principal, use_all=grant)
        else:
            group_id = (_runtime_group if grant else _group)(snap, a["group"]).id
            groups = (
                principal.use_groups | {group_id} if grant else principal.use_groups - {group_id}
            )
            changed = replace(principal, use_groups=frozenset(groups))
        return snap.with_principal(changed)

    return apply_use


def _assume(grant: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_assume(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        account = _principal(snap, a["account"], PrincipalKind.SERVICE_ACCOUNT).id
        grantee = _principal(snap, a["user"], PrincipalKind.USER, PrincipalKind.GROUP).id
        change = snap.assume_grants.add if grant else snap.assume_grants.remove
        return snap.evolve(assume_grants=change([(account, grantee)]))

    return apply_assume


_N = TypeVar("_N", RuleDef, SelectorDef)


def _rule(snap: Snapshot, rule_id: object) -> RuleDef:
    rule = snap.rules.get(rule_id) if _is_id(rule_id) else None
    if rule is None:
        raise _Invalid(f"refers to missing rule id {rule_id!r}")
    return rule


def _create_rule(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    rule_id = _new_id(snap, a)
    name, quoted = _name(a)
    if snap.rule_name_taken(Ident(name, quoted)) is not None:
        raise _Invalid(f"resource rule {name} already exists")
    group = _runtime_group(snap, a["group"])
    problem = conditions_problem(a["conditions"])
    if problem is not None:
        raise _Invalid(problem)
    action = a["action"]
    if action not in ACTIONS:
        raise _Invalid(f"action {action!r}: expected one of {', '.join(ACTIONS)}")
    target = a.get("target")
    if (action == MOVE) != (target is not None):
        raise _Invalid(f"action {action} with target {target!r}")
    if target is not None and not _is_id(target):
        raise _Invalid(f"target = {target!r}: expected a group id")
    if target is not None and _runtime_group(snap, target).id == group.id:
        raise _Invalid(f"rule {name} moves queries of {group.name} to itself")
    watch = _int(a, "watch", 0, INT32_MAX)
    if watch and action not in (KILL, MOVE):
        raise _Invalid(f"watch = {watch} on a {action} rule: only KILL and MOVE are watched")
    rule = RuleDef(
        rule_id,
        name,
        quoted,
        group.id,
        tuple((str(m), int(v)) for m, v in a["conditions"]),
        action,
        target,
        watch,
    )
    return snap.with_rule(rule).evolve(next_id=rule_id + 1)


def _renamed(found: _N, a: Mapping[str, Any], taken: Callable[[Ident], _N | None]) -> _N:
    """``found`` (a rule or a selector) under the record's new name, unless another
    of its kind has it (``taken``)."""
    name, quoted = _name(a)
    other = taken(Ident(name, quoted))
    if other is not None and other.id != found.id:
        raise _Invalid(f"cannot rename {found.name} to {name}: taken")
    return replace(found, name=name, quoted=quoted)


def _rename_rule(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    return snap.with_rule(_renamed(_rule(snap, a["id"]), a, snap.rule_name_taken))


def _drop_rule(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    return snap.without_rule(_rule(snap, a["id"]).id)


def _selector(snap: Snapshot, selector_id: object) -> SelectorDef:
    selector = snap.selectors.get(selector_id) if _is_id(selector_id) else None
    if selector is None:
        raise _Invalid(f"refers to missing selector id {selector_id!r}")
    return selector


def _create_selector(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    selector_id = _new_id(snap, a)
    name, quoted = _name(a)
    if snap.selector_name_taken(Ident(name, quoted)) is not None:
        raise _Invalid(f"resource selector {name} already exists")
    problem = selector_problem(a["conditions"])
    if problem is not None:
        raise _Invalid(problem)
    group = _runtime_group(snap, a["group"])
    conditions = tuple((str(c), str(o), v) for c, o, v in a["conditions"])
    selector = SelectorDef(
        selector_id, name, quoted, conditions, group.id, _int(a, "priority", 0, INT32_MAX)
    )
    return snap.with_selector(selector).evolve(next_id=selector_id + 1)


def _rename_selector(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    return snap.with_selector(_renamed(_selector(snap, a["id"]), a, snap.selector_name_taken))


def _drop_selector(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    return snap.without_selector(_selector(snap, a["id"]).id)


APPLY: Final[dict[str, Callable[[Snapshot, Mapping[str, Any]], Snapshot]]] = {
    "genesis": _genesis,
    "create_group": _create_group,
    "alter_group": _alter_group,
    "rename_group": _rename_group,
    "drop_group": _drop_group,
    "add_variant": _add_variant,
    "create_principal": _create_principal,
    "drop_principal": _drop_principal,
    "add_member": _membership(add=True),
    "remove_member": _membership(add=False),
    "set_mapping": _set_mapping,
    "set_memory_limit": _set_memory_limit,
    "set_admin": _set_admin,
    "grant_use": _use(grant=True),
    "revoke_use": _use(grant=False),
    "grant_assume": _assume(grant=True),
    "revoke_assume": _assume(grant=False),
    "create_rule": _create_rule,
    "rename_rule": _rename_rule,
    "drop_rule": _drop_rule,
    "create_selector": _create_selector,
    "rename_selector": _rename_selector,
    "drop_selector": _drop_selector,
}


def apply(snap: Snapshot, record: Record) -> Snapshot:
    """The snapshot after ``record``; its version must follow ``snap``'s.

    Costs O(log n) in the size of the catalog. A record that does not follow,
    or that SQL could not have written (an unknown operation, a missing or
    mistyped field, a value out of range, a malformed or taken name, a
    reference to a missing object), raises CatalogError XX001 and changes
    nothing.
    """
    where = f"catalog record {record.version} ({record.op})"
    if record.version != snap.version + 1:
        raise CatalogError(f"{where} does not follow version {snap.version}", sqlstate=CORRUPT)
    handler = APPLY.get(record.op)
    if handler is None:
        raise CatalogError(
            f"{where}: unknown operation {record.op!r}; it was written by another "
            f"version of resgroups (this one reads {', '.join(APPLY)})",
            sqlstate=CORRUPT,
        )
    try:
        changed = handler(snap.evolve(touched_groups=frozenset()), record.args)
    except KeyError as exc:
        raise CatalogError(f"{where} lacks field {exc}", sqlstate=CORRUPT) from None
    except (TypeError, ValueError) as exc:  # _Invalid among them
        raise CatalogError(f"{where} is invalid: {exc}", sqlstate=CORRUPT) from None
    except (RecursionError, MemoryError) as exc:  # a value nested or sized past reason
        raise CatalogError(
            f"{where} is invalid: a value nested or sized beyond what can be checked "
            f"({type(exc).__name__})",
            sqlstate=CORRUPT,
        ) from None
    return _note_limits(snap, changed).evolve(version=record.version)


def _note_limits(before: Snapshot, after: Snapshot) -> Snapshot:
    """Stamp ``limited_since`` on each group this record gave a max_active_queries
    it did not have (an ALTER from no limit, a variant's base, ...)."""
    for group_id in after.touched_groups:
        old, new = before.group(group_id), after.group(group_id)
        if (
            old is not None
            and new is not None
            and old.max_active_queries is None
            and new.max_active_queries is not None
        ):
            after = after.with_group(replace(new, limited_since=before.version + 1))
        if old is not None and new is not None and old.parent_id != new.parent_id:
            # a subtree joining limited ancestors brings queries that hold nothing
            # at their levels: as if their limits had just appeared (the fleet
            # adopts them before anyone admits on those limits)
            joined = {g.id for g in after.path(new)} - {g.id for g in before.path(old)}
            for ancestor_id in sorted(joined - {new.id}):
                ancestor = after.group(ancestor_id)
                if ancestor is not None and ancestor.max_active_queries is not None:
                    stamped = replace(ancestor, limited_since=before.version + 1)
                    after = after.with_group(stamped)
    return after


def replay(records: list[Record], start: Snapshot | None = None) -> Snapshot:
    """Apply ``records`` in order, then check the whole result once (O(n))."""
    snap = start or Snapshot()
    for record in records:
        snap = apply(snap, record)
    snap._check_invariants()
    return snap
