"""The live groups: one runtime per catalog group, kept equal to the catalog.

:class:`GroupRuntimes` owns every :class:`GroupRuntime` (gate, CPU state,
memory budget) and applies catalog snapshots to them: ALTER online, DROP
once idle, CREATE at once. Whatever the catalog does, the live policy is the
one of the latest version applied:

    applied(v) happens under the catalog's write lock, in version order, and
    a snapshot older than the last one applied is ignored,

so two DDL statements racing can never leave a gate enforcing the older
value (the catalog calls :meth:`apply` from inside :meth:`Catalog.write`,
and a replica's follower does the same for each record it reads).

Lock order: the catalog's write lock, then ``_lock``, then the dispatcher's
and the gates' own locks. The per-query path (:meth:`runtime_for` on a
known group) takes no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from resgroups.catalog.model import GroupDef, Snapshot
from resgroups.sched.cpu import BURST_S
from resgroups.sched.memory import MemoryLedger
from resgroups.sched.pool import CpuReading, Dispatcher
from resgroups.sched.runtime import GroupRuntime
from resgroups.sched.stats import (
    NO_CPU_READING,
    CounterReading,
    CpuShareReading,
    GroupStatistics,
    group_statistics,
    min_shares,
)


class GroupRuntimes:
    """Group id -> live runtime, for the groups of the catalog and the dropped
    groups whose queries still run."""

    def __init__(
        self,
        now: Callable[[], float],
        dispatcher: Dispatcher,
        memory: MemoryLedger,
        *,
        cpus: float,
        enabled: bool,
        snapshot: Callable[[], Snapshot],
        quotas: bool = False,
    ) -> None:
        self._now = now
        self._dispatcher = dispatcher
        self._memory = memory
        self._cpus = cpus
        self._enabled = enabled
        self._snapshot = snapshot  # the catalog's current snapshot
        self._quotas = quotas  # fleet quota mode: a new group's gate starts at quota 0
        self._runtimes: dict[int, GroupRuntime] = {}
        self._special: set[int] = set()  # groups with a CPU limit or the fair policy
        self._dropped: set[int] = set()  # dropped groups whose queries still run
        self._group_count = 1
        self._lock = threading.Lock()
        self.applied_version = -1
        # the version every runtime has been configured to (set once apply is done;
        # the fleet's modes adopt and report through it, fleet/modes.py)
        self.configured_version = 0

    # ---- applying the catalog ----------------------------------------------------

    def _new(self, group: GroupDef) -> GroupRuntime:
        runtime = GroupRuntime(group, self._now, self._dispatcher, 0 if self._quotas else None)
        self._configure(runtime, group)
        return runtime

    def _configure(self, runtime: GroupRuntime, group: GroupDef) -> None:
        runtime.configure(group, self._cpus)
        self._memory.set_group_limit(group.id, group.name, group.memory_limit)
        if group.cpu_limit_centi_pct is not None or group.scheduling_policy == "fair":
            self._special.add(group.id)
        else:
            self._special.discard(group.id)

    def apply(self, snapshot: Snapshot) -> None:
        """Make the live gates equal ``snapshot``: ALTER online, DROP once idle.

        Called in version order under the catalog's write lock; an older
        snapshot than the last one applied changes nothing. The snapshot that
        follows the last one applied touches only the groups its record
        changed (O(1) in the number of groups); any other is synced in full.
        """
        with self._lock:
            if snapshot.version < self.applied_version:
                return
            if snapshot.version == self.applied_version + 1:
                touched: Iterable[int] = snapshot.touched_groups
            else:
                touched = set(self._runtimes) | set(snapshot.group_by_id)
            self.applied_version = snapshot.version
            created = set()
            for group_id in touched:  # new groups first, so that a child finds its parent
                group = snapshot.runtime_group(group_id)
                if group is not None and group_id not in self._runtimes:
                    self._runtimes[group_id] = self._new(group)  # configured as made
                    created.add(group_id)
            # the tree before the settings: a record that moves a group and raises its
            # limit never admits its queue under the limit outside the new tree
            for group_id in touched:
                runtime, group = self._runtimes.get(group_id), snapshot.runtime_group(group_id)
                if runtime is not None and group is not None:
                    self._link_locked(runtime, group)
            for group_id in touched:
                if group_id not in created:
                    self._sync_locked(group_id, snapshot.runtime_group(group_id))
            self._group_count = snapshot.group_count()
            self._update_engagement()
            self.configured_version = snapshot.version

    def _sync_locked(self, group_id: int, group: GroupDef | None) -> None:
        runtime = self._runtimes.get(group_id)
        if group is not None and runtime is None:
            self._runtimes[group_id] = self._new(group)
        elif group is not None and runtime is not None:
            self._configure(runtime, group)
        elif runtime is not None:
            self._mark_dropped_locked(runtime)
            if self._idle(runtime):
                self._forget_locked(runtime)

    def _idle(self, runtime: GroupRuntime) -> bool:
        """Nothing held or queued in its subtree, no tracked byte in its budget:
        a dropped group's runtime may go (an inner one stays while a descendant's
        queries hold its slots and bytes)."""
        budget = self._memory.groups.get(runtime.group_id)
        return runtime.idle and (budget is None or budget.used == 0)

    def _link_locked(self, runtime: GroupRuntime, group: GroupDef) -> None:
        """Nest the runtime's gate under its parent's (SPEC §14), online."""
        parent = self._runtimes.get(group.parent_id) if group.parent_id is not None else None
        runtime.gate.set_parent(parent.gate if parent is not None else None)
        if parent is None:
            self._memory.set_parent(group.id, group.name, None, "")
        else:
            self._memory.set_parent(group.id, group.name, parent.group_id, parent.definition.name)

    def _mark_dropped_locked(self, runtime: GroupRuntime) -> None:
        """The group is gone from the catalog; its runtime stays while queries run."""
        runtime.dropped = True
        self._dropped.add(runtime.group_id)
        self._special.discard(runtime.group_id)

    def _forget_locked(self, runtime: GroupRuntime) -> None:
        # its gate and budget stay linked to their parents' (idle, they count for
        # nothing there): a query that resolved to it just before still counts at
        # every level if it enters
        del self._runtimes[runtime.group_id]
        self._dropped.discard(runtime.group_id)
        self._special.discard(runtime.group_id)
        runtime.forget()
        self._memory.forget(runtime.group_id)

    def _update_engagement(self) -> None:
        """Engaged while two or more groups exist, or any has a CPU limit or the fair
        policy, or queries of dropped groups still run (SPEC §7). Lock held; O(1)."""
        engaged = self._group_count >= 2 or bool(self._special) or bool(self._dropped)
        self._dispatcher.set_engaged(engaged and self._enabled)

    # ---- the query path ------------------------------------------------------------

    def runtime_for(self, group: GroupDef) -> GroupRuntime:
        """The live state of a group a query resolved to (even one dropped since)."""
        runtime = self._runtimes.get(group.id)  # the common case: no lock
        if runtime is not None:
            return runtime
        with self._lock:
            runtime = self._runtimes.get(group.id)
            if runtime is None:
                runtime = self._runtimes[group.id] = self._new(group)
                self._link_locked(runtime, group)
                if self._snapshot().runtime_group(group.id) is None:
                    self._mark_dropped_locked(runtime)
                self._update_engagement()
            return runtime

    def query_ended(self, runtime: GroupRuntime) -> None:
        """A query of ``runtime`` ended: a dropped group goes once idle, and so do
        its dropped ancestors that this leaves idle."""
        if not (runtime.dropped and runtime.idle):
            return
        with self._lock:
            at: GroupRuntime | None = runtime
            while at is not None and at.dropped and self._runtimes.get(at.group_id) is at:
                if not self._idle(at):
                    break
                self._forget_locked(at)
                parent_id = at.definition.parent_id
                at = self._runtimes.get(parent_id) if parent_id is not None else None
            self._update_engagement()

    # ---- observation ----------------------------------------------------------------

    def get(self, group_id: int) -> GroupRuntime | None:
        return self._runtimes.get(group_id)

    def all(self) -> list[GroupRuntime]:
        with self._lock:
            return list(self._runtimes.values())

    def statistics(
        self,
        snapshot: Snapshot,
        process_memory_limit: int,
        fleet_counts: Mapping[str, int] | None = None,
        fleet_quotas: Mapping[str, int] | None = None,
    ) -> list[GroupStatistics]:
        """One frozen statistics record per group of ``snapshot``, creation order;
        ``fleet_counts`` (fleet mode) gives the leases (quota mode: the quotas)
        held fleet-wide per group identity (``GroupDef.uid``), ``fleet_quotas``
        (quota mode) this instance's."""
        shares = min_shares(snapshot.groups)
        with self._lock:
            runtimes = dict(self._runtimes)
        ledger = self._memory
        with ledger.lock:
            memory = {gid: budget.used for gid, budget in ledger.groups.items()}
        cpu = {gid: _share_reading(r) for gid, r in self._dispatcher.cpu_readings().items()}
        lanes = self._dispatcher.shown_lanes()
        now = self._now()
        return [
            group_statistics(
                g,
                runtimes[g.id].reading(memory.get(g.id, 0), now)
                if g.id in runtimes
                else CounterReading(),
                min_share_pct=shares[g.id],
                cpus=self._cpus,
                process_memory_limit=process_memory_limit,
                fleet_active=None if fleet_counts is None else fleet_counts.get(g.uid, 0),
                cpu=cpu.get(g.id, NO_CPU_READING),
                base_group=None if g.base_id is None else snapshot.group_name(g.base_id),
                parent_group=None if g.parent_id is None else snapshot.group_name(g.parent_id),
                fleet_quota=(
                    None
                    if fleet_quotas is None or g.max_active_queries is None
                    else fleet_quotas.get(g.uid, 0)
                ),
                cpu_lane=None if lanes is None else lanes.get(g.id, 0),
            )
            for g in snapshot.groups
        ]


def _share_reading(reading: CpuReading) -> CpuShareReading:
    budget, limit = reading.budget_ns, reading.limit_cores
    fractional = budget is not None and limit is not None
    return CpuShareReading(
        entitled_pct=reading.share.entitled_pct,
        used_pct=reading.share.used_pct,
        budget_ms=budget / 1e6 if budget is not None else None,
        refill_cores=limit if fractional else None,
        burst_ms=limit * BURST_S * 1000 if fractional and limit is not None else None,
    )
