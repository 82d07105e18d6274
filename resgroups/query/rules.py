"""Runaway-query rules acting on a running query (SPEC §16).

A query of a group with rules carries a :class:`~resgroups.sched.rules.QueryRules`
in its :class:`~resgroups.query.extras.Extras` (a query of a group without
rules has none: its next rules check is never due, one compare per slow
checkpoint, nothing on the fast path). The rules are checked on the
slow path of a checkpoint, at most once a slice (``slice_ms``) by whichever
thread of the query reaches a checkpoint first, against the query's readings:

============  ==============================================================
cpu_time      CPU charged to the query (its thread and its tasks, at each
              slice end); while scheduling is disengaged its own thread is
              metered at each check instead
elapsed       engine-clock time since its first admission, suspended time out
memory        the high-water mark of its published memory (batched by 64 KiB)
rows, bytes   what it reported with ``q.scanned(rows, nbytes)``
============  ==============================================================

So a rule acts within one slice and one checkpoint of its threshold being
crossed. LOG logs and counts; KILL fails every thread of the query at its
next checkpoint with RunawayQuery and, with ``watch``, refuses the same
statement fingerprint at admission until the watch ends.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from resgroups.catalog.rules import KILL, LOG, MOVE
from resgroups.errors import (
    AdmissionRejected,
    MemoryLimitExceeded,
    QueryTimeout,
    QueueTimeout,
    RunawayQuery,
)
from resgroups.interrupts import Hold
from resgroups.query.states import RUNNING
from resgroups.sched.rules import QueryRules, describe_hit

if TYPE_CHECKING:
    from resgroups.catalog.model import GroupDef, RuleDef
    from resgroups.query.lifecycle import Query
    from resgroups.query.states import Placement

log = logging.getLogger("resgroups.rules")


def rules_for(placement: Placement, acted: frozenset[int] = frozenset()) -> QueryRules | None:
    """The rules of the group of ``placement`` for one query, as they were when it
    was resolved (None: the group has none); ``acted``: the rules that already
    acted on it (in a group it was moved from)."""
    rules = placement.rules
    return QueryRules(rules, placement.snapshot, acted) if rules else None


def current(query: Query, rules: QueryRules) -> QueryRules | None:
    """``rules`` as the catalog has them now: a rule dropped since the query was
    admitted stops acting on it, one altered acts as it is now (rules created
    since apply to the queries admitted after them). O(1) while the catalog
    does not change."""
    snap = query.session.engine.snapshot
    if rules.snapshot is snap:
        return rules
    runtime = query.held.runtime
    if runtime is None:
        return rules
    kept = [r for r in snap.rules_by_group.get(runtime.group_id, ()) if r.id in _ids(rules)]
    return QueryRules(kept, snap, rules.acted) if kept else None


def _ids(rules: QueryRules) -> frozenset[int]:
    return frozenset(r.id for r in rules.rules)


def watched(query: Query, group: GroupDef) -> GroupDef | None:
    """Before a query of ``group`` takes anything: if its statement is watched
    after a rule of the group acted, a KILL refuses it here (RunawayQuery) and a
    MOVE names the group it is admitted to instead; None when it is not watched."""
    engine = query.session.engine
    snap = engine.snapshot
    if not engine.watches or not snap.rules or query.statement is None:
        return None  # nothing watched: the fingerprint is not even computed
    watch = engine.watches.matching(group.id, query.fingerprint or "", snap.rules)
    if watch is None:
        return None
    rule = snap.rules[watch.rule_id]
    engine.rule_hits.record(rule.id)
    query.rule = rule.name
    target = snap.runtime_group(rule.target_id) if rule.target_id is not None else None
    if watch.action == MOVE and target is not None:
        query.moved_from = group.name
        return target
    raise RunawayQuery(
        f"query refused by resource rule {rule.name}: its statement is watched after a "
        f"{watch.action.upper()} until {_clock(watch.until_wall)} [group={group.name}, "
        f"user={query.user}]"
    )


def readings(query: Query, now: float) -> dict[str, int]:
    """What the query has used, per metric, in each metric's base unit."""
    published = query.held.published
    elapsed = now - query.admitted_at - query.suspended_s if query.admitted_at else 0.0
    return {
        "cpu_time": query.cpu_ns // 1_000_000,
        "elapsed": max(0, int(elapsed * 1000)),
        "memory": published.peak if published is not None else 0,
        "rows": query.rows_scanned,
        "bytes": query.bytes_scanned,
    }


def log_at_end(query: Query, rules: QueryRules, now: float) -> None:
    """The query ends: a LOG rule whose threshold it crossed since the last check
    still counts it (a KILL or a MOVE has nothing left to act on)."""
    values = readings(query, now)
    engine = query.session.engine
    for rule in rules.due(values, logs_only=True):
        engine.rule_hits.record(rule.id)
        query.rule = rule.name
        log.warning(
            "resource rule %s: query %d [group=%s, user=%s] %s (at its end)",
            rule.name,
            query.id,
            query.group,
            query.user,
            describe_hit(rule, values),
        )


def due(query: Query, now: float, *, own_thread: bool = True) -> None:
    """Act on the rules of ``query``'s group that are due (any thread of the
    query, at most once a slice). While the query's own thread is not metered
    for the scheduler, its CPU is metered here for rules on cpu_time."""
    extra = query._extra
    rules = extra.rules if extra is not None else None
    if extra is not None and rules is not None:
        rules = extra.rules = current(query, rules)  # a dropped rule stops acting
    if extra is None or rules is None:  # no rule left, or moved to a group without rules
        query._rules_at = math.inf
        return
    query._rules_at = now + query._engine.slice_s
    held = query.held
    runner = held.runner
    # metered for the scheduler (a runner's, or a counted worker's while engaged):
    # its mark is the charge's, read at its slice end or as it leaves
    scheduled = (runner is not None and runner.scheduled) or held.metered_at is not None
    if own_thread and not scheduled and query._cpu_mark and "cpu_time" in rules.metrics:
        query.cpu_ns += query._cpu_since_mark()
        query._mark_cpu()
    can_move = own_thread and query.state is RUNNING and extra.batch is None
    # under a hold (rare: once a slice, in a group with rules): a signal waits until
    # the rules' locks and the hit counts are back and what a rule did is whole
    with Hold(query._interrupted):
        check_rules(query, rules, now, can_move=can_move)
    if rules.move_left:  # a MOVE is due: the own thread takes it at its next checkpoint
        query._rules_at = now


def meter_for_rules(query: Query) -> None:
    """Start metering its thread for rules on cpu_time when it is not scheduled
    (the scheduler meters a scheduled one)."""
    extra = query._extra
    rules = extra.rules if extra is not None else None
    if rules is not None and "cpu_time" in rules.metrics and not query._cpu_mark:
        query._mark_cpu()


def arm_rules(query: Query) -> None:
    """Admitted with rules: check them at the end of its first slice."""
    extra = query._extra
    if extra is not None and extra.rules is not None:
        query._rules_at = query._checked_at + query._engine.slice_s
        meter_for_rules(query)
        query._arm(query._checked_at)


def check_rules(query: Query, rules: QueryRules, now: float, *, can_move: bool) -> None:
    """Act on the rules due now (any thread of the query; see the module). A
    KILL raises RunawayQuery here and fails the query's other threads; a MOVE
    (only where ``can_move``: the query's own thread, no ``map`` running) takes
    the query to the rule's group before it returns."""
    engine = query.session.engine
    values = readings(query, now)
    killed: RunawayQuery | None = None
    moved: tuple[RuleDef, str] | None = None
    for rule in rules.due(values, can_move=can_move):
        hit = describe_hit(rule, values)
        engine.rule_hits.record(rule.id)
        query.rule = rule.name
        if rule.action == LOG:
            log.warning(
                "resource rule %s: query %d [group=%s, user=%s] %s",
                rule.name,
                query.id,
                query.group,
                query.user,
                hit,
            )
        elif rule.action == KILL:
            _watch(query, rule)
            killed = RunawayQuery(
                f"query killed by resource rule {rule.name} [group={query.group}, "
                f"user={query.user}]: {hit}"
            )
        elif rule.action == MOVE and moved is None:  # the first MOVE due, in creation order
            _watch(query, rule)
            moved = rule, hit
    if killed is not None:
        log.warning("resource rule: query %d: %s", query.id, killed.message)
        query.fail(killed)
        raise RunawayQuery(killed.message)
    if moved is not None:
        rule, hit = moved
        target = engine.snapshot.group_name(rule.target_id or 0)
        log.warning(
            "resource rule %s: query %d [group=%s, user=%s] moves to %s: %s",
            rule.name,
            query.id,
            query.group,
            query.user,
            target,
            hit,
        )
        move(query, rule)


def move(query: Query, rule: RuleDef) -> None:
    """A rule's MOVE (SPEC §16), on the query's own thread at a checkpoint: its
    tracked memory goes to the target group's budget (or MemoryLimitExceeded,
    and it stays), the slot and the worker in its group are given back, and it
    passes the target's gate at the head of its queue holding no worker (a
    QueueTimeout there ends it), then takes a worker charged to the target.
    The target's rules apply to it from here."""
    engine = query._engine
    snap = engine.snapshot
    target = snap.runtime_group(rule.target_id) if rule.target_id is not None else None
    if target is None:  # the rule changed meanwhile (it cannot be dropped under it)
        return
    placement = engine.placement(query.session, target)
    held = query.held
    old_runtime, old_group = held.runtime, query.group
    extra = query._uses()  # a rule acts: its query keeps its rules there
    acted = extra.rules.acted if extra.rules is not None else frozenset()
    with Hold(query._interrupted):
        published = held.published
        if published is not None:
            if extra.memory is not None:
                extra.memory.flush()
            try:
                published.move_to(
                    placement.runtime.group_id,
                    placement.budget,
                    f"group={target.name}, user={query.user}",
                )
            except MemoryLimitExceeded as exc:  # the query fails, every thread of it
                error = MemoryLimitExceeded(
                    f"{exc.message} (moving there by resource rule {rule.name})"
                )
                query.fail(error)
                raise error from None
        query._give_back()
        query._placement = placement
        held.runtime = placement.runtime
        held.group = target.name
        extra.moved_from = old_group
        extra.fence = None  # fleet mode: the target's, taken as it is admitted
        extra.rules = rules_for(placement, acted)  # a rule acts once per query
        if old_runtime is not None and old_runtime.dropped:
            engine.runtimes.query_ended(old_runtime)
        try:
            query._admit(query._now(), front=True)
        except (AdmissionRejected, QueueTimeout, QueryTimeout) as exc:
            raise type(exc)(
                f"{exc.message} (moved there by resource rule {rule.name} from {old_group})"
            ) from None
        meter_for_rules(query)
        query._rules_at = (
            query._checked_at + engine.slice_s if extra.rules is not None else math.inf
        )
        query._arm(query._checked_at)


def _watch(query: Query, rule: RuleDef) -> None:
    """After a KILL or a MOVE: watch the query's statement in its group."""
    fingerprint = query.fingerprint if rule.watch_ms else None
    if fingerprint is not None:
        query.session.engine.watches.watch(
            rule.group_id, fingerprint, rule.id, rule.action, rule.watch_ms / 1000
        )


def _clock(wall: float) -> str:
    if not math.isfinite(wall):
        return "further notice"
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="seconds")
