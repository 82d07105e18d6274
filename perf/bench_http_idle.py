"""HTTP throughput of ``resgroups serve`` with and without idle connections held.

256 concurrent keep-alive clients (aiohttp) send ``GET /exec`` for a small
query for ``--seconds``; then the same again while other processes hold
``--idle`` idle HTTP connections, opening a new one each time the server
closes one (the server keeps at most ``--max-http-sockets`` sockets: at the
cap it closes the idle ones, oldest first). Printed: requests/s, p50 and p99
latency of both runs, and the ratio of throughputs.

    python perf/bench_http_idle.py [--seconds 10] [--idle 20000] [--clients 256]

A plain script (a load test, not a timing of one function): wrk is not
installed here, so aiohttp is the load client; it shares the machine's
cores with the server, so the figures are a comparison, not a capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.synchronize
import os
import resource
import selectors
import socket
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import start_server

QUERY = "SELECT 1"  # the front end, not the engine: no worker to wait for


async def _load(url: str, clients: int, seconds: float) -> tuple[int, list[float], int]:
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        end = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                began = time.perf_counter()
                try:
                    async with session.get(url, params={"query": QUERY}) as reply:
                        await reply.read()
                        if reply.status != 200:
                            errors += 1
                            continue
                except (aiohttp.ClientError, OSError):
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - began)

        await asyncio.gather(*(client() for _ in range(clients)))
    return len(latencies), latencies, errors


def _hold(
    host: str,
    port: int,
    count: int,
    reconnect: bool,
    ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Hold ``count`` idle connections (with ``reconnect``, opening another whenever
    the server closes one)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selector = selectors.DefaultSelector()

    def open_one() -> None:
        try:  # one at a time: a burst of SYNs would overflow the listen queue
            sock = socket.create_connection((host, port), timeout=10)
        except OSError:
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)

    for _ in range(count):
        open_one()
    ready.set()
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.2):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(1024)
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                if reconnect:
                    open_one()
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def _report(name: str, seconds: float, done: int, latencies: list[float], errors: int) -> float:
    rate = done / seconds
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    print(
        f"{name:<28} {rate:>9,.0f} req/s   p50 {q[49] * 1000:7.1f} ms   "
        f"p99 {q[98] * 1000:7.1f} ms   errors {errors}",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle", type=int, default=20_000)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--holders", type=int, default=2, help="processes holding idle sockets")
    parser.add_argument(
        "--reconnect", action="store_true", help="holders reopen every socket the server closes"
    )
    args = parser.parse_args()
    srv = start_server(["--workers", "2"])
    try:
        url = f"{srv.url}/exec"
        # warm up every request thread (each builds its parser on first use)
        asyncio.run(_load(url, args.clients, 5.0))
        base = _report("without idle connections", args.seconds,
                       *_unpack(asyncio.run(_load(url, args.clients, args.seconds))))  # fmt: skip
        stop = multiprocessing.Event()
        readies = [multiprocessing.Event() for _ in range(args.holders)]
        share = args.idle // args.holders
        holders = [
            multiprocessing.Process(
                target=_hold,
                args=(srv.host, srv.http_port, share, args.reconnect, ready, stop),
            )
            for ready in readies
        ]
        for holder in holders:
            holder.start()
        for ready in readies:
            ready.wait(300)
        fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
        print(f"the server has {fds:,} descriptors open with the idle connections", flush=True)
        what = "reopened" if args.reconnect else "opened"
        held = _report(f"with {args.idle:,} idle {what}", args.seconds,
                       *_unpack(asyncio.run(_load(url, args.clients, args.seconds))))  # fmt: skip
        stop.set()
        for holder in holders:
            holder.join(30)
        print(f"ratio with / without: {held / base:.2f}x")
    finally:
        srv.stop()


def _unpack(outcome: tuple[int, list[float], int]) -> tuple[int, list[float], int]:
    return outcome


if __name__ == "__main__":
    main()
