"""Managed queries (SPEC §2, §6-§8): a query's life, what it holds, its
parallel work and where it stands.

=================  ==========================================================
module             holds
=================  ==========================================================
``states``         the kinds of query, ``QueryState``, ``Placement``
``holdings``       ``Holdings``: what a query holds, the one record of it, and
                   the one way to give it back (``release``; the reconcile
                   loop's ``give_back``)
``lifecycle``      ``Query``: enter (resolve, admit), checkpoints, cursors,
                   cancellation, exit; its clock fields
``parallel``       ``q.map``: ``Task``, the batch of a map, the task runners
``progress``       ``QueryProgress``: the rows of ``resource_group_queries()``
=================  ==========================================================

Within the package a module imports only those above it in this list
(``progress`` and ``parallel`` name ``Query`` for type hints only).
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
