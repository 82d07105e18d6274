"""Fleet admission on PostgreSQL, side by side in one run, at 1, 8 and 32
concurrent admitters in one process (SPEC §11):

``lease``
    this design: one call of ``resgroups_fleet_try_acquire`` (the group's
    advisory lock for the call and its commit, the trigger-kept counter),
    releases queued to the batcher (one DELETE per batch);
``naive``
    four round trips: BEGIN, ``pg_advisory_xact_lock``, ``COUNT(*)`` over the
    group's leases + INSERT, COMMIT; each release its own DELETE;
``upsert``
    one statement on a counter row without the advisory lock
    (``INSERT ... ON CONFLICT DO UPDATE ... WHERE leased < max``); each
    release its own UPDATE.

Then whole engines, lease mode against quota mode (``fleet_admission``): in
one process, N threads each run managed queries (``with session.query()``)
in a group with a max_active_queries for ``--seconds``; quota mode admits on
the gate within its share of the limit, with no round trip per query.

Each admitter acquires and releases in a loop for ``--seconds``; the limit is
high enough that nothing waits, so the figures are the cost of the path.
``--held`` leases (default 1,000: running queries elsewhere in the fleet)
stand in every design's table the whole time. The run is made twice: with
``synchronous_commit`` on (the default: every design is bound by the commit's
WAL flush) and off (the cost of the path itself).
Printed: admissions per second, median and p99 admission latency, and for
``lease`` the releases per DELETE statement under that load.

    python perf/bench_fleet.py [--seconds 2] [--dsn postgresql://postgres@127.0.0.1/postgres]

A plain script (a throughput under concurrency, not one function's timing);
the database is created and dropped by the run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from _pg import add_dsn_argument, scratch_database

import resgroups
from resgroups.fleet.releases import BatchedReleases
from resgroups.fleet.store import FleetGroup, LeaseStore
from resgroups.pgschema import migrate

LIMIT = 1_000_000
GROUP = "hot"
ADMITTERS = (1, 8, 32)

BASELINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS naive_leases (query_id text PRIMARY KEY, group_name text NOT NULL);
CREATE INDEX IF NOT EXISTS naive_leases_group ON naive_leases (group_name);
CREATE TABLE IF NOT EXISTS upsert_counters (group_name text PRIMARY KEY, leased bigint NOT NULL);
"""


Admit = Callable[[str], None]
Release = Callable[[str], None]


def run(admitters: int, seconds: float, make: Callable[[], tuple[Admit, Release]]) -> list[float]:
    """Latencies of every admission made by ``admitters`` threads in ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(admitters)]
    barrier = threading.Barrier(admitters)

    def admitter(k: int) -> None:
        admit, release = make()
        barrier.wait()
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            query_id = uuid.uuid4().hex
            t0 = time.perf_counter()
            admit(query_id)
            latencies[k].append(time.perf_counter() - t0)
            release(query_id)

    threads = [threading.Thread(target=admitter, args=(k,)) for k in range(admitters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [x for per in latencies for x in per]


def lease_design(dsn: str, admitters: int) -> tuple[Callable[[], tuple[Admit, Release]], Any]:
    store = LeaseStore(dsn, f"bench-{admitters}", pool_size=admitters)
    releases = BatchedReleases(store)

    def make() -> tuple[Admit, Release]:
        def admit(query_id: str) -> None:
            if not store.try_acquire(FleetGroup(GROUP, GROUP), query_id, LIMIT, ("", 0, 300.0, 0)):
                raise RuntimeError("refused")

        return admit, releases.release

    return make, (store, releases)


def naive_design(dsn: str) -> Callable[[], tuple[Admit, Release]]:
    def make() -> tuple[Admit, Release]:
        conn = psycopg.connect(dsn, autocommit=True)

        def admit(query_id: str) -> None:
            conn.execute("BEGIN")
            conn.execute("SELECT pg_advisory_xact_lock(1, hashtext(%s))", [GROUP])
            row = conn.execute(
                "SELECT count(*) FROM naive_leases WHERE group_name = %s", [GROUP]
            ).fetchone()
            assert row is not None
            if row[0] < LIMIT:
                conn.execute(
                    "INSERT INTO naive_leases (query_id, group_name) VALUES (%s, %s)",
                    [query_id, GROUP],
                )
            conn.execute("COMMIT")

        def release(query_id: str) -> None:
            conn.execute("DELETE FROM naive_leases WHERE query_id = %s", [query_id])

        return admit, release

    return make


def upsert_design(dsn: str) -> Callable[[], tuple[Admit, Release]]:
    def make() -> tuple[Admit, Release]:
        conn = psycopg.connect(dsn, autocommit=True)

        def admit(query_id: str) -> None:
            row = conn.execute(
                "INSERT INTO upsert_counters AS c (group_name, leased) VALUES (%s, 1)"
                " ON CONFLICT (group_name) DO UPDATE SET leased = c.leased + 1"
                " WHERE c.leased < %s RETURNING leased",
                [GROUP, LIMIT],
            ).fetchone()
            if row is None:
                raise RuntimeError("refused")

        def release(query_id: str) -> None:
            conn.execute(
                "UPDATE upsert_counters SET leased = leased - 1 WHERE group_name = %s", [GROUP]
            )

        return admit, release

    return make


def engine_rate(
    dsn: str, mode: str, admitters: int, seconds: float, start_at: float | None = None
) -> float:
    """Managed queries per second of one engine in ``mode`` ('lease' or 'quota')
    with ``admitters`` threads, in a group whose limit nothing reaches; timed
    from the wall-clock ``start_at`` when given (processes started together)."""
    with resgroups.Engine(
        coordination=dsn, fleet_admission=mode, workers=admitters, coordination_pool=admitters
    ) as engine:
        engine.connect().execute(
            "CREATE RESOURCE GROUP served WITH (max_active_queries = 1000, queue_timeout = '60s')"
        )
        counts = [0] * admitters
        barrier = threading.Barrier(admitters + 1)
        stop = threading.Event()

        def admitter(k: int) -> None:
            session = engine.connect()
            session.execute("SET RESOURCE GROUP served")
            with session.query():  # the first takes the quota (or a lease): untimed
                pass
            barrier.wait()
            while not stop.is_set():
                with session.query():
                    pass
                counts[k] += 1

        threads = [threading.Thread(target=admitter, args=(k,)) for k in range(admitters)]
        for t in threads:
            t.start()
        barrier.wait()
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
            for k in range(admitters):
                counts[k] = 0
        t0 = time.perf_counter()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join()
        return sum(counts) / (time.perf_counter() - t0)


def fleet_rates(dsn: str, mode: str, admitters: int, seconds: float, processes: int) -> list[float]:
    """``engine_rate`` in ``processes`` processes at once (a fleet on one
    machine): each process's managed queries per second."""
    start_at = time.time() + 5.0  # every process set up by then
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                mode,
                str(admitters),
                str(seconds),
                str(start_at),
                "--dsn",
                dsn,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    return [float(child.communicate(timeout=120)[0].split()[-1]) for child in children]


def summary(latencies: list[float], seconds: float) -> tuple[float, float, float]:
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return len(ordered) / seconds, statistics.median(ordered) * 1e3, p99 * 1e3


def prepare(dsn: str, held: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate(conn)
        conn.execute(BASELINE_SCHEMA)
        for table in ("resgroups_fleet_leases", "naive_leases"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("DELETE FROM upsert_counters")
        conn.execute(
            "INSERT INTO resgroups_fleet_leases (query_id, group_key, instance_id)"
            " SELECT 'held' || i, %s, 'elsewhere' FROM generate_series(1, %s) AS i",
            [GROUP, held],
        )
        conn.execute(
            "INSERT INTO naive_leases (query_id, group_name)"
            " SELECT 'held' || i, %s FROM generate_series(1, %s) AS i",
            [GROUP, held],
        )
        conn.execute("INSERT INTO upsert_counters VALUES (%s, %s)", [GROUP, held])
        conn.execute("VACUUM ANALYZE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    add_dsn_argument(parser)
    parser.add_argument("--held", type=int, default=1000)
    parser.add_argument("--engines-only", action="store_true", help="only lease vs quota")
    parser.add_argument(
        "--processes", type=int, default=1, help="lease vs quota with this many engine processes"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one process of a --processes run
        mode, admitters, seconds, start_at = args.child
        print(engine_rate(args.dsn, mode, int(admitters), float(seconds), float(start_at)))
        return
    with scratch_database(args.dsn) as base:
        for commit in ("on", "off"):
            sep = "&" if "?" in base else "?"
            dsn = f"{base}{sep}options=-c%20synchronous_commit%3D{commit}"
            print(f"\nsynchronous_commit = {commit}, {args.held} leases held elsewhere")
            print(f"{'design':<8}{'admitters':>10}{'admissions/s':>14}{'median':>10}{'p99':>10}")
            per_second: dict[tuple[str, int], float] = {}
            for n in () if args.engines_only else ADMITTERS:
                prepare(dsn, args.held)
                make, (store, releases) = lease_design(dsn, n)
                for name, maker in (
                    ("lease", make),
                    ("naive", naive_design(dsn)),
                    ("upsert", upsert_design(dsn)),
                ):
                    rate, median, p99 = summary(run(n, args.seconds, maker), args.seconds)
                    per_second[(name, n)] = rate
                    extra = ""
                    if name == "lease":
                        releases.close()
                        per_delete = releases.released / max(1, releases.batches)
                        extra = f"   releases per DELETE: {per_delete:.1f}"
                    print(f"{name:<8}{n:>10}{rate:>14.0f}{median:>8.2f}ms{p99:>8.2f}ms{extra}")
                store.close()
            for n in () if args.engines_only else ADMITTERS:
                ratio = per_second[("lease", n)] / per_second[("naive", n)]
                print(f"lease / naive at {n} admitters: {ratio:.2f}x")
            procs = args.processes
            print(f"\nwhole engines, managed queries per second per process, {procs} process(es)")
            print(f"{'admitters':>10}{'lease':>12}{'quota':>12}{'quota/lease':>14}")
            for n in ADMITTERS:
                if procs == 1:
                    lease = engine_rate(dsn, "lease", n, args.seconds)
                    quota = engine_rate(dsn, "quota", n, args.seconds)
                else:
                    lease = statistics.mean(fleet_rates(dsn, "lease", n, args.seconds, procs))
                    quota = statistics.mean(fleet_rates(dsn, "quota", n, args.seconds, procs))
                print(f"{n:>10}{lease:>12.0f}{quota:>12.0f}{quota / lease:>13.1f}x")


if __name__ == "__main__":
    main()
