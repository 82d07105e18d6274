"""The catalog snapshot: groups, principals, mappings, limits and grants.

A :class:`Snapshot` is immutable. Every change produces a new snapshot (see
:mod:`resgroups.catalog.records`), so a query that resolved its group against
one snapshot keeps a consistent view however the catalog moves on.

Identities: every group and principal has an integer ``id`` that never
changes and is never reused; mappings, grants, memberships and session
choices refer to ids, so a rename keeps them all. Ids grow with creation, so
listings sorted by id are in creation order (DEFAULT, id 0, first): the order
of ``resource_groups()`` and the tie-break between equal mapping priorities.

Names: an unquoted reference matches an unquoted name case-insensitively; a
quoted one matches exactly. A name is displayed as it was created.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any, Final, Protocol, TypeVar

from immutables import Map

from resgroups.catalog.names import Ident, PrincipalKind
from resgroups.catalog.params import PARAMETERS, ParamValue
from resgroups.catalog.relation import EMPTY, Relation
from resgroups.catalog.selectors import Attributes, Condition, SelectorIndex, failing
from resgroups.errors import InternalError

DEFAULT_GROUP_ID: Final = 0
DEFAULT_GROUP_NAME: Final = "DEFAULT"  # as QuestDB shows it


def _matches(name: str, quoted: bool, ref: Ident) -> bool:
    if name == ref.text:
        return True
    return not quoted and not ref.quoted and name.casefold() == ref.text.casefold()


def conflicts(name: str, quoted: bool, new: Ident) -> bool:
    """Would an object called ``new`` be confused with one called ``name``?

    Only two quoted names may differ in case alone, so an unquoted reference
    never has two candidates.
    """
    return name == new.text or (
        (not quoted or not new.quoted) and name.casefold() == new.text.casefold()
    )


def _name_clashes(names: Iterable[tuple[str, bool]]) -> list[str]:
    """Names that break the rule of ``conflicts`` (O(n))."""
    buckets: dict[str, list[tuple[str, bool]]] = {}
    for name, quoted in names:
        buckets.setdefault(name.casefold(), []).append((name, quoted))
    return [
        f"names {[n for n, _ in same]} clash"
        for same in buckets.values()
        if len(same) > 1 and (not all(q for _, q in same) or len({n for n, _ in same}) < len(same))
    ]


VARIANT_SEPARATOR: Final = "::"
MAX_TREE_DEPTH: Final = 16  # the most levels a path of nested groups may have (SPEC §14)


def variant_name(base: str, variant: str) -> str:
    """The runtime name of a base group's variant: ``tenants::acme``."""
    return f"{base}{VARIANT_SEPARATOR}{variant}"


@dataclass(frozen=True)
class GroupDef:
    """A resource group's definition; ``params`` holds only what was SET.

    Variants (``CREATE RESOURCE GROUP tenants ... VARIANTS (acme ...)``): the
    base keeps the parameters SET on it and the ids of its ``variants``, and is
    not a runtime group while it has any; each variant is a runtime group named
    ``base::variant`` whose ``params`` are the base's with its ``overrides`` on
    top (recomputed whenever either changes), so everything downstream reads a
    variant's policy like any group's.
    """

    id: int
    name: str
    quoted: bool = False
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    base_id: int | None = None  # a variant: its base group
    variant: Ident | None = None  # a variant: its own name within the base
    overrides: Mapping[str, ParamValue] = field(default_factory=dict)  # a variant's own
    variants: tuple[int, ...] = ()  # a base: its variants, in creation order
    # the fleet's identity of the group (SPEC §11): fixed by the record that created
    # it, so it survives RENAME, is new after DROP + CREATE of the name, and is the
    # same in every process that follows one catalog (``group_uid``)
    uid: str = DEFAULT_GROUP_NAME
    # the catalog version at which max_active_queries last appeared (an ALTER from
    # no limit); 0: limited since creation, or never limited. Queries admitted
    # before it hold nothing in the fleet, which waits for them (docs/fleet.md)
    limited_since: int = 0

    @property
    def is_base(self) -> bool:
        """A group with variants: a policy shape, not a group queries run in."""
        return bool(self.variants)

    @property
    def is_variant(self) -> bool:
        return self.base_id is not None

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

    @property
    def max_active_queries_per_user(self) -> int | None:
        value = self.value("max_active_queries_per_user")
        assert value is None or isinstance(value, int)
        return value

    @property
    def parent_id(self) -> int | None:
        """The id of the group this one is nested in (SPEC §14); None: top level."""
        value = self.params.get("parent")
        assert value is None or isinstance(value, int)
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
    md5_verifier: str | None = None  # "md5" + md5(password + name), kept only when asked


@dataclass(frozen=True)
class RuleDef:
    """A runaway-query rule (SPEC §16, :mod:`resgroups.catalog.rules`): on the
    queries of ``group_id``, when every condition holds (each ``(metric,
    threshold)`` in the metric's base unit), ``action`` ('kill', 'move' to
    ``target_id``, or 'log'); ``watch_ms`` > 0 keeps the statement's fingerprint
    watched that long after a KILL or a MOVE."""

    id: int
    name: str
    quoted: bool
    group_id: int
    conditions: tuple[tuple[str, int], ...]
    action: str
    target_id: int | None = None
    watch_ms: int = 0


class _Named(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def quoted(self) -> bool: ...


N = TypeVar("N", bound=_Named)


def _find_named(objects: Iterable[N], ref: Ident) -> N | None:
    """The object ``ref`` names among ``objects`` (in their order): an exact match
    first, then a case-insensitive one (rules and selectors, few enough to scan)."""
    same = [o for o in objects if o.name.casefold() == ref.text.casefold()]
    exact = [o for o in same if o.name == ref.text]
    loose = [o for o in same if _matches(o.name, o.quoted, ref)]
    return next(iter(exact or loose), None)


def _name_taken(objects: Iterable[N], new: Ident) -> N | None:
    """The object a new one called ``new`` would be confused with (see ``conflicts``)."""
    return next((o for o in objects if conflicts(o.name, o.quoted, new)), None)


@dataclass(frozen=True)
class SelectorDef:
    """A selector (SPEC §15, :mod:`resgroups.catalog.selectors`): a query whose
    attributes meet every condition runs in ``group_id``; among the selectors
    that match, the highest ``priority`` wins, ties to the one created first."""

    id: int
    name: str
    quoted: bool
    conditions: tuple[Condition, ...]
    group_id: int
    priority: int = 0


def _indexed(
    index: Map[str, tuple[int, ...]], name: str, object_id: int
) -> Map[str, tuple[int, ...]]:
    key = name.casefold()
    return index.set(key, (*index.get(key, ()), object_id))


def _unindexed(
    index: Map[str, tuple[int, ...]], name: str, object_id: int
) -> Map[str, tuple[int, ...]]:
    key = name.casefold()
    ids = tuple(i for i in index.get(key, ()) if i != object_id)
    return index.set(key, ids) if ids else index.delete(key)


_NAMES: Final[Map[str, tuple[int, ...]]] = Map()
_NO_PRINCIPALS: Final[Map[int, Principal]] = Map()
_NO_DROPPED: Final[Map[int, str]] = Map()
_NO_GROUPS: Final[Map[int, GroupDef]] = Map()
_NO_RULES: Final[Map[int, RuleDef]] = Map()
_NO_SELECTORS: Final[Map[int, SelectorDef]] = Map()
_ONLY_DEFAULT: Final = _NO_GROUPS.set(
    DEFAULT_GROUP_ID, GroupDef(DEFAULT_GROUP_ID, DEFAULT_GROUP_NAME)
)
_DEFAULT_NAMED: Final = _indexed(_NAMES, DEFAULT_GROUP_NAME, DEFAULT_GROUP_ID)


@dataclass(frozen=True)
class Snapshot:
    """One consistent state of the catalog, as of record ``version``.

    Every collection is persistent (``immutables.Map`` or a
    :class:`~resgroups.catalog.relation.Relation`): the next snapshot shares
    all but what a record changed, so applying a record costs O(log n) in the
    size of the catalog, and lookups by id or by name are O(1)-ish. Listings
    (:attr:`groups`, :meth:`principals_of`) sort by id, which is creation order.
    """

    version: int = 0
    next_id: int = DEFAULT_GROUP_ID + 1
    group_by_id: Map[int, GroupDef] = _ONLY_DEFAULT
    group_names_index: Map[str, tuple[int, ...]] = _DEFAULT_NAMED
    principals: Map[int, Principal] = _NO_PRINCIPALS
    principal_names_index: Map[str, tuple[int, ...]] = _NAMES
    memberships: Relation = EMPTY  # (user id, ACL group id)
    assume_grants: Relation = EMPTY  # (account id, user or ACL group id)
    mapped: Relation = EMPTY  # (principal id, group id): Principal.group_id, by group
    use_grants: Relation = EMPTY  # (principal id, group id): Principal.use_groups, by group
    dropped_group_names: Map[int, str] = _NO_DROPPED  # last name of each dropped group
    base_ids: frozenset[int] = frozenset()  # the groups that have variants
    nested_ids: frozenset[int] = frozenset()  # the groups that have a parent
    touched_groups: frozenset[int] = frozenset()  # created, changed or dropped by this version
    # the log's identity, from its genesis record: engines that follow one log share
    # it ("": a log whose genesis record predates the field, or none yet)
    catalog_uid: str = ""
    rules: Map[int, RuleDef] = _NO_RULES  # runaway-query rules, by id
    selectors: Map[int, SelectorDef] = _NO_SELECTORS  # by id

    def evolve(self, **changes: Any) -> Snapshot:
        """A copy with ``changes``: ``dataclasses.replace`` without re-running
        ``__init__``, which made it the largest cost of replaying a long log."""
        unknown = changes.keys() - _FIELDS
        if unknown:
            raise TypeError(f"Snapshot has no fields {sorted(unknown)}")
        new = object.__new__(Snapshot)
        state = new.__dict__  # frozen: __setattr__ refuses, the instance dict does not
        state.update(self.__dict__)
        state.pop("groups", None)  # the cached listings belong to self alone
        state.pop("rules_by_group", None)
        state.pop("selector_index", None)
        state.pop("children", None)
        state.update(changes)
        return new

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
        return self.group_by_id[DEFAULT_GROUP_ID]

    @cached_property
    def groups(self) -> tuple[GroupDef, ...]:
        """Every runtime group (bases with variants left out) in creation order,
        DEFAULT first: O(n log n), for listings."""
        return tuple(g for g in self.all_groups if not g.is_base)

    @property
    def all_groups(self) -> tuple[GroupDef, ...]:
        """Every group, bases included, in creation order."""
        return tuple(sorted(self.group_by_id.values(), key=lambda g: g.id))

    def group_count(self) -> int:
        """How many runtime groups there are: O(1)."""
        return len(self.group_by_id) - len(self.base_ids)

    def group(self, group_id: int) -> GroupDef | None:
        """A group by id, a base with variants included."""
        return self.group_by_id.get(group_id)

    def runtime_group(self, group_id: int) -> GroupDef | None:
        """A group queries can run in: None for a missing group or a base with variants."""
        group = self.group_by_id.get(group_id)
        return None if group is None or group.is_base else group

    def _groups_named(self, text: str) -> list[GroupDef]:
        return [self.group_by_id[i] for i in self.group_names_index.get(text.casefold(), ())]

    def find_group(self, ref: Ident) -> GroupDef | None:
        """The group a reference names: an exact match first, then case-insensitive.

        DEFAULT answers to its name in any case, quoted or not (no other group
        may be called so)."""
        if ref.text.casefold() == DEFAULT_GROUP_NAME.casefold():
            return self.default_group
        same = self._groups_named(ref.text)
        exact = [g for g in same if g.name == ref.text]
        loose = [g for g in same if _matches(g.name, g.quoted, ref)]
        return next(iter(exact or loose), None)

    def group_name_taken(self, new: Ident) -> GroupDef | None:
        if new.text.casefold() == DEFAULT_GROUP_NAME.casefold():
            return self.default_group
        clash = [g for g in self._groups_named(new.text) if conflicts(g.name, g.quoted, new)]
        return clash[0] if clash else None

    def group_names(self) -> list[str]:
        """Every group's name, bases included, in creation order."""
        return [g.name for g in self.all_groups]

    def find_variant(self, base: GroupDef, ref: Ident) -> GroupDef | None:
        """The variant of ``base`` whose own name ``ref`` is (``acme`` of ``tenants``)."""
        own = [(v, v.variant) for v in self.variants_of(base) if v.variant is not None]
        exact = [v for v, name in own if name.text == ref.text]
        loose = [v for v, name in own if _matches(name.text, name.quoted, ref)]
        return next(iter(exact or loose), None)

    def with_group(self, group: GroupDef) -> Snapshot:
        """The snapshot with ``group`` added, or replacing the group of its id."""
        names = self.group_names_index
        old = self.group_by_id.get(group.id)
        if old is not None:
            names = _unindexed(names, old.name, old.id)
        bases = self.base_ids
        if group.is_base != (group.id in bases):
            bases = bases | {group.id} if group.is_base else bases - {group.id}
        nested = self.nested_ids
        if (group.parent_id is not None) != (group.id in nested):
            nested = nested | {group.id} if group.parent_id is not None else nested - {group.id}
        return self.evolve(
            group_by_id=self.group_by_id.set(group.id, group),
            group_names_index=_indexed(names, group.name, group.id),
            base_ids=bases,
            nested_ids=nested,
            touched_groups=self.touched_groups | {group.id},
        )

    def without_group(self, group_id: int) -> Snapshot:
        """The snapshot with a group dropped: its USE grants go, its name is remembered."""
        group = self.group_by_id[group_id]
        snap = self
        for holder in list(self.use_grants.left_of(group_id)):
            p = snap.principals[holder]
            snap = snap.with_principal(replace(p, use_groups=p.use_groups - {group_id}))
        return snap.evolve(
            group_by_id=snap.group_by_id.delete(group_id),
            group_names_index=_unindexed(snap.group_names_index, group.name, group_id),
            dropped_group_names=snap.dropped_group_names.set(group_id, group.name),
            base_ids=snap.base_ids - {group_id},
            nested_ids=snap.nested_ids - {group_id},
            touched_groups=snap.touched_groups | {group_id},
        )

    def variants_of(self, base: GroupDef) -> list[GroupDef]:
        """A base's variants, in creation order."""
        return [self.group_by_id[i] for i in base.variants]

    # ---- the tree of groups (SPEC §14)
    @cached_property
    def children(self) -> Mapping[int, tuple[int, ...]]:
        """Each inner group's children's ids, in creation order, computed once per
        snapshot from the nested groups alone (empty while no group has a parent):
        O(k log k) for k nested groups, whatever the number of groups, so that a
        mapping's check of its group stays O(1) at 10,000 top-level groups."""
        by_parent: dict[int, tuple[int, ...]] = {}
        for group_id in sorted(self.nested_ids):
            parent = self.group_by_id[group_id].parent_id
            if parent is not None:
                by_parent[parent] = (*by_parent.get(parent, ()), group_id)
        return by_parent

    def children_of(self, group_id: int) -> list[GroupDef]:
        """A group's children, in creation order."""
        return [self.group_by_id[i] for i in self.children.get(group_id, ())]

    def is_inner(self, group_id: int) -> bool:
        """Has the group children? Then no query of its own starts in it."""
        return group_id in self.children

    def would_cycle(self, group_id: int, parent_id: int) -> bool:
        """Would nesting ``group_id`` in ``parent_id`` make it its own ancestor?"""
        seen: set[int] = set()
        at: int | None = parent_id
        while at is not None and at not in seen:
            if at == group_id:
                return True
            seen.add(at)
            parent = self.group_by_id.get(at)
            at = None if parent is None else parent.parent_id
        return at is not None  # a loop above that does not pass through group_id

    def height(self, group_id: int) -> int:
        """How many levels the group's subtree has (1: no children)."""
        levels, frontier = 0, [group_id]
        while frontier and levels <= MAX_TREE_DEPTH + 1:  # a broken log cannot loop it
            levels += 1
            frontier = [c for g in frontier for c in self.children.get(g, ())]
        return levels

    def path(self, group: GroupDef) -> list[GroupDef]:
        """The group and its ancestors, from the root down to ``group``."""
        path = [group]
        seen = {group.id}
        while (parent_id := path[-1].parent_id) is not None:
            parent = self.group_by_id.get(parent_id)
            if parent is None or parent.id in seen:  # only a broken log: _tree_problems
                break
            seen.add(parent.id)
            path.append(parent)
        path.reverse()
        return path

    # ---- runaway-query rules
    @property
    def all_rules(self) -> list[RuleDef]:
        """Every rule, in creation order."""
        return sorted(self.rules.values(), key=lambda r: r.id)

    def rules_of(self, group_id: int) -> list[RuleDef]:
        """The rules on a group's queries, in creation order (the order they act)."""
        return list(self.rules_by_group.get(group_id, ()))

    @cached_property
    def rules_by_group(self) -> Mapping[int, tuple[RuleDef, ...]]:
        """Each group's rules, in creation order, computed once per snapshot (the
        query path asks it for its group's; empty while there are none)."""
        by_group: dict[int, tuple[RuleDef, ...]] = {}
        for rule in self.all_rules:
            by_group[rule.group_id] = (*by_group.get(rule.group_id, ()), rule)
        return by_group

    def rules_moving_to(self, group_id: int) -> list[RuleDef]:
        """The rules of other groups whose MOVE names this one, in creation order."""
        return [r for r in self.all_rules if r.target_id == group_id]

    def find_rule(self, ref: Ident) -> RuleDef | None:
        return _find_named(self.all_rules, ref)

    def rule_name_taken(self, new: Ident) -> RuleDef | None:
        return _name_taken(self.rules.values(), new)

    def with_rule(self, rule: RuleDef) -> Snapshot:
        """The snapshot with ``rule`` added, or replacing the rule of its id."""
        return self.evolve(rules=self.rules.set(rule.id, rule))

    def without_rule(self, rule_id: int) -> Snapshot:
        return self.evolve(rules=self.rules.delete(rule_id))

    # ---- selectors
    @property
    def all_selectors(self) -> list[SelectorDef]:
        """Every selector, in creation order."""
        return sorted(self.selectors.values(), key=lambda r: r.id)

    def selectors_to(self, group_id: int) -> list[SelectorDef]:
        """The selectors that route queries to a group, in creation order."""
        return [r for r in self.all_selectors if r.group_id == group_id]

    def find_selector(self, ref: Ident) -> SelectorDef | None:
        return _find_named(self.all_selectors, ref)

    def selector_name_taken(self, new: Ident) -> SelectorDef | None:
        return _name_taken(self.selectors.values(), new)

    def with_selector(self, selector: SelectorDef) -> Snapshot:
        return self.evolve(selectors=self.selectors.set(selector.id, selector))

    def without_selector(self, selector_id: int) -> Snapshot:
        return self.evolve(selectors=self.selectors.delete(selector_id))

    @cached_property
    def selector_index(self) -> SelectorIndex:
        """The selectors filed for routing, built once per snapshot."""
        return SelectorIndex.build((r.id, r.conditions) for r in self.selectors.values())

    def select(self, attrs: Attributes) -> SelectorDef | None:
        """The selector a query with ``attrs`` is routed by: of those whose every
        condition holds, the highest priority, ties to the one created first
        (None: none matches). O(candidates) through the index."""
        best: SelectorDef | None = None
        index = self.selector_index
        for selector_id in index.candidates(attrs):
            selector = self.selectors[selector_id]
            if best is not None and (selector.priority, -selector.id) <= (
                best.priority,
                -best.id,
            ):
                continue
            if failing(selector.conditions, attrs, index.like) is None:
                best = selector
        return best

    # ---- principals
    def principal(self, principal_id: int) -> Principal | None:
        return self.principals.get(principal_id)

    def find_principal(self, ref: Ident, kind: PrincipalKind | None = None) -> Principal | None:
        named = self.principal_names_index.get(ref.text.casefold(), ())
        same = [p for p in map(self.principals.__getitem__, named) if kind in (None, p.kind)]
        exact = [p for p in same if p.name == ref.text]
        loose = [p for p in same if _matches(p.name, p.quoted, ref)]
        return next(iter(exact or loose), None)

    def principal_name_taken(self, new: Ident) -> Principal | None:
        for i in self.principal_names_index.get(new.text.casefold(), ()):
            p = self.principals[i]
            if conflicts(p.name, p.quoted, new):
                return p
        return None

    def principals_of(self, kind: PrincipalKind) -> Iterator[Principal]:
        """Every principal of ``kind``, in creation order."""
        return iter(sorted((p for p in self.principals.values() if p.kind is kind), key=_by_id))

    def acl_groups_of(self, user_id: int) -> list[Principal]:
        """The ACL groups a user belongs to, in creation order."""
        return [self.principals[i] for i in sorted(self.memberships.right_of(user_id))]

    def mapped_to(self, group_id: int) -> list[Principal]:
        """The principals mapped to a group, in creation order."""
        return [self.principals[i] for i in sorted(self.mapped.left_of(group_id))]

    def with_principal(self, principal: Principal) -> Snapshot:
        """The snapshot with ``principal`` added, or replacing the one of its id;
        the name, mapping and USE indexes follow."""
        pid = principal.id
        old = self.principals.get(pid)
        names, mapped, use = self.principal_names_index, self.mapped, self.use_grants
        if old is not None:
            names = _unindexed(names, old.name, pid)
            if old.group_id is not None and old.group_id != principal.group_id:
                mapped = mapped.remove([(pid, old.group_id)])
            use = use.remove((pid, g) for g in old.use_groups - principal.use_groups)
            new_use = principal.use_groups - old.use_groups
        else:
            new_use = principal.use_groups
        if principal.group_id is not None:
            mapped = mapped.add([(pid, principal.group_id)])
        return self.evolve(
            principals=self.principals.set(pid, principal),
            principal_names_index=_indexed(names, principal.name, pid),
            mapped=mapped,
            use_grants=use.add((pid, g) for g in new_use),
        )

    def without_principal(self, principal_id: int) -> Snapshot:
        """The snapshot with a principal gone, with its memberships and grants."""
        p = self.principals[principal_id]
        return self.evolve(
            principals=self.principals.delete(principal_id),
            principal_names_index=_unindexed(self.principal_names_index, p.name, principal_id),
            memberships=self.memberships.without(principal_id),
            assume_grants=self.assume_grants.without(principal_id),
            mapped=self.mapped.without(principal_id),
            use_grants=self.use_grants.without(principal_id),
        )

    # ---- invariants
    def _check_invariants(self) -> None:
        """Check the whole snapshot, indexes included: O(n), for replay and tests."""
        problems: list[str] = []
        ids = list(self.group_by_id) + list(self.principals) + list(self.rules)
        ids += list(self.selectors)
        if len(ids) != len(set(ids)):
            problems.append(f"duplicate ids {sorted(ids)}")
        if ids and max(ids) >= self.next_id:
            problems.append(f"next_id {self.next_id} not above every id")
        if DEFAULT_GROUP_ID not in self.group_by_id:
            problems.append("DEFAULT is missing")
        group_ids = set(self.group_by_id)
        for gid, g in self.group_by_id.items():
            if gid != g.id:
                problems.append(f"group {g.name} filed under {gid}")
            unknown = (set(g.params) | set(g.overrides)) - set(PARAMETERS)
            if unknown:
                problems.append(f"group {g.name} has unknown parameters {unknown}")
            problems += self._variant_problems(g)
        if self.base_ids != {g.id for g in self.group_by_id.values() if g.is_base}:
            problems.append("base index out of step")
        if self.nested_ids != {g.id for g in self.group_by_id.values() if g.parent_id is not None}:
            problems.append("nested index out of step")
        for pid, p in self.principals.items():
            if pid != p.id:
                problems.append(f"principal {p.name} filed under {pid}")
            if p.group_id is not None and p.group_id not in group_ids:
                problems.append(f"{p.name} mapped to missing group {p.group_id}")
            if not p.use_groups <= group_ids:
                problems.append(f"{p.name} holds USE on missing groups")
        problems += self._rule_problems()
        problems += self._tree_problems()
        problems += _name_clashes((g.name, g.quoted) for g in self.group_by_id.values())
        problems += _name_clashes((r.name, r.quoted) for r in self.rules.values())
        problems += _name_clashes((r.name, r.quoted) for r in self.selectors.values())
        for sid, sel in self.selectors.items():
            if sid != sel.id:
                problems.append(f"selector {sel.name} filed under {sid}")
            if self.runtime_group(sel.group_id) is None:
                problems.append(f"selector {sel.name} routes to missing or base group")
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
        problems += self._index_problems()
        if problems:
            raise InternalError(f"catalog snapshot v{self.version} broken: " + "; ".join(problems))

    def _rule_problems(self) -> list[str]:
        """Does every rule act on a runtime group, and move to another one?"""
        problems = []
        for rid, r in self.rules.items():
            if rid != r.id:
                problems.append(f"rule {r.name} filed under {rid}")
            if self.runtime_group(r.group_id) is None:
                problems.append(f"rule {r.name} on missing or base group {r.group_id}")
            moves = r.target_id is not None
            if moves != (r.action == "move"):
                problems.append(f"rule {r.name}: action {r.action} with target {r.target_id}")
            if moves and (
                r.target_id == r.group_id or self.runtime_group(r.target_id or 0) is None
            ):
                problems.append(f"rule {r.name} moves to missing or base group {r.target_id}")
        return problems

    def _tree_problems(self) -> list[str]:
        """Is the tree a tree of plain groups, with no query routed to an inner one?"""
        problems = []
        for g in self.group_by_id.values():
            parent_id = g.parent_id
            if parent_id is None:
                continue
            parent = self.group_by_id.get(parent_id)
            if parent is None or parent.is_default or parent.is_base or parent.is_variant:
                problems.append(f"group {g.name} nested in missing or special group {parent_id}")
            if g.is_default or g.is_base or g.is_variant:
                problems.append(f"group {g.name} has a parent but is DEFAULT, a base or a variant")
            if self.would_cycle(g.id, parent_id):
                problems.append(f"group {g.name} is its own ancestor")
        for inner in self.children:
            if self.mapped_to(inner) or self.use_grants.left_of(inner):
                problems.append(f"inner group {inner} is mapped or granted")
            if self.selectors_to(inner) or self.rules_of(inner) or self.rules_moving_to(inner):
                problems.append(f"inner group {inner} has selectors or rules")
        return problems

    def _variant_problems(self, g: GroupDef) -> list[str]:
        """Does a base agree with its variants, and each variant with its base?"""
        if g.is_base and g.is_variant:
            return [f"variant {g.name} has variants itself"]
        if g.is_base:
            kids = [self.group_by_id.get(i) for i in g.variants]
            if any(v is None or v.base_id != g.id for v in kids):
                return [f"base {g.name} lists variants {list(g.variants)} that are not its own"]
            if self.mapped_to(g.id) or self.use_grants.left_of(g.id):
                return [f"base {g.name} is mapped or granted, as only runtime groups are"]
            return []
        if not g.is_variant:
            return []
        base = self.group_by_id.get(g.base_id) if g.base_id is not None else None
        if base is None or g.id not in base.variants or g.variant is None:
            return [f"variant {g.name} is not listed by its base {g.base_id}"]
        if g.name != variant_name(base.name, g.variant.text):
            return [f"variant {g.name} is not named after its base {base.name}"]
        if dict(g.params) != {**base.params, **g.overrides}:
            return [f"variant {g.name}'s parameters are not its base's with its overrides"]
        return []

    def _index_problems(self) -> list[str]:
        """Do the indexes say exactly what the objects say?"""
        fresh = Snapshot(group_by_id=Map(), group_names_index=_NAMES, dropped_group_names=Map())
        for g in self.all_groups:
            fresh = fresh.with_group(g)
        for p in sorted(self.principals.values(), key=_by_id):
            fresh = fresh.with_principal(p)
        problems = []
        if fresh.group_names_index != self.group_names_index:
            problems.append("group name index out of step")
        if fresh.principal_names_index != self.principal_names_index:
            problems.append("principal name index out of step")
        if fresh.mapped != self.mapped or fresh.use_grants != self.use_grants:
            problems.append("mapping or USE index out of step")
        return problems


_FIELDS: Final = frozenset(f.name for f in fields(Snapshot))


def _by_id(p: Principal) -> int:
    return p.id
