"""``resgroups demo``: dashboards against a nightly report, without and with groups.

The scenario of the reference document's "Common scenarios": dashboards
(many short queries from several users) compete with a nightly report (a
few long scans) and an ad-hoc analyst. It runs twice on the built-in
executor for the same duration: first with only DEFAULT, then with groups
created by DDL and principals mapped to them. It prints per workload the
queries run, p50/p95/p99 latency, CPU share, queue waits and rejections side
by side, and writes a PNG chart of the latency distributions and the CPU
share over time.
"""

from __future__ import annotations

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
from resgroups.cpus import available_cpus


@dataclass(frozen=True)
class Workload:
    name: str
    users: tuple[str, ...]  # one client thread per user
    sql: str  # with {rows}: the scan's length, chosen by calibrate()
    think_s: float  # pause between a client's queries
    share_of_report: float  # rows scanned, as a fraction of one report scan


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workloads: tuple[Workload, ...]
    ddl: tuple[str, ...]  # the second run's groups and mappings
    engine: str = "builtin"  # who runs the SQL: the built-in executor, or a demo_engines name


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
            ),
            Workload(
                "report",
                ("nightly", "nightly"),
                "SELECT sum(x % 1000), max(x) FROM long_sequence({rows})",
                0.0,
                1.0,
            ),
            Workload(
                "adhoc",
                ("analyst",),
                "SELECT avg(x), count(*) FROM long_sequence({rows}) WHERE x % 3 = 1",
                0.2,
                1 / 60,
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
            Workload("report", ("nightly", "nightly"), demo_engines.REPORT_SQL, 0.0, 1.0),
            replace(_DASHBOARDS.workloads[2], sql=_demo.sql[1]),
        ),
        _DASHBOARDS.ddl,
        engine=_engine,
    )


# ---- calibration: the same story on a fast or a slow machine ----------------------------

REPORT_SCAN_S: Final = 1.0  # one report scan, alone on this machine
_PROBE_ROWS: Final = 4_000_000
_MIN_ROWS: Final = 10_000


@dataclass(frozen=True)
class Calibration:
    rows_per_s: float  # the report's scan rate alone on this machine (all workers)
    rows: dict[str, int]  # workload -> rows per query
    database: Any = None  # an engine's scenario: its demo_engines.Database

    def sql(self, workload: Workload) -> str:
        return workload.sql.format(rows=self.rows[workload.name])


def calibrate(scenario: Scenario, probes: int = 3) -> Calibration:
    """Time the report's query on a short scan and size every workload from it,
    so that one report scan takes about REPORT_SCAN_S alone on this machine."""
    report = next(w for w in scenario.workloads if w.share_of_report == 1.0)
    if scenario.engine != "builtin":
        rate, table_rows = demo_engines.table_rows(
            demo_engines.ENGINES[scenario.engine], REPORT_SCAN_S
        )
        database = demo_engines.ENGINES[scenario.engine].open(table_rows)
        return Calibration(rate, _rows_per_workload(scenario, table_rows), database)
    with resgroups.Engine() as engine:
        session = engine.connect()
        best = _best_of(probes, lambda: session.execute(report.sql.format(rows=_PROBE_ROWS)))
    rate = _PROBE_ROWS / best
    return Calibration(rate, _rows_per_workload(scenario, rate * REPORT_SCAN_S))


def _best_of(probes: int, run: Callable[[], object]) -> float:
    """The shortest of ``probes`` timed runs, in seconds."""
    best = math.inf
    for _ in range(probes):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


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

    def summary(self) -> dict[str, dict[str, Any]]:
        total_cpu = sum(w.cpu_ns for w in self.workloads.values()) or 1
        out = {}
        for name, w in self.workloads.items():
            lat = sorted(w.latencies_ms)
            out[name] = {
                "queries": len(lat),
                "p50_ms": _percentile(lat, 50),
                "p95_ms": _percentile(lat, 95),
                "p99_ms": _percentile(lat, 99),
                "cpu_share_pct": round(100 * w.cpu_ns / total_cpu, 1),
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


class Live(Protocol):
    """``resgroups demo --serve``: an engine served (by ``resgroups serve``'s
    servers) while the run goes and after it, until the user stops it."""

    url: str  # the live page

    def wait(self) -> None:
        """Until the user asks to stop (Ctrl-C, SIGTERM)."""

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
) -> RunResult:
    """One timed run on a fresh engine; the statistics of every workload. With
    ``serve``, the engine is served from the start and stays up after the run
    (its queries cancelled), in the result's ``live``."""
    engine = resgroups.Engine(access_control=True)
    live: Live | None = None
    try:
        admin = engine.connect()
        _setup_users(admin, scenario)
        if with_groups:
            admin.execute_script("; ".join(scenario.ddl))
        if serve is not None:
            live = serve(engine)
            print(f"\nwatch it live: {live.url}", file=sys.stderr, flush=True)
        stats = {w.name: WorkloadStats() for w in scenario.workloads}
        run_query = _runner(scenario, calibration)
        sessions: dict[str, list[resgroups.Session]] = {w.name: [] for w in scenario.workloads}
        lock = threading.Lock()
        started = time.monotonic()
        stop = started + seconds

        def client(workload: Workload, user: str) -> None:
            session = engine.connect(user)
            with lock:
                sessions[workload.name].append(session)
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

        def cpu_now() -> dict[str, int]:
            with lock:
                return {n: sum(s.work_cpu_ns for s in ss) for n, ss in sessions.items()}

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
        return RunResult(label, seconds, stats, timeline, live)
    except BaseException:  # nothing stays up after a failed run, served or not
        if live is not None:
            live.close()
        engine.close(grace=0.5)
        raise


class Progress:
    """A one-line progress bar on a stream (stderr)."""

    def __init__(self, stream: TextIO, total: float) -> None:
        self.stream = stream
        self.total = total
        self.done = 0.0

    def update(self, label: str, seconds: float) -> None:
        width = 30
        fraction = min(1.0, (self.done + seconds) / self.total)
        bar = "#" * round(width * fraction) + "-" * (width - round(width * fraction))
        self.stream.write(f"\r[{bar}] {label:<15} {self.done + seconds:5.1f}/{self.total:.0f} s")
        self.stream.flush()

    def finish_run(self, seconds: float) -> None:
        self.done += seconds

    def close(self) -> None:
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
        ("CPU share %", "cpu_share_pct"),
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
    lines.append(
        f"report: {without['report']['queries']} scans completed without groups, "
        f"{with_['report']['queries']} with groups (CPU share "
        f"{without['report']['cpu_share_pct']}% -> {with_['report']['cpu_share_pct']}%)"
    )
    return "\n".join(lines)


def chart(runs: list[RunResult], path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(runs[0].workloads)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    ax = axes[0]
    data, labels, colors = [], [], []
    for name in names:
        for run, color in zip(runs, ("tab:red", "tab:green"), strict=True):
            data.append(run.workloads[name].latencies_ms or [0.0])
            labels.append(f"{name}\n{run.label}")
            colors.append(color)
    box = ax.boxplot(data, patch_artist=True, showfliers=True)
    for patch, color in zip(box["boxes"], colors, strict=True):
        patch.set_facecolor(color)
        patch.set_alpha(0.5)
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title("query latency by workload")
    for ax, run in zip(axes[1:], runs, strict=True):
        times = [t for t, _ in run.timeline]
        shares: dict[str, list[float]] = {n: [] for n in names}  # per sampling interval
        for (_, c0), (_, c1) in zip(run.timeline, run.timeline[1:], strict=False):
            total = sum(c1[n] - c0.get(n, 0) for n in names) or 1
            for n in names:
                shares[n].append(100 * (c1[n] - c0.get(n, 0)) / total)
        if len(times) > 1:
            ax.stackplot(times[1:], [shares[n] for n in names], labels=names, alpha=0.8)
        ax.set_ylim(0, 100)
        ax.set_xlabel("seconds")
        ax.set_ylabel("CPU share %")
        ax.set_title(f"CPU share over time, {run.label}")
        ax.legend(loc="upper right", fontsize=8)
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
            )
            progress.finish_run(per_run)
            runs.append(run)
    finally:
        if calibration.database is not None:  # an engine's table (a SQLite file)
            calibration.database.close()
    progress.close()
    path = chart(runs, chart_path)
    if as_json:
        document = {
            "scenario": scenario.name,
            "seconds_per_run": per_run,
            "cpus": available_cpus(),
            "ddl": list(scenario.ddl),
            "calibration": {
                "report_rows_per_s": round(calibration.rows_per_s),
                "report_scan_s": REPORT_SCAN_S,
                "rows": calibration.rows,
            },
            "runs": {r.label.replace(" ", "_"): r.summary() for r in runs},
            "chart": path,
        }
        json.dump(document, out, indent=2)
        out.write("\n")
    else:
        print(side_by_side(runs), file=out)
        print(verdict(runs), file=out)
        print(f"chart: {path}", file=out)
    live = runs[-1].live
    if live is not None:
        print(
            f"the run with groups stays up at {live.url} (the last 5 minutes); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        try:
            live.wait()
        finally:
            live.close()
    return 0
