"""Run managed queries in a loop while another process sends SIGINTs; when told to
stop, say what the engine still holds (issue 28's reproducer).

    python tests/programs/sigint_storm.py      # then SIGINT it; close stdin to stop
    python tests/programs/sigint_storm.py --signal term   # SIGTERM, SystemExit

Two groups, ``workers=2``, ``query_timeout=2``. Each query allocates tracked
memory and maps four tasks that allocate, checkpoint and release; every third
runs a nested query in the other group. The SIGINT
handler raises ``KeyboardInterrupt`` itself (not through
``signal.default_int_handler``) whenever a query is in flight: armed just before
the ``with`` statement, disarmed once it has left it (``--signal term``: the
SIGTERM handler raises ``SystemExit`` the same way), so that an interrupt lands
in resgroups or in the body, never in this loop's own bookkeeping (a handler
that swallows the signal outside the query stands for a program that was going
to exit anyway).

Prints ``{"ready": true}`` once the engine serves, then one JSON object when
stdin closes: queries completed and interrupted, the errors seen (a stranded
query makes every later one time out waiting for a worker), and what is held
after a bounded settle: the rows of ``resource_group_queries()``, the pool's free
workers, each group's active, queued and memory counters, the process's tracked
bytes, and whether a last query is still served.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time

import numpy as np

import resgroups
from resgroups.query import Task

# an interrupted body leaves its bytes to __exit__, which returns them and logs a
# leak: one warning per interrupt, kept out of a pipe the parent reads only at the end
logging.getLogger("resgroups").setLevel(logging.ERROR)

WORKERS = 2
GROUPS = ("alpha", "beta")


class Flag:
    """A plain attribute: read and written with no call (no point where CPython
    would run a handler), and no lock a handler could wait on."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-seconds", type=float, default=120.0)
    parser.add_argument("--signal", choices=("int", "term"), default="int")
    args = parser.parse_args()
    signum = signal.SIGINT if args.signal == "int" else signal.SIGTERM
    raised: type[BaseException] = KeyboardInterrupt if args.signal == "int" else SystemExit

    engine = resgroups.Engine(workers=WORKERS, query_timeout=2.0)
    admin = engine.connect()
    admin.execute_script(
        "CREATE RESOURCE GROUP alpha WITH (memory_limit = '64M');"
        "CREATE RESOURCE GROUP beta WITH (cpu_weight = 50, memory_limit = '64M')"
    )
    sessions = []
    for name in GROUPS:
        session = engine.connect()
        session.execute(f"SET RESOURCE GROUP {name}")
        sessions.append(session)
    data = np.arange(4_096, dtype=np.float64)

    def task(t: Task, k: int) -> float:
        t.memory.allocate(data.nbytes)
        t.checkpoint()
        total = float((data * k).sum())
        t.checkpoint()
        t.memory.release(data.nbytes)
        return total

    armed, stop = Flag(), Flag()

    handled = [0, 0]  # the handler's calls while armed, and while not

    def on_signal(signum: int, frame: object) -> None:
        handled[armed.value] += 1
        if armed.value:
            raise raised

    def watch_stdin() -> None:
        sys.stdin.read()  # until the parent closes it
        stop.value = True

    signal.signal(signum, on_signal)
    threading.Thread(target=watch_stdin, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)

    completed = interrupted = iteration = 0
    errors: dict[str, int] = {}
    deadline = time.monotonic() + args.max_seconds
    while not stop.value and time.monotonic() < deadline:
        session = sessions[iteration % len(sessions)]
        iteration += 1
        try:
            armed.value = True
            with session.query() as q:
                q.memory.allocate(1 << 16)
                q.map(task, range(4))
                q.checkpoint()
                if iteration % 3 == 0:  # a nested query, in the other group
                    with sessions[iteration % len(sessions)].query() as inner:
                        inner.memory.allocate(1 << 12)
                        inner.map(task, range(2))
                        inner.memory.release(1 << 12)
                q.memory.release(1 << 16)
            armed.value = False
            completed += 1
        except raised:
            armed.value = False
            interrupted += 1
        except resgroups.Error as exc:
            armed.value = False
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1

    def held() -> dict[str, object]:
        return {
            "queries": [
                list(row) for row in admin.execute("SELECT * FROM resource_group_queries()").rows
            ],
            "pool_free": engine.pool("default").free,
            "groups": {
                r["name"]: [r["active_queries"], r["queued_queries"], r["memory_used_bytes"]]
                for r in engine.resource_groups()
            },
            "process_memory": engine.memory_ledger.process.used,
            "open_queries": len(engine.live_queries()),
        }

    def whole(state: dict[str, object]) -> bool:
        groups = state["groups"]
        assert isinstance(groups, dict)
        return (
            state["queries"] == []
            and state["pool_free"] == WORKERS
            and all(counts == [0, 0, 0] for counts in groups.values())
            and state["process_memory"] == 0
            and state["open_queries"] == 0
        )

    # settle, bounded: a map's workers and a queued query's wait end within a poll
    settle_by = time.monotonic() + 5.0
    state = held()
    while not whole(state) and time.monotonic() < settle_by:
        time.sleep(0.01)
        state = held()
    served = False
    try:
        with sessions[0].query() as q:
            served = len(q.map(task, range(4))) == 4
    except resgroups.Error as exc:
        errors["after:" + type(exc).__name__] = 1
    engine.dispatcher.check_invariants()
    report = {
        "completed": completed,
        "interrupted": interrupted,
        "handled": {"armed": handled[True], "disarmed": handled[False]},
        "errors": errors,
        "served_after": served,
        "workers": WORKERS,
        **state,
    }
    engine.close(grace=1.0)
    print(json.dumps(report, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
