"""Deliver SIGINT at random instants while the main thread enters, exits and maps
managed queries; then check that the pools, gates and budgets are whole.

    python tests/programs/interrupt_storm.py --interrupts 3000 --seed 1

Prints one JSON object: the interrupts delivered and caught, where they landed,
and what the engine holds at the end (every count must be back to zero). A
helper thread sends the signals with ``pthread_kill`` to the main thread, the
only one Python runs signal handlers on, at random gaps of 0 to 300 µs.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time

import numpy as np

import resgroups

logging.getLogger("resgroups").setLevel(logging.ERROR)  # the 1,024 bytes left on purpose
# the kinds of step that must each catch an interrupt (tests/test_interrupts.py checks)
REQUIRED = ("enter-exit", "map", "memory", "queued", "sql")


class Flag:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--interrupts", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--min-seconds", type=float, default=3.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    engine = resgroups.Engine(workers=2, query_timeout=30.0)
    admin = engine.connect()
    admin.execute_script(
        "CREATE RESOURCE GROUP narrow WITH (max_active_queries = 1, memory_limit = '64M');"
        "CREATE RESOURCE GROUP wide WITH (cpu_weight = 50)"
    )
    main_ident = threading.get_ident()
    stop = threading.Event()
    sent = 0

    # at least this long too: on a loaded machine the main thread may run little
    # while 3,000 signals go out in half a second
    storm_until = time.monotonic() + args.min_seconds

    # and until each kind of step has caught one (a loaded machine may run the main
    # thread so little that a kind is missed in 3 s), within --max-seconds
    storm_deadline = time.monotonic() + args.max_seconds

    def more() -> bool:
        if time.monotonic() >= storm_deadline:
            return False
        missed = any(step not in caught for step in REQUIRED)
        return sent < args.interrupts or time.monotonic() < storm_until or missed

    def storm() -> None:
        nonlocal sent
        while not stop.is_set() and more():
            time.sleep(rng.random() * 0.0002)
            signal.pthread_kill(main_ident, signal.SIGINT)
            sent += 1
        stop.set()

    # a second session holds narrow's one slot now and then, so the main thread queues
    other = engine.connect()
    other.execute("SET RESOURCE GROUP narrow")

    def rival() -> None:  # holds narrow's slot now and then, and keeps the pool busy
        while not stop.is_set():
            try:
                with other.query() as q:
                    q.map(lambda task, i: float((data * i).sum()), range(3))
                    time.sleep(0.0003)
            except resgroups.Error:
                pass

    session = engine.connect()
    data = np.arange(2_000, dtype=np.float64)

    def work(task: resgroups.query.Task, chunk: int) -> float:
        task.checkpoint()
        with task.memory.track(data):
            return float((data * chunk).sum())

    caught: dict[str, int] = {}
    steps = ["enter-exit", "map", "memory", "queued", "suspend", "sql"]
    threads = [
        threading.Thread(target=storm, daemon=True),
        threading.Thread(target=rival, daemon=True),
    ]
    # the handler raises only while a query is being entered, run or left, so
    # every KeyboardInterrupt lands there and none in this loop's bookkeeping.
    # A plain flag, no lock: a handler that took a lock the interrupted code
    # holds would wait on it, run the next signal's handler while waiting, and
    # nest until the recursion limit.
    armed = Flag()

    def on_sigint(signum: int, frame: object) -> None:
        if armed.value:
            armed.value = False
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    for t in threads:
        t.start()
    deadline = time.monotonic() + args.max_seconds
    completed = iteration = 0
    while not stop.is_set() and time.monotonic() < deadline:
        step = steps[iteration % len(steps)]
        iteration += 1
        try:
            armed.value = True
            session.execute("SET RESOURCE GROUP " + ("narrow" if step == "queued" else "wide"))
            if step == "sql":  # the executor: morsels mapped over the pool
                session.execute("SELECT sum(x) FROM long_sequence(20000)")
                armed.value = False
                completed += 1
                continue
            with session.query() as q:
                if step == "map":
                    q.map(work, range(6))
                elif step == "memory":
                    q.memory.allocate(4096)
                    q.memory.release(4096)
                    q.memory.allocate(1024)  # left to the end of the query
                elif step == "suspend":
                    q.suspend()
                    q.resume()
                q.checkpoint()
            armed.value = False
            completed += 1
        except KeyboardInterrupt:
            armed.value = False
            caught[step] = caught.get(step, 0) + 1
        except resgroups.Error as exc:
            armed.value = False
            caught[type(exc).__name__] = caught.get(type(exc).__name__, 0) + 1
    stop.set()
    for t in threads:
        t.join(10)

    # settle: the pools come back, nothing is left admitted, queued or charged
    settled_by = time.monotonic() + 10
    while time.monotonic() < settled_by:
        if engine.pool("default").free == 2 and all(
            r["active_queries"] == 0 and r["queued_queries"] == 0 and r["memory_used_bytes"] == 0
            for r in engine.resource_groups()
        ):
            break
        time.sleep(0.01)
    engine.dispatcher.check_invariants()
    with session.query() as q:  # and it still serves
        results = q.map(work, range(4))
    report = {
        "sent": sent,
        "caught": caught,
        "completed": completed,
        "pool_free": engine.pool("default").free,
        "pool_size": 2,
        "groups": {
            r["name"]: [r["active_queries"], r["queued_queries"], r["memory_used_bytes"]]
            for r in engine.resource_groups()
        },
        "process_memory": engine.memory_ledger.process.used,
        "open_queries": len(engine._queries),
        "session_running": len(session.running_ids) + len(other.running_ids),
        "served_after": len(results),
    }
    engine.close()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
