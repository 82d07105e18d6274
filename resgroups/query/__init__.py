"""Managed queries (SPEC §2, §6-§8): a query's life, what it holds, its
parallel work and where it stands.

=================  ==========================================================
module             holds
=================  ==========================================================
``states``         the kinds of query, ``QueryState``, ``Placement``
``holdings``       ``Holdings``: what a query holds, the one record of it, and
                   the one way to give it back (``release``; the reconcile
                   loop's ``give_back``)
``extras``         ``Extras``: what a query keeps only once it uses a feature
``cursors``        a cursor's suspension between pages and its resumption
``memory``         a query's published memory: made on first use of
                   ``q.memory`` or ``map``, every byte returned at its end
``native``         ``on_cancel`` callbacks for native work, when they are due
``parallel``       ``q.map``: ``Task``, the batch of a map, the task runners
``progress``       ``QueryProgress``: the rows of ``resource_group_queries()``
``rules``          the runaway-query rules acting on a running query
``waiting``        the slow path of admission: the queue, a lease, a worker,
                   a lane, the promotion at a first slice end
``lifecycle``      ``Query``: enter (resolve, admit), checkpoints,
                   cancellation, exit; its clock fields
=================  ==========================================================

At run time a module imports only those above it in this list (the
import-linter contract "a query's modules are layered"); type hints may
name any of them (``Query``, a map's batch).
"""

from resgroups.query.holdings import Holdings
from resgroups.query.lifecycle import Query
from resgroups.query.parallel import Task
from resgroups.query.progress import PROGRESS_COLUMNS, QueryProgress
from resgroups.query.states import KINDS, MANAGED_KINDS, Placement, QueryState

__all__ = [
    "KINDS",
    "MANAGED_KINDS",
    "PROGRESS_COLUMNS",
    "Holdings",
    "Placement",
    "Query",
    "QueryProgress",
    "QueryState",
    "Task",
]
