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
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Final, Protocol, TextIO

import resgroups
from resgroups import demo_engines
from resgroups.config import EngineConfig
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


def _runner(
    scenario: Scenario, calibration: Calibration
) -> Callable[[resgroups.Session, str], float]:
    """How a client runs one query: ``run(session, sql)`` -> its wait in ms."""
    if scenario.engine == "builtin":

        def builtin(session: resgroups.Session, sql: str) -> float:
            return float(session.execute(sql).timings.get("wait_ms", 0.0))

        return builtin
    database = calibration.database

    def on_engine(session: resgroups.Session, sql: str) -> float:
        timings: dict[str, float] = {}
        cpu = time.thread_time_ns()
        try:
            database.run(session, sql, timings)
        finally:  # its thread's CPU, and its engine's threads' charged to it
            native = int(timings.get("native_cpu_ms", 0.0) * 1e6)
            session.add_work_cpu(time.thread_time_ns() - cpu + native)
        return timings.get("wait_ms", 0.0)

    return on_engine


@dataclass
class WorkloadStats:
    latencies_ms: list[float] = field(default_factory=list)
    waits_ms: list[float] = field(default_factory=list)
    rejections: int = 0
    errors: int = 0
    cancelled: int = 0  # still running when the run ended: cancelled, not counted
    cpu_ns: int = 0


@dataclass
class RunResult:
    label: str
    seconds: float
    workloads: dict[str, WorkloadStats]
    timeline: list[tuple[float, dict[str, int]]]  # (seconds, cumulative CPU per workload)
    live: Live | None = None  # --serve: the run's engine, still served
    cpus: float = field(default_factory=available_cpus)  # the CPUs a share is a share of
    limits: dict[str, float] = field(default_factory=dict)  # workload -> its cpu_limit_pct
    process_cpu_ns: int | None = None  # the whole process's CPU over the run
    lanes: dict[str, int] | None = None  # group -> priority lane at the end (None: lanes off)

    def cpu_pct(self, cpu_ns: float, seconds: float) -> float:
        """``cpu_ns`` over ``seconds`` as a percentage of the CPUs this process may use."""
        return 100 * cpu_ns / (max(seconds, 1e-9) * self.cpus * 1e9)

    def _queries_pct(self) -> float:
        return sum(self.cpu_pct(w.cpu_ns, self.seconds) for w in self.workloads.values())

    def outside_queries_pct(self) -> float | None:
        """The process's CPU outside the queries (client threads, scheduling), % of the CPUs."""
        if self.process_cpu_ns is None:
            return None
        process = self.cpu_pct(self.process_cpu_ns, self.seconds)
        return round(max(0.0, process - self._queries_pct()), 1)

    def idle_pct(self) -> float:
        """What the process did not use, % of the CPUs: idle, or taken by other
        processes (without the process's own figure: what no workload used)."""
        used = self._queries_pct()
        if self.process_cpu_ns is not None:
            used = max(used, self.cpu_pct(self.process_cpu_ns, self.seconds))
        return round(max(0.0, 100 - used), 1)

    def summary(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name, w in self.workloads.items():
            lat = sorted(w.latencies_ms)
            out[name] = {
                "queries": len(lat),
                "p50_ms": _percentile(lat, 50),
                "p95_ms": _percentile(lat, 95),
                "p99_ms": _percentile(lat, 99),
                # % of the CPUs this process may use, as resource_groups()'s cpu_used_pct
                "cpu_share_pct": round(self.cpu_pct(w.cpu_ns, self.seconds), 1),
                "cpu_limit_pct": self.limits.get(name),
                "avg_queue_wait_ms": round(statistics.fmean(w.waits_ms), 1) if w.waits_ms else 0.0,
                "rejections": w.rejections,
                "errors": w.errors,
                "cancelled_at_end": w.cancelled,
            }
        return out


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    index = min(len(values) - 1, max(0, round(pct / 100 * len(values) + 0.5) - 1))
    return round(values[index], 1)


def _setup_users(admin: resgroups.Session, scenario: Scenario) -> None:
    users = sorted({u for w in scenario.workloads for u in w.users})
    admin.execute_script("; ".join(f"CREATE USER {u}" for u in users))


PROCESS: Final = "(process)"  # the timeline's key for the whole process's CPU


class ThreadClock:
    """The CPU the calling thread has used since this was made, readable from any
    thread (its last reading once the thread has ended)."""

    def __init__(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        self._start = time.clock_gettime_ns(self._clock)
        self._last = 0

    def read(self) -> int:
        with contextlib.suppress(OSError):  # the thread has ended: its clock is gone
            self._last = time.clock_gettime_ns(self._clock) - self._start
        return self._last


def _limits(engine: resgroups.Engine, scenario: Scenario) -> dict[str, float]:
    """Each workload's CPU limit, % of the CPUs, as its group has it now (none in DEFAULT)."""
    by_group = {g["name"]: g["cpu_limit_pct"] for g in engine.resource_groups()}
    limits = {}
    for w in scenario.workloads:
        limit = by_group.get(w.group)
        if limit is not None:
            limits[w.name] = float(limit)
    return limits


class Live(Protocol):
    """``resgroups demo --serve``: an engine served (by ``resgroups serve``'s
    servers) while the run goes and after it, until the user stops it."""

    url: str  # the live page

    def wait(self, ready: Callable[[], None]) -> None:
        """Until the user asks to stop (Ctrl-C, SIGTERM); ``ready()`` once a stop
        is heard (a SIGTERM sent when the user is told may come at once)."""

    def close(self) -> None:
        """Stop serving and close the engine."""


def run_once(
    scenario: Scenario,
    calibration: Calibration,
    seconds: float,
    *,
    with_groups: bool,
    progress: Callable[[float], None],
    serve: Callable[[resgroups.Engine], Live] | None = None,
    oversubscribe: float = 1.0,
) -> RunResult:
    """One timed run on a fresh engine; the statistics of every workload. With
    ``serve``, the engine is served from the start and stays up after the run
    (its queries cancelled), in the result's ``live``."""
    engine = resgroups.Engine(access_control=True, oversubscribe=oversubscribe)
    live: Live | None = None
    try:
        admin = engine.connect()
        _setup_users(admin, scenario)
        if with_groups:
            admin.execute_script("; ".join(scenario.ddl))
        limits = _limits(engine, scenario)
        if serve is not None:
            live = serve(engine)
            print(f"\nwatch it live: {live.url}", file=sys.stderr, flush=True)
        stats = {w.name: WorkloadStats() for w in scenario.workloads}
        run_query = _runner(scenario, calibration)
        sessions: dict[str, list[resgroups.Session]] = {w.name: [] for w in scenario.workloads}
        lock = threading.Lock()
        started = time.monotonic()
        stop = started + seconds

        # DuckDB charges a query's CPU to the session when the query ends, so its
        # curve sawed between workloads; the client threads' own CPU clocks (DuckDB
        # runs on the calling thread) say what each workload uses as it goes
        threads_cpu = scenario.engine == "duckdb" and hasattr(time, "pthread_getcpuclockid")
        clocks: dict[str, list[ThreadClock]] = {w.name: [] for w in scenario.workloads}

        def client(workload: Workload, user: str) -> None:
            session = engine.connect(user)
            with lock:
                sessions[workload.name].append(session)
                if threads_cpu:
                    clocks[workload.name].append(ThreadClock())
            record = stats[workload.name]
            sql = calibration.sql(workload)
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    wait_ms = run_query(session, sql)
                except resgroups.AdmissionRejected:
                    with lock:
                        record.rejections += 1
                    time.sleep(0.05)
                    continue
                except resgroups.Error:
                    with lock:
                        if time.monotonic() >= stop:  # cancelled as the run ended
                            record.cancelled += 1
                        else:
                            record.errors += 1
                    continue
                if time.monotonic() <= stop:  # count what completed inside the run
                    with lock:
                        record.latencies_ms.append((time.monotonic() - t0) * 1000)
                        record.waits_ms.append(wait_ms)
                if workload.think_s:
                    time.sleep(workload.think_s)

        process_started = time.process_time_ns()

        def cpu_now() -> dict[str, int]:
            with lock:
                if threads_cpu:
                    cpu = {n: sum(c.read() for c in cs) for n, cs in clocks.items()}
                else:
                    cpu = {n: sum(s.work_cpu_ns for s in ss) for n, ss in sessions.items()}
            cpu[PROCESS] = time.process_time_ns() - process_started
            return cpu

        threads = [
            threading.Thread(target=client, args=(w, u), daemon=True)
            for w in scenario.workloads
            for u in w.users
        ]
        for t in threads:
            t.start()
        timeline: list[tuple[float, dict[str, int]]] = []
        at_stop: dict[str, int] = {}
        while True:
            now = time.monotonic()
            elapsed = min(now - started, seconds)
            timeline.append((elapsed, cpu_now()))
            progress(elapsed)
            if now >= stop:
                at_stop = cpu_now()
                break
            time.sleep(min(0.25, max(0.0, stop - now)))
        process_cpu_ns = at_stop.pop(PROCESS)
        shown = {str(r["name"]): r["cpu_lane"] for r in engine.resource_groups()}
        lanes = {name: int(lane) for name, lane in shown.items() if isinstance(lane, int)} or None
        for name, cpu in at_stop.items():
            stats[name].cpu_ns = cpu
        # long scans still running are cancelled; their latency is not counted
        for t in threads:
            t.join(0.01)
        if live is None:
            engine.close(grace=0.5)
        else:  # the engine stays up: cancel the clients' queries until they are done
            give_up = time.monotonic() + 30
            while any(t.is_alive() for t in threads) and time.monotonic() < give_up:
                with lock:
                    everyone = [s for ss in sessions.values() for s in ss]
                for session in everyone:
                    session.cancel()
                for t in threads:
                    t.join(0.1)
        for t in threads:
            t.join(10)
        label = "with groups" if with_groups else "without groups"
        return RunResult(
            label, seconds, stats, timeline, live, engine.cpus, limits, process_cpu_ns, lanes
        )
    except BaseException:  # nothing stays up after a failed run, served or not
        if live is not None:
            live.close()
        engine.close(grace=0.5)
        raise


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


def side_by_side(runs: list[RunResult]) -> str:
    from tabulate import tabulate

    summaries = [r.summary() for r in runs]
    rows = []
    metrics = [
        ("queries", "queries"),
        ("p50 latency ms", "p50_ms"),
        ("p95 latency ms", "p95_ms"),
        ("p99 latency ms", "p99_ms"),
        (f"CPU share % of {runs[0].cpus:g} CPUs", "cpu_share_pct"),
        ("CPU limit %", "cpu_limit_pct"),
        ("avg queue wait ms", "avg_queue_wait_ms"),
        ("rejections", "rejections"),
        ("errors", "errors"),
        ("cancelled at end", "cancelled_at_end"),
    ]
    for workload in summaries[0]:
        for i, (label, key) in enumerate(metrics):
            values = [s[workload][key] for s in summaries]
            rows.append(
                [workload if i == 0 else "", label, *("-" if v is None else v for v in values)]
            )
    outside = [r.outside_queries_pct() for r in runs]
    if any(v is not None for v in outside):
        rows.append(
            ["(outside queries)", metrics[4][0], *("-" if v is None else v for v in outside)]
        )
    rows.append(["(idle or others)", metrics[4][0], *(r.idle_pct() for r in runs)])
    return tabulate(
        rows,
        headers=["workload", "metric", *(r.label for r in runs)],
        tablefmt="psql",
        disable_numparse=True,
        colalign=("left", "left", *("right" for _ in runs)),
    )


def describe(scenario: Scenario, calibration: Calibration) -> str:
    """What calibration chose, for the reader."""
    lines = [
        f"calibrated: the report scans {calibration.rows_per_s / 1e6:.0f}M rows/s alone here; "
        f"each query scans (about {REPORT_SCAN_S:g} s per report scan alone):"
    ]
    lines += [f"  {w.name:<11} {calibration.sql(w)}" for w in scenario.workloads]
    return "\n".join(lines)


BUSY_MACHINE_PCT: Final = 25.0  # idle or others' in the run without groups: a busy machine


def verdict(runs: list[RunResult]) -> str:
    without, with_ = (r.summary() for r in runs)
    lines = []
    p99_before, p99_after = without["dashboards"]["p99_ms"], with_["dashboards"]["p99_ms"]
    if p99_before and p99_after:
        ratio = p99_before / p99_after
        change = f"{ratio:.1f}x lower" if ratio >= 1 else f"{1 / ratio:.1f}x higher"
        lines.append(
            f"dashboard p99: {p99_before:.1f} ms without groups, {p99_after:.1f} ms with groups "
            f"({change})"
        )
    busy = runs[0].idle_pct()
    if runs[0].process_cpu_ns is not None and busy >= BUSY_MACHINE_PCT:
        # the run without groups keeps every CPU busy on a quiet machine: what it did
        # not have, other processes took
        lines.append(
            f"note: this process had only {100 - busy:.0f}% of its {runs[0].cpus:g} CPUs in the "
            "run without groups (other processes had the rest): every figure is smaller "
            "than on a quiet machine"
        )
    report = with_["report"]
    limit = report.get("cpu_limit_pct")
    of_limit = "" if limit is None else f", limit {limit:g}%"
    cpus = f" of the {runs[0].cpus:g} CPUs" if runs[0].cpus else ""
    lines.append(
        f"report: {without['report']['queries']} scans completed without groups, "
        f"{report['queries']} with groups (its CPU {without['report']['cpu_share_pct']}% -> "
        f"{report['cpu_share_pct']}%{cpus}{of_limit})"
    )
    return "\n".join(lines)


# one colour per workload, the same in every run and every chart (the live page's
# palette: Tableau 10); idle is grey
PALETTE: Final = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip
IDLE_COLOUR: Final = "#e6e6e6"
OUTSIDE_COLOUR: Final = "#a6a6a6"


def colours(names: list[str]) -> dict[str, str]:
    """Each workload's colour: by its place in the scenario, so fixed per workload."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def cpu_over_time(run: RunResult, window_s: float) -> tuple[list[float], dict[str, list[float]]]:
    """Each workload's CPU over the last ``window_s`` at every sample, % of the CPUs;
    the whole process's too, under :data:`PROCESS`, when the timeline has it."""
    times: list[float] = []
    names = [*run.workloads, *([PROCESS] if run.timeline and PROCESS in run.timeline[0][1] else [])]
    shares: dict[str, list[float]] = {n: [] for n in names}
    start = 0
    for end, (at, cpu) in enumerate(run.timeline):
        while start < end and at - run.timeline[start + 1][0] >= window_s:
            start += 1
        since, before = run.timeline[start]
        if end == start or at - since <= 0:
            continue
        times.append(at)
        for n in names:
            shares[n].append(run.cpu_pct(cpu.get(n, 0) - before.get(n, 0), at - since))
    return times, shares


def chart(runs: list[RunResult], path: str, window_s: float = 1.0) -> str:
    """The latency of every workload in both runs, then each run's CPU over time
    side by side on the same scale (% of the CPUs), limits as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = list(runs[0].workloads)
    colour = colours(names)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [1.2, 1, 1]})
    ax = axes[0]
    data, labels, faces, hatches = [], [], [], []
    for name in names:
        for run in runs:
            data.append(run.workloads[name].latencies_ms)  # none completed: no box
            labels.append(f"{name}\n{run.label.replace(' groups', '')}")
            faces.append(colour[name])
            hatches.append("//" if run is runs[0] and len(runs) > 1 else "")
    box = ax.boxplot(data, patch_artist=True, showfliers=True)
    for patch, face, hatch in zip(box["boxes"], faces, hatches, strict=True):
        patch.set_facecolor(face)
        patch.set_alpha(0.35 if hatch else 0.85)
        patch.set_hatch(hatch)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("query latency by workload")
    if len(runs) > 1:
        ax.legend(
            handles=[
                Patch(facecolor="white", edgecolor="black", hatch="//", label=runs[0].label),
                Patch(facecolor="grey", edgecolor="black", label=runs[-1].label),
            ],
            loc="upper right",
            fontsize=8,
        )
    longest = max(r.seconds for r in runs)
    # workloads limited in any run at the bottom, so each limit's line sits on its
    # band; one order for every run, so the two charts stack alike
    limited = {n for r in runs for n in r.limits}
    order = sorted(names, key=lambda n: n not in limited)
    for ax, run in zip(axes[1:], runs, strict=False):
        times, shares = cpu_over_time(run, window_s)
        if times:
            queries = [sum(shares[n][i] for n in names) for i in range(len(times))]
            process = shares.get(PROCESS, queries)
            outside = [max(0.0, p - q) for p, q in zip(process, queries, strict=True)]
            idle = [max(0.0, 100 - q - o) for q, o in zip(queries, outside, strict=True)]
            ax.stackplot(
                times,
                [shares[n] for n in order] + [outside, idle],
                labels=[*order, "this process, outside queries", "idle or other processes"],
                colors=[colour[n] for n in order] + [OUTSIDE_COLOUR, IDLE_COLOUR],
                alpha=0.85,
            )
            base = [0.0] * len(times)
            for n in order:
                if n in run.limits:
                    ax.plot(
                        times,
                        [b + run.limits[n] for b in base],
                        linestyle="--",
                        linewidth=2,
                        color="black",
                        label=f"{n}'s limit ({run.limits[n]:g}%)",
                    )
                base = [b + v for b, v in zip(base, shares[n], strict=True)]
        ax.set_ylim(0, 100)
        ax.set_xlim(0, longest)
        ax.set_xlabel("seconds")
        ax.set_ylabel(f"% of the {run.cpus:g} CPUs")
        ax.set_title(f"CPU used, {run.label} (each second: the last {window_s:g} s)", fontsize=10)
        ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
