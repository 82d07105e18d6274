"""The work of one uncontended managed query, counted rather than timed.

    python perf/count_query_path.py            # off the main thread, then on it
    python perf/count_query_path.py --by-function

Counts, per ``with session.query(): pass`` in DEFAULT (the first row of
``perf/bench_admission.py``), the Python bytecodes executed, the Python
functions called and the C functions called, under ``sys.settrace`` and
``sys.setprofile``. The counts do not depend on the machine's load, so two
versions of the path compare exactly where timings on a shared machine are
noise; they say nothing of what a C call (a ``sigaction``, a clock read)
costs, which ``bench_admission.py`` measures.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from types import FrameType
from typing import Any

import resgroups

QUERIES = 20


def count(by_function: bool) -> tuple[dict[str, float], Counter[str]]:
    """Per query: bytecodes, Python calls, C calls; and bytecodes by function."""
    with resgroups.Engine() as engine:
        session = engine.connect("bench")
        for _ in range(50):  # warm: the placement is resolved, the handlers planned
            with session.query():
                pass
        totals: Counter[str] = Counter()
        by_code: Counter[str] = Counter()

        def trace(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "call":
                totals["python_calls"] += 1
                frame.f_trace_opcodes = True
            elif event == "opcode":
                totals["bytecodes"] += 1
                if by_function:
                    by_code[frame.f_code.co_qualname] += 1
            return trace

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            if event == "c_call":
                totals["c_calls"] += 1

        sys.settrace(trace)
        sys.setprofile(profile)
        try:
            for _ in range(QUERIES):
                with session.query():
                    pass
        finally:
            sys.settrace(None)
            sys.setprofile(None)
    per_query = {key: value / QUERIES for key, value in totals.items()}
    return per_query, Counter({k: v // QUERIES for k, v in by_code.items()})


def report(where: str, by_function: bool) -> None:
    per_query, by_code = count(by_function)
    print(
        f"{where}: {per_query['bytecodes']:.0f} bytecodes, "
        f"{per_query['python_calls']:.0f} Python calls, {per_query['c_calls']:.0f} C calls"
    )
    for name, ops in by_code.most_common():
        print(f"  {ops:5d}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-function", action="store_true", help="bytecodes per function")
    by_function = parser.parse_args().by_function
    thread = threading.Thread(target=report, args=("other thread", by_function))
    thread.start()
    thread.join()
    report("main thread", by_function)


if __name__ == "__main__":
    main()
