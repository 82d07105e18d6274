"""``resgroups serve`` under attack, side by side with the same server calm, in one run.

One server (access control on, the admin with a password, 2 workers) is
measured in rounds that alternate calm and attacked, so the machine's load
moves both alike. Each round runs, for ``--seconds``:

- ``pgbench -c 100 -M simple`` on ``SELECT 1`` over the wire protocol, and
  ``--http-clients`` keep-alive clients on ``GET /exec?query=SELECT 1``, both
  logged in as a user with a password (not the admin, whose reserve is not
  the throughput path);
- the admin's ``SELECT * FROM resource_groups()`` over the wire every 0.1 s,
  timed (the issue's bound: within 100 ms).

An attacked round adds, for its whole length: ``--nonreaders`` wire clients
that each send a query with a large result and never read it, and
``--idle`` idle HTTP connections, held by helper processes that reopen
what the server closes. Printed: per round and side, pgbench tps, HTTP
requests/s, the admin's p50/p99/max latency; then the ratios attacked/calm.

    python perf/bench_serve_attacked.py [--seconds 8] [--rounds 2] [--idle 20000]

A plain script (a load test): the load clients share the machine's cores
with the server, so the figures are a comparison, not a capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.synchronize
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from pgraw import RawClient, query  # noqa: E402

from tests.servers import ServerProcess, start_server  # noqa: E402

PASSWORD = "sesame"
BIG = "SELECT x FROM long_sequence(300000)"  # what a non-reader asks for


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- the attackers ----------------------------------------------------------------------


def _hold_idle(host: str, port: int, count: int, stop: multiprocessing.synchronize.Event) -> None:
    """Hold ``count`` idle HTTP connections, reopening the ones the server closes."""
    _raise_fd_limit()
    socks: list[socket.socket] = []
    while not stop.is_set():
        socks = [s for s in socks if _open(s)]
        while len(socks) < count and not stop.is_set():
            try:
                socks.append(socket.create_connection((host, port), timeout=5))
            except OSError:
                break
        stop.wait(1.0)
    for s in socks:
        s.close()


def _open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        data = sock.recv(1)
    except BlockingIOError:
        return True
    except OSError:
        data = b""
    sock.close()
    return bool(data)


def _nonreaders(srv: ServerProcess, count: int) -> list[RawClient]:
    """Clients that ask for a large result and never read it: a cursor held over
    its rows, then FETCH ALL (the engine holds nothing for them once the cursor is
    made; their output waits on the server)."""
    clients = []
    for _ in range(count):
        client = RawClient(srv.pg_port, timeout=120, rcvbuf=4096)
        client.login("attacker")
        client.send(query(f"DECLARE c CURSOR WITH HOLD FOR {BIG}; FETCH ALL FROM c"))
        clients.append(client)
    return clients


# ---- the load and the admin's latency ------------------------------------------------------


def _pgbench(srv: ServerProcess, seconds: float, out: dict[str, float]) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write("SELECT 1;\n")
    run = subprocess.run(
        ["pgbench", "-n", "-c", "100", "-j", "4", "-T", str(int(seconds)), "-M", "simple",
         "-f", script.name, "-h", srv.host, "-p", str(srv.pg_port), "-U", "loader", "resgroups"],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": PASSWORD},
        timeout=seconds + 120,
    )  # fmt: skip
    os.unlink(script.name)
    tps = [line for line in run.stdout.splitlines() if line.startswith("tps")]
    out["tps"] = float(tps[0].split()[2]) if tps else 0.0
    if not tps or run.returncode:
        said = f"{run.stdout.strip()[-300:]} {run.stderr.strip()[-300:]}"
        print(f"pgbench: exit {run.returncode}: {said}", file=sys.stderr)


async def _http(url: str, clients: int, seconds: float) -> float:
    done = 0
    auth = aiohttp.BasicAuth("loader", PASSWORD)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(
        connector=connector, auth=auth, timeout=aiohttp.ClientTimeout(total=60)
    ) as session:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < end:
                try:
                    async with session.get(f"{url}/exec", params={"query": "SELECT 1"}) as r:
                        await r.read()
                        done += r.status == 200
                except (TimeoutError, aiohttp.ClientError):
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(clients)))
    return done / seconds


def _admin_latency(srv: ServerProcess, seconds: float, out: list[float]) -> None:
    with psycopg.connect(srv.dsn("admin", PASSWORD), autocommit=True) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            conn.execute("SELECT * FROM resource_groups()").fetchall()
            out.append((time.perf_counter() - started) * 1000)
            time.sleep(0.1)


def _round(srv: ServerProcess, seconds: float, http_clients: int) -> dict[str, float]:
    bench: dict[str, float] = {}
    latencies: list[float] = []
    threads = [
        threading.Thread(target=_pgbench, args=(srv, seconds, bench)),
        threading.Thread(target=_admin_latency, args=(srv, seconds, latencies)),
    ]
    for t in threads:
        t.start()
    rate = asyncio.run(_http(srv.url, http_clients, seconds))
    for t in threads:
        t.join(seconds + 180)
    latencies.sort()
    return {
        "tps": bench.get("tps", 0.0),
        "http": rate,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "max": latencies[-1] if latencies else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nonreaders", type=int, default=50)
    parser.add_argument("--idle", type=int, default=20000)
    parser.add_argument("--http-clients", type=int, default=64)
    args = parser.parse_args()
    _raise_fd_limit()
    srv = start_server(
        ["--access-control", "--workers", "2", "--query-timeout", "120"],
        env={"RESGROUPS_ADMIN_PASSWORD": PASSWORD, "OPENBLAS_NUM_THREADS": "1"},
    )
    results: dict[str, list[dict[str, float]]] = {"calm": [], "attacked": []}
    with psycopg.connect(srv.dsn("admin", PASSWORD), autocommit=True) as conn:
        conn.execute("CREATE USER attacker")  # no password: logs in without one
        # the load logs in as a user: the admin's reserve is not the throughput path
        conn.execute(f"CREATE USER loader WITH PASSWORD '{PASSWORD}'")
    try:
        for _ in range(args.rounds):
            results["calm"].append(_round(srv, args.seconds, args.http_clients))
            stop = multiprocessing.Event()
            holders = [
                multiprocessing.Process(
                    target=_hold_idle, args=(srv.host, srv.http_port, args.idle // 4, stop)
                )
                for _ in range(4)
            ]
            for p in holders:
                p.start()
            readers = _nonreaders(srv, args.nonreaders)
            time.sleep(3.0)  # let the idle connections open
            try:
                results["attacked"].append(_round(srv, args.seconds, args.http_clients))
            finally:
                stop.set()
                for p in holders:
                    p.join(30)
                for client in readers:
                    client.close()
    finally:
        srv.stop()
    print(f"{'round':>8} {'side':>9} {'pgbench tps':>12} {'http req/s':>11} "
          f"{'admin p50':>10} {'p99':>8} {'max':>8}")  # fmt: skip
    for side, rows in results.items():
        for i, r in enumerate(rows):
            print(f"{i:>8} {side:>9} {r['tps']:>12.0f} {r['http']:>11.0f} "
                  f"{r['p50']:>8.1f}ms {r['p99']:>6.1f}ms {r['max']:>6.1f}ms")  # fmt: skip
    for key, label in (("tps", "pgbench tps"), ("http", "HTTP req/s")):
        calm = statistics.mean(r[key] for r in results["calm"])
        hit = statistics.mean(r[key] for r in results["attacked"])
        ratio = hit / calm if calm else float("nan")
        print(f"{label}: attacked / calm = {hit:.0f} / {calm:.0f} = {ratio:.2f}x")
    worst = max(r["p99"] for r in results["attacked"])
    print(f"admin resource_groups() p99 under attack: {worst:.1f} ms (bound: 100 ms)")


if __name__ == "__main__":
    main()
