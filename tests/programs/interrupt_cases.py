"""SIGINT at the worst moments, made to happen: while ``__exit__`` waits for the
dispatcher's lock, while ``__enter__`` waits for the gate's lock, while
``map`` waits for a task on a pool thread, while a query waits in the queue.

    python tests/programs/interrupt_cases.py

Each case prints one JSON line: whether the KeyboardInterrupt reached the
caller, and what the pool and the group hold right after (nothing, at once).
A helper thread makes the main thread block where the case wants it (by
holding a lock, or by running a slow task), then sends SIGINT to it.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable

import resgroups

MAIN = threading.main_thread().ident
assert MAIN is not None


def interrupt_later(hold: threading.Lock | None, delay: float = 0.1) -> threading.Thread:
    """Take ``hold`` (if any), SIGINT the main thread after ``delay``, then let go."""
    taken = threading.Event()

    def run() -> None:
        if hold is not None:
            hold.acquire()
        taken.set()
        time.sleep(delay)  # the main thread is now blocked where the case wants it
        signal.pthread_kill(MAIN, signal.SIGINT)
        time.sleep(delay)
        if hold is not None:
            hold.release()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    taken.wait(5)
    return thread


def whole(engine: resgroups.Engine) -> dict[str, object]:
    """What the engine holds right now: nothing, if every path gave back."""
    return {
        "pool_free": engine.pool("default").free,
        "pool_size": 2,
        "active": sum(r["active_queries"] for r in engine.resource_groups()),
        "queued": sum(r["queued_queries"] for r in engine.resource_groups()),
        "memory": engine.memory_ledger.process.used,
        "open_queries": len(engine._queries),
    }


def case(name: str, body: Callable[[resgroups.Engine, resgroups.Session], None]) -> None:
    with resgroups.Engine(workers=2, query_timeout=30) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        session.execute("SET RESOURCE GROUP g")
        interrupted = False
        try:
            body(engine, session)
        except KeyboardInterrupt:
            interrupted = True
        except resgroups.Error as exc:
            print(json.dumps({"case": name, "error": repr(exc)}), flush=True)
        result = {"case": name, "interrupted": interrupted, **whole(engine)}
        print(json.dumps(result), flush=True)


def exit_waits_for_the_dispatcher(engine: resgroups.Engine, session: resgroups.Session) -> None:
    q = session.query()
    q.__enter__()
    q.memory.allocate(1 << 20)
    helper = interrupt_later(engine.dispatcher.lock)
    try:
        q.__exit__(None, None, None)
    finally:
        helper.join(5)


def enter_waits_for_the_gate(engine: resgroups.Engine, session: resgroups.Session) -> None:
    group = engine.snapshot.find_group(resgroups.sql.ast.Ident("g"))
    assert group is not None
    runtime = engine.runtime_for(group)
    helper = interrupt_later(runtime.gate.lock)
    try:
        with session.query():
            time.sleep(0.01)
    finally:
        helper.join(5)


def enter_waits_for_a_worker(engine: resgroups.Engine, session: resgroups.Session) -> None:
    helper = interrupt_later(engine.dispatcher.lock)
    try:
        with session.query():
            time.sleep(0.01)
    finally:
        helper.join(5)


def map_waits_for_a_task(engine: resgroups.Engine, session: resgroups.Session) -> None:
    started = threading.Event()

    def task(t: resgroups.query.Task, i: int) -> int:
        if threading.get_ident() == MAIN:  # the caller's item: done once the other runs
            started.wait(5)
            return i
        started.set()  # on a pool thread: slow, with checkpoints
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            t.checkpoint()
            time.sleep(0.001)
        return i

    helper = None
    with session.query() as q:
        helper = interrupt_later(None, delay=0.15)
        try:
            q.map(task, range(2))
        finally:
            helper.join(5)


def queued_query(engine: resgroups.Engine, session: resgroups.Session) -> None:
    other = engine.connect()
    other.execute("SET RESOURCE GROUP g")
    holding, done = threading.Event(), threading.Event()

    def hold_the_slot() -> None:
        with other.query():
            holding.set()
            done.wait(5)

    holder = threading.Thread(target=hold_the_slot, daemon=True)
    holder.start()
    holding.wait(5)
    helper = interrupt_later(None, delay=0.1)
    started = time.monotonic()
    try:
        with session.query():  # queued behind the holder
            pass
    finally:
        waited = time.monotonic() - started
        helper.join(5)
        done.set()
        holder.join(5)
        print(json.dumps({"case": "queued_query", "waited_s": round(waited, 3)}), flush=True)


if __name__ == "__main__":
    for name, body in [
        ("exit_waits_for_the_dispatcher", exit_waits_for_the_dispatcher),
        ("enter_waits_for_the_gate", enter_waits_for_the_gate),
        ("enter_waits_for_a_worker", enter_waits_for_a_worker),
        ("map_waits_for_a_task", map_waits_for_a_task),
        ("queued_query", queued_query),
    ]:
        case(name, body)
    sys.exit(0)
