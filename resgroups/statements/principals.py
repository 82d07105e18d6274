"""Principals, memberships, mappings, memory limits and grants (SPEC §5).

These statements need access control. Each validates against the snapshot
and returns the one change record it makes; SHOW and the session statements
(ASSUME / EXIT SERVICE ACCOUNT) read the snapshot and touch only the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from resgroups.access import (
    Identity,
    check_group_admin,
    explain,
    find_runtime_group,
    is_group_admin,
    may_assume,
)
from resgroups.auth import hash_password, md5_verifier
from resgroups.catalog import Principal, Snapshot
from resgroups.catalog.model import RuleDef
from resgroups.catalog.names import Ident
from resgroups.catalog.rules import format_conditions, format_duration
from resgroups.catalog.selectors import MAX_APPLICATION, MAX_TAG, MAX_TAGS, Attributes
from resgroups.errors import (
    CatalogError,
    FeatureNotSupported,
    InvalidParameter,
    PermissionDenied,
    did_you_mean,
)
from resgroups.result import Result
from resgroups.sql import ast
from resgroups.sql.ast import PrincipalKind

if TYPE_CHECKING:
    from resgroups.session import Session

Change = tuple[str, dict[str, object]] | None


def find_principal(
    session: Session, snap: Snapshot, ref: ast.Ident, *kinds: PrincipalKind
) -> Principal:
    """The principal ``ref`` names, of one of ``kinds``; CatalogError 42704 otherwise."""
    wanted = " or ".join(k.value for k in kinds)
    principal = snap.find_principal(ref)
    if principal is None:
        if ref.text.casefold() == session.engine.admin_user.casefold():
            raise CatalogError(
                f"{ref.text} is the built-in admin, which is not a catalog {wanted}: it holds "
                "every permission and its queries run in DEFAULT or the group it chooses",
                sqlstate=CatalogError.UNDEFINED,
            )
        names = [p.name for p in snap.principals.values() if p.kind in kinds]
        raise CatalogError(
            f"{wanted} {ref.text} does not exist." + did_you_mean(ref.text, names),
            sqlstate=CatalogError.UNDEFINED,
        )
    if principal.kind not in kinds:
        raise CatalogError(
            f"{ref.text} is a {principal.kind.value}, not a {wanted}",
            sqlstate=CatalogError.UNDEFINED,
        )
    return principal


ANY_KIND = (PrincipalKind.USER, PrincipalKind.GROUP, PrincipalKind.SERVICE_ACCOUNT)


def create_principal(session: Session, stmt: ast.CreatePrincipal) -> Result:
    if stmt.name.text.casefold() == session.engine.admin_user.casefold():
        raise CatalogError(
            f"{stmt.name.text} is the name of the built-in admin", sqlstate=CatalogError.DUPLICATE
        )
    password_hash = None if stmt.password is None else hash_password(stmt.password)
    md5 = None
    if stmt.password is not None and session.engine.md5_passwords:
        md5 = md5_verifier(stmt.password, stmt.name.text)

    def build(snap: Snapshot) -> Change:
        taken = snap.principal_name_taken(stmt.name)
        if taken is not None:
            raise CatalogError(
                f"a {taken.kind.value} named {taken.name} already exists "
                "(users, groups and service accounts share one name space)",
                sqlstate=CatalogError.DUPLICATE,
            )
        return "create_principal", {
            "id": snap.next_id,
            "kind": stmt.kind.value,
            "name": stmt.name.text,
            "quoted": stmt.name.quoted,
            "password_hash": password_hash,
            **({"md5_verifier": md5} if md5 is not None else {}),
        }

    session.engine.write_catalog(build)
    return Result.command(f"CREATE {stmt.kind.sql}")


def drop_principal(session: Session, stmt: ast.DropPrincipal) -> Result:
    def build(snap: Snapshot) -> Change:
        return "drop_principal", {"id": find_principal(session, snap, stmt.name, stmt.kind).id}

    session.engine.write_catalog(build)
    return Result.command(f"DROP {stmt.kind.sql}")


def _membership(session: Session, user: ast.Ident, groups: tuple[ast.Ident, ...], op: str) -> None:
    def build(snap: Snapshot) -> Change:
        member = find_principal(session, snap, user, PrincipalKind.USER)
        acl = [find_principal(session, snap, g, PrincipalKind.GROUP).id for g in groups]
        return op, {"user": member.id, "groups": sorted(set(acl))}

    session.engine.write_catalog(build)


def add_user(session: Session, stmt: ast.AddUser) -> Result:
    _membership(session, stmt.user, stmt.groups, "add_member")
    return Result.command("ADD USER")


def remove_user(session: Session, stmt: ast.RemoveUser) -> Result:
    _membership(session, stmt.user, stmt.groups, "remove_member")
    return Result.command("REMOVE USER")


def _assume_grant(session: Session, account: ast.Ident, user: ast.Ident, op: str) -> None:
    def build(snap: Snapshot) -> Change:
        sa = find_principal(session, snap, account, PrincipalKind.SERVICE_ACCOUNT)
        grantee = find_principal(session, snap, user, PrincipalKind.USER, PrincipalKind.GROUP)
        return op, {"account": sa.id, "user": grantee.id}

    session.engine.write_catalog(build)


def grant_assume(session: Session, stmt: ast.GrantAssume) -> Result:
    _assume_grant(session, stmt.account, stmt.user, "grant_assume")
    return Result.command("GRANT")


def revoke_assume(session: Session, stmt: ast.RevokeAssume) -> Result:
    _assume_grant(session, stmt.account, stmt.user, "revoke_assume")
    return Result.command("REVOKE")


def assume_service_account(session: Session, stmt: ast.AssumeServiceAccount) -> Result:
    snap = session.engine.snapshot
    account = find_principal(session, snap, stmt.account, PrincipalKind.SERVICE_ACCOUNT)
    who = session.identity
    if not who.is_admin:
        login = snap.principal(who.login_id) if who.login_id is not None else None
        if login is None or login.kind is not PrincipalKind.USER:
            raise PermissionDenied(
                f"Access denied for {who.login_name}: only users assume service accounts"
            )
    if not may_assume(snap, who, account):
        raise PermissionDenied(
            f"Access denied for {who.login_name} [ASSUME SERVICE ACCOUNT {account.name}]"
        )
    session.assume(account.id)
    return Result.command("ASSUME SERVICE ACCOUNT")


def exit_service_account(session: Session, stmt: ast.ExitServiceAccount) -> Result:
    session.assume(None)
    return Result.command("EXIT SERVICE ACCOUNT")


def set_mapping(session: Session, stmt: ast.SetMapping) -> Result:
    def build(snap: Snapshot) -> Change:
        principal = find_principal(session, snap, stmt.name, stmt.kind)
        group = None if stmt.group is None else find_runtime_group(snap, stmt.group).id
        return "set_mapping", {
            "principal": principal.id,
            "group": group,
            "priority": stmt.priority or 0,
        }

    session.engine.write_catalog(build)
    return Result.command(f"ALTER {stmt.kind.sql}")


def set_memory_limit(session: Session, stmt: ast.SetMemoryLimit) -> Result:
    def build(snap: Snapshot) -> Change:
        principal = find_principal(session, snap, stmt.name, stmt.kind)
        return "set_memory_limit", {"principal": principal.id, "limit": stmt.limit}

    session.engine.write_catalog(build)
    return Result.command(f"ALTER {stmt.kind.sql}")


def _set_admin(session: Session, ref: ast.Ident, value: bool) -> None:
    def build(snap: Snapshot) -> Change:
        principal = find_principal(session, snap, ref, *ANY_KIND)
        return "set_admin", {"principal": principal.id, "value": value}

    session.engine.write_catalog(build)


def grant_admin(session: Session, stmt: ast.GrantAdmin) -> Result:
    _set_admin(session, stmt.principal, True)
    return Result.command("GRANT")


def revoke_admin(session: Session, stmt: ast.RevokeAdmin) -> Result:
    _set_admin(session, stmt.principal, False)
    return Result.command("REVOKE")


def _use(session: Session, group: ast.Ident | None, ref: ast.Ident, op: str) -> None:
    def build(snap: Snapshot) -> Change:
        principal = find_principal(session, snap, ref, *ANY_KIND)
        group_id = None if group is None else find_runtime_group(snap, group).id
        return op, {"principal": principal.id, "group": group_id}

    session.engine.write_catalog(build)


def grant_use(session: Session, stmt: ast.GrantUse) -> Result:
    _use(session, stmt.group, stmt.principal, "grant_use")
    return Result.command("GRANT")


def revoke_use(session: Session, stmt: ast.RevokeUse) -> Result:
    _use(session, stmt.group, stmt.principal, "revoke_use")
    return Result.command("REVOKE")


def show(session: Session, stmt: ast.Show) -> Result:
    snap = session.engine.snapshot
    columns = ["name", "memory_limit", "resource_group"]
    types = ["text", "int", "text"]
    if stmt.what is PrincipalKind.GROUP:
        columns.append("priority")
        types.append("int")
    rows = []
    for p in snap.principals_of(stmt.what):
        group = snap.group(p.group_id) if p.group_id is not None else None
        row: tuple[object, ...] = (p.name, p.memory_limit, group.name if group else None)
        if stmt.what is PrincipalKind.GROUP:
            row += (p.priority if group else None,)
        rows.append(row)
    return Result.table(columns, rows, types)


EXPLAIN_COLUMNS: Final = ("candidate", "source", "priority", "eligible", "reason", "chosen")
EXPLAIN_TYPES: Final = ("text", "text", "int", "bool", "text", "bool")


def explain_resource_group(session: Session, stmt: ast.ExplainResourceGroup) -> Result:
    """EXPLAIN RESOURCE GROUP: the rules resolution considers, in order, and the one
    that decides (for the session, or for a principal logging in afresh, which
    takes RESOURCE GROUP ADMIN to ask)."""
    engine = session.engine
    snap = engine.snapshot
    if stmt.name is None:
        who, chosen = session.identity, session.chosen_group_id
        application, tags = session.application, session.tags
    else:
        if not engine.access_control:
            raise FeatureNotSupported(
                "EXPLAIN RESOURCE GROUP FOR USER|SERVICE ACCOUNT requires access control "
                "(without it there are no principals or mappings)"
            )
        check_group_admin(snap, session.identity, access_control=True)
        assert stmt.kind is not None
        principal = find_principal(session, snap, stmt.name, stmt.kind)
        who, chosen = Identity(principal.name, login_id=principal.id), None
        application, tags = None, frozenset()
    if stmt.application is not None:
        application = _checked_application(stmt.application)
    if stmt.tags is not None:
        tags = _checked_tags(stmt.tags)
    attributes = Attributes(who.login_name, stmt.query_kind or "select", application, tags)
    if attributes.kind == "export":  # exports keep the principal's group (SPEC §3)
        chosen = None
    if not engine.enabled or not snap.has_catalog:
        why = (
            "resource groups are disabled: queries run unmanaged"
            if not engine.enabled
            else "this replica has not received the catalog yet: queries run unmanaged"
        )
        rows: list[tuple[object, ...]] = [(None, "unmanaged", None, True, why, True)]
    else:
        admin = is_group_admin(snap, session.identity, access_control=engine.access_control)
        candidates = explain(
            snap,
            who,
            chosen,
            access_control=engine.access_control,
            attributes=attributes,
            per_query=False,  # no statement here: its conditions are each query's
            all_selectors=admin,  # others see the selectors that route them
        )
        rows = [(c.candidate, c.source, c.priority, c.eligible, c.reason, c.chosen)
                for c in candidates]  # fmt: skip
        picked = next((c.candidate for c in candidates if c.chosen), None)
        group = snap.find_group(Ident(picked, quoted=True)) if picked is not None else None
        path = snap.path(group) if group is not None else []
        if len(path) > 1:  # nested (SPEC §14): a slot in every level, from the root
            levels = " > ".join(g.name for g in path)
            why = f"path {levels}: a query holds a slot in each level, admitted when all have room"
            rows.append((path[-1].name, "group_path", None, False, why, False))
        if group is not None and admin:  # the rules are RESOURCE GROUP ADMIN's to read
            for rule in snap.rules_of(group.id):
                text = _rule_text(snap, rule)
                rows.append((group.name, "resource_rule", None, False, text, False))
    return Result.table(EXPLAIN_COLUMNS, rows, EXPLAIN_TYPES)


def _checked_application(application: str) -> str | None:
    """EXPLAIN's APPLICATION, as a session would have it ('' is none)."""
    if len(application) > MAX_APPLICATION:
        raise InvalidParameter(
            f"APPLICATION of {len(application)} characters: at most {MAX_APPLICATION}"
        )
    return application or None


def _checked_tags(tags: tuple[str, ...]) -> frozenset[str]:
    """EXPLAIN's TAGS, as a session could carry them."""
    if len(tags) > MAX_TAGS or any(not t or len(t) > MAX_TAG for t in tags):
        raise InvalidParameter(f"TAGS: at most {MAX_TAGS} tags of 1..{MAX_TAG} characters")
    return frozenset(tags)


def _rule_text(snap: Snapshot, rule: RuleDef) -> str:
    """A rule as EXPLAIN shows it: what applies to the queries of the group it picks."""
    action = rule.action.upper()
    if rule.target_id is not None:
        action = f"MOVE TO RESOURCE GROUP {snap.group_name(rule.target_id)}"
    watch = f" WITH (watch = {format_duration(rule.watch_ms)})" if rule.watch_ms else ""
    return (
        f"resource rule {rule.name}: WHEN {format_conditions(rule.conditions)} THEN {action}{watch}"
    )
