"""One frozen statistics record per group: the single source of every counter.

``resource_groups()``, ``Engine.resource_groups()`` and failure dumps all
render :class:`GroupStatistics`; nothing keeps a second copy of a counter.
The fields are the columns of SPEC §9, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Final, NamedTuple

from resgroups.catalog.model import GroupDef


class CpuShareReading(NamedTuple):
    """A group's share of the CPU over the window, and its token bucket."""

    entitled_pct: float = 0.0
    used_pct: float = 0.0
    budget_ms: float | None = None
    refill_cores: float | None = None
    burst_ms: float | None = None


NO_CPU_READING: Final = CpuShareReading()


class CounterReading(NamedTuple):
    """Live counters of one group at one instant (all 0 until work has run)."""

    active_queries: int = 0
    queued_queries: int = 0
    oldest_queue_wait_millis: int = 0
    memory_used_bytes: int = 0
    cpu_nanos_total: int = 0
    cpu_wait_nanos_total: int = 0
    admission_rejections: int = 0
    admission_timeouts: int = 0
    admitted_total: int = 0


@dataclass(frozen=True)
class GroupStatistics:
    name: str
    memory_limit_bytes: int
    max_active_queries: int | None
    max_queued_queries: int | None
    queue_timeout_millis: int
    cpu_weight: int
    active_queries: int
    queued_queries: int
    oldest_queue_wait_millis: int
    memory_used_bytes: int
    cpu_nanos_total: int
    cpu_wait_nanos_total: int
    admission_rejections: int
    admission_timeouts: int
    cpu_min_share_pct: float
    cpu_limit_pct: float | None
    cpu_limit_cores: float | None
    scheduling_policy: str
    admitted_total: int
    fleet_active_queries: int | None  # fleet mode (§11): leases held fleet-wide; else NULL
    cpu_entitled_pct: float  # weight's share among groups wanting CPU over the window
    cpu_used_pct: float  # CPU charged over the same window, % of the process's CPUs
    cpu_share_error_pct: float  # used minus entitled
    cpu_budget_millis: float | None  # fractional CPU limit: tokens now (negative: debt)
    cpu_refill_cores: float | None  # fractional CPU limit: the refill rate, in cores
    cpu_burst_millis: float | None  # fractional CPU limit: the most the budget holds
    base_group: str | None  # a variant (tenants::acme): its base group (tenants); else NULL
    fleet_quota: int | None  # fleet quota mode, a limited group: this instance's share; else NULL
    parent_group: str | None  # nested (SPEC §14): the group it is nested in; else NULL
    max_active_queries_per_user: int | None  # the slots one user holds in its subtree
    cpu_lane: int | None  # priority lane (nice above the process's) while lanes are on; else NULL

    def row(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in COLUMN_NAMES)


COLUMNS: Final[tuple[tuple[str, str], ...]] = tuple(
    (f.name, {"str": "text", "float": "float"}.get(str(f.type).split(" ")[0], "int"))
    for f in fields(GroupStatistics)
)
COLUMN_NAMES: Final = tuple(name for name, _ in COLUMNS)


def effective_memory_limit(group_limit: int, process_limit: int) -> int:
    """The group's ceiling after the process cap; 0 means none."""
    limits = [limit for limit in (group_limit, process_limit) if limit > 0]
    return min(limits) if limits else 0


def group_statistics(
    group: GroupDef,
    counters: CounterReading,
    *,
    min_share_pct: float,
    cpus: float,
    process_memory_limit: int,
    fleet_active: int | None = None,
    cpu: CpuShareReading = NO_CPU_READING,
    base_group: str | None = None,
    fleet_quota: int | None = None,
    parent_group: str | None = None,
    cpu_lane: int | None = None,
) -> GroupStatistics:
    """Combine a group's definition with its counters into the row of §9;
    ``min_share_pct`` is :func:`min_shares`' for the group."""
    limit_centi = group.cpu_limit_centi_pct
    limit_pct = None if limit_centi is None else limit_centi / 100
    return GroupStatistics(
        name=group.name,
        memory_limit_bytes=effective_memory_limit(group.memory_limit, process_memory_limit),
        max_active_queries=group.max_active_queries,
        max_queued_queries=group.max_queued_queries,
        queue_timeout_millis=group.queue_timeout_ms,
        cpu_weight=group.cpu_weight,
        active_queries=counters.active_queries,
        queued_queries=counters.queued_queries,
        oldest_queue_wait_millis=counters.oldest_queue_wait_millis,
        memory_used_bytes=counters.memory_used_bytes,
        cpu_nanos_total=counters.cpu_nanos_total,
        cpu_wait_nanos_total=counters.cpu_wait_nanos_total,
        admission_rejections=counters.admission_rejections,
        admission_timeouts=counters.admission_timeouts,
        cpu_min_share_pct=min_share_pct,
        cpu_limit_pct=limit_pct,
        cpu_limit_cores=None if limit_pct is None else limit_pct / 100 * cpus,
        scheduling_policy=group.scheduling_policy,
        admitted_total=counters.admitted_total,
        fleet_active_queries=fleet_active,
        # window estimates: three decimals are more than they can tell
        cpu_entitled_pct=round(cpu.entitled_pct, 3),
        cpu_used_pct=round(cpu.used_pct, 3),
        cpu_share_error_pct=round(cpu.used_pct - cpu.entitled_pct, 3),
        cpu_budget_millis=None if cpu.budget_ms is None else round(cpu.budget_ms, 3),
        cpu_refill_cores=cpu.refill_cores,
        cpu_burst_millis=cpu.burst_ms,
        base_group=base_group,
        fleet_quota=fleet_quota,
        parent_group=parent_group,
        max_active_queries_per_user=group.max_active_queries_per_user,
        cpu_lane=cpu_lane,
    )


def min_shares(groups: Iterable[GroupDef]) -> dict[int, float]:
    """Each group's least share of the CPUs in percent when every group wants CPU
    (SPEC §7, §14): its weight's part of its siblings' (the top-level groups' at
    the top) times its parent's share, capped by its own ``cpu_limit`` at every
    level. O(n) in the groups."""
    listed = list(groups)
    by_id = {g.id: g for g in listed}
    siblings: dict[int | None, int] = {}
    for g in listed:
        parent = g.parent_id if g.parent_id in by_id else None
        siblings[parent] = siblings.get(parent, 0) + g.cpu_weight
    shares: dict[int, float] = {}

    def share(g: GroupDef) -> float:
        known = shares.get(g.id)
        if known is not None:
            return known
        parent = by_id.get(g.parent_id) if g.parent_id is not None else None
        above = 100.0 if parent is None else share(parent)
        mine = g.cpu_weight / siblings[None if parent is None else parent.id] * above
        limit = g.cpu_limit_centi_pct
        if limit is not None:
            mine = min(mine, limit / 100)
        shares[g.id] = mine
        return mine

    for g in listed:
        share(g)
    return shares
