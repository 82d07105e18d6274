"""Table functions: relations computed on demand, usable in FROM.

``resource_groups()`` reads engine state, so it runs unmanaged (SPEC §3):
monitoring never queues behind the workload it watches. With access control
on it needs RESOURCE GROUP ADMIN.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from resgroups.access import check_group_admin, is_group_admin
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
    from resgroups.session import Session


@dataclass(frozen=True)
class TableFunction:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, type)
    produce: Callable[[Session, tuple[Any, ...]], list[tuple[Any, ...]]]
    engine_state: bool  # True: unmanaged, like every function over engine state


def _resource_groups(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if args:
        raise DatatypeMismatch(f"resource_groups() takes no arguments, got {len(args)}")
    engine = session.engine
    check_group_admin(engine.snapshot, session.identity, access_control=engine.access_control)
    return [stats.row() for stats in engine.statistics()]


def _resource_group_queries(session: Session, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Every managed query that is queued, running, parked or suspended. An admin or
    RESOURCE GROUP ADMIN sees all of them; anyone else sees their own."""
    if args:
        raise DatatypeMismatch(f"resource_group_queries() takes no arguments, got {len(args)}")
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
    if args:
        raise DatatypeMismatch(f"resource_group_instances() takes no arguments, got {len(args)}")
    engine = session.engine
    check_group_admin(engine.snapshot, session.identity, access_control=engine.access_control)
    if engine.fleet is None:
        raise FeatureNotSupported(
            "resource_group_instances() lists the instances of a fleet: start the engine "
            "with coordination='postgresql://...' (resgroups serve --coordination ...)"
        )
    return [
        (str(i), str(h), int(p), at, int(n), bool(ok), int(v))
        for i, h, p, at, n, ok, v in engine.fleet.instances()
    ]


TABLE_FUNCTIONS: Final[dict[str, TableFunction]] = {
    "resource_groups": TableFunction("resource_groups", COLUMNS, _resource_groups, True),
    "resource_group_queries": TableFunction(
        "resource_group_queries", PROGRESS_COLUMNS, _resource_group_queries, True
    ),
    "resource_group_instances": TableFunction(
        "resource_group_instances", INSTANCE_COLUMNS, _resource_group_instances, True
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
