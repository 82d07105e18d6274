"""One engine of a fleet, in its own process, for the fleet tests.

    python tests/programs/fleet_node.py DSN --threads 6 --rounds 4 --hold 0.05

Creates (in its own catalog) ``capped`` with ``max_active_queries = 3``, runs
``--threads`` threads of ``--rounds`` queries each in it, every query body
holding for ``--hold`` seconds, and prints one JSON line per query body:
``{"start": t0, "end": t1}`` (wall clock, comparable across processes on one
machine), then ``{"done": true, "errors": [...]}``. With ``--forever`` the
threads keep going until the process is killed.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import resgroups


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--hold", type=float, default=0.05)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--expiry", type=float, default=300.0)
    parser.add_argument(
        "--holder",
        action="store_true",
        help="hold group 'one' (max_active_queries = 1) on 'enter', give it back on "
        "'exit' (stdin lines), printing the wall-clock time of each release",
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help="one query in group 'one' that checkpoints until it fails (printing the "
        "error), then one more query (printing 'served'); heartbeat 0.5 s, expiry 2 s",
    )
    args = parser.parse_args()
    if args.holder:
        return holder(args.dsn)
    if args.worker:
        return worker(args.dsn)
    out = threading.Lock()
    errors: list[str] = []

    def emit(**fields: object) -> None:
        with out:
            print(json.dumps(fields), flush=True)

    engine = resgroups.Engine(
        coordination=args.dsn,
        workers=args.threads,
        lease_heartbeat=min(60.0, args.expiry / 3),
        lease_expiry=args.expiry,
        sweep_interval=min(120.0, args.expiry / 3),
    )
    engine.connect().execute(
        "CREATE RESOURCE GROUP capped WITH (max_active_queries = 3, queue_timeout = '60s')"
    )

    def run() -> None:
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        i = 0
        while args.forever or i < args.rounds:
            i += 1
            try:
                with session.query():
                    start = time.time()
                    time.sleep(args.hold)
                    emit(start=start, end=time.time())
            except resgroups.Error as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=run) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.close()
    emit(done=True, errors=errors)
    return 0


def holder(dsn: str) -> int:
    with resgroups.Engine(coordination=dsn, workers=1) as engine:
        session = engine.connect()
        session.execute(
            "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, queue_timeout = '30s')"
        )
        session.execute("SET RESOURCE GROUP one")
        query = None
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "enter":
                query = session.query()
                query.__enter__()
                print(json.dumps({"holding": True}), flush=True)
            elif command == "exit" and query is not None:
                query.__exit__(None, None, None)
                print(json.dumps({"released": time.time()}), flush=True)
            elif command == "quit":
                break
    return 0


def worker(dsn: str) -> int:
    with resgroups.Engine(
        coordination=dsn, workers=1, lease_heartbeat=0.5, lease_expiry=2.0, sweep_interval=0.5
    ) as engine:
        session = engine.connect()
        session.execute(
            "CREATE RESOURCE GROUP IF NOT EXISTS one WITH "
            "(max_active_queries = 1, queue_timeout = '60s')"
        )
        session.execute("SET RESOURCE GROUP one")
        try:
            with session.query() as q:
                print(json.dumps({"holding": engine.instance_id}), flush=True)
                while True:
                    q.checkpoint()
                    time.sleep(0.01)
        except resgroups.Error as exc:
            print(json.dumps({"failed": type(exc).__name__, "sqlstate": exc.sqlstate}), flush=True)
        with session.query():
            print(json.dumps({"served": True}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
