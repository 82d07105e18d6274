"""A query's memory (SPEC §8): the published record its bytes are charged to,
made the first time the query uses ``q.memory`` or ``map``, and ended with it.

``q.memory`` is a :class:`~resgroups.sched.memory.MemoryCounter` of the
query's own thread, kept in its :class:`~resgroups.query.extras.Extras`; what
it allocates is published in batches to one
:class:`~resgroups.sched.memory.QueryMemory`, which its
:class:`~resgroups.query.holdings.Holdings` keep (``published``), so that the
reconcile loop finds the bytes of a query whose handle was lost. A query
that never tracks a byte makes neither.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from resgroups.errors import InvalidParameter
from resgroups.query.states import ENTERED
from resgroups.sched.memory import QueryMemory

if TYPE_CHECKING:
    from resgroups.query.lifecycle import Query

log = logging.getLogger("resgroups.query")


def memory_state(query: Query) -> QueryMemory | None:
    """The query's published memory, created on first use (None: unmanaged, not
    entered, or ended). Only the query's own thread creates it (``map()`` does
    so before its tasks start)."""
    held = query.held
    published = held.published
    placement = query._placement
    if published is None and placement is not None and query.state in ENTERED:
        published = held.published = QueryMemory(
            query._engine.memory_ledger,
            placement.runtime.group_id,
            placement.budget,
            placement.ceiling,
            f"group={query.group}, user={query.user}",
            held.fail,
        )
    return published


def end_memory(query: Query) -> None:
    """Publish what is pending and return every byte the query still holds (its
    exit); what it never released is kept as its ``leaked_bytes``."""
    held = query.held
    extra = query._extra
    try:
        if extra is not None and extra.memory is not None:
            extra.memory.flush()
    except InvalidParameter as exc:  # released more than it allocated: do not mask
        log.warning("%s: memory accounting error at the end of the query: %s", query, exc)
    finally:
        published, held.published = held.published, None
        if published is not None:
            query._uses().leaked_bytes = published.finish()
