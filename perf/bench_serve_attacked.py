"""``resgroups serve`` under attack, side by side with the same server calm, in one run.

One server (access control on, the admin with a password, 2 workers) is
measured in rounds that alternate calm and attacked, so the machine's load
moves both alike. Each round runs, for ``--seconds``:

- ``pgbench -c 100 -M simple`` on ``SELECT 1`` over the wire protocol, and
  ``wrk -c 256`` (``--http-clients``) keep-alive clients on
  ``GET /exec?query=SELECT 1`` (basic auth with a password), both as users,
  not the admin, whose reserve is not the throughput path;
- the admin's ``SELECT * FROM resource_groups()`` over the wire every 0.1 s,
  timed (the issue's bound: within 100 ms), on the admin port
  (``--admin-port``) and, side by side, on the port everyone uses.

An attacked round adds, for its whole length: ``--nonreaders`` wire clients
that each send a query with a large result and never read it, and
``--idle`` idle HTTP connections, held by helper processes that reopen
what the server closes (from ``--attacker-addresses`` loopback addresses,
127.0.0.2 up, so a per-address cap can be seen at work or left out of the
way), opened before the round starts. Printed: per round and side, pgbench
tps, HTTP requests/s, the admin's p50/p99/max latency and the server's CPU
seconds; then the ratios attacked/calm.

    python perf/bench_serve_attacked.py [--seconds 8] [--rounds 2] [--idle 20000]
        [--attacker-addresses 20] [-- extra serve flags]

The server's descriptor limit is raised (when this runs as root) to
``--nofile``, so that it can hold ``--idle`` sockets at all; otherwise it
keeps the hard limit it inherits. Needs ``pgbench`` and ``wrk``.

A plain script (a load test): the load clients share the machine's cores
with the server, so the figures are a comparison, not a capacity.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import multiprocessing.synchronize
import os
import re
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from pgraw import RawClient, query  # noqa: E402

from tests.servers import ServerProcess, start_server  # noqa: E402

PASSWORD = "sesame"
BIG = "SELECT x FROM long_sequence(300000)"  # what a non-reader asks for


def _raise_fd_limit(want: int = 0) -> None:
    """The soft limit to the hard one; as root, both to ``want`` if that is more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if want > hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, want))
            return
        except (ValueError, OSError):
            pass
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- the attackers ----------------------------------------------------------------------


def _hold_idle(
    host: str,
    port: int,
    source: str,
    count: int,
    ready: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    counts: Any,
) -> None:
    """Hold ``count`` idle HTTP connections from ``source``, reopening each one the
    server closes at once (a reconnect storm when the server evicts)."""
    _raise_fd_limit()
    selector = selectors.DefaultSelector()
    held = 0

    def open_one() -> bool:
        nonlocal held
        try:
            sock = socket.create_connection((host, port), timeout=1, source_address=(source, 0))
        except OSError:
            with counts.get_lock():
                counts[1] += 1
            return False
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
        held += 1
        with counts.get_lock():
            counts[0] += 1
        return True

    give_up = time.monotonic() + 30
    for _ in range(count):
        if not open_one() and (stop.is_set() or time.monotonic() > give_up):
            break
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
                held -= 1
                with counts.get_lock():
                    counts[0] -= 1
                open_one()
        while held < count and not stop.is_set() and open_one():
            pass
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


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
         "-f", script.name, "-h", srv.host, "-p", str(srv.pg_port), "-U", "wireloader",
         "resgroups"],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": PASSWORD},
        timeout=seconds + 120,
    )  # fmt: skip
    os.unlink(script.name)
    tps = [line for line in run.stdout.splitlines() if line.startswith("tps")]
    out["tps"] = float(tps[0].split()[2]) if tps else 0.0
    if not tps or run.returncode:
        said = f"{run.stdout.strip()[-300:]} {run.stderr.strip()[-300:]}"
        print(f"pgbench: exit {run.returncode}: {said}", file=sys.stderr)


def _wrk(srv: ServerProcess, clients: int, seconds: float, out: dict[str, float]) -> None:
    token = base64.b64encode(f"loader:{PASSWORD}".encode()).decode()
    run = subprocess.run(
        ["wrk", "-t", "2", "-c", str(clients), "-d", f"{int(seconds)}s", "--timeout", "10s",
         "-H", f"Authorization: Basic {token}", f"{srv.url}/exec?query=SELECT%201"],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    rate = re.search(r"Requests/sec:\s*([\d.]+)", run.stdout)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", run.stdout)
    total = re.search(r"(\d+) requests in", run.stdout)
    bad = int(non2xx.group(1)) if non2xx else 0
    good = (int(total.group(1)) - bad) if total else 0
    out["http"] = good / seconds if rate else 0.0
    out["http_errors"] = bad
    if not rate or run.returncode:
        print(
            f"wrk: exit {run.returncode}: {run.stdout[-300:]} {run.stderr[-300:]}", file=sys.stderr
        )


def _admin_latency(srv: ServerProcess, port: int, seconds: float, out: list[float]) -> None:
    with psycopg.connect(srv.dsn("admin", PASSWORD, port=str(port)), autocommit=True) as conn:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            started = time.perf_counter()
            conn.execute("SELECT * FROM resource_groups()").fetchall()
            out.append((time.perf_counter() - started) * 1000)
            time.sleep(0.1)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(srv: ServerProcess, seconds: float, http_clients: int) -> dict[str, float]:
    bench: dict[str, float] = {}
    latencies: list[float] = []  # on the admin port
    main_port: list[float] = []  # the admin on the port everyone uses
    assert srv.admin_port is not None
    threads = [
        threading.Thread(target=_pgbench, args=(srv, seconds, bench)),
        threading.Thread(target=_wrk, args=(srv, http_clients, seconds, bench)),
        threading.Thread(target=_admin_latency, args=(srv, srv.admin_port, seconds, latencies)),
        threading.Thread(target=_admin_latency, args=(srv, srv.pg_port, seconds, main_port)),
    ]
    cpu = _cpu_seconds(srv.proc.pid)
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    latencies.sort()
    main_port.sort()
    return {
        "main_p99": main_port[int(0.99 * (len(main_port) - 1))] if main_port else float("nan"),
        "tps": bench.get("tps", 0.0),
        "http": bench.get("http", 0.0),
        "http_errors": bench.get("http_errors", 0),
        "cpu": _cpu_seconds(srv.proc.pid) - cpu,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p99": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "max": latencies[-1] if latencies else float("nan"),
    }


def _attack(
    srv: ServerProcess, args: argparse.Namespace
) -> tuple[list[multiprocessing.Process], multiprocessing.synchronize.Event, list[RawClient], Any]:
    """Start the holders and the non-readers; return once the idle sockets are open."""
    stop = multiprocessing.Event()
    counts = multiprocessing.Array("l", 2)  # held now, connects that failed
    addresses = max(1, args.attacker_addresses)
    per_process = -(-args.idle // max(addresses, 4))
    holders, readies = [], []
    left = args.idle
    i = 0
    while left > 0:
        count = min(per_process, left)
        ready = multiprocessing.Event()
        source = f"127.0.0.{2 + i % addresses}"
        holders.append(
            multiprocessing.Process(
                target=_hold_idle,
                args=(srv.host, srv.http_port, source, count, ready, stop, counts),
            )
        )
        readies.append(ready)
        left -= count
        i += 1
    for p in holders:
        p.start()
    give_up = time.monotonic() + 60
    for ready in readies:
        ready.wait(max(0.0, give_up - time.monotonic()))
    readers = _nonreaders(srv, args.nonreaders)
    _settle(srv.proc.pid)
    return holders, stop, readers, counts


def _settle(pid: int, cores: float = 0.5, within: float = 60.0) -> None:
    """Until the server uses less than ``cores`` (the attack's one-time work done:
    accepting the sockets, encoding what the non-readers asked for), at most
    ``within`` seconds: what is measured is the attack held, not its opening."""
    give_up = time.monotonic() + within
    while time.monotonic() < give_up:
        before = _cpu_seconds(pid)
        time.sleep(0.5)
        if (_cpu_seconds(pid) - before) / 0.5 < cores:
            return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nonreaders", type=int, default=50)
    parser.add_argument("--idle", type=int, default=20000)
    parser.add_argument("--attacker-addresses", type=int, default=20)
    parser.add_argument("--http-clients", type=int, default=256)
    parser.add_argument("--nofile", type=int, default=65536)
    parser.add_argument("serve_flags", nargs="*", help="more `resgroups serve` flags (after --)")
    args = parser.parse_args()
    for tool in ("pgbench", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (pgbench: postgresql-client; wrk: wrk)")
    _raise_fd_limit(args.nofile)
    srv = start_server(
        [
            "--access-control",
            "--workers",
            "2",
            "--query-timeout",
            "120",
            "--admin-port",
            "0",
            *args.serve_flags,
        ],
        env={"RESGROUPS_ADMIN_PASSWORD": PASSWORD, "OPENBLAS_NUM_THREADS": "1"},
    )
    limit = Path(f"/proc/{srv.proc.pid}/limits").read_text()
    nofile = next(line for line in limit.splitlines() if line.startswith("Max open files"))
    print(f"server: {' '.join(nofile.split()[3:5])} descriptors (soft, hard)", flush=True)
    results: dict[str, list[dict[str, float]]] = {"calm": [], "attacked": []}
    with psycopg.connect(srv.dsn("admin", PASSWORD), autocommit=True) as conn:
        conn.execute("CREATE USER attacker")  # no password: logs in without one
        # the load logs in as a user: the admin's reserve is not the throughput path.
        # pgbench's without a password: its 100 SCRAM logins (PBKDF2 in the client)
        # took longer than a round on this machine; HTTP's is checked once a minute
        conn.execute("CREATE USER wireloader")
        conn.execute(f"CREATE USER loader WITH PASSWORD '{PASSWORD}'")
    try:
        for _ in range(args.rounds):
            results["calm"].append(_round(srv, args.seconds, args.http_clients))
            holders, stop, readers, counts = _attack(srv, args)
            fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
            print(f"attack: the server has {fds:,} descriptors open; the holders hold "
                  f"{counts[0]:,}, {counts[1]:,} connects failed", flush=True)  # fmt: skip
            try:
                results["attacked"].append(_round(srv, args.seconds, args.http_clients))
                print(f"after the round: the holders hold {counts[0]:,}, "
                      f"{counts[1]:,} connects failed", flush=True)  # fmt: skip
            finally:
                stop.set()
                for p in holders:
                    p.join(30)
                for client in readers:
                    client.close()
    finally:
        srv.stop()
    said = [line for line in srv.stderr if "HTTP sockets" in line or "accept" in line]
    print("".join(said[-3:]), end="")
    print(f"{'round':>5} {'side':>9} {'pgbench tps':>12} {'http req/s':>11} {'non-2xx':>8} "
          f"{'cpu s':>6} {'admin p50':>10} {'p99':>8} {'max':>8} {'main p99':>10}")  # fmt: skip
    for side, rows in results.items():
        for i, r in enumerate(rows):
            print(f"{i:>5} {side:>9} {r['tps']:>12.0f} {r['http']:>11.0f} "
                  f"{r['http_errors']:>8.0f} {r['cpu']:>6.1f} {r['p50']:>8.1f}ms "
                  f"{r['p99']:>6.1f}ms {r['max']:>6.1f}ms {r['main_p99']:>8.1f}ms")  # fmt: skip
    for row in (*results["calm"], *results["attacked"]):
        row["total"] = row["tps"] + row["http"]
    for key, label in (("tps", "pgbench tps"), ("http", "HTTP req/s"), ("total", "both, /s")):
        calm = statistics.mean(r[key] for r in results["calm"])
        hit = statistics.mean(r[key] for r in results["attacked"])
        ratio = hit / calm if calm else float("nan")
        print(f"{label}: attacked / calm = {hit:.0f} / {calm:.0f} = {ratio:.2f}x")
    for key, where in (("p99", "the admin port"), ("main_p99", "the main port")):
        calm_p99 = max(r[key] for r in results["calm"])
        worst = max(r[key] for r in results["attacked"])
        print(f"admin resource_groups() p99 on {where}: attacked {worst:.1f} ms, "
              f"calm {calm_p99:.1f} ms (bound: 100 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
