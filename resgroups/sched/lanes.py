"""Priority lanes: the kernel shares CPUs by the groups' weights between checkpoints.

What it does
    The scheduler (``cpu.py``) decides at checkpoints: which runner holds a
    worker, when one yields. Between two checkpoints a thread runs until the
    kernel takes its CPU away, and when more threads are runnable than CPUs,
    the kernel decides who runs by each thread's nice value. A *lane* is a
    nice level: while scheduling is engaged each group's work runs at the
    level its ``cpu_weight`` maps to, so the kernel's shares between
    checkpoints follow the weights too, and a dashboard query woken while a
    report scans preempts it at once instead of waiting for a slice end.

Symbols
    w_g    cpu_weight of group g; W = max w_h over the engine's groups
    n(r)   nice value whose CFS weight is r times smaller than nice 0's:
           the n in 0..19 minimising |ln(1024 / K_n) - ln(r)|, K the
           kernel's table (nice 0 = 1024, each step ~1.25x)
    lane_g = n(W / w_g): the heaviest group runs at lane 0 (the process's
           own priority, b, read when the engine starts); g runs at nice
           b + lane_g, at most 19

What runs where
    - Parallel tasks run on pool threads of their group's lane: threads of
      one pool and one lane are created on demand, keep their nice for life
      and are reused, so a task costs no syscall.
    - A query's own thread (its body, and the ``map`` items it runs itself)
      runs at its lane only when the process may lower a nice again
      (CAP_SYS_NICE, or RLIMIT_NICE): the lane is set when it takes a
      worker and its own nice restored when it gives the worker back (three
      syscalls a query of a lower lane; none at lane 0). A caller thread
      already at a weaker nice than its lane keeps it. Without that
      privilege a raised nice could never come back, so caller threads stay
      at their own priority and only tasks use lanes.
    - Oversubscription: while lanes are on, each pool has ``oversubscribe``
      times its workers (the core's pool size changes online,
      ``CpuScheduler.resize``): a short query finds a worker at once and the
      kernel decides who runs; caps, budgets and CPU charged per thread are
      unchanged.

Engagement
    Lanes are on while scheduling is engaged and the kernel lets this
    process raise a thread's nice (Linux; ``Privilege``). Off, every lane is
    0 and pools have their configured size: a single-group engine pays
    nothing. The probe runs once per engine, on a short-lived thread.

Alternatives rejected
    Re-nicing a pool thread for each task (one syscall a task, and an
    unprivileged process cannot lower it again); lanes relative to the
    groups busy at the moment (a dashboard group idle between two short
    queries would let the report back up to lane 0 in between).

Known limits
    The nice values act only among this process's threads and others in
    the same autogroup or cgroup. A lone low-lane group competes with other
    processes of its cgroup at its lane's nice.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import sys
import threading
from collections.abc import Iterable
from typing import Final, NamedTuple

log = logging.getLogger("resgroups.sched")

# the kernel's CFS weight of each nice value 0..19 (kernel/sched/core.c)
NICE_WEIGHTS: Final = (
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip
MAX_NICE: Final = 19


def lane_for(weight: int, heaviest: int) -> int:
    """The nice offset whose CFS weight ratio to nice 0 is nearest ``heaviest /
    weight`` (0 for the heaviest group). O(20)."""
    target = math.log(max(1.0, heaviest / weight))
    return min(
        range(len(NICE_WEIGHTS)),
        key=lambda n: abs(math.log(NICE_WEIGHTS[0] / NICE_WEIGHTS[n]) - target),
    )


class Privilege(enum.Enum):
    NONE = "none"  # no per-thread nice here: lanes stay off
    RAISE = "raise"  # a thread's nice may go up only: lane threads for tasks
    FULL = "full"  # it may come down again: caller threads follow their lane too


def _set_nice(nice: int) -> None:
    # Linux: PRIO_PROCESS with who=0 is the calling thread (per-thread nice)
    os.setpriority(os.PRIO_PROCESS, 0, nice)


def _get_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def probe() -> Privilege:
    """What this process may do to a thread's nice, tried on a short-lived thread."""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return Privilege.NONE
    found = [Privilege.NONE]

    def run() -> None:
        try:
            base = _get_nice()
            if base >= MAX_NICE:
                return
            _set_nice(base + 1)
        except OSError:
            return
        try:
            _set_nice(base)
        except OSError:
            found[0] = Privilege.RAISE
        else:
            found[0] = Privilege.FULL

    thread = threading.Thread(target=run, name="resgroups-lane-probe", daemon=True)
    thread.start()
    thread.join()
    return found[0]


class Lanes:
    """Each group's lane, and the nice values threads run at. The table changes
    under the dispatcher's lock; readers take a dict lookup."""

    def __init__(self, enabled: bool, privilege: Privilege | None = None) -> None:
        self.privilege = (privilege or probe()) if enabled else Privilege.NONE
        self.base = _get_nice() if self.privilege is not Privilege.NONE else 0
        self.on = False  # engaged and permitted
        self._lanes: dict[int, int] = {}  # group id -> lane, computed for every group

    @property
    def supported(self) -> bool:
        return self.privilege is not Privilege.NONE

    def engage(self, engaged: bool) -> None:
        self.on = engaged and self.supported

    def recompute(self, weights: Iterable[tuple[int, int]]) -> None:
        """From (group id, cpu_weight) of every group the engine has. O(groups)."""
        pairs = list(weights)
        heaviest = max((w for _, w in pairs), default=1)
        self._lanes = {gid: lane_for(w, heaviest) for gid, w in pairs}

    def lane(self, group_id: int) -> int:
        """The lane ``group_id``'s work runs at now (0 while lanes are off)."""
        return self._lanes.get(group_id, 0) if self.on else 0

    def shown(self, group_id: int) -> int | None:
        """resource_groups()'s ``cpu_lane``: None while lanes are off."""
        return self._lanes.get(group_id, 0) if self.on else None

    def nice(self, lane: int) -> int:
        return min(MAX_NICE, self.base + lane)

    # ---- threads ---------------------------------------------------------------------

    def join_lane(self, lane: int) -> None:
        """A pool thread of ``lane`` takes its nice for life (called on it, once)."""
        if lane == 0 and self.privilege is not Privilege.FULL:
            return  # created at the process's priority by a thread at it
        try:
            if _get_nice() != self.nice(lane):
                _set_nice(self.nice(lane))
        except OSError as exc:  # inherited a weaker nice that cannot come down
            log.info("lane %d thread stays at nice %d: %r", lane, _get_nice(), exc)

    def enter(self, group_id: int) -> Restore | None:
        """On a query's own thread as it takes a worker: run at the group's lane when
        the process may come back from it. Returns what :meth:`leave` restores
        (None: unchanged; no syscall at all at lane 0 or while lanes are off)."""
        if not self.on or self.privilege is not Privilege.FULL:
            return None
        lane = self._lanes.get(group_id, 0)
        if not lane:
            return None
        try:
            own = _get_nice()
            target = self.nice(lane)
            if own >= target:  # already weaker than its lane: left as it is
                return None
            _set_nice(target)
        except OSError:  # a seccomp filter or a changed limit: the query runs as is
            return None
        return Restore(threading.current_thread(), threading.get_native_id(), own)

    @staticmethod
    def leave(restore: Restore | None) -> None:
        """Giving the worker back: the thread that took it runs at its own nice again
        (a cursor may be suspended from another thread than resumed it)."""
        if restore is None:
            return
        try:
            if restore.thread is threading.current_thread():
                _set_nice(restore.nice)
            elif restore.thread.is_alive():  # its id is not reused while it lives
                os.setpriority(os.PRIO_PROCESS, restore.native_id, restore.nice)
        except OSError as exc:
            log.warning("could not restore a query thread's nice to %d: %r", restore.nice, exc)


class Restore(NamedTuple):
    """A query thread's own nice, to put back when it gives its worker back."""

    thread: threading.Thread
    native_id: int
    nice: int
