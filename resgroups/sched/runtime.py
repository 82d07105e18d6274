"""The live state of one group: its gate and the queries that belong to it.

A runtime is keyed by the group's identity. It outlives a DROP while the
group still has queries (they finish under its last settings) and is removed
once idle; a group created again under the same name gets a new runtime,
with fresh counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from resgroups.catalog.model import GroupDef
from resgroups.sched.admission import GateConfig, GateRuntime
from resgroups.sched.cpu import GroupCpu
from resgroups.sched.stats import CounterReading

if TYPE_CHECKING:
    from resgroups.sched.pool import Dispatcher


def gate_config(group: GroupDef, quota: int | None = None) -> GateConfig:
    """The gate's settings: the group's, with ``max_active_queries`` lowered to the
    instance's fleet quota in quota mode (``quota``; None: not in quota mode)."""
    limit = group.max_active_queries
    if limit is not None and quota is not None:
        limit = min(limit, quota)
    return GateConfig(
        name=group.name,
        max_active=limit,
        max_queued=group.max_queued_queries,
        queue_timeout_ms=group.queue_timeout_ms,
        policy=group.scheduling_policy,
        max_per_user=group.max_active_queries_per_user,
    )


class GroupRuntime:
    def __init__(
        self,
        group: GroupDef,
        now: Callable[[], float],
        dispatcher: Dispatcher,
        quota: int | None = None,
    ) -> None:
        self.group_id = group.id
        self.definition = group
        self.dropped = False
        self.quota = quota  # fleet quota mode: the slots this instance may use; else None
        self.gate = GateRuntime(gate_config(group, quota), now, dispatcher.lock)  # one lock
        self.suspended = 0  # cursors between pages (guarded by the gate's lock)
        self.fleet_waiting = 0  # holding a local slot, waiting for a fleet lease (gate's lock)
        self._dispatcher = dispatcher
        with dispatcher.lock:
            self.cpu: GroupCpu = dispatcher.core.group(group.id, group.name)

    def configure(self, group: GroupDef, cpus: float) -> None:
        """Apply an ALTER or a RENAME online. In fleet quota mode a lowered limit
        admits nothing new until the quota keeper has checked this instance's
        quota against it (``set_quota``)."""
        old = self.definition.max_active_queries
        new = group.max_active_queries
        if self.quota is not None and new is not None and (old is None or new < old):
            self.quota = 0
        with self.gate.lock:  # the lease mode decides on the limit under it
            self.definition = group
        self.gate.configure(gate_config(group, self.quota))
        centi = group.cpu_limit_centi_pct
        limit_cores = None if centi is None else centi / 10000 * cpus
        self._dispatcher.configure(
            group.id,
            group.name,
            group.cpu_weight,
            limit_cores,
            group.scheduling_policy,
            parent=group.parent_id,
        )

    def set_quota(self, quota: int) -> None:
        """Fleet quota mode: admit at most ``quota`` at once from now on (queries
        running above it finish; nothing new is admitted meanwhile)."""
        self.quota = quota
        self.gate.configure(gate_config(self.definition, quota))

    def fleet_wait(self, delta: int) -> None:
        with self.gate.lock:
            self.fleet_waiting += delta

    def fleet_timed_out(self) -> None:
        """A wait for a fleet lease ended at the queue timeout: an admission timeout."""
        with self.gate.lock:
            self.gate.gate.admission_timeouts += 1

    def suspend(self, delta: int) -> None:
        with self.gate.lock:
            self.suspended += delta

    @property
    def idle(self) -> bool:
        gate = self.gate.gate  # its subtree's too: an inner group holds what is below
        return not gate.load and not gate.queued and not gate.waiting_below and not self.suspended

    def forget(self) -> None:
        """The group is gone and idle: drop its CPU state too."""
        with self._dispatcher.lock:
            self._dispatcher.core.forget(self.group_id)

    def reading(self, memory_used: int, now: float) -> CounterReading:
        """The live counters at ``now`` (one reading of the clock for every group
        of a listing, so that the waits of a parent and its child compare);
        ``memory_used`` is the sum over the group's queries."""
        with self.gate.lock:
            gate = self.gate.gate
            return CounterReading(
                # an inner group's: its subtree's (SPEC §14)
                active_queries=gate.load,
                queued_queries=gate.queued + gate.waiting_below + self.fleet_waiting,
                oldest_queue_wait_millis=round(gate.oldest_wait_below(now) * 1000),
                memory_used_bytes=memory_used,
                cpu_nanos_total=self.cpu.cpu_ns_total,
                cpu_wait_nanos_total=self.cpu.wait_ns_total,
                admission_rejections=gate.admission_rejections,
                admission_timeouts=gate.admission_timeouts,
                admitted_total=gate.admitted_total,
            )
