"""What a convoy of threads through a FIFO gate costs, and where resgroups sits in it.

    python perf/convoy_model.py            # 5 interleaved rounds
    python perf/convoy_model.py --fast     # a smoke run

8 threads loop through a gate of 2 slots that admits in arrival order, as in
the contended rows of ``perf/bench_admission.py``. Every admission is a
hand-off: the leaving thread wakes the first waiter, and the GIL serialises
the Python both run. The model is the bare FIFO hand-off of that benchmark
with ``work`` (plain Python: calls, attribute reads, arithmetic) run by each
thread between leaving and entering again, as a managed query's exit and
next entry run between its hand-off and its next wait; beside each size the
same work timed serially on one thread (its cost with warm caches).

If the convoy's time per admission is the bare hand-off plus the serial
Python of one admission cycle (the model's rows say so: ``convoy - bare``
against ``serial``), a gate whose cycle runs P of Python is (bare + P) /
bare times the bare hand-off: at most 2x needs P no longer than one bare
hand-off, a thread's wake-up on this machine. The managed rows (DEFAULT
alone, scheduling not engaged; and a group of its own, engaged) show where
resgroups' contended admission sits against that line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from _threads import THREADS, contended_fifo, contended_gate

SIZES = (0, 10, 25, 50)  # iterations of the work loop, about 25 bytecodes each


class _Obj:
    __slots__ = ("a", "b", "c")

    def __init__(self) -> None:
        self.a, self.b, self.c = 0, 1, 2


def _step(o: _Obj, x: int) -> int:
    o.a += x
    return o.b + x


def work(n: int) -> None:
    o = _Obj()
    for i in range(n):
        _step(o, i)
        o.c = o.a - i


def bytecodes(n: int) -> int:
    """Bytecodes one ``work(n)`` executes (traced once)."""
    count = 0

    def trace(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        work(n)
    finally:
        sys.settrace(None)
    return count


def serial(n: int, loops: int) -> float:
    """Seconds of one admission cycle's ``work`` (two halves) on one thread."""
    t0 = time.perf_counter()
    for _ in range(loops):
        work(n)
        work(n)
    return (time.perf_counter() - t0) / loops


def convoy(n: int, loops: int) -> float:
    """Seconds per admission: 8 threads through ``FifoHandoff(2)``, each running
    ``work(n)`` twice between leaving and entering again, in the convoy."""

    def cycle() -> None:
        work(n)
        work(n)

    return contended_fifo(loops, cycle) / loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--fast", action="store_true", help="a smoke run: 1 round, fewer loops")
    args = parser.parse_args()
    rounds, loops = (1, 2000) if args.fast else (args.rounds, 16000)
    runs: dict[str, Callable[[], float]] = {
        f"model {n}": (lambda n=n: convoy(n, loops)) for n in SIZES
    }
    runs["managed, DEFAULT alone"] = lambda: contended_gate(loops, in_default=True) / loops
    runs["managed, own group"] = lambda: contended_gate(loops) / loops
    times: dict[str, list[float]] = {name: [] for name in runs}
    serials: dict[int, list[float]] = {n: [] for n in SIZES}
    for r in range(rounds):
        order = list(runs.items())
        for name, run in order if r % 2 == 0 else reversed(order):
            times[name].append(run())
        for n in SIZES:
            serials[n].append(serial(n, loops))
    bare = statistics.median(times[f"model {SIZES[0]}"])
    print(f"{THREADS} threads, 2 slots, FIFO; medians of {rounds} interleaved rounds (us)")
    print(f"{'':24} {'bytecodes':>9} {'serial':>7} {'convoy':>7} {'- bare':>7} {'x bare':>6}")
    for n in SIZES:
        t = statistics.median(times[f"model {n}"])
        print(
            f"{'model, work ' + str(n):24} {2 * bytecodes(n):9d} "
            f"{statistics.median(serials[n]) * 1e6:7.2f} {t * 1e6:7.2f} "
            f"{(t - bare) * 1e6:7.2f} {t / bare:6.2f}"
        )
    for name in ("managed, DEFAULT alone", "managed, own group"):
        t = statistics.median(times[name])
        print(f"{name:24} {'-':>9} {'-':>7} {t * 1e6:7.2f} {(t - bare) * 1e6:7.2f} {t / bare:6.2f}")
    print(
        f"2x the bare hand-off leaves {bare * 1e6:.2f} us of Python an admission cycle "
        "(perf/count_query_path.py --contended counts resgroups')"
    )


if __name__ == "__main__":
    main()
