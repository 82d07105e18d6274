"""The work of one uncontended managed query, counted rather than timed.

    python perf/count_query_path.py            # off the main thread, then on it
    python perf/count_query_path.py --by-function
    python perf/count_query_path.py --contended [--by-function]
    python perf/count_query_path.py --engaged [--by-function]

Counts, per ``with session.query(): pass`` in DEFAULT (the first row of
``perf/bench_admission.py``), the Python bytecodes executed, the Python
functions called and the C functions called, under ``sys.settrace`` and
``sys.setprofile``. The counts do not depend on the machine's load, so two
versions of the path compare exactly where timings on a shared machine are
noise; they say nothing of what a C call (a ``sigaction``, a clock read)
costs, which ``bench_admission.py`` measures.

``--contended`` counts the second row of ``bench_admission.py`` instead: 8
threads each looping ``with session.query(): pass`` in a group with
``max_active_queries = 2`` (``workers=8``; the second group engages CPU
scheduling), every thread traced after its warm-up, the totals divided by
the admissions made while traced (what the waiting threads execute while
they wait counts too). It prints the share of those admissions that queued
(calls of ``Gate._enqueue``), which should be near 1: traced, the threads
run in a convoy.

``--engaged`` counts the uncontended query off the main thread while a second
group exists (CPU scheduling engaged: the query's CPU is read as it starts
and ends, and charged), the sixth row of ``bench_admission.py``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from types import CodeType, FrameType
from typing import Any

import resgroups
from resgroups.sched.admission import Gate

QUERIES = 20
THREADS = 8
CONTENDED_QUERIES = 200  # per thread


def traced(
    session: resgroups.Session, queries: int, by_function: bool, queued_code: CodeType | None = None
) -> tuple[Counter[str], Counter[str]]:
    """What ``queries`` managed queries of ``session`` execute on this thread:
    bytecodes, Python calls, C calls (and the calls of ``queued_code``, as
    "queued"); and bytecodes by function. The loop runs in this function's frame,
    which began before the trace was set, so only the queries are counted."""
    totals: Counter[str] = Counter()  # changed by this thread only
    by_code: Counter[str] = Counter()

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "call":
            totals["python_calls"] += 1
            if frame.f_code is queued_code:
                totals["queued"] += 1
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
        for _ in range(queries):
            with session.query():
                pass
    finally:
        sys.settrace(None)
        sys.setprofile(None)
    return totals, by_code


def _warm(session: resgroups.Session) -> None:
    """Untraced: the placement is resolved, the handlers planned."""
    for _ in range(50):
        with session.query():
            pass


def count(by_function: bool, engaged: bool = False) -> tuple[dict[str, float], Counter[str]]:
    """Per query: bytecodes, Python calls, C calls; and bytecodes by function."""
    with resgroups.Engine() as engine:
        if engaged:
            engine.connect().execute("CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")
        session = engine.connect("bench")
        _warm(session)
        totals, by_code = traced(session, QUERIES, by_function)
    per_query = {key: value / QUERIES for key, value in totals.items()}
    return per_query, Counter({k: v // QUERIES for k, v in by_code.items()})


def count_contended(by_function: bool) -> tuple[dict[str, float], Counter[str]]:
    """Per admission, 8 threads at a limit of 2: bytecodes, Python calls, C calls
    (and the share of admissions that queued); and bytecodes by function."""
    queued_code = Gate._enqueue.__code__  # every queued ticket passes it once
    with resgroups.Engine(workers=THREADS) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 2)")
        ready = threading.Barrier(THREADS)
        results: list[tuple[Counter[str], Counter[str]]] = []

        def work() -> None:
            session = engine.connect("bench")
            session.execute("SET RESOURCE GROUP g")
            _warm(session)
            ready.wait()
            results.append(traced(session, CONTENDED_QUERIES, by_function, queued_code))

        pool = [threading.Thread(target=work) for _ in range(THREADS)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    totals: Counter[str] = Counter()
    by_code: Counter[str] = Counter()
    for mine, code in results:
        totals.update(mine)
        by_code.update(code)
    admissions = THREADS * CONTENDED_QUERIES
    per_query = {key: value / admissions for key, value in totals.items()}
    return per_query, Counter({k: v // admissions for k, v in by_code.items()})


def report(where: str, by_function: bool, contended: bool = False, engaged: bool = False) -> None:
    if contended:
        per_query, by_code = count_contended(by_function)
    else:
        per_query, by_code = count(by_function, engaged)
    print(
        f"{where}: {per_query['bytecodes']:.0f} bytecodes, "
        f"{per_query['python_calls']:.0f} Python calls, {per_query['c_calls']:.0f} C calls"
        + (f", {per_query.get('queued', 0.0):.1%} queued" if contended else "")
    )
    for name, ops in by_code.most_common():
        print(f"  {ops:5d}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--by-function", action="store_true", help="bytecodes per function")
    parser.add_argument(
        "--contended", action="store_true", help="8 threads at a limit of 2, per admission"
    )
    parser.add_argument(
        "--engaged", action="store_true", help="off the main thread, a second group existing"
    )
    args = parser.parse_args()
    by_function = args.by_function
    if args.contended:
        report("8 threads, limit 2", by_function, contended=True)
        return
    if args.engaged:
        thread = threading.Thread(
            target=report, args=("other thread, engaged", by_function), kwargs={"engaged": True}
        )
        thread.start()
        thread.join()
        return
    thread = threading.Thread(target=report, args=("other thread", by_function))
    thread.start()
    thread.join()
    report("main thread", by_function)


if __name__ == "__main__":
    main()
