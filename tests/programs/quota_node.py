"""One engine of a fleet in quota mode, in its own process, for the quota tests.

    python tests/programs/quota_node.py DSN --threads 8 --seconds 4 --hold 0.003

Creates ``capped`` (``max_active_queries = --limit``) if missing, then runs
``--threads`` threads of queries in it for ``--seconds`` (``--forever``: until
killed). Each query body checkpoints every ``--hold`` / 3 seconds for
``--hold`` seconds and prints ``{"start": t0, "end": t1, "error": null}``:
wall clock (comparable across processes on one machine) from the body's
start to its last checkpoint that passed, so a body stopped by SIGSTOP
counts only the time it ran. With ``--idle-after S`` it stops the load after
S seconds and prints ``{"idle": quota}``, then waits to be killed. At the
end: ``{"done": true, "completed": n, "errors": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import resgroups


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--hold", type=float, default=0.003)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--idle-after", type=float, default=None)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--expiry", type=float, default=300.0)
    parser.add_argument("--quota-hold", type=float, default=1.0)
    args = parser.parse_args()
    out = threading.Lock()
    errors: list[str] = []
    completed = [0]

    def emit(**fields: object) -> None:
        with out:
            print(json.dumps(fields), flush=True)

    engine = resgroups.Engine(
        coordination=args.dsn,
        fleet_admission="quota",
        workers=args.threads,
        lease_heartbeat=args.heartbeat,
        lease_expiry=args.expiry,
        sweep_interval=min(args.heartbeat, args.expiry / 3),
        quota_hold=args.quota_hold,
    )
    engine.connect().execute(
        "CREATE RESOURCE GROUP IF NOT EXISTS capped WITH "
        f"(max_active_queries = {args.limit}, queue_timeout = '60s')"
    )
    emit(ready=engine.instance_id)
    stop_at = time.monotonic() + (args.idle_after or args.seconds)
    step = max(0.001, args.hold / 3)

    def run() -> None:
        session = engine.connect()
        session.execute("SET RESOURCE GROUP capped")
        while args.forever or time.monotonic() < stop_at:
            start = last = 0.0
            try:
                with session.query() as q:
                    start = last = time.time()
                    while last - start < args.hold:
                        time.sleep(step)
                        q.checkpoint()
                        last = time.time()
                emit(start=start, end=last, error=None)
                with out:
                    completed[0] += 1
            except resgroups.Error as exc:
                if start:
                    emit(start=start, end=last, error=type(exc).__name__)
                else:
                    errors.append(repr(exc))

    threads = [threading.Thread(target=run) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if args.idle_after is not None:
        row = next(r for r in engine.resource_groups() if r["name"] == "capped")
        emit(idle=row["fleet_quota"])
        threading.Event().wait()  # until killed
    engine.close()
    emit(done=True, completed=completed[0], errors=errors)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
