"""Interrupting native work: ``on_cancel`` callbacks, when they are due, firing them.

A body inside one native call (DuckDB, Polars, DataFusion) reaches no
checkpoint, so it cannot see a cancel, a failure, its query timeout or
(fleet mode) the instance's fence. ``q.on_cancel(callback)`` registers a
callback that the engine's one deadline watcher (resgroups.deadlines) calls
once, on its own thread, when any of those comes; the body then raises its
error at its next checkpoint, as always. A query that never calls
``on_cancel`` is never watched: the callbacks and the flag live in its
:class:`~resgroups.query.extras.Extras`, made by the first ``on_cancel``
(on the query's own thread), and ``__exit__`` reads one field to know there
is nothing to unwatch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from resgroups.errors import InvalidParameter
from resgroups.fleet.modes import seconds_left
from resgroups.query.states import DONE, SUSPENDED

if TYPE_CHECKING:
    from resgroups.query.lifecycle import Query

log = logging.getLogger("resgroups.query")
INF: Final = float("inf")


def on_cancel(query: Query, callback: Callable[[], object]) -> None:
    """``Query.on_cancel``: keep ``callback`` and have the watcher watch ``query``."""
    if query.state is DONE:
        raise InvalidParameter("on_cancel() on a query that has ended")
    extra = query._uses()
    extra.on_cancel = (*extra.on_cancel, callback)
    extra.watched = True
    query._engine.deadlines.watch(query)


def due_at(query: Query) -> float:
    """When the on_cancel callbacks are due, on the engine clock (the watcher's)."""
    if query._cancelled or query._failure is not None:
        return -INF
    if query.state is SUSPENDED:  # the timeout does not run meanwhile
        return INF
    due = query._timeout_at
    extra = query._extra
    if extra is None:
        return due
    rules = extra.rules
    if rules is not None and rules.kill_after_ms is not None and query.admitted_at:
        # a rule that KILLs on elapsed alone interrupts native work at its threshold
        # (a millisecond past it: the rule needs elapsed > its threshold)
        kill_at = query.admitted_at + extra.suspended_s + (rules.kill_after_ms + 1) / 1000
        due = min(due, kill_at)
    if extra.fence is not None:  # fleet mode: native work stops at the fence too
        return min(due, query._now() + seconds_left(extra.fence))
    return due


def fire(query: Query) -> None:
    """The watcher's thread: call each pending callback once."""
    extra = query._extra
    if extra is None:  # on_cancel() made it: nothing was ever due
        return
    callbacks, extra.on_cancel = extra.on_cancel, ()
    if extra.rules is not None:  # an interrupted body checks its rules at once
        query._rules_at = query._check_at = -INF
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("%s: an on_cancel callback failed", query)
