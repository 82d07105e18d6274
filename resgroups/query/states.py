"""The words a query is described in: its kinds, its states, where it runs."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from resgroups.catalog.model import GroupDef, RuleDef, Snapshot
    from resgroups.sched.memory import Budget
    from resgroups.sched.runtime import GroupRuntime

KINDS: Final = ("select", "ctas", "insert_select", "export", "other")
MANAGED_KINDS: Final = frozenset(KINDS) - {"other"}


class QueryState(Enum):
    """Where a query is in its life (``docs/queries.md`` "Lifecycle")::

    NEW --enter--> ADMITTING --slot+worker--> RUNNING --exit--> DONE
                                              |     ^
                                        suspend     resume (passes the gate again)
                                              v     |
                                             SUSPENDED
    """

    NEW = "new"
    ADMITTING = "admitting"
    RUNNING = "running"
    SUSPENDED = "suspended"
    DONE = "done"


# The states as module constants, compared with on the per-query path: reading an
# enum member through its class runs the enum metaclass's attribute hook, a global
# is a dict read (as the ticket's and the runner's states, sched/).
NEW: Final = QueryState.NEW
ADMITTING: Final = QueryState.ADMITTING
RUNNING: Final = QueryState.RUNNING
SUSPENDED: Final = QueryState.SUSPENDED
DONE: Final = QueryState.DONE
ENTERED: Final = frozenset({ADMITTING, RUNNING, SUSPENDED})


class Placement(NamedTuple):
    """Where a session's managed queries run, as resolved at one catalog version
    (``snapshot``): the group, its live runtime, its memory budget, the query
    memory ceiling (SPEC §5, §8) and the group's runaway-query rules (§16; empty
    for most groups, so that a query of one looks nothing else up). A session
    keeps the last one (``Session.placement``)."""

    group: GroupDef
    runtime: GroupRuntime
    budget: Budget
    ceiling: int | None
    rules: tuple[RuleDef, ...]
    snapshot: Snapshot
