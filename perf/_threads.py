"""Timing a loop run by several threads at once (shared by the benchmarks)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyperf


def timed_threads(threads: int, loops: int, prepare: Callable[[], Callable[[int], None]]) -> float:
    """Seconds for ``loops`` iterations split over ``threads`` threads.

    Each thread calls ``prepare()`` first (untimed) and gets the loop to run
    with its share of the iterations; the clock starts when all are ready.
    """
    per_thread = max(1, loops // threads)
    ready = threading.Barrier(threads + 1)

    def work() -> None:
        loop = prepare()
        ready.wait()
        loop(per_thread)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    ready.wait()
    t0 = pyperf.perf_counter()
    for t in pool:
        t.join()
    return (pyperf.perf_counter() - t0) * loops / (per_thread * threads)
