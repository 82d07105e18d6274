"""Wire load with clients that never read: pgbench throughput and the admin's latency.

    python perf/bench_wire_nonreaders.py 0     # baseline
    python perf/bench_wire_nonreaders.py 50    # with 50 non-reading clients

A wire node (``tests/programs/wire_node.py``: 16 request threads, 2 workers,
access control on) serves ``pgbench -c 100 -j 4 -T 15 -M simple`` running
``SELECT 1``, while N raw clients each DECLARE a cursor over 300,000 rows,
FETCH ALL and never read (the engine holds nothing for them; their output
waits on the event loop). Prints pgbench's tps and the admin's
``resource_groups()`` latency, sampled every 0.2 s during the run. Compare
the two runs made back to back: the machine's load moves both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import psycopg  # noqa: E402
from pgraw import RawClient, query  # noqa: E402


def main(attackers: int) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OPENBLAS_NUM_THREADS": "1",
        "RESGROUPS_ADMIN_PASSWORD": "sesame",
    }
    node = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "programs" / "wire_node.py"), "--threads", "16",
         "--workers", "2", "--access-control", "--max-connections", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )  # fmt: skip
    assert node.stdout is not None
    port = json.loads(node.stdout.readline())["port"]
    script = Path("/tmp/resgroups_select1.sql")
    script.write_text("SELECT 1;\n")
    try:
        admin = psycopg.connect(
            f"host=127.0.0.1 port={port} user=admin password=sesame dbname=x", autocommit=True
        )
        admin.execute("CREATE USER analyst")
        stuck = []
        for _ in range(attackers):
            client = RawClient(port, timeout=120, rcvbuf=4096)
            client.login()
            client.send(
                query(
                    "DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(300000);"
                    "FETCH ALL FROM c"
                )
            )
            stuck.append(client)
        time.sleep(5)  # their FETCH ALLs are made and their sockets full
        latencies: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                admin.execute("SELECT * FROM resource_groups()").fetchall()
                latencies.append((time.perf_counter() - start) * 1000)
                stop.wait(0.2)

        bench = subprocess.Popen(
            ["pgbench", "-n", "-h", "127.0.0.1", "-p", str(port), "-U", "analyst", "-c", "100",
             "-j", "4", "-T", "15", "-M", "simple", "-f", str(script), "x"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        prober = threading.Thread(target=probe)
        prober.start()
        out = bench.communicate()[0]
        stop.set()
        prober.join()
        tps = [line for line in out.splitlines() if line.startswith("tps")]
        latencies.sort()
        n = len(latencies)
        print(
            f"non-readers={attackers} {tps[0] if tps else out!r}; admin resource_groups() ms: "
            f"p50 {latencies[n // 2]:.1f} p90 {latencies[int(n * 0.9)]:.1f} "
            f"max {latencies[-1]:.1f} (n={n})"
        )
        for client in stuck:
            client.close()
        admin.close()
    finally:
        node.terminate()
        node.wait(30)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
