"""The servers of ``resgroups serve``, side by side with PostgreSQL in one run.

``wire``
    round trips per second of one client, against a ``resgroups serve``
    process and, in the same run, the local PostgreSQL server: psycopg 3
    (autocommit; ``SELECT 1`` and ``SELECT %s`` with a binary int, which it
    sends by the extended protocol and prepares from the fifth run), asyncpg
    (its prepared statements: ``SELECT 1`` and ``SELECT $1::bigint``), and
    pgbench with 2 clients (``SELECT :x`` by ``-M simple``, ``extended`` and
    ``prepared``). The servers take turns for ``--rounds`` rounds and each
    row prints the median, with the ratio resgroups / PostgreSQL (goal: at
    least 0.3x), then the resgroups server's CPU time per round trip (all
    its threads, from /proc), which other work on the cores moves less than
    a rate. ``--baseline DIR``: a second ``resgroups serve`` from the
    checkout in DIR (``git worktree add DIR main``, say) takes its turn in
    each round too, for a before/after measured under the same load.
``http``
    ``/execute`` requests per second (``SELECT 1``, keep-alive) with 1 and 16
    concurrent clients, with the median and p99 latency.

    python perf/bench_wire.py [--seconds 2] [--rounds 3] [--baseline DIR]
        [--dsn postgresql://postgres@127.0.0.1/postgres]

A plain script: throughput under a client's loop, not one function's timing.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from perf._pg import add_dsn_argument
from tests.servers import ServerProcess, start_server

PGBENCH_SCRIPT = "\\set x random(1, 1000)\nSELECT :x;\n"


class Meter:
    """A server's CPU time (all its threads, from /proc) over the timed part of a
    run: after the client connected and warmed up. No pid: not measured."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.used = 0.0

    def start(self) -> None:
        if self.pid is not None:
            self.used = -_cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.pid is not None:
            self.used += _cpu_seconds(self.pid)


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` (Linux), all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_trips(
    dsn: str, seconds: float, meter: Meter, query: str, params: list[int] | None
) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(50):  # warm up (and let psycopg prepare the statement)
            conn.execute(query, params).fetchone()
        done = 0
        meter.start()
        started = time.perf_counter()
        while time.perf_counter() < started + seconds:
            for _ in range(20):
                conn.execute(query, params).fetchone()
            done += 20
        elapsed = time.perf_counter() - started
        meter.stop()
        return done / elapsed


def asyncpg_round_trips(
    dsn: str, seconds: float, meter: Meter, query: str, params: list[int]
) -> float:
    import asyncio

    import asyncpg

    async def loop() -> float:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            for _ in range(50):  # warm up (asyncpg prepares and caches the statement)
                await conn.fetchval(query, *params)
            done = 0
            meter.start()
            started = time.perf_counter()
            while time.perf_counter() < started + seconds:
                for _ in range(20):
                    await conn.fetchval(query, *params)
                done += 20
            elapsed = time.perf_counter() - started
            meter.stop()
            return done / elapsed
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


def pgbench_rate(dsn: str, seconds: float, meter: Meter, mode: str, clients: int = 2) -> float:
    """Transactions per second of ``pgbench -M mode`` running ``SELECT :x`` (the
    meter's time includes pgbench's connecting)."""
    url = urlsplit(dsn)
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(PGBENCH_SCRIPT)
    meter.start()
    try:
        done = subprocess.run(
            [
                "pgbench", "-n", "-f", script.name, "-M", mode, "-c", str(clients),
                "-j", str(clients), "-T", str(max(1, round(seconds))),
                "-h", url.hostname or "127.0.0.1", "-p", str(url.port or 5432),
                "-U", url.username or "postgres", (url.path or "/postgres").lstrip("/"),
            ],
            capture_output=True, text=True, timeout=seconds + 60,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
        )  # fmt: skip
    finally:
        meter.stop()
        os.unlink(script.name)
    found = re.search(r"tps = ([\d.]+)", done.stdout)
    if found is None:
        raise RuntimeError(f"pgbench failed: {done.stdout[-500:]}{done.stderr[-500:]}")
    return float(found.group(1))


def _uri(server: ServerProcess) -> str:
    return f"postgresql://bench@{server.host}:{server.pg_port}/resgroups"


Run = Callable[[str, float, Meter], float]
Case = tuple[str, Run]


def _cases() -> list[Case]:
    def psycopg_case(query: str, params: list[int] | None) -> Run:
        return lambda dsn, seconds, meter: round_trips(dsn, seconds, meter, query, params)

    def asyncpg_case(query: str, params: list[int]) -> Run:
        return lambda dsn, seconds, meter: asyncpg_round_trips(dsn, seconds, meter, query, params)

    def pgbench_case(mode: str) -> Run:
        return lambda dsn, seconds, meter: pgbench_rate(dsn, seconds, meter, mode)

    cases: list[Case] = [
        ("psycopg SELECT 1", psycopg_case("SELECT 1", None)),
        ("psycopg SELECT %s (binary int)", psycopg_case("SELECT %s", [1])),
        ("asyncpg SELECT 1 (prepared)", asyncpg_case("SELECT 1", [])),
        ("asyncpg SELECT $1::bigint (binary)", asyncpg_case("SELECT $1::bigint", [1])),
    ]
    if shutil.which("pgbench"):
        cases += [(f"pgbench -c 2 -M {mode} (tps)", pgbench_case(mode)) for mode in
                  ("simple", "extended", "prepared")]  # fmt: skip
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR", help="a checkout to compare with")
    add_dsn_argument(parser)
    args = parser.parse_args()
    servers = {"resgroups": start_server(["--workers", "2"])}
    if args.baseline:
        servers["baseline"] = start_server(["--workers", "2"], cwd=args.baseline)
    try:
        targets = {name: _uri(server) for name, server in servers.items()}
        targets["PostgreSQL"] = args.dsn
        header = "".join(f"{name:>12}" for name in targets)
        extra = f"{'vs base':>9}" if args.baseline else ""
        cpu_header = "".join(f"{name + ' µs':>14}" for name in servers)
        print(f"{'median of ' + str(args.rounds) + ' rounds':<36}{header}{'ratio':>9}{extra}")
        cpu_rows: list[tuple[str, list[float]]] = []
        for label, run in _cases():
            rates: dict[str, list[float]] = {name: [] for name in targets}
            # server CPU per round trip: steadier than a rate when other work shares the cores
            costs: dict[str, list[float]] = {name: [] for name in servers}
            for _ in range(args.rounds):  # the servers take turns: the same load for each
                for name, dsn in targets.items():
                    server = servers.get(name)
                    meter = Meter(server.proc.pid if server is not None else None)
                    rate = run(dsn, args.seconds, meter)
                    rates[name].append(rate)
                    if server is not None:
                        costs[name].append(meter.used / max(1.0, rate * args.seconds) * 1e6)
            median = {name: statistics.median(r) for name, r in rates.items()}
            cells = "".join(f"{median[name]:>12.0f}" for name in targets)
            ratio = median["resgroups"] / median["PostgreSQL"]
            versus = f"{median['resgroups'] / median['baseline']:>8.2f}x" if args.baseline else ""
            print(f"{label:<36}{cells}{ratio:>8.2f}x{versus}", flush=True)
            cpu_rows.append((label, [statistics.median(costs[n]) for n in servers]))
        print()
        print(f"{'server CPU per round trip, median':<36}{cpu_header}")
        for label, used in cpu_rows:
            print(f"{label:<36}" + "".join(f"{u:>14.0f}" for u in used))
        print()
        server = servers["resgroups"]
        print(f"{'/execute SELECT 1':<18} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for clients in (1, 16):
            rate, p50, p99 = http_rate(server.host, server.http_port, clients, args.seconds)
            print(f"{f'{clients} client(s)':<18} {rate:>8.0f} {p50:>8.2f} {p99:>8.2f}")
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
