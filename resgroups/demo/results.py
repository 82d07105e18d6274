"""A demo run's results and their rendering: each workload's figures
(:class:`WorkloadStats`, :class:`RunResult`), the side-by-side table, what
calibration chose, the verdict, and the chart of latencies and CPU over time.

CPU is a percentage of the CPUs this process may use, as the module
``resgroups.demo`` says."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from resgroups.cpus import available_cpus
from resgroups.demo.scenarios import REPORT_SCAN_S, Calibration, Scenario

PROCESS: Final = "(process)"  # the timeline's key for the whole process's CPU


class Live(Protocol):
    """``resgroups demo --serve``: an engine served (by ``resgroups serve``'s
    servers) while the run goes and after it, until the user stops it."""

    url: str  # the live page

    def wait(self, ready: Callable[[], None]) -> None:
        """Until the user asks to stop (Ctrl-C, SIGTERM); ``ready()`` once a stop
        is heard (a SIGTERM sent when the user is told may come at once)."""

    def close(self) -> None:
        """Stop serving and close the engine."""


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
