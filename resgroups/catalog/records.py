"""Change records: the catalog log's unit, and how each one changes a snapshot.

A record is ``{"v": version, "op": name, ...arguments}`` encoded as compact
JSON. Every DDL statement that changes the catalog becomes exactly one
record; ``apply`` is a pure function from (snapshot, record) to the next
snapshot, so replaying the log from version 1 rebuilds the same snapshot.
Records carry ids, never names, for everything they refer to.

``apply`` trusts nothing: a record that refers to a missing object or breaks
an invariant raises :class:`InternalError` (the executor validates first and
reports user errors; a failure here is a bug or a foreign log).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from resgroups.catalog.model import GroupDef, Principal, Snapshot
from resgroups.catalog.names import PrincipalKind
from resgroups.errors import InternalError

LOG_FORMAT: Final = 1


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
        body = json.loads(payload.decode("utf-8"))
        if not isinstance(body, dict) or not isinstance(body.get("v"), int):
            raise ValueError("not a catalog record")
        version, op = body.pop("v"), body.pop("op")
        if op not in APPLY:
            raise ValueError(f"unknown catalog record op {op!r}")
        return cls(version, op, body)


def _group(snap: Snapshot, group_id: int) -> GroupDef:
    group = snap.group(group_id)
    if group is None:
        raise InternalError(f"catalog record refers to missing resource group id {group_id}")
    return group


def _principal(snap: Snapshot, principal_id: int) -> Principal:
    principal = snap.principal(principal_id)
    if principal is None:
        raise InternalError(f"catalog record refers to missing principal id {principal_id}")
    return principal


def _new_id(snap: Snapshot, new_id: int) -> int:
    if new_id != snap.next_id:
        raise InternalError(f"catalog record assigns id {new_id}, expected {snap.next_id}")
    return new_id + 1


def _replace_group(snap: Snapshot, group: GroupDef) -> tuple[GroupDef, ...]:
    return tuple(group if g.id == group.id else g for g in snap.groups)


def _with_principal(snap: Snapshot, principal: Principal) -> dict[int, Principal]:
    principals = dict(snap.principals)
    principals[principal.id] = principal
    return principals


# ---- the operations ---------------------------------------------------------


def _genesis(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    if snap.version != 0:
        raise InternalError("genesis record after the start of the log")
    if a.get("format") != LOG_FORMAT:
        raise InternalError(f"catalog log format {a.get('format')} is not {LOG_FORMAT}")
    return snap


def _create_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    next_id = _new_id(snap, a["id"])
    group = GroupDef(a["id"], a["name"], a["quoted"], dict(a["params"]))
    return replace(snap, next_id=next_id, groups=(*snap.groups, group))


def _alter_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    group = _group(snap, a["id"])
    params = {k: v for k, v in group.params.items() if k not in a["reset"]}
    params.update(a["set"])
    return replace(snap, groups=_replace_group(snap, replace(group, params=params)))


def _rename_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    group = replace(_group(snap, a["id"]), name=a["name"], quoted=a["quoted"])
    return replace(snap, groups=_replace_group(snap, group))


def _drop_group(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    group = _group(snap, a["id"])
    if group.is_default or snap.mapped_to(group.id):
        raise InternalError(f"catalog record drops {group.name}, which must stay")
    principals = {
        pid: replace(p, use_groups=p.use_groups - {group.id}) for pid, p in snap.principals.items()
    }
    return replace(
        snap,
        groups=tuple(g for g in snap.groups if g.id != group.id),
        principals=principals,
        dropped_group_names={**snap.dropped_group_names, group.id: group.name},
    )


def _create_principal(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    next_id = _new_id(snap, a["id"])
    principal = Principal(
        a["id"], PrincipalKind(a["kind"]), a["name"], a["quoted"], a.get("password_hash")
    )
    return replace(snap, next_id=next_id, principals=_with_principal(snap, principal))


def _drop_principal(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    gone = _principal(snap, a["id"]).id
    return replace(
        snap,
        principals={pid: p for pid, p in snap.principals.items() if pid != gone},
        memberships=frozenset(m for m in snap.memberships if gone not in m),
        assume_grants=frozenset(g for g in snap.assume_grants if gone not in g),
    )


def _membership(add: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_membership(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        user = _principal(snap, a["user"]).id
        pairs = {(user, _principal(snap, g).id) for g in a["groups"]}
        members = snap.memberships | pairs if add else snap.memberships - pairs
        return replace(snap, memberships=frozenset(members))

    return apply_membership


def _set_mapping(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
    principal = _principal(snap, a["principal"])
    if a["group"] is not None:
        _group(snap, a["group"])
    changed = replace(principal, group_id=a["group"], priority=a.get("priority", 0))
    return replace(snap, principals=_with_principal(snap, changed))


def _principal_field(name: str, value_key: str) -> Callable[..., Snapshot]:
    def apply_field(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        principal = _principal(snap, a["principal"])
        value = a[value_key]
        return replace(snap, principals=_with_principal(snap, replace(principal, **{name: value})))

    return apply_field


def _use(grant: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_use(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        principal = _principal(snap, a["principal"])
        if a["group"] is None:
            changed = replace(principal, use_all=grant)
        else:
            group_id = _group(snap, a["group"]).id
            groups = (
                principal.use_groups | {group_id} if grant else principal.use_groups - {group_id}
            )
            changed = replace(principal, use_groups=frozenset(groups))
        return replace(snap, principals=_with_principal(snap, changed))

    return apply_use


def _assume(grant: bool) -> Callable[[Snapshot, Mapping[str, Any]], Snapshot]:
    def apply_assume(snap: Snapshot, a: Mapping[str, Any]) -> Snapshot:
        pair = (_principal(snap, a["account"]).id, _principal(snap, a["user"]).id)
        grants = snap.assume_grants | {pair} if grant else snap.assume_grants - {pair}
        return replace(snap, assume_grants=frozenset(grants))

    return apply_assume


APPLY: Final[dict[str, Callable[[Snapshot, Mapping[str, Any]], Snapshot]]] = {
    "genesis": _genesis,
    "create_group": _create_group,
    "alter_group": _alter_group,
    "rename_group": _rename_group,
    "drop_group": _drop_group,
    "create_principal": _create_principal,
    "drop_principal": _drop_principal,
    "add_member": _membership(add=True),
    "remove_member": _membership(add=False),
    "set_mapping": _set_mapping,
    "set_memory_limit": _principal_field("memory_limit", "limit"),
    "set_admin": _principal_field("admin", "value"),
    "grant_use": _use(grant=True),
    "revoke_use": _use(grant=False),
    "grant_assume": _assume(grant=True),
    "revoke_assume": _assume(grant=False),
}


def apply(snap: Snapshot, record: Record) -> Snapshot:
    """The snapshot after ``record``; its version must follow ``snap``'s."""
    if record.version != snap.version + 1:
        raise InternalError(
            f"catalog record version {record.version} does not follow {snap.version}"
        )
    try:
        handler = APPLY[record.op]
    except KeyError:
        raise InternalError(f"unknown catalog record op {record.op!r}") from None
    try:
        changed = handler(snap, record.args)
    except (KeyError, TypeError, ValueError) as exc:
        raise InternalError(f"malformed catalog record {record.encode()!r}: {exc}") from exc
    new = replace(changed, version=record.version)
    new._check_invariants()
    return new


def replay(records: list[Record], start: Snapshot | None = None) -> Snapshot:
    snap = start or Snapshot()
    for record in records:
        snap = apply(snap, record)
    return snap
