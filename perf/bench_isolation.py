"""Dashboards beside a report, and a limited group beside an unlimited one: the
isolation each mode gives, measured side by side in one run (interleaved).

    python perf/bench_isolation.py                 # 3 rounds of 3 s phases
    python perf/bench_isolation.py --seconds 2 --rounds 2
    python perf/bench_isolation.py --fast          # a smoke run

1. Dashboards: 4 threads, each a ~0.4 ms numpy query then 20 ms of think
   time; a report: 2 threads scanning in ~10 ms chunks. Dashboard latency
   p50/p99 alone and under the report, and the report's chunks a second, in
   four modes:
     none      plain threads, no resgroups
     nice      plain threads, the report's at nice 19 (the kernel alone)
     resgroups dashboards weight 400; report weight 25, max_active_queries=1,
               cpu_limit='50%'; workers=2; priority lanes off
     lanes     the same with priority lanes on (the default)
   For the resgroups modes also the report's used and entitled CPU share and
   its limit (cpu_used_pct against cpu_limit_pct). And where the slowest 2 %
   of dashboard queries spend their time: runnable but waiting for a CPU (the
   thread's run delay in /proc/self/task/*/schedstat), on a CPU, blocked (a
   worker or slot, the GIL), and entering the query.
2. Work conservation: workers=2, a group limited to half a core and an
   unlimited group (equal weights), two CPU-bound queries each; how busy the
   process keeps the CPUs, each group's share against its entitlement, lanes
   off and on.
3. The cost of a grant: a query of a lower lane entered and left, lanes on
   (two setpriority calls and a getpriority) against lanes off.

Targets (docs/cpu.md): lanes' dashboard p99 under the report <= 1.5x its p99
alone and <= nice's; the report within 10 points of its entitled share and
under its limit; work conservation >= 95 % busy, each group within 5 points.
The dashboards' targets are judged twice: on the rounds pooled, and on the
medians of each round's figures (a round's modes ran back to back, on one
state of the machine; pooled, the tail of the busiest round sets every
mode's p99 under the report).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

import resgroups

N = 100_000
# work conservation at two step sizes: ~40 us steps, where the GIL between two
# ufunc calls already keeps plain threads below the CPUs, and ~0.4 ms steps
CONSERVATION_N = (100_000, 1_000_000)
DASHBOARDS = 4
REPORTS = 2
THINK_S = 0.020
MODES = ("none", "nice", "resgroups", "lanes")
OVER = 2.0  # the lanes mode's oversubscribe


def _step(a: np.ndarray, b: np.ndarray) -> None:
    np.multiply(a, 1.0000001, out=b)
    np.add(b, 1e-9, out=a)


def calibrate(target_s: float) -> int:
    """numpy steps of N elements that take about ``target_s`` on one thread."""
    a = np.random.rand(N)
    b = np.empty_like(a)
    for _ in range(50):
        _step(a, b)
    t0 = time.thread_time()  # CPU time: a loaded machine does not stretch it
    for _ in range(500):
        _step(a, b)
    per_step = (time.thread_time() - t0) / 500
    return max(1, round(target_s / per_step))


def work(steps: int, a: np.ndarray, b: np.ndarray) -> None:
    for _ in range(steps):
        _step(a, b)


@dataclass
class Sample:
    """One dashboard query: its wall time and where it went (seconds)."""

    wall: float
    admission: float  # entering the query (0 without resgroups)
    cpu: float  # the thread's CPU over the query
    run_delay: float  # runnable, waiting for a CPU (the kernel's schedstat; 0 if unread)


_SAMPLE_FIELDS = [f.name for f in fields(Sample)]


@dataclass
class Phase:
    samples: list[Sample] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    report_used: float | None = None
    report_entitled: float | None = None
    report_limit: float | None = None
    busy_pct: float = 0.0

    @property
    def latencies(self) -> list[float]:
        """The dashboard queries' wall times, in seconds."""
        return [x.wall for x in self.samples]


def _engine(lanes: bool) -> resgroups.Engine:
    engine = resgroups.Engine(
        workers=2, priority_lanes=lanes, oversubscribe=OVER if lanes else 1, cpu_share_window=60.0
    )
    s = engine.connect()
    s.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
    s.execute(
        "CREATE RESOURCE GROUP report WITH (cpu_weight = 25, max_active_queries = 1, "
        "cpu_limit = '50%')"
    )
    return engine


def run_isolation(
    mode: str, with_report: bool, seconds: float, dash_steps: int, chunk_steps: int
) -> Phase:
    phase = Phase()
    engine = _engine(mode == "lanes") if mode in ("resgroups", "lanes") else None
    stop = threading.Event()
    ready = threading.Barrier(DASHBOARDS + (REPORTS if with_report else 0) + 1)
    lock = threading.Lock()

    def query(group: str) -> Callable[[Callable[[Callable[[], None]], None]], float]:
        """Runs its argument inside a query of ``group`` (or bare without resgroups);
        the seconds its admission took."""
        if engine is None:

            def bare(body: Callable[[Callable[[], None]], None]) -> float:
                body(lambda: None)
                return 0.0

            return bare
        session = engine.connect()
        session.execute(f"SET RESOURCE GROUP {group}")

        def run(body: Callable[[Callable[[], None]], None]) -> float:
            t0 = time.perf_counter()
            with session.query() as q:
                admitted = time.perf_counter() - t0
                body(q.checkpoint)
            return admitted

        return run

    def dashboard() -> None:
        a, b = np.random.rand(N), np.empty(N)
        in_query = query("dash")
        mine = []

        def body(checkpoint: Callable[[], None]) -> None:
            checkpoint()
            work(dash_steps, a, b)

        schedstat = f"/proc/self/task/{threading.get_native_id()}/schedstat"
        delay = _run_delay if os.path.exists(schedstat) else lambda _: 0
        ready.wait()
        while not stop.is_set():
            d0 = delay(schedstat)  # read outside the timed window
            c0, t0 = time.thread_time(), time.perf_counter()
            admission = in_query(body)
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            mine.append(Sample(wall, admission, cpu, (delay(schedstat) - d0) / 1e9))
            stop.wait(THINK_S)
        with lock:
            phase.samples.extend(mine)

    def report() -> None:
        a, b = np.random.rand(N), np.empty(N)
        if mode == "nice":
            os.setpriority(os.PRIO_PROCESS, 0, 19)  # this thread only (Linux)
        in_query = query("report")
        done = [0]

        def scan(checkpoint: Callable[[], None]) -> None:
            for _ in range(20):
                if stop.is_set():
                    return
                checkpoint()
                work(chunk_steps, a, b)
                done[0] += 1

        ready.wait()
        while not stop.is_set():
            with contextlib.suppress(resgroups.Error):  # a queue timeout at the end
                in_query(scan)
        with lock:
            phase.chunks += done[0]

    threads = [threading.Thread(target=dashboard) for _ in range(DASHBOARDS)]
    if with_report:
        threads += [threading.Thread(target=report) for _ in range(REPORTS)]
    for t in threads:
        t.start()
    ready.wait()
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    if engine is not None and with_report:
        row = next(r for r in engine.resource_groups() if r["name"] == "report")
        phase.report_used, phase.report_entitled = row["cpu_used_pct"], row["cpu_entitled_pct"]
        phase.report_limit = row["cpu_limit_pct"]
    stop.set()
    phase.seconds = time.perf_counter() - t0
    phase.busy_pct = (time.process_time() - cpu0) / phase.seconds / (os.cpu_count() or 1) * 100
    for t in threads:
        t.join()
    if engine is not None:
        engine.close()
    return phase


def _run_delay(schedstat: str) -> int:
    """Nanoseconds this thread has spent runnable but not running (Linux)."""
    with open(schedstat) as f:
        return int(f.read().split()[1])


def tail(samples: list[Sample], share: float = 0.02) -> dict[str, float]:
    """The slowest ``share`` of ``samples``, averaged, in ms: wall, runnable waiting
    for a CPU, on a CPU, blocked (the rest: a worker or slot, the GIL), and the
    part of the wall time spent entering the query (any of the three)."""
    worst = sorted(samples, key=lambda x: x.wall)[-max(1, round(len(samples) * share)) :]
    mean = {k: statistics.mean(getattr(x, k) for x in worst) * 1000 for k in _SAMPLE_FIELDS}
    mean["blocked"] = mean["wall"] - mean["run_delay"] - mean["cpu"]
    return mean


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


# ---- 2. work conservation ------------------------------------------------------------


def run_free(seconds: float, count: int, n: int = N) -> float:
    """The baseline beside it: CPUs ``count`` plain threads of ``n``-element steps get
    now (no resgroups)."""
    stop = threading.Event()
    ready = threading.Barrier(count + 1)

    def burn() -> None:
        a, b = np.random.rand(n), np.empty(n)
        ready.wait()
        while not stop.is_set():
            _step(a, b)

    threads = [threading.Thread(target=burn) for _ in range(count)]
    for t in threads:
        t.start()
    ready.wait()
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    used = (time.process_time() - cpu0) / (time.perf_counter() - t0)
    stop.set()
    for t in threads:
        t.join()
    return used


def run_conservation(lanes: bool, seconds: float, n: int = N) -> dict[str, float]:
    engine = resgroups.Engine(
        workers=2, priority_lanes=lanes, oversubscribe=OVER if lanes else 1, cpu_share_window=60.0
    )
    s = engine.connect()
    cpus = engine.cpus
    s.execute(f"CREATE RESOURCE GROUP limited WITH (cpu_limit = '{50 / cpus:g}%')")
    s.execute("CREATE RESOURCE GROUP free")
    stop = threading.Event()
    ready = threading.Barrier(5)

    def cpu_bound(group: str) -> None:
        session = engine.connect()
        session.execute(f"SET RESOURCE GROUP {group}")
        a, b = np.random.rand(n), np.empty(n)
        ready.wait()
        with session.query() as q:
            while not stop.is_set():
                q.checkpoint()
                _step(a, b)

    threads = [threading.Thread(target=cpu_bound, args=(g,)) for g in ("limited", "free") * 2]
    for t in threads:
        t.start()
    ready.wait()
    cpu0, t0 = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    rows = {r["name"]: r for r in engine.resource_groups()}
    busy = (time.process_time() - cpu0) / (time.perf_counter() - t0) / (os.cpu_count() or 1)
    stop.set()
    for t in threads:
        t.join()
    engine.close()
    out = {"busy_pct": busy * 100}
    for name in ("limited", "free"):
        out[f"{name}_used"] = rows[name]["cpu_used_pct"]
        out[f"{name}_entitled"] = rows[name]["cpu_entitled_pct"]
    return out


def conservation(n: int, seconds: float, rounds: int) -> None:
    """Section 2 for steps of ``n`` elements: lanes off and on, interleaved, with plain
    threads' CPU beside them (what the machine and the GIL give now)."""
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    free_cpus: dict[int, list[float]] = {2: [], 4: []}
    for r in range(rounds):
        for lanes in (False, True) if r % 2 == 0 else (True, False):
            runs[lanes].append(run_conservation(lanes, seconds, n))
        for count in (2, 4):
            free_cpus[count].append(run_free(seconds, count, n))
    two, four = (statistics.mean(free_cpus[c]) / (os.cpu_count() or 1) * 100 for c in (2, 4))
    print(
        f"steps of {n:,} elements: plain threads beside it get {two:.1f} % (2 threads) and "
        f"{four:.1f} % (4 threads) of the CPUs"
    )
    print(
        f"{'lanes':6} {'busy %':>7} {'of 2':>5} {'of 4':>5} {'lim used':>8} {'lim ent':>8} "
        f"{'lim err':>7} {'free used':>9} {'free ent':>8} {'free err':>8}"
    )
    for lanes in (False, True):
        m = {k: statistics.mean(x[k] for x in runs[lanes]) for k in runs[lanes][0]}
        errors = (
            m["limited_used"] - m["limited_entitled"],
            m["free_used"] - m["free_entitled"],
        )
        print(
            f"{'on' if lanes else 'off':6} {m['busy_pct']:7.1f} "
            f"{m['busy_pct'] / two:5.2f} {m['busy_pct'] / four:5.2f} "
            f"{m['limited_used']:8.1f} {m['limited_entitled']:8.1f} {errors[0]:7.1f} "
            f"{m['free_used']:9.1f} {m['free_entitled']:8.1f} {errors[1]:8.1f}"
        )
    print(
        f"  target (lanes on): >= 95 % busy {_met(m['busy_pct'] >= 95)}, "
        f">= 0.95 of 2 plain threads {_met(m['busy_pct'] / two >= 0.95)}, "
        f"each group within 5 points {_met(all(abs(e) <= 5 for e in errors))}"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


# ---- 3. the cost of a grant ----------------------------------------------------------


def grant_cost(lanes: bool, loops: int) -> float:
    """CPU seconds per query entered and left in the lower lane of two busy groups (a
    query of the heavier one stays open meanwhile, so the lower lane is 12)."""
    with resgroups.Engine(workers=2, priority_lanes=lanes, oversubscribe=OVER) as engine:
        s = engine.connect()
        s.execute("CREATE RESOURCE GROUP top WITH (cpu_weight = 400)")
        s.execute("CREATE RESOURCE GROUP low WITH (cpu_weight = 25)")
        held, done = threading.Event(), threading.Event()

        def hold_top() -> None:
            top = engine.connect()
            top.execute("SET RESOURCE GROUP top")
            with top.query():
                held.set()
                done.wait()

        holder = threading.Thread(target=hold_top)
        holder.start()
        held.wait()
        s.execute("SET RESOURCE GROUP low")
        for _ in range(200):
            with s.query():
                pass
        if lanes:
            with s.query() as q:
                assert q.held.nice is not None or engine.dispatcher.lanes.privilege.value != "full"
        # CPU time of this thread: a thread at nice 12 on a loaded machine waits
        # longer for a CPU, which is the lane working, not what a grant costs
        t0 = time.thread_time()
        for _ in range(loops):
            with s.query():
                pass
        cost = (time.thread_time() - t0) / loops
        done.set()
        holder.join()
        return cost


def paired(per_round: dict[str, list[float]], loaded: dict[str, list[Phase]]) -> None:
    """Each round's p99 ratio (under the report / alone) per mode, and lanes
    against nice round by round: the modes ran back to back within a round,
    so a round's pair shares the machine's state, where the pooled figures
    above mix rounds of a busier and a quieter machine. The targets again,
    judged on the rounds' medians."""
    print("   p99 x by round: " + "; ".join(
        f"{mode} " + " ".join(f"{x:.2f}" for x in per_round[mode]) for mode in MODES
    ))  # fmt: skip
    diffs = [
        lanes - nice for lanes, nice in zip(per_round["lanes"], per_round["nice"], strict=True)
    ]
    print(
        f"   lanes - nice, p99 x by round: {' '.join(f'{d:+.2f}' for d in diffs)}; "
        f"lanes <= nice in {sum(d <= 0 for d in diffs)} of {len(diffs)} rounds, "
        f"median {statistics.median(diffs):+.2f}"
    )
    p99_load = {m: [pct(p.latencies, 99) for p in loaded[m]] for m in ("nice", "lanes")}
    gaps = [lanes - nice for lanes, nice in zip(p99_load["lanes"], p99_load["nice"], strict=True)]
    print(
        f"   lanes - nice, p99 under the report by round (ms): "
        f"{' '.join(f'{d:+.2f}' for d in gaps)}; lanes <= nice in "
        f"{sum(d <= 0 for d in gaps)} of {len(gaps)} rounds, median {statistics.median(gaps):+.2f}"
    )
    lanes_x = statistics.median(per_round["lanes"])
    print(
        f"  target (lanes), rounds' medians: p99 x {lanes_x:.2f} <= 1.5 {_met(lanes_x <= 1.5)}, "
        f"<= nice's p99 x {_met(statistics.median(diffs) <= 0)}, "
        f"p99 under the report <= nice's {_met(statistics.median(gaps) <= 0)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--fast", action="store_true", help="a smoke run: 1 round of 1 s")
    parser.add_argument("--only", choices=("isolation", "conservation", "grant"))
    args = parser.parse_args()
    seconds, rounds = (1.0, 1) if args.fast else (args.seconds, args.rounds)
    dash_steps, chunk_steps = calibrate(0.0004), calibrate(0.010)
    print(
        f"{os.cpu_count()} CPUs; dashboard query {dash_steps} steps (~0.4 ms), "
        f"report chunk {chunk_steps} steps (~10 ms); {rounds} rounds of {seconds:g} s phases"
    )

    if args.only in (None, "isolation"):
        alone: dict[str, list[float]] = {m: [] for m in MODES}
        alone_samples: dict[str, list[Sample]] = {m: [] for m in MODES}
        loaded: dict[str, list[Phase]] = {m: [] for m in MODES}
        per_round: dict[str, list[float]] = {m: [] for m in MODES}  # p99 under load / alone
        for r in range(rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                quiet = run_isolation(mode, False, seconds, dash_steps, chunk_steps)
                alone[mode] += quiet.latencies
                alone_samples[mode] += quiet.samples
                loaded[mode].append(run_isolation(mode, True, seconds, dash_steps, chunk_steps))
                per_round[mode].append(
                    pct(loaded[mode][-1].latencies, 99) / pct(quiet.latencies, 99)
                )
        print("\n1. dashboards beside a report (latency in ms; report in chunks/s)")
        print(
            f"{'mode':10} {'p50 alone':>9} {'p99 alone':>9} {'p50 load':>9} {'p99 load':>9} "
            f"{'p99 x':>6} {'report/s':>9} {'busy %':>7} {'rep used':>8} {'entitled':>8} "
            f"{'limit':>6}"
        )
        for mode in MODES:
            lat = [x for p in loaded[mode] for x in p.latencies]
            rate = sum(p.chunks for p in loaded[mode]) / sum(p.seconds for p in loaded[mode])
            busy = statistics.mean(p.busy_pct for p in loaded[mode])
            used = [p.report_used for p in loaded[mode] if p.report_used is not None]
            ent = [p.report_entitled for p in loaded[mode] if p.report_entitled is not None]
            lim = loaded[mode][0].report_limit
            p99a, p99l = pct(alone[mode], 99), pct(lat, 99)
            print(
                f"{mode:10} {pct(alone[mode], 50):9.2f} {p99a:9.2f} {pct(lat, 50):9.2f} "
                f"{p99l:9.2f} {p99l / p99a:6.2f} {rate:9.1f} {busy:7.1f} "
                + (
                    f"{statistics.mean(used):8.1f} {statistics.mean(ent):8.1f} {lim:6.1f}"
                    if used
                    else f"{'-':>8} {'-':>8} {'-':>6}"
                )
            )

        lat = [x for p in loaded["lanes"] for x in p.latencies]
        ratio = {m: pct([x for p in loaded[m] for x in p.latencies], 99) / pct(alone[m], 99)
                 for m in ("nice", "lanes")}  # fmt: skip
        report = [
            (p.report_used, p.report_entitled, p.report_limit)
            for p in loaded["lanes"]
            if p.report_used is not None
            and p.report_entitled is not None
            and p.report_limit is not None
        ]
        print(
            f"  target (lanes): p99 x <= 1.5 {_met(ratio['lanes'] <= 1.5)}, "
            f"<= nice's p99 x {_met(ratio['lanes'] <= ratio['nice'])}, "
            f"p99 under the report <= nice's "
            f"{_met(pct(lat, 99) <= pct([x for p in loaded['nice'] for x in p.latencies], 99))}, "
            f"report within 10 points of its entitled share "
            f"{_met(all(abs(u - e) <= 10 for u, e, _ in report))} and under its limit "
            f"{_met(all(u <= lim for u, _, lim in report))}"
        )
        paired(per_round, loaded)
        print(
            "\n   where the slowest 2 % of dashboard queries spend their time (mean, ms):"
            " runnable waiting\n   for a CPU (the kernel's run delay), on a CPU, blocked"
            " (a worker or slot, the GIL); and\n   how much of the wall time went to"
            " entering the query"
        )
        print(
            f"   {'mode':10} {'':6} {'wall':>6} {'run wait':>8} {'on CPU':>7} {'blocked':>7} "
            f"{'entering':>8}"
        )
        for mode in MODES:
            for label, samples in (
                ("alone", alone_samples[mode]),
                ("load", [x for p in loaded[mode] for x in p.samples]),
            ):
                t = tail(samples)
                print(
                    f"   {mode:10} {label:6} {t['wall']:6.2f} {t['run_delay']:8.2f} "
                    f"{t['cpu']:7.2f} {t['blocked']:7.2f} {t['admission']:8.2f}"
                )

    if args.only in (None, "conservation"):
        print("\n2. work conservation: half-core limited + unlimited, 2 queries each, workers=2")
        for n in CONSERVATION_N:
            conservation(n, seconds, rounds)

    if args.only in (None, "grant"):
        loops = 2000 if args.fast else 20000
        costs: dict[bool, list[float]] = {False: [], True: []}
        for r in range(max(3, rounds)):
            for lanes in (False, True) if r % 2 == 0 else (True, False):
                costs[lanes].append(grant_cost(lanes, loops))
        off, on = statistics.median(costs[False]), statistics.median(costs[True])
        print("\n3. CPU time of a query entered and left in a lower lane (median, interleaved)")
        print(
            f"lanes off {off * 1e6:.2f} us, lanes on {on * 1e6:.2f} us: "
            f"{(on - off) * 1e6:+.2f} us a grant"
        )
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        t0 = time.perf_counter()
        for _ in range(loops):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        print(f"one setpriority call: {(time.perf_counter() - t0) / loops * 1e6:.2f} us")


if __name__ == "__main__":
    main()
