"""A cursor's query: suspended between pages, admitted afresh as it resumes.

A paging cursor (SPEC §6) suspends its query between pages: the slot and
the worker go back (a counted query's by count), its tracked memory stays
charged, and its group counts it among its suspended cursors. Resuming
passes the gate again, as a new admission would (a refusal raises and
leaves it suspended); the query timeout does not run meanwhile, and neither
does the elapsed time rules see. When it was suspended and for how long
are kept in the query's :class:`~resgroups.query.extras.Extras`, made as it
is first suspended (on its own thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.errors import InvalidParameter, QueryCancelled
from resgroups.interrupts import Hold
from resgroups.query.states import RUNNING, SUSPENDED

if TYPE_CHECKING:
    from resgroups.query.lifecycle import Query


def suspend(query: Query) -> None:
    """Give the slot and the worker back between pages; memory stays charged."""
    if query.state is not RUNNING:
        raise InvalidParameter(f"suspend() on a {query.state.value} query")
    with Hold():
        query._give_back()
        extra = query._uses()  # a cursor: it comes back to its suspension
        if extra.memory is not None:  # charged while suspended: publish what is pending
            extra.memory.flush()
        extra.suspended_at = query._now()
        runtime = query.held.runtime
        if runtime is not None:
            runtime.suspend(+1)
            query.held.suspended = True
        query.state = SUSPENDED


def resume(query: Query) -> None:
    """Pass the gate again; a refusal raises and leaves the query suspended."""
    if query.state is not SUSPENDED:
        raise InvalidParameter(f"resume() on a {query.state.value} query")
    if query._cancelled:
        raise QueryCancelled(f"query cancelled [group={query.group}]")
    # the query timeout does not run while the cursor is suspended
    extra = query._uses()  # made as it was suspended
    now = query._now()
    query._timeout_at += now - extra.suspended_at
    extra.suspended_s += now - extra.suspended_at
    extra.suspended_at = now  # a refused resume may be retried
    if not query._cancelled and query._failure is None:
        query._stop_at = query._check_at = query._timeout_at
    with Hold(query._interrupted):
        runtime = query.held.runtime
        if runtime is not None:
            try:
                query._admit(now)
            except BaseException:
                query._give_back()
                raise
            query._meter_for_rules()
            runtime.suspend(-1)
            query.held.suspended = False
        query.state = RUNNING
    if extra.watched:  # its timeout runs again, later than it was
        query._engine.deadlines.watch(query)
