"""Who a session is, which group its queries run in, and what it may do (SPEC §5).

Resolution, once at the start of each managed query:

1. the session's chosen group (SET RESOURCE GROUP), checked again for
   existence and USE every time;
2. the principal's own mapping;
3. for users only, the highest-priority mapping among their ACL groups, equal
   priorities going to the resource group created first;
4. DEFAULT.

The principal whose mapping counts is the one that logged in: a session that
assumed a service account keeps its login principal's group. Permissions
come from the acting principal (the assumed account while one is assumed),
and, for users, from their ACL groups too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from resgroups.auth import hash_password, md5_verifier, verify_password
from resgroups.catalog.model import GroupDef, Principal, Snapshot
from resgroups.catalog.names import Ident, PrincipalKind
from resgroups.catalog.selectors import Attributes, failing, format_condition, format_conditions
from resgroups.errors import AuthenticationFailed, CatalogError, PermissionDenied, did_you_mean


@dataclass(frozen=True)
class Identity:
    """A session's principals. ``login_id`` is None for the admin and without access control."""

    login_name: str
    login_id: int | None = None
    is_admin: bool = False
    assumed_id: int | None = None


def login_principal(snap: Snapshot, who: Identity) -> Principal | None:
    """The catalog principal that logged in (None: the admin, or access control off)."""
    if who.login_id is None:
        return None
    principal = snap.principal(who.login_id)
    if principal is None:
        raise AuthenticationFailed(f"principal {who.login_name} no longer exists")
    return principal


def acting_principal(snap: Snapshot, who: Identity) -> Principal | None:
    """The principal whose permissions apply: the assumed account, else the login."""
    if who.assumed_id is not None:
        account = snap.principal(who.assumed_id)
        if account is None:
            raise AuthenticationFailed("the assumed service account no longer exists")
        return account
    return login_principal(snap, who)


def holds(snap: Snapshot, principal: Principal, grant: Callable[[Principal], bool]) -> bool:
    """Does the principal hold a grant itself or, for a user, through an ACL group?"""
    if grant(principal):
        return True
    return principal.kind is PrincipalKind.USER and any(
        grant(acl) for acl in snap.acl_groups_of(principal.id)
    )


def may_assume(snap: Snapshot, who: Identity, account: Principal) -> bool:
    """May ``who`` act as service account ``account``? The admin may; a user needs
    GRANT ASSUME SERVICE ACCOUNT, to itself or to one of its ACL groups."""
    if who.is_admin:
        return True
    login = snap.principal(who.login_id) if who.login_id is not None else None
    if login is None or login.kind is not PrincipalKind.USER:
        return False
    return holds(snap, login, lambda p: (account.id, p.id) in snap.assume_grants)


def still_assumed(snap: Snapshot, who: Identity) -> bool:
    """Does the session's assumption (if any) still stand? A REVOKE ASSUME or a
    dropped account ends it at the session's next statement or query."""
    if who.assumed_id is None:
        return True
    account = snap.principal(who.assumed_id)
    return account is not None and may_assume(snap, who, account)


def own_group(snap: Snapshot, principal: Principal | None) -> GroupDef:
    """What resolution gives without a session choice."""
    if principal is None:
        return snap.default_group
    if principal.group_id is not None:
        mapped = snap.runtime_group(principal.group_id)
        if mapped is not None:
            return mapped
    if principal.kind is PrincipalKind.USER:
        candidates = [
            (acl.priority, -acl.group_id, acl.group_id)
            for acl in snap.acl_groups_of(principal.id)
            if acl.group_id is not None
        ]
        # highest priority; equal priorities: the group created first (smallest id)
        if candidates:
            group = snap.runtime_group(max(candidates)[2])
            if group is not None:
                return group
    return snap.default_group


def may_use(snap: Snapshot, who: Identity, group: GroupDef, *, access_control: bool) -> bool:
    if not access_control or who.is_admin:
        return True
    if group.id == own_group(snap, login_principal(snap, who)).id:
        return True
    acting = acting_principal(snap, who)
    return acting is not None and holds(
        snap, acting, lambda p: p.use_all or group.id in p.use_groups
    )


def check_use(snap: Snapshot, who: Identity, group: GroupDef, *, access_control: bool) -> None:
    if not may_use(snap, who, group, access_control=access_control):
        raise PermissionDenied(
            f"Access denied for {who.login_name} [USE ON RESOURCE GROUP {group.name}]: "
            f"grant it with GRANT USE ON RESOURCE GROUP {group.name} TO {who.login_name}"
        )


def find_group(snap: Snapshot, ref: Ident) -> GroupDef:
    """The group ``ref`` names, or CatalogError 42704 with a suggestion."""
    group = snap.find_group(ref)
    if group is None:
        raise CatalogError(
            f"resource group {ref.text} does not exist."
            + did_you_mean(ref.text, snap.group_names()),
            sqlstate=CatalogError.UNDEFINED,
        )
    return group


def _variant_list(snap: Snapshot, base: GroupDef) -> str:
    return ", ".join(f'"{v.name}"' for v in snap.variants_of(base))


def find_runtime_group(snap: Snapshot, ref: Ident) -> GroupDef:
    """The group ``ref`` names for a mapping, a grant or SET RESOURCE GROUP: a
    base with variants is refused (42809), naming the variants to use instead."""
    group = find_group(snap, ref)
    if group.is_base:
        raise CatalogError(
            f"resource group {group.name} has variants, so queries do not run in it: "
            f"name one of its variants ({_variant_list(snap, group)})",
            sqlstate=CatalogError.FORBIDDEN,
        )
    if snap.is_inner(group.id):
        raise CatalogError(
            f"resource group {group.name} has children, so queries do not start in it: "
            f"name one of its children ({_children_list(snap, group)})",
            sqlstate=CatalogError.FORBIDDEN,
        )
    return group


def _children_list(snap: Snapshot, group: GroupDef) -> str:
    return ", ".join(f'"{c.name}"' for c in snap.children_of(group.id))


def _lost_choice(snap: Snapshot, chosen: int) -> str:
    """Why a session's SET RESOURCE GROUP choice no longer resolves."""
    base = snap.group(chosen)
    if base is not None and snap.is_inner(chosen):  # it gained children since
        return (
            f"resource group {base.name} chosen by SET RESOURCE GROUP has children now; "
            f"choose one of them ({_children_list(snap, base)})"
        )
    if base is not None:  # it exists, so it gained variants since
        return (
            f"resource group {base.name} chosen by SET RESOURCE GROUP has variants now; "
            f"choose one of them ({_variant_list(snap, base)})"
        )
    name = snap.group_name(chosen) or f"id {chosen}"
    return (
        f"resource group {name} chosen by SET RESOURCE GROUP no longer exists; "
        "RESET RESOURCE GROUP or choose another"
    )


def resolve(
    snap: Snapshot,
    who: Identity,
    chosen: int | None,
    *,
    access_control: bool,
    attributes: Attributes | None = None,
) -> GroupDef:
    """The group a managed query starting now runs in (SPEC §5, §15); ``chosen``
    is the id of the session's choice (SET RESOURCE GROUP), named as it is now;
    ``attributes`` what the query is, for selectors (None: none apply)."""
    if chosen is not None:
        group = snap.runtime_group(chosen)
        if group is None or snap.is_inner(chosen):
            state = CatalogError.UNDEFINED if group is None else CatalogError.FORBIDDEN
            raise CatalogError(_lost_choice(snap, chosen), sqlstate=state)
        check_use(snap, who, group, access_control=access_control)
        return group
    if attributes is not None and snap.selectors:
        selector = snap.select(attributes)
        if selector is not None:
            routed = snap.runtime_group(selector.group_id)
            if routed is not None:
                return routed
    return own_group(snap, login_principal(snap, who))


@dataclass(frozen=True)
class Candidate:
    """One row of EXPLAIN RESOURCE GROUP: a rule resolution considers, in its order."""

    candidate: str | None  # the group the rule names (None: it names none)
    source: str  # session, principal, acl_group, assumed_service_account, default
    priority: int | None  # MAPPING PRIORITY (ACL groups)
    eligible: bool  # could this rule decide the group?
    reason: str
    chosen: bool = False


def _order(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def explain(
    snap: Snapshot,
    who: Identity,
    chosen: int | None,
    *,
    access_control: bool,
    attributes: Attributes | None = None,
    per_query: bool = True,
    all_selectors: bool = True,
) -> list[Candidate]:
    """Every rule :func:`resolve` considers for ``who``, in its order, and which one
    decides: the same decision ``resolve`` makes (a property test holds them
    together). When resolution would fail, no row is chosen and the failing
    row's reason is the error a query would get."""
    rows: list[Candidate] = []
    failed = False
    if chosen is not None:
        group = snap.runtime_group(chosen)
        if group is None or snap.is_inner(chosen):
            name = snap.group_name(chosen) or f"id {chosen}"
            rows.append(Candidate(name, "session", None, False, _lost_choice(snap, chosen)))
            failed = True
        elif may_use(snap, who, group, access_control=access_control):
            why = "SET RESOURCE GROUP; " + _use_reason(snap, who, group, access_control)
            rows.append(Candidate(group.name, "session", None, True, why))
        else:
            error = (
                f"Access denied for {who.login_name} [USE ON RESOURCE GROUP {group.name}]: "
                f"grant it with GRANT USE ON RESOURCE GROUP {group.name} TO {who.login_name}"
            )
            rows.append(Candidate(group.name, "session", None, False, error))
            failed = True
    if attributes is not None:
        selector_rows = _selector_rows(snap, attributes, per_query)
        if not all_selectors:  # the catalog's routing is the admin's to read in full
            selector_rows = [r for r in selector_rows if r.eligible]
        rows.extend(selector_rows)
    principal = login_principal(snap, who)
    if not access_control:
        rows.append(Candidate(None, "principal", None, False, "access control is off: no mappings"))
    elif principal is None:
        rows.append(Candidate(None, "principal", None, False, "the admin has no mapping"))
    else:
        mapped = snap.group(principal.group_id) if principal.group_id is not None else None
        what = f"{principal.kind.value} {principal.name}"
        if mapped is not None:
            reason = f"{what} is mapped to it (ALTER {principal.kind.sql} ... SET RESOURCE GROUP)"
            rows.append(Candidate(mapped.name, "principal", None, True, reason))
        else:
            rows.append(Candidate(None, "principal", None, False, f"{what} has no mapping"))
        if principal.kind is PrincipalKind.USER:
            rows.extend(_acl_rows(snap, principal))
    if who.assumed_id is not None:
        account = snap.principal(who.assumed_id)
        if account is not None:
            mapped = snap.group(account.group_id) if account.group_id is not None else None
            rows.append(
                Candidate(
                    mapped.name if mapped is not None else None,
                    "assumed_service_account",
                    None,
                    False,
                    f"service account {account.name} is assumed: its grants decide USE, "
                    "but the login principal's mapping decides the group",
                )
            )
    rows.append(
        Candidate(snap.default_group.name, "default", None, True, "when no rule above applies")
    )
    if not failed:
        decided = next(i for i, row in enumerate(rows) if row.eligible)
        rows[decided] = replace(rows[decided], chosen=True)
    return rows


_PER_QUERY: Final = ("statement", "estimated_rows", "estimated_memory")


def _selector_rows(snap: Snapshot, attributes: Attributes, per_query: bool) -> list[Candidate]:
    """Every selector in the order routing considers them (highest priority first,
    ties: created first), eligible when all its conditions hold, else with the
    first that does not. Without ``per_query`` (EXPLAIN, which has no statement),
    a selector whose other conditions hold but that looks at the statement or the
    executor's estimate is shown as decided by each query, not eligible."""
    ordered = sorted(snap.selectors.values(), key=lambda s: (-s.priority, s.id))
    like = snap.selector_index.like
    rows = []
    for selector in ordered:
        group = snap.group(selector.group_id)
        name = group.name if group is not None else None
        conditions = selector.conditions
        later = [c for c in conditions if c[0] in _PER_QUERY] if not per_query else []
        missing = failing([c for c in conditions if c not in later], attributes, like)
        if missing is None and later:
            decided = " AND ".join(format_condition(c) for c in later)
            why = (
                f"selector {selector.name}: its other conditions hold; {decided} is decided "
                "by each query (its statement text and the executor's estimate)"
            )
            rows.append(Candidate(name, "selector", selector.priority, False, why))
            continue
        if missing is None:
            why = f"selector {selector.name}: {format_conditions(selector.conditions)}"
        else:
            attribute = missing[0]
            actual = _shown_attribute(attributes, attribute)
            why = f"selector {selector.name}: {format_condition(missing)} does not hold ({actual})"
        rows.append(Candidate(name, "selector", selector.priority, missing is None, why))
    return rows


def _shown_attribute(attributes: Attributes, attribute: str) -> str:
    if attribute == "tag":
        tags = ", ".join(sorted(attributes.tags))
        return f"tags: {tags}" if tags else "no tags"
    value = getattr(attributes, attribute)
    return f"{attribute} is unknown" if value is None else f"{attribute} is {value!r}"


def _use_reason(snap: Snapshot, who: Identity, group: GroupDef, access_control: bool) -> str:
    if not access_control:
        return "access control is off: any group may be used"
    if who.is_admin:
        return "the admin may use any group"
    if group.id == own_group(snap, login_principal(snap, who)).id:
        return "it is the principal's own group"
    return "USE granted (GRANT USE ON RESOURCE GROUP, directly or through an ACL group)"


def _acl_rows(snap: Snapshot, user: Principal) -> list[Candidate]:
    """The user's ACL groups in resolution order: mapped ones by priority, then the
    resource group created first; unmapped ones after, never eligible."""
    mapped: list[tuple[int, int, Principal, GroupDef]] = []
    unmapped: list[Principal] = []
    for acl in snap.acl_groups_of(user.id):
        group = snap.group(acl.group_id) if acl.group_id is not None else None
        if group is None:
            unmapped.append(acl)
        else:
            mapped.append((-acl.priority, group.id, acl, group))
    creation = {g.id: i + 1 for i, g in enumerate(snap.groups)}  # DEFAULT is the 1st
    rows = [
        Candidate(
            group.name,
            "acl_group",
            acl.priority,
            True,
            f"ACL group {acl.name} (MAPPING PRIORITY {acl.priority}; {group.name} was the "
            f"{_order(creation[group.id])} group created)",
        )
        for _, _, acl, group in sorted(mapped, key=lambda m: (m[0], m[1]))
    ]
    rows += [
        Candidate(None, "acl_group", acl.priority, False, f"ACL group {acl.name} has no mapping")
        for acl in unmapped
    ]
    return rows


def is_group_admin(snap: Snapshot, who: Identity, *, access_control: bool) -> bool:
    """RESOURCE GROUP ADMIN: group DDL, mappings, USE grants, reading resource_groups()."""
    if not access_control or who.is_admin:
        return True
    acting = acting_principal(snap, who)
    return acting is not None and holds(snap, acting, lambda p: p.admin)


def check_group_admin(snap: Snapshot, who: Identity, *, access_control: bool) -> None:
    if not is_group_admin(snap, who, access_control=access_control):
        raise PermissionDenied(f"Access denied for {who.login_name} [RESOURCE GROUP ADMIN]")


def memory_limits(snap: Snapshot, who: Identity) -> tuple[int | None, list[int]]:
    """(the principal's own memory limit, the limits of its ACL groups) for the
    query ceiling (SPEC §8). An assumed service account's own limit applies;
    only users have ACL groups."""
    principal = acting_principal(snap, who) if who.assumed_id is not None else None
    if principal is not None and principal.memory_limit is not None:
        return principal.memory_limit, []
    login = login_principal(snap, who)
    if login is None:
        return None, []
    acl = [
        g.memory_limit
        for g in snap.acl_groups_of(login.id)
        if g.memory_limit is not None and login.kind is PrincipalKind.USER
    ]
    return login.memory_limit, acl


class Authenticator:
    """Who may open a session (SPEC §2): the admin, or a catalog user or service
    account, each checked against its password when it has one.

    Every attempt fails alike, whatever went wrong (an unknown name, an ACL
    group's name, a wrong, missing or unencodable password): one
    AuthenticationFailed 28P01 with one message, after one password hash
    (an attempt that has nothing to check hashes a dummy), so neither the
    answer nor its timing tells whether a principal exists.
    """

    def __init__(
        self,
        *,
        access_control: bool,
        admin_user: str,
        admin_password: str | None,
        md5_passwords: bool = False,
    ) -> None:
        self.access_control = access_control
        self.admin_user = admin_user
        self._admin_hash = None if admin_password is None else hash_password(admin_password)
        self._admin_md5 = (
            md5_verifier(admin_password, admin_user)
            if md5_passwords and admin_password is not None
            else None
        )

    @property
    def open_admin(self) -> bool:
        """Can anyone be the admin, with any password or none? (access control on,
        no admin password: how the demo runs)"""
        return self.access_control and self._admin_hash is None

    def login(self, snap: Snapshot, name: str, password: str | None) -> Identity:
        """The identity ``name`` logs in as; AuthenticationFailed otherwise."""
        if not self.access_control:
            return Identity(name)
        if name == self.admin_user:
            if self._passes(password, self._admin_hash):
                return Identity(name, is_admin=True)
        else:
            principal = snap.find_principal(Ident(name))
            can_log_in = principal is not None and principal.kind is not PrincipalKind.GROUP
            stored = principal.password_hash if principal is not None else None
            if self._passes(password, stored) and can_log_in:
                assert principal is not None
                return Identity(principal.name, login_id=principal.id)
        raise AuthenticationFailed(f'password authentication failed for user "{name}"')

    def credentials(self, snap: Snapshot, name: str) -> tuple[Identity | None, str | None]:
        """For protocols that check the password themselves (SCRAM): the identity
        ``name`` logs in as (None: it cannot log in, being unknown or an ACL
        group) and its stored password hash (None: no password is needed)."""
        if not self.access_control:
            return Identity(name), None
        if name == self.admin_user:
            return Identity(name, is_admin=True), self._admin_hash
        principal = snap.find_principal(Ident(name))
        if principal is None or principal.kind is PrincipalKind.GROUP:
            return None, _DUMMY_HASH
        return Identity(principal.name, login_id=principal.id), principal.password_hash

    def md5_credentials(self, snap: Snapshot, name: str) -> tuple[Identity | None, str | None]:
        """For an md5 login: the identity ``name`` logs in as (None: it cannot) and
        its md5 verifier (None: none is kept, e.g. the password was set before
        md5 verifiers were asked for)."""
        identity, _ = self.credentials(snap, name)
        if identity is None or not self.access_control:
            return identity, None
        if identity.is_admin:
            return identity, self._admin_md5
        principal = login_principal(snap, identity)
        return identity, principal.md5_verifier if principal is not None else None

    @staticmethod
    def _passes(given: str | None, stored: str | None) -> bool:
        """Does ``given`` match ``stored`` (None: no password needed)? Always one hash."""
        if stored is None:
            verify_password("", _DUMMY_HASH)  # the same work as a real check
            return True
        return given is not None and verify_password(given, stored)


_DUMMY_HASH: Final = hash_password("resgroups: the hash an attempt with nothing to check pays")
