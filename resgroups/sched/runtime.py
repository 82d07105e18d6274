"""The live state of one group: its gate and the queries that belong to it.

A runtime is keyed by the group's identity. It outlives a DROP while the
group still has queries (they finish under its last settings) and is removed
once idle; a group created again under the same name gets a new runtime,
with fresh counters.
"""

from __future__ import annotations

from collections.abc import Callable

from resgroups.catalog.model import GroupDef
from resgroups.sched.admission import GateConfig, GateRuntime
from resgroups.sched.stats import CounterReading


def gate_config(group: GroupDef) -> GateConfig:
    return GateConfig(
        name=group.name,
        max_active=group.max_active_queries,
        max_queued=group.max_queued_queries,
        queue_timeout_ms=group.queue_timeout_ms,
        policy=group.scheduling_policy,
    )


class GroupRuntime:
    def __init__(self, group: GroupDef, now: Callable[[], float]) -> None:
        self.group_id = group.id
        self.definition = group
        self.dropped = False
        self.gate = GateRuntime(gate_config(group), now)
        self.suspended = 0  # cursors between pages (guarded by the gate's lock)

    def configure(self, group: GroupDef) -> None:
        """Apply an ALTER or a RENAME online."""
        self.definition = group
        self.gate.configure(gate_config(group))

    def suspend(self, delta: int) -> None:
        with self.gate.lock:
            self.suspended += delta

    @property
    def idle(self) -> bool:
        gate = self.gate.gate
        return not gate.active and not gate.queued and not self.suspended

    def reading(self, memory_used: int) -> CounterReading:
        """The live counters; ``memory_used`` is the sum over the group's queries."""
        with self.gate.lock:
            gate = self.gate.gate
            now = self.gate.now()
            return CounterReading(
                active_queries=gate.active,
                queued_queries=gate.queued,
                oldest_queue_wait_millis=round(gate.oldest_wait(now) * 1000),
                memory_used_bytes=memory_used,
                admission_rejections=gate.admission_rejections,
                admission_timeouts=gate.admission_timeouts,
                admitted_total=gate.admitted_total,
            )
