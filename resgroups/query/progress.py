"""Where a query stands now: the rows of ``resource_group_queries()`` (SPEC:
explainability).

A row is read without stopping the query: each field is true of a moment
during the read, taken from the query's :class:`~resgroups.query.Holdings`
(its ticket, runner and published memory) and its clock fields.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING, Final, NamedTuple

from resgroups.query.states import DONE, NEW, SUSPENDED
from resgroups.sched.admission import TICKET_QUEUED
from resgroups.sched.cpu import RUNNER_RUNNING, RUNNER_WAITING

if TYPE_CHECKING:
    from resgroups.query.lifecycle import Query


class QueryProgress(NamedTuple):
    """One row of ``resource_group_queries()``."""

    query_id: int
    user_name: str
    resource_group: str | None
    state: str  # queued, running, parked, suspended
    blocked_by: str | None  # group_queue, fleet_lease, worker, cpu_budget, cpu_limit
    queue_position: int | None  # 1-based in arrival order, while queued in the group
    waited_millis: int  # queued: since submission; else the wait before it first ran
    timeout_in_millis: int | None  # the nearer of the queue and query deadlines
    cpu_nanos: int
    memory_used_bytes: int
    workers_held: int
    kind: str
    started_at: datetime | None
    stalled: bool  # running, but no checkpoint for longer than the stall threshold
    pool: str  # the pool whose workers it holds
    cpu_time_millis: int  # CPU charged to it, as rules on cpu_time see it (SPEC §16)
    rows_scanned: int  # what the body reported with q.scanned()
    bytes_scanned: int
    statement: str | None  # the statement text the executor gave
    rule: str | None  # the last runaway-query rule that acted on it
    moved_from: str | None  # the group a rule's MOVE took it from


PROGRESS_COLUMNS: Final = (
    ("query_id", "int"), ("user_name", "text"), ("resource_group", "text"), ("state", "text"),
    ("blocked_by", "text"), ("queue_position", "int"), ("waited_millis", "int"),
    ("timeout_in_millis", "int"), ("cpu_nanos", "int"), ("memory_used_bytes", "int"),
    ("workers_held", "int"), ("kind", "text"), ("started_at", "timestamptz"),
    ("stalled", "bool"), ("pool", "text"), ("cpu_time_millis", "int"),
    ("rows_scanned", "int"), ("bytes_scanned", "int"), ("statement", "text"), ("rule", "text"),
    ("moved_from", "text"),
)  # fmt: skip


def progress_of(query: Query) -> QueryProgress | None:
    """``query``'s row (None: unmanaged, not started, or done)."""
    held = query.held
    runtime = held.runtime
    state = query.state
    if runtime is None or state is NEW or state is DONE:
        return None
    engine = query.session.engine
    now = engine.now()
    ticket, runner = held.ticket, held.runner
    position = None
    blocked: str | None = None
    deadline = query.timeout_at
    if state is SUSPENDED:
        shown = "suspended"
    elif ticket is not None and ticket.state is TICKET_QUEUED:
        shown = "queued"
        blocked = runtime.gate.blocked_by(ticket) or "group_queue"  # parent:x, user_limit
        position = runtime.gate.position(ticket)
        deadline = min(deadline, ticket.queue_deadline)
    elif held.counted:
        shown = "running"
    elif held.seeking:
        shown, blocked = "queued", "fleet_lease"
    elif runner is not None and runner.state is RUNNER_WAITING:
        shown = "parked"
        blocked = engine.dispatcher.blocked_by(runner) or "worker"
    elif runner is not None and runner.state is RUNNER_RUNNING:
        shown = "running"
    else:  # between the gate and the worker, or leaving
        shown, blocked = ("queued", "group_queue") if ticket is None else ("parked", "worker")
    waited = now - query.submitted_at if shown == "queued" else query.waited_s
    own = held.counted or (runner is not None and runner.state is RUNNER_RUNNING)
    workers = int(own) + query.task_workers()
    published = held.published
    return QueryProgress(
        query_id=query.id,
        user_name=query.user,
        resource_group=query.group,
        state=shown,
        blocked_by=blocked,
        queue_position=position,
        waited_millis=round(max(0.0, waited) * 1000),
        timeout_in_millis=(
            None if deadline == math.inf else max(0, round((deadline - now) * 1000))
        ),
        cpu_nanos=query.cpu_ns,
        memory_used_bytes=published.published if published is not None else 0,
        workers_held=workers,
        kind=query.kind,
        started_at=query.started_at,
        stalled=shown == "running" and query.stalled(now),
        pool=query.pool_name,
        cpu_time_millis=query.cpu_ns // 1_000_000,
        rows_scanned=query.rows_scanned,
        bytes_scanned=query.bytes_scanned,
        statement=query.statement,
        rule=query.rule,
        moved_from=query.moved_from,
    )
