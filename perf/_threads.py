"""Timing a loop run by several threads at once, and the gates they pass (shared by
the benchmarks; no pyperf here, so that the suite can run the scripts that use it)."""

from __future__ import annotations

import threading
import time
from _thread import LockType, allocate_lock
from collections import deque
from collections.abc import Callable

import resgroups


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
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    return (time.perf_counter() - t0) * loops / (per_thread * threads)


THREADS = 8


def contended_gate(loops: int, in_default: bool = False) -> float:
    """8 threads through a group with max_active_queries = 2: a group ``g`` of
    its own (CPU scheduling engaged, as wherever a second group exists), or
    DEFAULT itself (``in_default``: the one group, not engaged). Timed from
    the convoy, as :func:`contended_fifo`: two queries of the main thread
    hold both slots until every thread waits behind them (uncontended, a
    thread may pass many times on the counted path before another runs)."""
    group = "default" if in_default else "g"
    with resgroups.Engine(workers=THREADS) as engine:
        engine.connect().execute(
            "ALTER RESOURCE GROUP default SET (max_active_queries = 2)"
            if in_default
            else "CREATE RESOURCE GROUP g WITH (max_active_queries = 2)"
        )

        def session() -> resgroups.Session:
            s = engine.connect("bench")
            if not in_default:
                s.execute("SET RESOURCE GROUP g")
            return s

        holders = [session().query() for _ in range(2)]
        for held in holders:
            held.__enter__()
        per_thread = max(1, loops // THREADS)
        ready = threading.Barrier(THREADS + 1)

        def work() -> None:
            s = session()
            ready.wait()
            for _ in range(per_thread):
                with s.query():
                    pass

        pool = [threading.Thread(target=work) for _ in range(THREADS)]
        for thread in pool:
            thread.start()
        ready.wait()
        deadline = time.monotonic() + 10
        while _queued(engine, group) < THREADS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{_queued(engine, group)} of {THREADS} queued after 10 s")
            time.sleep(0.001)
        t0 = time.perf_counter()
        for held in holders:
            held.__exit__(None, None, None)
        for thread in pool:
            thread.join()
        return (time.perf_counter() - t0) * loops / (per_thread * THREADS)


def _queued(engine: resgroups.Engine, group: str) -> int:
    return next(
        int(g["queued_queries"]) for g in engine.resource_groups() if g["name"].lower() == group
    )


class FifoHandoff:
    """Admission in arrival order at its barest: a leaving thread hands its slot
    straight to the first waiter (no barging), each waiter blocks on a raw lock
    of its own. No deadlines, counters, workers or cancellation."""

    def __init__(self, limit: int) -> None:
        self._lock = allocate_lock()
        self._free = limit
        self.waiters: deque[LockType] = deque()

    def enter(self) -> None:
        with self._lock:
            if self._free and not self.waiters:
                self._free -= 1
                return
            waiter = allocate_lock()
            waiter.acquire()
            self.waiters.append(waiter)
        waiter.acquire()  # released by leave(): the slot is ours

    def leave(self) -> None:
        with self._lock:
            if self.waiters:
                self.waiters.popleft().release()
            else:
                self._free += 1


def contended_fifo(loops: int, between: Callable[[], None] | None = None) -> float:
    """8 threads through a ``FifoHandoff(2)``, timed from a queue of all of them.

    Started from free slots, the bare gate sometimes runs with nobody queued
    (the GIL lets one thread pass many times before another runs) and
    sometimes falls into a convoy (every admission a hand-off to a woken
    thread), a different mode each run; so both gates are timed in the
    convoy (:func:`contended_gate` too): the run starts with both slots
    held until every thread waits, and the convoy then persists. ``between``
    runs on each thread after it leaves and before it enters again, as a
    managed query's exit and next entry do (perf/convoy_model.py)."""
    gate = FifoHandoff(2)
    per_thread = max(1, loops // THREADS)
    ready = threading.Barrier(THREADS + 1)

    def work() -> None:
        ready.wait()
        for _ in range(per_thread):
            gate.enter()
            gate.leave()
            if between is not None:
                between()

    pool = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in pool:
        thread.start()
    gate.enter()
    gate.enter()
    ready.wait()
    deadline = time.monotonic() + 10
    while len(gate.waiters) < THREADS:  # every thread queued behind the two slots
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(gate.waiters)} of {THREADS} threads queued after 10 s")
        time.sleep(0.001)
    t0 = time.perf_counter()
    gate.leave()
    gate.leave()
    for thread in pool:
        thread.join()
    return (time.perf_counter() - t0) * loops / (per_thread * THREADS)
