"""One engine process of a fleet that runs queries in a tree of groups
(tests/test_nested_fleet.py, SPEC §14).

    python tests/programs/tree_node.py DSN --mode lease --threads 6

DSN is both the catalog and the coordination database. At start it creates,
if they do not exist yet (several processes share the catalog), ``team`` with
``max_active_queries = --parent-limit`` and its children ``a`` and ``b`` with
``max_active_queries = --child-limit`` each, then prints ``{"ready": pid}``
and runs ``--threads`` threads of short queries, alternating between a and b,
until SIGTERM. Each body stamps ``clock_gettime(CLOCK_MONOTONIC)`` (system
wide, comparable across processes) before each checkpoint; one JSON line per
body as its first checkpoint passes, ``{"body", "group", "start"}``, and one
once it ends, ``{"body", "group", "start": the first stamp, "end": the last
stamp whose checkpoint passed, "error"}``, so [start, end] lies inside the
time the body certainly held its slots.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time

import resgroups

MONO = time.CLOCK_MONOTONIC


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--mode", choices=("lease", "quota"), default="lease")
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--parent-limit", type=int, default=4)
    parser.add_argument("--child-limit", type=int, default=3)
    parser.add_argument("--heartbeat", type=float, default=0.3)
    parser.add_argument("--expiry", type=float, default=1.5)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    logging.basicConfig(filename=args.log or os.devnull, level=logging.INFO)

    out = threading.Lock()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def emit(**fields: object) -> None:
        with out:
            sys.stdout.write(json.dumps(fields) + "\n")
            sys.stdout.flush()

    engine = resgroups.Engine(
        catalog=args.dsn,
        coordination=args.dsn,
        fleet_admission=args.mode,
        workers=args.threads,
        lease_heartbeat=args.heartbeat,
        lease_expiry=args.expiry,
        sweep_interval=args.heartbeat,
        quota_hold=0.5,
    )
    admin = engine.connect()
    for ddl in (
        f"CREATE RESOURCE GROUP IF NOT EXISTS team WITH "
        f"(max_active_queries = {args.parent_limit}, queue_timeout = '60s')",
        f"CREATE RESOURCE GROUP IF NOT EXISTS a WITH (parent = team, "
        f"max_active_queries = {args.child_limit}, queue_timeout = '60s')",
        f"CREATE RESOURCE GROUP IF NOT EXISTS b WITH (parent = team, "
        f"max_active_queries = {args.child_limit}, queue_timeout = '60s')",
    ):
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.execute(ddl)
                break
            except resgroups.CatalogError as exc:  # another process wrote first
                if exc.sqlstate != resgroups.CatalogError.DUPLICATE or time.monotonic() > deadline:
                    raise
                stop.wait(0.05)  # pacing between retries, not synchronisation
    emit(ready=os.getpid())

    def run(index: int) -> None:
        rng = random.Random(os.getpid() * 100 + index)
        group = "ab"[index % 2]
        session = engine.connect()
        session.execute(f"SET RESOURCE GROUP {group}")
        sequence = 0
        while not stop.is_set():
            sequence += 1
            body = f"{os.getpid()}-{index}-{sequence}"
            start: float | None = None
            end: float | None = None
            error: str | None = None
            try:
                with session.query() as q:
                    for _ in range(rng.randint(3, 12)):
                        t = time.clock_gettime(MONO)
                        q.checkpoint()
                        if start is None:  # said at once: a SIGKILL may come next
                            start = t
                            emit(body=body, group=group, start=start)
                        end = t
                        time.sleep(0.004)  # the body's work
            except resgroups.Error as exc:
                error = type(exc).__name__
            emit(body=body, group=group, start=start, end=end, error=error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.threads)]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(30)
    engine.close()
    emit(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
