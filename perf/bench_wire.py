"""The servers of ``resgroups serve``, side by side with PostgreSQL in one run.

``wire``
    trivial-SELECT round trips per second over psycopg 3 (autocommit, one
    connection, ``SELECT 1`` by the simple protocol and ``SELECT %s`` by the
    extended protocol with a binary parameter) and over asyncpg (one
    connection, its prepared statements: ``SELECT 1`` and ``SELECT $1::bigint``
    with a binary parameter) against a ``resgroups serve`` process and, in
    the same run, against the local PostgreSQL server; printed with the
    ratio resgroups / PostgreSQL (goal: at least 0.3x).
``http``
    ``/execute`` requests per second (``SELECT 1``, keep-alive) with 1 and 16
    concurrent clients, with the median and p99 latency.

    python perf/bench_wire.py [--seconds 3] [--dsn postgresql://postgres@127.0.0.1/postgres]

A plain script: throughput under a client's loop, not one function's timing.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from perf._pg import add_dsn_argument
from tests.servers import start_server


def round_trips(dsn: str, seconds: float, query: str, params: list[int] | None) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(50):  # warm up (and let psycopg prepare the statement)
            conn.execute(query, params).fetchone()
        done = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(20):
                conn.execute(query, params).fetchone()
            done += 20
        return done / seconds


def asyncpg_round_trips(dsn: str, seconds: float, query: str, params: list[int]) -> float:
    import asyncio

    import asyncpg

    async def loop() -> float:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            for _ in range(50):  # warm up (asyncpg prepares and caches the statement)
                await conn.fetchval(query, *params)
            done = 0
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                for _ in range(20):
                    await conn.fetchval(query, *params)
                done += 20
            return done / seconds
        finally:
            await conn.close()

    return asyncio.run(loop())


def http_rate(host: str, port: int, clients: int, seconds: float) -> tuple[float, float, float]:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    stop_at: list[float] = []

    def client(mine: list[float]) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        barrier.wait()
        while time.perf_counter() < stop_at[0]:
            started = time.perf_counter()
            conn.request("GET", "/execute?query=SELECT%201")
            reply = conn.getresponse()
            reply.read()
            assert reply.status == 200, reply.status
            mine.append(time.perf_counter() - started)
        conn.close()

    threads = [threading.Thread(target=client, args=(m,)) for m in latencies]
    for t in threads:
        t.start()
    stop_at.append(time.perf_counter() + seconds)
    barrier.wait()
    for t in threads:
        t.join()
    every = sorted(x for m in latencies for x in m)
    p99 = every[int(len(every) * 0.99) - 1] if every else 0.0
    return len(every) / seconds, statistics.median(every) * 1000, p99 * 1000


def _row(label: str, ours: float, theirs: float) -> str:
    return f"{label:<34} {ours:>10.0f} {theirs:>12.0f} {ours / theirs:>8.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    add_dsn_argument(parser)
    args = parser.parse_args()
    server = start_server(["--workers", "2"])
    try:
        ours = server.dsn("bench")
        cases: list[tuple[str, str, list[int] | None]] = [
            ("SELECT 1 (simple protocol)", "SELECT 1", None),
            ("SELECT %s (extended, binary int)", "SELECT %s", [1]),
        ]
        print(f"{'round trips per second':<34} {'resgroups':>10} {'PostgreSQL':>12} {'ratio':>9}")
        for label, query, params in cases:
            mine = round_trips(ours, args.seconds, query, params)
            theirs = round_trips(args.dsn, args.seconds, query, params)
            print(_row(label, mine, theirs))
        ours_uri = f"postgresql://bench@{server.host}:{server.pg_port}/resgroups"
        for label, query, params in [
            ("asyncpg SELECT 1 (prepared)", "SELECT 1", []),
            ("asyncpg SELECT $1::bigint (binary)", "SELECT $1::bigint", [1]),
        ]:
            mine = asyncpg_round_trips(ours_uri, args.seconds, query, params)
            theirs = asyncpg_round_trips(args.dsn, args.seconds, query, params)
            print(_row(label, mine, theirs))
        print()
        print(f"{'/execute SELECT 1':<18} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for clients in (1, 16):
            rate, p50, p99 = http_rate(server.host, server.http_port, clients, args.seconds)
            print(f"{f'{clients} client(s)':<18} {rate:>8.0f} {p50:>8.2f} {p99:>8.2f}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
