"""Admission cost, side by side with a bare threading.Semaphore in the same run.

    python perf/bench_admission.py --fast            # rough, quick
    python perf/bench_admission.py -o admission.json # pyperf, several processes

1. one uncontended managed query (enter + exit, DEFAULT only) vs
   ``Semaphore.acquire() + release()``, on the main thread (where a query
   holds off signal handlers while it takes and gives back: see
   resgroups/interrupts.py) and on another thread (where no handler runs);
2. 8 threads passing through a group with max_active_queries = 2, vs 8
   threads on a ``Semaphore(2)``: time per admission (1 / throughput);
3. ``q.map`` over 1,000 trivial tasks on a pool of 2 workers, vs
   ``ThreadPoolExecutor(2).map`` over the same items: time per task.

Two more rows give context. The same 8 threads through ``FifoHandoff``: the
least a gate that admits strictly in arrival order can do in Python (a
deque of raw locks; a leaving thread hands its slot to the first waiter),
timed, as the managed rows are, from the convoy (all 8 threads queued), so that
the cost of FIFO order itself (a semaphore lets a thread take back the slot
it gave, which FIFO forbids) shows apart from resgroups' bookkeeping; and
the same 8 threads with the limit on DEFAULT, the only group, so that CPU
scheduling is not engaged (its share of the contended cost). And an uncontended query on
another thread while CPU scheduling is engaged (a second group exists, as
in most deployments), where each query's CPU is read and charged. Beside
it, the same query while runaway-query rules exist on that other group
(SPEC §16): the rules of a query's own group are all it looks at, so the
ratio of the two is the cost of rules elsewhere (perf/bench_rules.py has the
cost per checkpoint of a rule on the query's own group).

The ratios print at the end (goals: 1 at most 3x, 2 at most 6x, 3 at most 2x).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyperf
from _threads import THREADS, contended_fifo, contended_gate, timed_threads

import resgroups

MAP_WORKERS = 2
MAP_ITEMS = list(range(1000))


def managed_query(loops: int, setup: str = "") -> float:
    """Uncontended queries in DEFAULT, after ``setup`` (SQL) has run."""
    with resgroups.Engine() as engine:
        if setup:
            engine.connect().execute_script(setup)
        session = engine.connect("bench")
        t0 = pyperf.perf_counter()
        for _ in range(loops):
            with session.query():
                pass
        return pyperf.perf_counter() - t0


def managed_query_engaged(loops: int) -> float:
    """An uncontended query in DEFAULT while a second group exists (scheduling
    engaged: the query's CPU is read as it starts and ends, and charged)."""
    return managed_query(loops, "CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")


def managed_query_rules_elsewhere(loops: int) -> float:
    """As ``managed_query_engaged``, with runaway-query rules on the other group."""
    return managed_query(
        loops,
        "CREATE RESOURCE GROUP other WITH (cpu_weight = 200);"
        "CREATE RESOURCE RULE r1 ON RESOURCE GROUP other WHEN cpu_time > 1h THEN KILL;"
        "CREATE RESOURCE RULE r2 ON RESOURCE GROUP other WHEN rows > 1000000 THEN LOG",
    )


def semaphore(loops: int) -> float:
    sem = threading.Semaphore(1)
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        sem.acquire()
        sem.release()
    return pyperf.perf_counter() - t0


def on_a_thread(bench: Callable[[int], float]) -> Callable[[int], float]:
    """``bench`` run on a thread of its own (not the main thread)."""

    def run(loops: int) -> float:
        result: list[float] = []
        thread = threading.Thread(target=lambda: result.append(bench(loops)))
        thread.start()
        thread.join()
        return result[0]

    return run


def contended_default(loops: int) -> float:
    return contended_gate(loops, in_default=True)


def contended_semaphore(loops: int) -> float:
    sem = threading.Semaphore(2)

    def loop(n: int) -> None:
        for _ in range(n):
            with sem:
                pass

    return timed_threads(THREADS, loops, lambda: loop)


def query_map(loops: int) -> float:
    """Seconds per task of q.map (loops counted in tasks)."""
    with resgroups.Engine(workers=MAP_WORKERS) as engine:
        session = engine.connect("bench")
        batches = max(1, loops // len(MAP_ITEMS))
        t0 = pyperf.perf_counter()
        for _ in range(batches):
            with session.query() as q:
                q.map(lambda task, x: x, MAP_ITEMS)
        return (pyperf.perf_counter() - t0) * loops / (batches * len(MAP_ITEMS))


def executor_map(loops: int) -> float:
    with ThreadPoolExecutor(MAP_WORKERS) as executor:
        batches = max(1, loops // len(MAP_ITEMS))
        t0 = pyperf.perf_counter()
        for _ in range(batches):
            list(executor.map(lambda x: x, MAP_ITEMS))
        return (pyperf.perf_counter() - t0) * loops / (batches * len(MAP_ITEMS))


def _ratio(a: pyperf.Benchmark | None, b: pyperf.Benchmark | None, label: str) -> None:
    if a is not None and b is not None and a.get_nrun() and b.get_nrun():
        print(
            f"{label}: {a.median() * 1e6:.2f} us vs {b.median() * 1e6:.2f} us "
            f"= {a.median() / b.median():.1f}x"
        )


if __name__ == "__main__":
    runner = pyperf.Runner()
    worker = runner.parse_args().worker
    q = runner.bench_time_func("managed_query_enter_exit", managed_query)
    s = runner.bench_time_func("semaphore_acquire_release", semaphore)
    qt = runner.bench_time_func("managed_query_enter_exit_thread", on_a_thread(managed_query))
    st = runner.bench_time_func("semaphore_acquire_release_thread", on_a_thread(semaphore))
    cq = runner.bench_time_func("admission_8_threads_limit_2", contended_gate)
    cd = runner.bench_time_func("admission_8_threads_limit_2_default", contended_default)
    cs = runner.bench_time_func("semaphore_8_threads_limit_2", contended_semaphore)
    cf = runner.bench_time_func("fifo_handoff_8_threads_limit_2", contended_fifo)
    qe = runner.bench_time_func("managed_query_engaged_thread", on_a_thread(managed_query_engaged))
    qr = runner.bench_time_func(
        "managed_query_rules_elsewhere_thread", on_a_thread(managed_query_rules_elsewhere)
    )
    qm = runner.bench_time_func("query_map_per_task", query_map)
    em = runner.bench_time_func("thread_pool_executor_map_per_task", executor_map)
    if worker:
        raise SystemExit(0)
    _ratio(q, s, "uncontended, main thread: managed query / semaphore")
    _ratio(qt, st, "uncontended, other thread: managed query / semaphore")
    _ratio(cq, cs, "8 threads, limit 2: managed query / semaphore")
    _ratio(cf, cs, "8 threads, limit 2: bare FIFO hand-off / semaphore")
    _ratio(cq, cf, "8 threads, limit 2: managed query / bare FIFO hand-off")
    _ratio(cd, cf, "8 threads, limit 2, DEFAULT only (not engaged): managed / FIFO hand-off")
    _ratio(qe, st, "uncontended, other thread, scheduling engaged: managed query / semaphore")
    _ratio(qr, qe, "uncontended, other thread: rules on another group / none (engaged)")
    _ratio(qm, em, "q.map / ThreadPoolExecutor.map, per task")
    if cq is not None and cq.get_nrun():
        print(f"admissions per second, 8 threads, limit 2: {1 / cq.median():,.0f}")
