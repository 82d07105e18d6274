"""Catalog replication, directory and PostgreSQL side by side in one run: DDL
appends per second on a primary, and the time from a record's commit to a
follower having applied it (median, p99).

    python perf/bench_catalog.py                      # 300 records per backend
    python perf/bench_catalog.py --records 1000 --dsn postgresql://postgres@127.0.0.1/postgres

For each backend a primary and a replica engine run in this process; the
primary creates ``--records`` resource groups one statement at a time, and
the replica's catalog calls a subscriber as it applies each version (under
its write lock, the moment the version is live). The latency of a record is
that moment minus the moment the primary's statement returned (durable:
fsync'd, or committed). A distribution, not a function's timing, so this is
a plain script rather than a pyperf one; run it a few times to see the noise.

The PostgreSQL backend gets a database of its own (created and dropped).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from _pg import add_dsn_argument, scratch_database

import resgroups
from resgroups.catalog import Snapshot


def measure(catalog: str, records: int) -> dict[str, float]:
    applied: dict[int, float] = {}
    done = threading.Event()
    with resgroups.Engine(catalog=catalog, workers=1) as primary:
        target = primary.catalog_version + records

        def on_apply(snap: Snapshot) -> None:
            applied[snap.version] = time.perf_counter()
            if snap.version >= target:
                done.set()

        with resgroups.Engine(catalog=catalog, role="replica", workers=1) as replica:
            replica._catalog.subscribe(on_apply)
            session = primary.connect()
            committed: dict[int, float] = {}
            start = time.perf_counter()
            for i in range(records):
                session.execute(f"CREATE RESOURCE GROUP g{i}")
                committed[primary.catalog_version] = time.perf_counter()
            elapsed = time.perf_counter() - start
            if not done.wait(60):
                raise RuntimeError("the replica did not catch up within 60 s")
    lags = sorted(applied[v] - t for v, t in committed.items())
    return {
        "appends_per_s": records / elapsed,
        "median_ms": statistics.median(lags) * 1e3,
        "p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    add_dsn_argument(parser)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        results["directory"] = measure(directory, args.records)
    with scratch_database(args.dsn) as dsn:
        results["postgresql"] = measure(dsn, args.records)
    print(f"{args.records} records per backend; a primary and a replica in this process")
    print(f"{'backend':<12}{'appends/s':>12}{'commit->applied median':>26}{'p99':>10}")
    for name, r in results.items():
        print(
            f"{name:<12}{r['appends_per_s']:>12.0f}{r['median_ms']:>23.1f} ms{r['p99_ms']:>7.1f} ms"
        )


if __name__ == "__main__":
    main()
