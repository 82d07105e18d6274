"""The catalog snapshot: groups, principals, mappings, limits and grants.

A :class:`Snapshot` is immutable. Every change produces a new snapshot (see
:mod:`resgroups.catalog.records`), so a query that resolved its group against
one snapshot keeps a consistent view however the catalog moves on.

Identities: every group and principal has an integer ``id`` that never
changes and is never reused; mappings, grants, memberships and session
choices refer to ids, so a rename keeps them all. Groups are kept in creation
order (DEFAULT, id 0, first), which is also the order of ``resource_groups()``
and the tie-break between equal mapping priorities.

Names: an unquoted reference matches an unquoted name case-insensitively; a
quoted one matches exactly. A name is displayed as it was created.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from resgroups.catalog.names import Ident, PrincipalKind
from resgroups.catalog.params import PARAMETERS, ParamValue
from resgroups.errors import InternalError

DEFAULT_GROUP_ID: Final = 0
DEFAULT_GROUP_NAME: Final = "DEFAULT"  # as QuestDB shows it


def _matches(name: str, quoted: bool, ref: Ident) -> bool:
    if name == ref.text:
        return True
    return not quoted and not ref.quoted and name.casefold() == ref.text.casefold()


def _conflicts(name: str, quoted: bool, new: Ident) -> bool:
    """Would an object called ``new`` be confused with one called ``name``?

    Only two quoted names may differ in case alone, so an unquoted reference
    never has two candidates.
    """
    return name == new.text or (
        (not quoted or not new.quoted) and name.casefold() == new.text.casefold()
    )


def _name_clashes(names: Iterable[tuple[str, bool]]) -> list[str]:
    """Names that break the rule of ``_conflicts`` (O(n))."""
    buckets: dict[str, list[tuple[str, bool]]] = {}
    for name, quoted in names:
        buckets.setdefault(name.casefold(), []).append((name, quoted))
    return [
        f"names {[n for n, _ in same]} clash"
        for same in buckets.values()
        if len(same) > 1 and (not all(q for _, q in same) or len({n for n, _ in same}) < len(same))
    ]


@dataclass(frozen=True)
class GroupDef:
    """A resource group's definition; ``params`` holds only what was SET."""

    id: int
    name: str
    quoted: bool = False
    params: Mapping[str, ParamValue] = field(default_factory=dict)

    def value(self, param: str) -> ParamValue:
        return self.params.get(param, PARAMETERS[param].default)

    @property
    def is_default(self) -> bool:
        return self.id == DEFAULT_GROUP_ID

    @property
    def cpu_weight(self) -> int:
        value = self.value("cpu_weight")
        assert isinstance(value, int)
        return value

    @property
    def cpu_limit_centi_pct(self) -> int | None:
        """The CPU limit in hundredths of a percent (2500 = 25%), or None."""
        value = self.value("cpu_limit")
        assert value is None or isinstance(value, int)
        return value

    @property
    def max_active_queries(self) -> int | None:
        value = self.value("max_active_queries")
        assert value is None or isinstance(value, int)
        return value

    @property
    def max_queued_queries(self) -> int | None:
        value = self.value("max_queued_queries")
        assert value is None or isinstance(value, int)
        return value

    @property
    def queue_timeout_ms(self) -> int:
        value = self.value("queue_timeout")
        assert isinstance(value, int)
        return value

    @property
    def memory_limit(self) -> int:
        value = self.value("memory_limit")
        assert isinstance(value, int)
        return value

    @property
    def scheduling_policy(self) -> str:
        value = self.value("scheduling_policy")
        assert isinstance(value, str)
        return value


@dataclass(frozen=True)
class Principal:
    """A user, an ACL group or a service account (one name space for all three)."""

    id: int
    kind: PrincipalKind
    name: str
    quoted: bool = False
    password_hash: str | None = None
    memory_limit: int | None = None  # None: no limit of its own
    group_id: int | None = None  # the mapped resource group
    priority: int = 0  # MAPPING PRIORITY (ACL groups)
    admin: bool = False  # RESOURCE GROUP ADMIN
    use_all: bool = False  # USE RESOURCE GROUP
    use_groups: frozenset[int] = frozenset()  # USE ON RESOURCE GROUP g


@dataclass(frozen=True)
class Snapshot:
    """One consistent state of the catalog, as of record ``version``."""

    version: int = 0
    next_id: int = DEFAULT_GROUP_ID + 1
    groups: tuple[GroupDef, ...] = (GroupDef(DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME),)
    principals: Mapping[int, Principal] = field(default_factory=dict)
    memberships: frozenset[tuple[int, int]] = frozenset()  # (user id, ACL group id)
    assume_grants: frozenset[tuple[int, int]] = frozenset()  # (account id, user id)
    dropped_group_names: Mapping[int, str] = field(default_factory=dict)  # last name of each

    def group_name(self, group_id: int) -> str | None:
        """A group's current name, or the last name of a dropped one."""
        group = self.group(group_id)
        return group.name if group is not None else self.dropped_group_names.get(group_id)

    @property
    def has_catalog(self) -> bool:
        """True once the genesis record has been applied."""
        return self.version > 0

    # ---- groups
    @property
    def default_group(self) -> GroupDef:
        return self.groups[0]

    def group(self, group_id: int) -> GroupDef | None:
        for g in self.groups:
            if g.id == group_id:
                return g
        return None

    def find_group(self, ref: Ident) -> GroupDef | None:
        """The group a reference names: an exact match first, then case-insensitive.

        DEFAULT answers to its name in any case, quoted or not (no other group
        may be called so)."""
        if ref.text.casefold() == DEFAULT_GROUP_NAME.casefold():
            return self.default_group
        for g in self.groups:
            if g.name == ref.text:
                return g
        for g in self.groups:
            if _matches(g.name, g.quoted, ref):
                return g
        return None

    def group_name_taken(self, new: Ident) -> GroupDef | None:
        if new.text.casefold() == DEFAULT_GROUP_NAME.casefold():
            return self.default_group
        for g in self.groups:
            if _conflicts(g.name, g.quoted, new):
                return g
        return None

    def group_names(self) -> list[str]:
        return [g.name for g in self.groups]

    # ---- principals
    def principal(self, principal_id: int) -> Principal | None:
        return self.principals.get(principal_id)

    def find_principal(self, ref: Ident, kind: PrincipalKind | None = None) -> Principal | None:
        candidates = [p for p in self.principals.values() if kind is None or p.kind is kind]
        for p in candidates:
            if p.name == ref.text:
                return p
        for p in candidates:
            if _matches(p.name, p.quoted, ref):
                return p
        return None

    def principal_name_taken(self, new: Ident) -> Principal | None:
        for p in self.principals.values():
            if _conflicts(p.name, p.quoted, new):
                return p
        return None

    def principals_of(self, kind: PrincipalKind) -> Iterator[Principal]:
        return (p for p in self.principals.values() if p.kind is kind)

    def acl_groups_of(self, user_id: int) -> list[Principal]:
        """The ACL groups a user belongs to, in creation order."""
        return [
            p
            for p in self.principals.values()
            if p.kind is PrincipalKind.GROUP and (user_id, p.id) in self.memberships
        ]

    def mapped_to(self, group_id: int) -> list[Principal]:
        return [p for p in self.principals.values() if p.group_id == group_id]

    # ---- invariants
    def _check_invariants(self) -> None:
        problems: list[str] = []
        ids = [g.id for g in self.groups] + list(self.principals)
        if len(ids) != len(set(ids)):
            problems.append(f"duplicate ids {sorted(ids)}")
        if ids and max(ids) >= self.next_id:
            problems.append(f"next_id {self.next_id} not above every id")
        if not self.groups or self.groups[0].id != DEFAULT_GROUP_ID:
            problems.append("DEFAULT is not the first group")
        if [g.id for g in self.groups] != sorted(g.id for g in self.groups):
            problems.append("groups not in creation order")
        group_ids = {g.id for g in self.groups}
        for g in self.groups:
            unknown = set(g.params) - set(PARAMETERS)
            if unknown:
                problems.append(f"group {g.name} has unknown parameters {unknown}")
        for pid, p in self.principals.items():
            if pid != p.id:
                problems.append(f"principal {p.name} filed under {pid}")
            if p.group_id is not None and p.group_id not in group_ids:
                problems.append(f"{p.name} mapped to missing group {p.group_id}")
            if not p.use_groups <= group_ids:
                problems.append(f"{p.name} holds USE on missing groups")
        problems += _name_clashes((g.name, g.quoted) for g in self.groups)
        problems += _name_clashes((p.name, p.quoted) for p in self.principals.values())
        for user_id, acl_id in self.memberships:
            user, acl = self.principals.get(user_id), self.principals.get(acl_id)
            if user is None or user.kind is not PrincipalKind.USER:
                problems.append(f"membership of missing user {user_id}")
            if acl is None or acl.kind is not PrincipalKind.GROUP:
                problems.append(f"membership in missing ACL group {acl_id}")
        for account_id, user_id in self.assume_grants:
            account, user = self.principals.get(account_id), self.principals.get(user_id)
            if account is None or account.kind is not PrincipalKind.SERVICE_ACCOUNT:
                problems.append(f"ASSUME grant of missing account {account_id}")
            if user is None or user.kind is PrincipalKind.SERVICE_ACCOUNT:
                problems.append(f"ASSUME grant to missing user or group {user_id}")
        if problems:
            raise InternalError(f"catalog snapshot v{self.version} broken: " + "; ".join(problems))
