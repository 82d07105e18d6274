"""CPU scheduling cost and accuracy, measured side by side in one run.

    python perf/bench_sched.py --fast          # pyperf micro part quick; then the rest
    python perf/bench_sched.py --seconds 3     # length of each throughput run

1. the checkpoint fast path next to an empty function call (pyperf);
2. CPU-bound throughput under contention (2 workers, 2 groups weighted 2:1,
   3 queries each) with scheduling engaged, against 6 free threads doing the
   same numpy work without resgroups: median of 5 alternating runs each
   (target: 0.95 or better);
3. the 2:1 fairness error of those engaged runs;
4. the error of a 0.5-core limit with the rest of the machine idle.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import numpy as np
import pyperf

import resgroups

N = 300_000
RUNS = 5


def step(a: np.ndarray, b: np.ndarray) -> None:
    np.multiply(a, 1.0000001, out=b)
    np.add(b, 1e-9, out=a)


# ---- 1. micro -------------------------------------------------------------------------


def checkpoint_loop(loops: int) -> float:
    with resgroups.Engine() as engine, engine.connect().query() as q:
        checkpoint = q.checkpoint
        t0 = pyperf.perf_counter()
        for _ in range(loops):
            checkpoint()
        return pyperf.perf_counter() - t0


def empty_call_loop(loops: int) -> float:
    def empty() -> None:
        pass

    t0 = pyperf.perf_counter()
    for _ in range(loops):
        empty()
    return pyperf.perf_counter() - t0


# ---- 2-4. throughput and accuracy -----------------------------------------------------


def free_threads(seconds: float) -> int:
    """Steps done by 6 plain threads in ``seconds``."""
    done = [0] * 6
    stop = time.monotonic() + seconds

    def work(i: int) -> None:
        a = np.random.rand(N)
        b = np.empty_like(a)
        while time.monotonic() < stop:
            step(a, b)
            done[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(done)


def scheduled(seconds: float, setup: str, groups: list[str]) -> tuple[int, dict[str, int]]:
    """Steps done, and CPU per group, by 3 queries per group through resgroups."""
    with resgroups.Engine(workers=2) as engine:
        engine.connect().execute_script(setup)
        done = [0] * (3 * len(groups))
        cpu: dict[str, int] = {g: 0 for g in groups}
        lock = threading.Lock()
        stop = time.monotonic() + seconds

        def work(i: int, group: str) -> None:
            session = engine.connect("bench")
            session.execute(f"SET RESOURCE GROUP {group}")
            a = np.random.rand(N)
            b = np.empty_like(a)
            with session.query() as q:
                c0 = time.thread_time_ns()
                while time.monotonic() < stop:
                    q.checkpoint()
                    step(a, b)
                    done[i] += 1
                used = time.thread_time_ns() - c0
            with lock:
                cpu[group] += used

        threads = [
            threading.Thread(target=work, args=(i, g))
            for i, g in enumerate(g for g in groups for _ in range(3))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(done), cpu


def accuracy(seconds: float) -> None:
    ratios, errors = [], []
    for _ in range(RUNS):
        base = free_threads(seconds)
        steps, cpu = scheduled(
            seconds,
            "CREATE RESOURCE GROUP a WITH (cpu_weight = 100);"
            "CREATE RESOURCE GROUP b WITH (cpu_weight = 50);",
            ["a", "b"],
        )
        ratios.append(steps / base)
        errors.append(abs(cpu["a"] / cpu["b"] - 2.0) / 2.0)
    print(
        f"throughput engaged / free threads: median {statistics.median(ratios):.3f} "
        f"(runs: {', '.join(f'{r:.3f}' for r in ratios)})"
    )
    print(f"2:1 fairness error: median {statistics.median(errors) * 100:.1f}%")
    cpus = resgroups.Engine().cpus
    pct = round(0.5 / cpus * 100, 2)
    limit_errors = []
    for _ in range(3):
        _, cpu = scheduled(
            seconds, f"CREATE RESOURCE GROUP half WITH (cpu_limit = '{pct}%')", ["half"]
        )
        limit_errors.append(abs(cpu["half"] / (seconds * 1e9) - 0.5))
    print(
        f"0.5-core limit, rest idle: error median {statistics.median(limit_errors):.3f} cores "
        f"({pct}% of {cpus} CPUs)"
    )


if __name__ == "__main__":
    seconds = 3.0
    if "--seconds" in sys.argv:
        i = sys.argv.index("--seconds")
        seconds = float(sys.argv[i + 1])
        del sys.argv[i : i + 2]
    runner = pyperf.Runner()
    args = runner.parse_args()
    cp = runner.bench_time_func("checkpoint_fast_path", checkpoint_loop)
    ec = runner.bench_time_func("empty_function_call", empty_call_loop)
    if not args.worker:
        if cp is not None and ec is not None and cp.get_nrun() and ec.get_nrun():
            print(
                f"checkpoint / empty call: {cp.median() * 1e9:.0f} ns vs "
                f"{ec.median() * 1e9:.0f} ns = {cp.median() / ec.median():.2f}x"
            )
        accuracy(seconds)
