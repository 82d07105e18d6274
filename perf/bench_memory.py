"""Memory accounting cost: the batched per-thread path against a locked shared
counter updated on every call, with 1 and 4 threads, in one run.

    python perf/bench_memory.py --fast

Each loop does allocate(4096) + release(4096). The batched path is what a
query's ``q.memory`` / ``task.memory`` does; the baseline takes one lock per
call on a counter shared by every thread (goal: 2.5x cheaper or better).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyperf
from _threads import timed_threads

from resgroups.sched.memory import MemoryCounter, MemoryLedger, QueryMemory

SIZE = 4096


class LockedCounter:
    """The baseline: every call takes the lock of one shared counter."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.used = 0

    def allocate(self, n: int) -> None:
        with self.lock:
            self.used += n

    def release(self, n: int) -> None:
        with self.lock:
            self.used -= n


def _loop(counter: MemoryCounter | LockedCounter) -> Callable[[int], None]:
    allocate, release = counter.allocate, counter.release

    def loop(n: int) -> None:
        for _ in range(n):
            allocate(SIZE)
            release(SIZE)

    return loop


def batched(threads: int) -> Callable[[int], float]:
    ledger = MemoryLedger(0)
    budget = ledger.group(1, "g")
    query = QueryMemory(ledger, 1, budget, None, "bench", lambda e: None)
    return lambda loops: timed_threads(threads, loops, lambda: _loop(MemoryCounter(query)))


def locked(threads: int) -> Callable[[int], float]:
    shared = LockedCounter()
    return lambda loops: timed_threads(threads, loops, lambda: _loop(shared))


if __name__ == "__main__":
    runner = pyperf.Runner()
    args = runner.parse_args()
    results = {}
    for threads in (1, 4):
        results[threads] = (
            runner.bench_time_func(f"batched_{threads}_threads", batched(threads)),
            runner.bench_time_func(f"locked_counter_{threads}_threads", locked(threads)),
        )
    if not args.worker:
        for threads, (b, lk) in results.items():
            if b is not None and lk is not None and b.get_nrun() and lk.get_nrun():
                print(
                    f"{threads} thread(s): batched {b.median() * 1e9:.0f} ns vs locked "
                    f"{lk.median() * 1e9:.0f} ns per allocate+release = "
                    f"{lk.median() / b.median():.2f}x cheaper"
                )
