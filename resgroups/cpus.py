"""How many CPUs this process may use: its affinity, capped by a cgroup v2 quota."""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """cpu.max of this process's cgroup v2 (and its ancestors), in cores."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    relative = next((line[3:] for line in lines if line.startswith("0::")), None)
    if relative is None:
        return None
    quota: float | None = None
    path = root / relative.lstrip("/")
    while True:
        try:
            fields = (path / "cpu.max").read_text().split()
        except OSError:
            fields = []
        if len(fields) == 2 and fields[0] != "max":
            cores = int(fields[0]) / int(fields[1])
            quota = cores if quota is None else min(quota, cores)
        if path == root or root not in path.parents:
            break
        path = path.parent
    return quota


def _affinity() -> int:
    """CPUs this process may run on (psutil knows it on Linux, Windows and the
    BSDs; 0 where the platform does not say)."""
    try:
        return len(psutil.Process().cpu_affinity() or [])
    except (AttributeError, psutil.Error, OSError):
        return 0


def available_cpus() -> float:
    """CPUs available to the process: affinity, capped by a cgroup ``cpu.max`` quota.

    A fractional quota (``150000 100000``) gives a fractional count (1.5).
    """
    count: float = _affinity() or psutil.cpu_count() or os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None and quota < count:
        return quota
    return count
