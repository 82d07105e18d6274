"""Table functions: relations computed on demand, usable in FROM.

``resource_groups()`` reads engine state, so it runs unmanaged (SPEC §3):
monitoring never queues behind the workload it watches. With access control
on it needs RESOURCE GROUP ADMIN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from resgroups.access import check_group_admin, is_group_admin
from resgroups.catalog.rules import format_conditions
from resgroups.catalog.selectors import format_conditions as format_selector_conditions
from resgroups.errors import (
    DatatypeMismatch,
    FeatureNotSupported,
    UndefinedFunction,
    did_you_mean,
)
from resgroups.query import PROGRESS_COLUMNS, Query
from resgroups.sched.stats import COLUMNS
from resgroups.sql.select import Relation

if TYPE_CHECKING:
    from resgroups.catalog import Snapshot
    from resgroups.session import Session


@dataclass(frozen=True)
class TableFunction:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, type)
    produce: Callable[[Session, tuple[Any, ...]], list[tuple[Any, ...]]]
    engine_state: bool  # True: unmanaged, like every function over engine state


def _no_arguments(name: str, args: tuple[Any, ...]) -> None:
    if args:
        raise DatatypeMismatch(f"{name}() takes no arguments, got {len(args)}")


def _for_group_admins(session: Session, name: str, args: tuple[Any, ...]) -> Snapshot:
    """A function over engine state that takes no arguments and needs RESOURCE
    GROUP ADMIN: the snapshot it reads, once both are checked."""
    _no_arguments(name, args)
    engine = session.engine
    snap = engine.snapshot
    check_group_admin(snap, session.identity, access_control=engine.access_control)
    return snap


def _resource_groups(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    _for_group_admins(session, "resource_groups", args)
    engine = session.engine
    return [stats.row() for stats in engine.statistics()]


def _resource_group_queries(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every managed query that is queued, running, parked or suspended. An admin or
    RESOURCE GROUP ADMIN sees all of them; anyone else sees their own."""
    _no_arguments("resource_group_queries", args)
    engine = session.engine
    sees_all = is_group_admin(
        engine.snapshot, session.identity, access_control=engine.access_control
    )
    mine = [
        progress
        for progress in map(Query.progress, engine.live_queries())
        if progress is not None and (sees_all or progress.user_name == session.user)
    ]
    return [tuple(p) for p in sorted(mine, key=lambda p: p.query_id)]


INSTANCE_COLUMNS: Final = (
    ("instance_id", "text"), ("host", "text"), ("pid", "int"),
    ("last_heartbeat", "timestamptz"), ("leases_held", "int"), ("healthy", "bool"),
    ("catalog_version", "int"),
)  # fmt: skip


def _resource_group_instances(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The fleet's instances and their health (fleet mode); RESOURCE GROUP ADMIN."""
    _for_group_admins(session, "resource_group_instances", args)
    engine = session.engine
    if engine.fleet is None:
        raise FeatureNotSupported(
            "resource_group_instances() lists the instances of a fleet: start the engine "
            "with coordination='postgresql://...' (resgroups serve --coordination ...)"
        )
    return [
        (str(i), str(h), int(p), at, int(n), bool(ok), int(v))
        for i, h, p, at, n, ok, v in engine.fleet.instances()
    ]


RULE_COLUMNS: Final = (
    ("name", "text"), ("group", "text"), ("conditions", "text"), ("action", "text"),
    ("target_group", "text"), ("watch_millis", "int"), ("hits_total", "int"),
    ("last_hit_at", "timestamptz"),
)  # fmt: skip


def _resource_group_rules(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every runaway-query rule, in creation order, with how often it acted
    (SPEC §16); RESOURCE GROUP ADMIN."""
    snap = _for_group_admins(session, "resource_group_rules", args)
    engine = session.engine
    rows = []
    for rule in snap.all_rules:
        hit = engine.rule_hits.get(rule.id)
        target = None if rule.target_id is None else snap.group_name(rule.target_id)
        last = None if hit.last_at is None else datetime.fromtimestamp(hit.last_at, UTC)
        rows.append(
            (
                rule.name,
                snap.group_name(rule.group_id),
                format_conditions(rule.conditions),
                rule.action.upper(),
                target,
                rule.watch_ms,
                hit.total,
                last,
            )
        )
    return rows


WATCH_COLUMNS: Final = (
    ("fingerprint", "text"), ("rule", "text"), ("action", "text"), ("until", "timestamptz"),
    ("hits_total", "int"),
)  # fmt: skip


def _resource_group_watches(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The statements watched after a rule's KILL or MOVE, until when, and how many
    queries the watch caught (SPEC §16); RESOURCE GROUP ADMIN."""
    snap = _for_group_admins(session, "resource_group_watches", args)
    engine = session.engine
    rows = []
    for watch in engine.watches.entries():
        rule = snap.rules.get(watch.rule_id)
        if rule is None:  # dropped: it catches nothing any more
            continue
        until = datetime.fromtimestamp(watch.until_wall, UTC)
        rows.append((watch.fingerprint, rule.name, watch.action.upper(), until, watch.hits))
    return rows


SELECTOR_COLUMNS: Final = (
    ("name", "text"), ("conditions", "text"), ("group", "text"), ("priority", "int"),
    ("matches_total", "int"),
)  # fmt: skip


def _resource_selectors(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every selector, in creation order, with how many queries it routed (SPEC §15);
    RESOURCE GROUP ADMIN."""
    snap = _for_group_admins(session, "resource_selectors", args)
    engine = session.engine
    return [
        (
            selector.name,
            format_selector_conditions(selector.conditions),
            snap.group_name(selector.group_id),
            selector.priority,
            engine.selector_matches.get(selector.id, 0),
        )
        for selector in snap.all_selectors
    ]


TABLE_FUNCTIONS: Final[dict[str, TableFunction]] = {
    "resource_groups": TableFunction("resource_groups", COLUMNS, _resource_groups, True),
    "resource_group_queries": TableFunction(
        "resource_group_queries", PROGRESS_COLUMNS, _resource_group_queries, True
    ),
    "resource_group_instances": TableFunction(
        "resource_group_instances", INSTANCE_COLUMNS, _resource_group_instances, True
    ),
    "resource_group_rules": TableFunction(
        "resource_group_rules", RULE_COLUMNS, _resource_group_rules, True
    ),
    "resource_group_watches": TableFunction(
        "resource_group_watches", WATCH_COLUMNS, _resource_group_watches, True
    ),
    "resource_selectors": TableFunction(
        "resource_selectors", SELECTOR_COLUMNS, _resource_selectors, True
    ),
}


def table_function(name: str) -> TableFunction:
    try:
        return TABLE_FUNCTIONS[name]
    except KeyError:
        raise UndefinedFunction(
            f"table function {name}() does not exist." + did_you_mean(name, TABLE_FUNCTIONS)
        ) from None


def relation(session: Session, fn: TableFunction, args: tuple[Any, ...]) -> Relation:
    return Relation(
        tuple(name for name, _ in fn.columns),
        fn.produce(session, args),
        tuple(kind for _, kind in fn.columns),
    )
