"""The demo's scenarios and their calibration: the workloads each runs (the
built-in executor's, and the same story on each of ``demo_engines``' tables),
the groups the second run creates, and how many rows each query scans so that
the story is the same on a fast or a slow machine."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Final

import resgroups
from resgroups import demo_engines
from resgroups.cpus import available_cpus


@dataclass(frozen=True)
class Workload:
    name: str
    users: tuple[str, ...]  # one client thread per user
    sql: str  # with {rows}: the scan's length, chosen by calibrate()
    think_s: float  # pause between a client's queries
    share_of_report: float  # rows scanned, as a fraction of one report scan
    group: str = "DEFAULT"  # the group the second run's DDL maps its users to


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workloads: tuple[Workload, ...]
    ddl: tuple[str, ...]  # the second run's groups and mappings
    engine: str = "builtin"  # who runs the SQL: the built-in executor, or a demo_engines name
    # the chart's CPU over the last this many seconds: an engine's CPU is charged as
    # its queries end, so its curve needs a longer window not to saw
    chart_window_s: float = 1.0


SCENARIOS: Final = {
    "dashboards": Scenario(
        "dashboards",
        "dashboards (short queries, 4 users) against a nightly report (long scans) "
        "and an ad-hoc analyst",
        (
            Workload(
                "dashboards",
                ("dash1", "dash2", "dash3", "dash4"),
                "SELECT count(*), sum(x) FROM long_sequence({rows}) WHERE x % 7 = 3",
                0.05,
                1 / 1000,
                "dashboards",
            ),
            Workload(
                "report",
                ("nightly", "nightly"),
                "SELECT sum(x % 1000), max(x) FROM long_sequence({rows})",
                0.0,
                1.0,
                "reporting",
            ),
            Workload(
                "adhoc",
                ("analyst",),
                "SELECT avg(x), count(*) FROM long_sequence({rows}) WHERE x % 3 = 1",
                0.2,
                1 / 60,
                "adhoc",
            ),
        ),
        (
            "CREATE RESOURCE GROUP dashboards WITH (cpu_weight = 400)",
            "CREATE RESOURCE GROUP adhoc WITH (cpu_weight = 100, scheduling_policy = 'fair')",
            "CREATE RESOURCE GROUP reporting WITH (cpu_weight = 25, max_active_queries = 1, "
            "cpu_limit = '50%')",
            "ALTER USER dash1 SET RESOURCE GROUP dashboards",
            "ALTER USER dash2 SET RESOURCE GROUP dashboards",
            "ALTER USER dash3 SET RESOURCE GROUP dashboards",
            "ALTER USER dash4 SET RESOURCE GROUP dashboards",
            "ALTER USER nightly SET RESOURCE GROUP reporting",
            "ALTER USER analyst SET RESOURCE GROUP adhoc",
        ),
    ),
}


_DASHBOARDS = SCENARIOS["dashboards"]
for _engine, _demo in demo_engines.ENGINES.items():  # the same story on an engine's table
    SCENARIOS[_engine] = Scenario(
        _engine,
        f"the same on {_engine} (resgroups.integrations.{_engine}): dashboards (short queries, "
        "4 users) against a nightly report (GROUP BY over the whole table) and an ad-hoc analyst",
        (
            replace(_DASHBOARDS.workloads[0], sql=_demo.sql[0]),
            replace(_DASHBOARDS.workloads[1], sql=demo_engines.REPORT_SQL),
            replace(_DASHBOARDS.workloads[2], sql=_demo.sql[1]),
        ),
        _DASHBOARDS.ddl,
        engine=_engine,
        chart_window_s=2.0,
    )


# ---- calibration: the same story on a fast or a slow machine ----------------------------

REPORT_SCAN_S: Final = 1.0  # one report scan, alone on this machine
_PROBE_ROWS: Final = 10_000_000
_MIN_ROWS: Final = 10_000


@dataclass(frozen=True)
class Calibration:
    rows_per_s: float  # the report's scan rate alone on this machine (all its CPUs)
    rows: dict[str, int]  # workload -> rows per query
    database: Any = None  # an engine's scenario: its demo_engines.Database
    rows_per_cpu_s: float = 0.0  # the same per CPU-second: what calibration measures

    def sql(self, workload: Workload) -> str:
        return workload.sql.format(rows=self.rows[workload.name])


def calibrate(scenario: Scenario, probes: int = 3) -> Calibration:
    """Measure the CPU time of the report's query on a short scan and size every
    workload from it, so that one report scan costs REPORT_SCAN_S on each CPU
    this process may use (about REPORT_SCAN_S alone on a quiet machine).

    CPU time, not wall time: another process busy while the probe runs stretches
    its wall time (a machine shared with others, a test suite beside it), which
    made the scans smaller and the report's story change from run to run."""
    report = next(w for w in scenario.workloads if w.share_of_report == 1.0)
    if scenario.engine != "builtin":
        rate, table_rows = demo_engines.table_rows(
            demo_engines.ENGINES[scenario.engine], REPORT_SCAN_S
        )
        database = demo_engines.ENGINES[scenario.engine].open(table_rows)
        return Calibration(
            rate, _rows_per_workload(scenario, table_rows), database, rows_per_cpu_s=rate
        )
    cpus = available_cpus()
    with resgroups.Engine() as engine:
        session = engine.connect()
        best = _best_of(probes, lambda: session.execute(report.sql.format(rows=_PROBE_ROWS)))
    per_cpu_s = _PROBE_ROWS / best
    rows = _rows_per_workload(scenario, per_cpu_s * REPORT_SCAN_S * cpus)
    return Calibration(per_cpu_s * cpus, rows, rows_per_cpu_s=per_cpu_s)


def _best_of(probes: int, run: Callable[[], object]) -> float:
    """The least CPU time (this process's, every thread) of ``probes`` runs, in seconds."""
    best = math.inf
    for _ in range(probes):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return max(best, 1e-6)


def _rows_per_workload(scenario: Scenario, report_rows: float) -> dict[str, int]:
    """Each workload's rows per query: its share of one report scan."""
    return {
        w.name: max(_MIN_ROWS, int(round(report_rows * w.share_of_report, -4)))
        for w in scenario.workloads
    }
