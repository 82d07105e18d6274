"""One engine process of a fleet under fault injection (tests/fleet_faults.py).

    python tests/programs/fault_node.py DSN --mode lease --threads 4 \
        --heartbeat 0.3 --expiry 1.5 --forever

DSN is both the catalog and the coordination database, so every process of
the fleet follows ONE PostgreSQL catalog. The engine has access control on:
its threads log in as ``--user`` (created and mapped to a group by the
driver), so each query resolves its group by the user's mapping, which
follows a RENAME (mappings refer to group ids) and falls back to DEFAULT
while the driver has it unmapped.

At start it runs ``CREATE RESOURCE GROUP IF NOT EXISTS <--group> WITH
(max_active_queries = <--limit>, queue_timeout = '60s')`` (retried on a
duplicate: several processes share the catalog) and waits, bounded, until its
snapshot has that group and the user. Then it prints ``{"ready": ...}`` and
runs ``--threads`` threads of short queries until ``--seconds`` pass, or, with
``--forever``, until SIGTERM.

Each query body is a loop of ``--step`` second steps (``--steps`` of them; for
a ``--long-share`` of the bodies ``--long-steps``, long enough to outlive a
fault). At each step it takes ``t = clock_gettime(CLOCK_MONOTONIC)``
(system-wide, comparable across processes) BEFORE ``q.checkpoint()``; when the
checkpoint passes, ``t`` is the body's latest instant at which its slot was
certainly held. One JSON line per body that started::

    {"pid", "submit": a stamp just before session.query(),
     "start": the first stamp, "end": the last stamp whose checkpoint passed
     (null: none did), "error": the exception's class name or null,
     "group": the group name it resolved to, "group_id": its catalog id,
     "v0", "v1": the engine's catalog version before session.query() and once
     admitted}

Errors
before a body starts (QueueTimeout, CoordinationUnavailable, ...) are counted,
not fatal. Every line is flushed. At the end (SIGTERM or --seconds): the engine
is closed and ``{"done": true, ...counts}`` printed.
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
from collections import Counter
from typing import Any

import resgroups

MONO = time.CLOCK_MONOTONIC


def stamp() -> float:
    return time.clock_gettime(MONO)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--mode", choices=("lease", "quota"), default="lease")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--heartbeat", type=float, default=0.3)
    parser.add_argument("--expiry", type=float, default=1.5)
    parser.add_argument("--quota-hold", type=float, default=0.5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--group", default="g")
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--user", default="u1")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--step", type=float, default=0.004, help="seconds per body step")
    parser.add_argument("--steps", type=int, nargs=2, default=(3, 8), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--long-share", type=float, default=0.03, help="the share of long bodies (--long-steps)"
    )
    parser.add_argument(
        "--long-steps", type=int, nargs=2, default=(50, 600), metavar=("MIN", "MAX")
    )
    parser.add_argument("--pool", type=int, default=4, help="coordination_pool")
    parser.add_argument("--log", default=None, help="a file for the engine's log (not stderr)")
    args = parser.parse_args()

    # the engine's log goes to a file: a pipe nobody reads until the end must never
    # fill up and block a thread that logs (a fleet thread blocked would be a fault
    # of the harness, not of the library)
    logging.basicConfig(
        filename=args.log or os.devnull,
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    out = threading.Lock()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def emit(**fields: object) -> None:
        line = json.dumps(fields)
        with out:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    engine = resgroups.Engine(
        catalog=args.dsn,
        coordination=args.dsn,
        fleet_admission=args.mode,
        instance_id=args.instance_id,
        access_control=True,
        workers=args.threads,
        lease_heartbeat=args.heartbeat,
        lease_expiry=args.expiry,
        sweep_interval=args.heartbeat,
        quota_hold=args.quota_hold,
        coordination_pool=args.pool,
    )
    admin = engine.connect()
    create = (
        f"CREATE RESOURCE GROUP IF NOT EXISTS {args.group} WITH "
        f"(max_active_queries = {args.limit}, queue_timeout = '60s')"
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            admin.execute(create)
            break
        except resgroups.CatalogError as exc:  # another process created it meanwhile
            if exc.sqlstate != resgroups.CatalogError.DUPLICATE or time.monotonic() > deadline:
                raise
            stop.wait(0.05)

    def has_everything() -> bool:
        if not any(g.name == args.group for g in engine.snapshot.groups):
            return False
        try:
            engine.connect(user=args.user)
        except resgroups.AuthenticationFailed:
            return False
        return True

    while not has_everything():  # the driver created the user before starting us
        if time.monotonic() > deadline:
            emit(failed="the catalog never had the group and the user", group=args.group)
            engine.close()
            return 1
        stop.wait(0.02)

    counts: Counter[str] = Counter()  # completed, bodies, and errors by class
    before: Counter[str] = Counter()  # errors before a body started, by class
    count_lock = threading.Lock()
    stop_at = time.monotonic() + args.seconds

    def running() -> bool:
        return not stop.is_set() and (args.forever or time.monotonic() < stop_at)

    def run(index: int) -> None:
        rng = random.Random(os.getpid() * 1000 + index)
        session = None
        while running():
            if session is None:
                try:
                    session = engine.connect(user=args.user)
                except resgroups.Error as exc:
                    with count_lock:
                        before[type(exc).__name__] += 1
                    stop.wait(0.05)  # pacing, not synchronisation
                    continue
            start: float | None = None
            end: float | None = None
            group: str | None = None
            group_id: int | None = None
            error: str | None = None
            v0 = engine.catalog_version  # the catalog this query may resolve against: >= v0
            submit = stamp()  # admission happens between this and the first stamp
            v1: int | None = None
            try:
                with session.query() as q:
                    v1 = engine.catalog_version  # ... and <= v1
                    group = q.group
                    runtime = q.runtime
                    group_id = getattr(runtime, "group_id", None)
                    long = rng.random() < args.long_share
                    steps = rng.randint(*(args.long_steps if long else args.steps))
                    for i in range(steps + 1):
                        if i:
                            time.sleep(args.step)
                        t = stamp()
                        if start is None:
                            start = t
                        q.checkpoint()
                        end = t  # the checkpoint passed: the slot was held at t
            except Exception as exc:
                error = type(exc).__name__
            if start is None:  # never got into the body
                with count_lock:
                    before[error or "unmanaged"] += 1
                if error is not None:
                    stop.wait(0.01)  # pacing: a failing admission must not spin
                continue
            with count_lock:
                counts["bodies"] += 1
                counts["completed" if error is None else f"body:{error}"] += 1
            emit(
                pid=os.getpid(),
                submit=submit,
                start=start,
                end=end,
                error=error,
                group=group,
                group_id=group_id,
                v0=v0,
                v1=v1,
            )

    emit(ready=engine.instance_id, pid=os.getpid(), version=engine.catalog_version)
    threads = [
        threading.Thread(target=run, args=(i,), name=f"fault-{i}", daemon=True)
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    while running():
        stop.wait(0.1 if args.forever else max(0.0, min(0.1, stop_at - time.monotonic())))
    stop.set()
    closed_error: str | None = None
    try:
        engine.close(grace=3.0)  # fails queued queries, waits for running ones
    except Exception as exc:
        closed_error = repr(exc)
    for thread in threads:
        thread.join(10)
    stuck = sum(thread.is_alive() for thread in threads)
    done: dict[str, Any] = {
        "done": True,
        "pid": os.getpid(),
        "instance": engine.instance_id,
        "bodies": counts["bodies"],
        "completed": counts["completed"],
        "body_errors": {k[5:]: v for k, v in counts.items() if k.startswith("body:")},
        "errors_before_body": dict(before),
        "stuck_threads": stuck,
        "close_error": closed_error,
    }
    emit(**done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
