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

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from resgroups.auth import verify_password
from resgroups.catalog.model import GroupDef, Principal, Snapshot
from resgroups.catalog.names import Ident, PrincipalKind
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


def own_group(snap: Snapshot, principal: Principal | None) -> GroupDef:
    """What resolution gives without a session choice."""
    if principal is None:
        return snap.default_group
    if principal.group_id is not None:
        mapped = snap.group(principal.group_id)
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
            group = snap.group(max(candidates)[2])
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


def resolve(snap: Snapshot, who: Identity, chosen: int | None, *, access_control: bool) -> GroupDef:
    """The group a managed query starting now runs in (SPEC §5); ``chosen`` is
    the id of the session's choice (SET RESOURCE GROUP), named as it is now."""
    if chosen is not None:
        group = snap.group(chosen)
        if group is None:
            name = snap.group_name(chosen) or f"id {chosen}"
            raise CatalogError(
                f"resource group {name} chosen by SET RESOURCE GROUP no longer exists; "
                "RESET RESOURCE GROUP or choose another",
                sqlstate=CatalogError.UNDEFINED,
            )
        check_use(snap, who, group, access_control=access_control)
        return group
    return own_group(snap, login_principal(snap, who))


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
    account, each checked against its password when it has one."""

    def __init__(
        self, *, access_control: bool, admin_user: str, admin_password: str | None
    ) -> None:
        self.access_control = access_control
        self.admin_user = admin_user
        self._admin_password = admin_password

    def login(self, snap: Snapshot, name: str, password: str | None) -> Identity:
        """The identity ``name`` logs in as; AuthenticationFailed otherwise."""
        if not self.access_control:
            return Identity(name)
        if name == self.admin_user:
            self._check_admin_password(name, password)
            return Identity(name, is_admin=True)
        principal = snap.find_principal(Ident(name))
        if principal is None or principal.kind is PrincipalKind.GROUP:
            what = "is a group and cannot log in" if principal else "does not exist"
            raise AuthenticationFailed(f"authentication failed: principal {name} {what}")
        if principal.password_hash is not None and (
            password is None or not verify_password(password, principal.password_hash)
        ):
            raise AuthenticationFailed(
                f"password authentication failed for {name}", sqlstate="28P01"
            )
        return Identity(principal.name, login_id=principal.id)

    def _check_admin_password(self, name: str, given: str | None) -> None:
        expected = self._admin_password
        if expected is None:
            return
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            raise AuthenticationFailed(
                f"password authentication failed for {name}", sqlstate="28P01"
            )
