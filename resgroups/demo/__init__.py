"""``resgroups demo``: dashboards against a nightly report, without and with groups.

The scenario of the reference document's "Common scenarios": dashboards
(many short queries from several users) compete with a nightly report (a
few long scans) and an ad-hoc analyst. It runs twice on the built-in
executor for the same duration: first with only DEFAULT, then with groups
created by DDL and principals mapped to them. It prints per workload the
queries run, p50/p95/p99 latency, CPU share, queue waits and rejections side
by side, and writes a PNG chart of the latency distributions and the CPU
share over time.

One vocabulary for CPU, as ``resource_groups()`` and the live page speak it: a
share is a percentage of the CPUs this process may use (``available_cpus()``),
so a group limited to ``cpu_limit = '50%'`` shows at most 50, and what no
workload used is shown: the process's own work outside the queries (client
threads, scheduling) and what the process did not have, idle or taken by other
processes on a shared machine.

Its parts, every name importable from here: the scenarios and their
calibration (``scenarios.py``), one timed run on a fresh engine
(``run.py``), the results and their rendering: the side-by-side table, the
verdict and the chart (``results.py``). The command itself, :func:`main`, and
its progress bar are here.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from functools import partial
from typing import Final, TextIO

import resgroups
from resgroups import demo_engines
from resgroups.config import EngineConfig
from resgroups.cpus import available_cpus
from resgroups.demo.results import (
    BUSY_MACHINE_PCT,
    IDLE_COLOUR,
    OUTSIDE_COLOUR,
    PALETTE,
    PROCESS,
    Live,
    RunResult,
    WorkloadStats,
    chart,
    colours,
    cpu_over_time,
    describe,
    side_by_side,
    verdict,
)
from resgroups.demo.results import _percentile as _percentile
from resgroups.demo.run import ThreadClock, run_once
from resgroups.demo.run import _limits as _limits
from resgroups.demo.run import _runner as _runner
from resgroups.demo.run import _setup_users as _setup_users
from resgroups.demo.scenarios import _DASHBOARDS as _DASHBOARDS
from resgroups.demo.scenarios import _MIN_ROWS as _MIN_ROWS
from resgroups.demo.scenarios import _PROBE_ROWS as _PROBE_ROWS
from resgroups.demo.scenarios import (
    REPORT_SCAN_S,
    SCENARIOS,
    Calibration,
    Scenario,
    Workload,
    calibrate,
)
from resgroups.demo.scenarios import _best_of as _best_of
from resgroups.demo.scenarios import _rows_per_workload as _rows_per_workload

# importable from here as when the demo was one module (so are its private
# helpers, above)
__all__ = [
    "BUSY_MACHINE_PCT",
    "IDLE_COLOUR",
    "OUTSIDE_COLOUR",
    "PALETTE",
    "PROCESS",
    "REPORT_SCAN_S",
    "SCENARIOS",
    "Calibration",
    "Live",
    "Progress",
    "RunResult",
    "Scenario",
    "ThreadClock",
    "Workload",
    "WorkloadStats",
    "calibrate",
    "chart",
    "colours",
    "cpu_over_time",
    "describe",
    "main",
    "run_once",
    "side_by_side",
    "verdict",
]


class Progress:
    """A one-line progress bar on a stream (stderr) that is a terminal; elsewhere
    (a file, a pipe, CI's log) a line per step: each tenth of the way."""

    STEPS: Final = 10

    def __init__(self, stream: TextIO, total: float, *, terminal: bool | None = None) -> None:
        self.stream = stream
        self.total = total
        self.done = 0.0
        if terminal is None:
            isatty = getattr(stream, "isatty", None)
            terminal = bool(isatty()) if callable(isatty) else False
        self.terminal = terminal
        self._step = -1  # the last step written, off a terminal

    def update(self, label: str, seconds: float) -> None:
        fraction = min(1.0, (self.done + seconds) / self.total)
        shown = f"{label:<15} {self.done + seconds:5.1f}/{self.total:.0f} s"
        if self.terminal:
            width = 30
            bar = "#" * round(width * fraction) + "-" * (width - round(width * fraction))
            self.stream.write(f"\r[{bar}] {shown}")
        else:
            step = math.floor(fraction * self.STEPS + 1e-9)
            if step <= self._step:
                return
            self._step = step
            self.stream.write(f"[{100 * step // self.STEPS:3d}%] {shown}\n")
        self.stream.flush()

    def finish_run(self, seconds: float) -> None:
        self.done += seconds

    def close(self) -> None:
        if self.terminal:
            self.stream.write("\n")
            self.stream.flush()


def main(
    *,
    duration: float,
    as_json: bool,
    chart_path: str,
    scenario_name: str,
    out: TextIO,
    serve: Callable[[resgroups.Engine], Live] | None = None,
    oversubscribe: float = 1.0,
) -> int:
    """The demo; with ``serve`` (``--serve``), the run with groups is served live
    and its engine stays up after the runs until the user stops it."""
    scenario = SCENARIOS.get(scenario_name)
    if scenario is None:
        print(
            f"resgroups demo: no scenario {scenario_name!r}; scenarios: {', '.join(SCENARIOS)}",
            file=sys.stderr,
        )
        return 2
    if duration <= 0:
        print("resgroups demo: --duration must be positive", file=sys.stderr)
        return 2
    try:  # the engine's own check, before the calibration's minute
        EngineConfig(oversubscribe=oversubscribe)
    except resgroups.Error as exc:
        print(f"resgroups demo: --oversubscribe: {exc}", file=sys.stderr)
        return 2
    engine = demo_engines.ENGINES.get(scenario.engine)
    missing = engine.missing() if engine is not None else []
    if engine is not None and missing:
        print(
            f"resgroups demo: --scenario {scenario.name} needs {' and '.join(missing)}: "
            f"pip install 'resgroups[{engine.extra}]'",
            file=sys.stderr,
        )
        return 2
    per_run = duration / 2
    # the scans still running at the end of a run are cancelled on purpose
    logging.getLogger("resgroups").setLevel(logging.ERROR)
    calibration = calibrate(scenario)
    progress = Progress(sys.stderr, duration)
    if not as_json:
        print(f"resgroups demo: {scenario.description}", file=out)
        print(f"two runs of {per_run:g} s on {available_cpus():g} CPUs", file=out)
        print(describe(scenario, calibration), file=out)
        print("second run's DDL:\n  " + ";\n  ".join(scenario.ddl) + ";", file=out)
        out.flush()
    runs = []
    try:
        for with_groups in (False, True):
            label = "with groups" if with_groups else "without groups"
            run = run_once(
                scenario,
                calibration,
                per_run,
                with_groups=with_groups,
                progress=partial(progress.update, label),
                serve=serve if with_groups else None,
                oversubscribe=oversubscribe,
            )
            progress.finish_run(per_run)
            runs.append(run)
    finally:
        if calibration.database is not None:  # an engine's table (a SQLite file)
            calibration.database.close()
    progress.close()
    path = chart(runs, chart_path, scenario.chart_window_s)
    if as_json:
        document = {
            "scenario": scenario.name,
            "seconds_per_run": per_run,
            "cpus": available_cpus(),
            "ddl": list(scenario.ddl),
            "calibration": {
                "report_rows_per_s": round(calibration.rows_per_s),
                "report_rows_per_cpu_s": round(calibration.rows_per_cpu_s),
                "report_scan_s": REPORT_SCAN_S,
                "rows": calibration.rows,
            },
            "runs": {r.label.replace(" ", "_"): r.summary() for r in runs},
            # % of the same CPUs as cpu_share_pct: the process's work outside the
            # queries, and what the process did not have (idle, or other processes')
            "cpu_outside_queries_pct": {
                r.label.replace(" ", "_"): r.outside_queries_pct() for r in runs
            },
            "cpu_idle_pct": {r.label.replace(" ", "_"): r.idle_pct() for r in runs},
            # Engine(oversubscribe=...), and each group's priority lane at the end of a
            # run (null: lanes off, as with no more workers than CPUs: docs/cpu.md)
            "oversubscribe": oversubscribe,
            "priority_lanes": {r.label.replace(" ", "_"): r.lanes for r in runs},
            "chart": path,
        }
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        print(side_by_side(runs), file=out)
        for r in runs:
            if r.lanes:
                shown = ", ".join(f"{name} {lane}" for name, lane in sorted(r.lanes.items()))
                print(f"priority lanes {r.label} (nice steps): {shown}", file=out)
        print(verdict(runs), file=out)
        print(f"chart: {path}", file=out)
    live = runs[-1].live
    if live is not None:
        url = live.url

        def announce() -> None:
            print(
                f"the run with groups stays up at {url} (the last 5 minutes); Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )

        try:
            live.wait(announce)
        finally:
            live.close()
    return 0
