"""The server's work for one wire protocol round trip, counted rather than timed.

    python perf/count_wire_path.py                 # every case
    python perf/count_wire_path.py --by-function   # and where the bytecodes go

Runs ``resgroups serve``'s server on a thread of this process and a client
(psycopg or asyncpg, the cases of ``perf/bench_wire.py``) on another, and
counts what the server's threads (its event loop and its request threads)
execute per round trip, under ``threading.settrace``: Python bytecodes,
Python calls and C calls. The client's own thread is not counted. The counts
do not depend on the machine's load, so two versions of the server compare
exactly where round-trip rates on a shared machine are noise; they say
nothing of what a system call costs, which ``bench_wire.py`` measures.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import resgroups
from resgroups.server.app import BackgroundServer

ROUND_TRIPS = 200
WARM = 50


class Counts:
    """What the traced threads execute while ``on`` is set."""

    def __init__(self, by_function: bool) -> None:
        self.on = False
        self.by_function = by_function
        self.totals: Counter[str] = Counter()
        self.by_code: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.client: int | None = None  # the client's thread: not counted

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if threading.get_ident() == self.client:
            return None
        if event == "call":
            frame.f_trace_opcodes = True
            if self.on:
                self.totals["python_calls"] += 1
                if self.by_function:
                    code = frame.f_code
                    self.calls[
                        f"{code.co_qualname} ({Path(code.co_filename).name}:{code.co_firstlineno})"
                    ] += 1
        elif event == "opcode" and self.on:
            self.totals["bytecodes"] += 1
            if self.by_function:
                self.by_code[frame.f_code.co_qualname] += 1
        return self.trace

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and self.on and threading.get_ident() != self.client:
            self.totals["c_calls"] += 1


def psycopg_client(query: str, params: list[int] | None) -> Callable[[str, Counts], None]:
    def run(dsn: str, counts: Counts) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(WARM):  # psycopg prepares the statement from its fifth run
                conn.execute(query, params).fetchone()
            counts.on = True
            for _ in range(ROUND_TRIPS):
                conn.execute(query, params).fetchone()
            counts.on = False

    return run


def asyncpg_client(query: str, params: list[int]) -> Callable[[str, Counts], None]:
    def run(dsn: str, counts: Counts) -> None:
        import asyncpg

        async def loop() -> None:
            conn = await asyncpg.connect(dsn, timeout=10)
            try:
                for _ in range(WARM):
                    await conn.fetchval(query, *params)
                counts.on = True
                for _ in range(ROUND_TRIPS):
                    await conn.fetchval(query, *params)
                counts.on = False
            finally:
                await conn.close()

        asyncio.run(loop())

    return run


CASES: dict[str, Callable[[str, Counts], None]] = {
    "psycopg SELECT 1": psycopg_client("SELECT 1", None),
    "psycopg SELECT %s (binary int)": psycopg_client("SELECT %s", [1]),
    "asyncpg SELECT 1 (prepared)": asyncpg_client("SELECT 1", []),
    "asyncpg SELECT $1::bigint (binary)": asyncpg_client("SELECT $1::bigint", [1]),
}


def count(case: Callable[[str, Counts], None], by_function: bool) -> Counts:
    counts = Counts(by_function)
    threading.settrace(counts.trace)  # the server's threads, started from here on
    threading.setprofile(counts.profile)
    try:
        engine = resgroups.Engine()
        server = BackgroundServer(engine, pg_port=0, http_port=0)
        listeners = server.start()
        dsn = f"postgresql://bench@{listeners.host}:{listeners.pg_port}/resgroups"

        def client() -> None:
            counts.client = threading.get_ident()
            sys.settrace(None)
            sys.setprofile(None)
            case(dsn, counts)

        runner = threading.Thread(target=client)
        runner.start()
        runner.join()
        server.stop()
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        threading.setprofile(None)  # type: ignore[arg-type]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--by-function", action="store_true")
    args = parser.parse_args()
    print(f"per round trip, {ROUND_TRIPS} counted    bytecodes  python calls  c calls")
    for name, case in CASES.items():
        counts = count(case, args.by_function)
        t = counts.totals
        print(
            f"{name:<36}{t['bytecodes'] / ROUND_TRIPS:>9.0f}"
            f"{t['python_calls'] / ROUND_TRIPS:>14.1f}{t['c_calls'] / ROUND_TRIPS:>9.1f}"
        )
        if args.by_function:
            for code, n in counts.by_code.most_common(25):
                print(f"    {n / ROUND_TRIPS:>8.1f}  {code}")
            print("  calls by function")
            for code, n in counts.calls.most_common(40):
                print(f"    {n / ROUND_TRIPS:>8.1f}  {code}")


if __name__ == "__main__":
    main()
