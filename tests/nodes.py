"""Engines in other processes (tests/programs/catalog_node.py), read line by line
with bounded waits: a node that stops talking fails the test, never hangs it."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROGRAM = Path(__file__).parent / "programs" / "catalog_node.py"


class Node:
    def __init__(self, *args: str, program: Path = PROGRAM) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(program), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(json.loads(line))
        self._lines.put(None)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any]:
        """The first line (from now on) for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"node said nothing matching in {timeout} s: {self.seen[-3:]}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"node exited ({self.proc.wait()}): {err[-2000:]}")
            self.seen.append(line)
            if predicate(line):
                return line

    def drain(self) -> list[dict[str, Any]]:
        """Every line read so far that no wait took yet, appended to ``seen``
        (after ``kill``: everything the process said)."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return self.seen
            if line is not None:
                self.seen.append(line)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def follow_delays(catalog: str, statements: int = 20) -> list[float]:
    """Run ``statements`` DDL statements on a primary in this process while a
    replica process follows ``catalog``; the delay from each statement's return
    to the replica having applied it. The replica must end with the primary's
    snapshot (digests compared)."""
    from catalog_digest import digest

    import resgroups

    with resgroups.Engine(catalog=catalog) as primary:  # the genesis record exists
        target = primary.catalog_version + statements
        with Node("replica", catalog, "--until", str(target)) as rep:
            rep.wait_for(lambda m: "started" in m)
            session = primary.connect()
            written: dict[int, float] = {}
            for i in range(statements):
                session.execute(f"CREATE RESOURCE GROUP g{i}")
                written[primary.catalog_version] = time.time()
                time.sleep(0.02)
            done = rep.wait_for(lambda m: m.get("done", False))
        assert done["digest"] == digest(primary.snapshot)
    return [m["at"] - written[m["version"]] for m in rep.seen if m.get("version") in written]


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (query bodies across processes)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    return peak


def bodies(node: Node) -> list[tuple[float, float]]:
    """The (start, end) of every query body a node reported."""
    return [(m["start"], m["end"]) for m in node.seen if "start" in m]
