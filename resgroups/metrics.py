"""Prometheus metrics (SPEC §9): one registry per engine, read at scrape time.

A custom collector renders :meth:`Engine.statistics` (the same frozen
records ``resource_groups()`` shows), so no counter has a second copy and a
query costs nothing extra. Names are QuestDB's with ``resgroups_`` in place
of ``questdb_``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

import psutil
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from resgroups.engine import Engine

GROUP: Final = "resgroups_resource_group_"
INSTANCE: Final = "resgroups_resource_groups_"

# (metric suffix, statistics field, help, counter?)
PER_GROUP: Final = (
    ("active_queries", "active_queries", "Queries holding an admission slot.", False),
    ("queued_queries", "queued_queries", "Queries waiting for admission.", False),
    (
        "oldest_queue_wait_millis",
        "oldest_queue_wait_millis",
        "How long the oldest queued query has waited.",
        False,
    ),
    ("memory_bytes", "memory_used_bytes", "Tracked query memory (published).", False),
    ("memory_limit_bytes", "memory_limit_bytes", "Group memory ceiling; 0 = none.", False),
    ("cpu_nanos", "cpu_nanos_total", "CPU charged to the group.", True),
    ("cpu_wait_nanos", "cpu_wait_nanos_total", "Runnable time spent waiting for CPU.", True),
    ("admission_rejections", "admission_rejections", "Queries refused: queue full.", True),
    ("admission_timeouts", "admission_timeouts", "Queue waits ended by a timeout.", True),
    ("admitted", "admitted_total", "Passes through the admission gate.", True),
    (
        "cpu_entitled_pct",
        "cpu_entitled_pct",
        "Weight's share of the CPUs among groups wanting CPU over the window, within limits.",
        False,
    ),
    ("cpu_used_pct", "cpu_used_pct", "CPU charged over the window, % of the CPUs.", False),
    ("cpu_share_error_pct", "cpu_share_error_pct", "Used minus entitled CPU share.", False),
)
# fractional CPU limits only: the token bucket (a group without one has no sample)
BUCKET: Final = (
    ("cpu_budget_millis", "CPU budget now; negative for debt."),
    ("cpu_refill_cores", "Budget refill rate, in cores."),
    ("cpu_burst_millis", "The most CPU budget the group can hold."),
)


class _Collector(Collector):
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        stats = engine.statistics()
        for suffix, field, help_text, counter in PER_GROUP:
            family: CounterMetricFamily | GaugeMetricFamily
            if counter:
                family = CounterMetricFamily(GROUP + suffix, help_text, labels=["resource_group"])
            else:
                family = GaugeMetricFamily(GROUP + suffix, help_text, labels=["resource_group"])
            for s in stats:
                family.add_metric([s.name], getattr(s, field))
            yield family
        for field, help_text in BUCKET:
            bucket = GaugeMetricFamily(GROUP + field, help_text, labels=["resource_group"])
            for s in stats:
                value = getattr(s, field)
                if value is not None:
                    bucket.add_metric([s.name], value)
            yield bucket
        hits = CounterMetricFamily(
            "resgroups_resource_rule_hits",
            "Times a runaway-query rule acted (SPEC §16), by rule and action.",
            labels=["rule", "action"],
        )
        for rule in engine.snapshot.all_rules:
            hits.add_metric([rule.name, rule.action.upper()], engine.rule_hits.get(rule.id).total)
        yield hits
        stalled = GaugeMetricFamily(
            "resgroups_pool_stalled_workers",
            "Workers held by queries with no checkpoint for longer than the stall threshold.",
            labels=["pool"],
        )
        for pool, count in engine.stalled_workers().items():
            stalled.add_metric([pool], count)
        yield stalled
        yield CounterMetricFamily(
            INSTANCE + "zombies_reclaimed",
            "Queries gone without giving back what they held, reclaimed by the reconcile loop.",
            value=engine.zombies_reclaimed,
        )
        yield GaugeMetricFamily(
            INSTANCE + "enabled", "1 while resource groups are enabled.", value=int(engine.enabled)
        )
        yield GaugeMetricFamily(
            INSTANCE + "catalog_current",
            "1 once this node has received the catalog.",
            value=int(engine.snapshot.has_catalog),
        )
        if engine.fleet is not None:
            fleet_active = GaugeMetricFamily(
                GROUP + "fleet_active_queries",
                "Leases held fleet-wide (fleet mode), as last read.",
                labels=["resource_group"],
            )
            for s in stats:
                fleet_active.add_metric([s.name], s.fleet_active_queries or 0)
            yield fleet_active
        if engine.fleet is not None and engine.fleet.quotas is not None:
            quota = GaugeMetricFamily(
                GROUP + "fleet_quota",
                "Slots of the group's limit this instance may admit on (fleet quota mode).",
                labels=["resource_group"],
            )
            for s in stats:
                if s.fleet_quota is not None:
                    quota.add_metric([s.name], s.fleet_quota)
            yield quota
        yield CounterMetricFamily(
            INSTANCE + "coordination_errors",
            "Failed calls to the fleet coordination database.",
            value=0 if engine.fleet is None else engine.fleet.errors,
        )
        yield CounterMetricFamily(
            INSTANCE + "fleet_fence_lapses",
            "Heartbeats that came after this instance's fleet fence had passed (its "
            "queries admitted before failed with CoordinationUnavailable).",
            value=0 if engine.fleet is None else engine.fleet.total_lapses,
        )
        yield GaugeMetricFamily(
            INSTANCE + "lease_release_queue",
            "Fleet lease releases queued for the batcher.",
            value=0 if engine.fleet is None else engine.fleet.releases.queued,
        )
        yield GaugeMetricFamily(
            INSTANCE + "catalog_version",
            "The version of the last catalog record applied.",
            value=engine.catalog_version,
        )
        lag = engine.catalog_lag
        yield GaugeMetricFamily(
            INSTANCE + "catalog_lag_seconds",
            "How long this node has been behind the newest catalog version it has seen.",
            value=lag.seconds,
        )
        yield GaugeMetricFamily(
            INSTANCE + "catalog_lag_records",
            "Catalog records seen and not applied yet.",
            value=lag.records,
        )
        yield CounterMetricFamily(
            INSTANCE + "catalog_lag_unmanaged_queries",
            "Queries run unmanaged because the catalog had not arrived.",
            value=engine.catalog_lag_unmanaged_queries,
        )
        yield CounterMetricFamily(
            INSTANCE + "memory_leaks",
            "Queries that ended holding tracked memory (returned when they ended).",
            value=engine.memory_ledger.leaks,
        )
        yield GaugeMetricFamily(
            INSTANCE + "process_memory_bytes",
            "Tracked query memory of the whole process (published).",
            value=engine.memory_ledger.process.used,
        )
        yield GaugeMetricFamily(
            INSTANCE + "process_rss_bytes",
            "Resident memory of the whole process (psutil), beside the tracked query memory.",
            value=_rss(),
        )
        yield GaugeMetricFamily(
            INSTANCE + "cpu_managed_dispatch",
            "1 while CPU scheduling is engaged.",
            value=int(engine.cpu_managed_dispatch),
        )
        yield GaugeMetricFamily(
            INSTANCE + "cpu_scheduler_degraded",
            "1 after an internal CPU scheduler fault, until the engine restarts.",
            value=int(engine.cpu_scheduler_degraded),
        )


def _rss() -> int:
    try:
        return int(psutil.Process().memory_info().rss)
    except psutil.Error:
        return 0


class EngineMetrics:
    """The engine's own registry (the global one would clash between engines)."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(engine))

    def text(self) -> str:
        return generate_latest(self.registry).decode("utf-8")
