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
    w_g    cpu_weight of group g
    C      the groups competing now: those with work (running or waiting)
           within the last ``RECENT_S`` (1 s)
    W      max w_h over h in C (1 when C is empty)
    n(r)   the nice value whose CFS weight is r times smaller than nice 0's:
           the n in 0..19 minimising |ln(1024 / K_n) - ln(r)|, K the
           kernel's table (nice 0 = 1024, each step ~1.25x; 16:1 is 12)
    lane_g = n(max(1, W / w_g)); g's work runs at nice b + lane_g (at most
           19), b the nice of the thread that opened the engine

Why relative to the competing groups
    Weights never limit an uncontended group (SPEC §7): a lone low-weight
    group runs at lane 0. A group stays in C for a second after its last
    work, so a dashboard group idle between two short queries still keeps a
    report at its lane; a query's own thread looks at its lane again at each
    slice end, so a change reaches it within a slice.

What runs where
    - Parallel tasks run on pool threads of their group's lane: threads of
      one pool and one lane are started on demand (by one spawner thread at
      the process's priority, since a thread inherits its creator's nice),
      keep their nice for life and are reused: a task costs no syscall.
    - A query's own thread (its body, and the ``map`` items it runs itself)
      runs at its lane only when the process may lower a nice again
      (``Privilege.FULL``: CAP_SYS_NICE, or RLIMIT_NICE): set as it takes a
      worker, looked at again at slice ends, and its own nice restored when
      it gives the worker back (``Holdings.release``): three syscalls a
      query of a lower lane, none at lane 0. A thread already weaker than
      its lane keeps its own nice. Without that privilege a raised nice
      could never come back, so caller threads stay at their own priority
      and only tasks use lanes.
    - Oversubscription (``Engine(oversubscribe=f)``): while lanes are on, a
      pool has ceil(f x workers) workers (``CpuScheduler.resize``, online),
      and the extra ones are room for other groups: one group takes no more
      than the configured count there from free workers
      (``CpuScheduler._may_run``), though a lagging group may be handed a
      leading one's worker past it at a slice end; caps, budgets and CPU
      charged per thread are unchanged.

Engagement
    Lanes are on while scheduling is engaged (and not degraded), the kernel
    lets this process raise a thread's nice (Linux; ``Privilege``), and
    only in pools whose workers (after oversubscription) outnumber the CPUs:
    with no more threads than CPUs the kernel has nothing to choose, and a
    low lane holding a worker a higher lane waits for would only hand it
    over later. Off, every lane is 0 and pools have their configured size:
    a single-group engine pays nothing. The probe runs once per engine, on a
    short-lived thread.

Alternatives rejected
    Re-nicing a pool thread for each task (a syscall a task, and an
    unprivileged process cannot lower it again); lanes relative to every
    group in the catalog (a lone report would run at nice 12 beside an idle
    dashboard group, and lose to anything else in its cgroup); lanes
    without oversubscription (the dashboard test's p95 wait for a worker
    went from under 25 ms to 115 ms: a niced report reached its checkpoint
    later).

Known limits
    Nice values act among the threads of one autogroup or cgroup: other
    processes there meet a low lane too. A low-lane thread holding a worker
    that a higher lane waits for (a full pool) is a priority inversion until
    its next checkpoint. A query's nice follows a weight change at its next
    slice end; a task's lane is chosen when it is granted.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

log = logging.getLogger("resgroups.sched")

# the kernel's CFS weight of each nice value 0..19 (kernel/sched/core.c)
NICE_WEIGHTS: Final = (
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip
MAX_NICE: Final = 19
RECENT_S: Final = 1.0  # a group with work this recently still competes (W)
REFRESH_S: Final = 0.01  # W and the lanes are recomputed at most this often
# (group id, cpu_weight) of every group, (group id, cpu_limit in cores) of the limited
WeightsAndLimits = tuple[Iterable[tuple[int, int]], Iterable[tuple[int, float]]]


def lane_for(weight: int, heaviest: int) -> int:
    """The lane of a group of ``weight`` among groups as heavy as ``heaviest``: the
    nice offset whose CFS weight ratio to nice 0 is nearest ``heaviest /
    weight`` (0 for the heaviest group). O(20)."""
    return _nearest(max(1.0, heaviest / weight))


def limit_lane(cores: float, held: int, threads: int, cpus: float) -> int:
    """The lane at which a limited group's ``held`` threads, among ``threads``
    threads holding workers on ``cpus`` CPUs (the others at nice 0), get about
    ``cores`` of CPU from the kernel; 0 when they would get no more than that at
    nice 0, or when there are no more threads than CPUs (nice then changes
    nothing). Its budget still holds the limit exactly; at this lane the kernel
    already shares near it, so the budget seldom parks the group's thread (a
    parked thread's CPU idles until the kernel moves another thread to it).

    At nice 0 each of T threads on C CPUs gets C / T of one, so the group's h
    get h C / T. At weight x relative to the others' 1 they get C h x / (h x +
    T - h), which is L for x = L (T - h) / (h (C - L)), below 1 exactly when L
    < h C / T.

    It assumes the other threads run at nice 0 and can use what the group
    gives up. Where they are at lower lanes by weight (a limited group heavier
    than the others), or the group holds more threads than its cap (an ALTER
    lowered the limit while they ran), it gets more than L from the kernel:
    the budget then holds the limit as without lanes, only the gain in
    conservation is lost."""
    if threads <= cpus or held >= threads or cores >= held * cpus / threads:
        return 0
    relative = cores * (threads - held) / (held * (cpus - cores))
    return _nearest(1 / relative)


def _nearest(ratio: float) -> int:
    """The nice offset whose CFS weight ratio to nice 0 is nearest ``ratio`` (>= 1)."""
    target = math.log(ratio)
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
    """Each group's lane, and the nice values threads run at. Changed under the
    dispatcher's lock; a lookup is a dict read."""

    def __init__(
        self, enabled: bool, privilege: Privilege | None = None, cpus: float | None = None
    ) -> None:
        self.privilege = (privilege or probe()) if enabled else Privilege.NONE
        self.base = _get_nice() if self.privilege is not Privilege.NONE else 0
        self.on = False  # engaged, permitted, and some pool has more workers than CPUs
        self.cpus = cpus or float(os.cpu_count() or 1)  # C
        self._weights: dict[int, int] = {}  # group id -> cpu_weight, every group
        self._limits: dict[int, float] = {}  # group id -> cpu_limit in cores, limited ones
        self._seen: dict[int, float] = {}  # group id -> when it last had work
        self._heaviest = 0  # W: the heaviest weight among the competing groups
        self._by_weight: dict[int, int] = {}  # group id -> lane by weight, relative to W
        self._lanes: dict[int, int] = {}  # group id -> lane: by weight, or lower by limit
        self._lowered: set[int] = set()  # the groups whose lane their limit lowered
        self._refresh_at = -math.inf
        # set_weights_from: the weights and limits to read at the next refresh
        self._pending: Callable[[], WeightsAndLimits] | None = None

    @property
    def supported(self) -> bool:
        return self.privilege is not Privilege.NONE

    def engage(self, engaged: bool) -> None:
        self.on = engaged and self.supported

    def set_weights(
        self, weights: Iterable[tuple[int, int]], limits: Iterable[tuple[int, float]] = ()
    ) -> None:
        """(group id, cpu_weight) of every group the engine has (an ALTER, a DROP), and
        (group id, cpu_limit in cores) of those with a limit."""
        self._weights = dict(weights)
        self._limits = {gid: cores for gid, cores in limits if gid in self._weights}
        self._seen = {gid: t for gid, t in self._seen.items() if gid in self._weights}
        self._heaviest = 0  # recomputed at the next refresh
        self._refresh_at = -math.inf
        self._pending = None

    def set_weights_from(self, source: Callable[[], WeightsAndLimits]) -> None:
        """:meth:`set_weights` with what ``source()`` returns, read at the next
        :meth:`refresh` (called under the same lock): O(1) now, so a DDL statement
        at 10,000 groups does not copy every group's weight (creating them one by
        one was quadratic); the refresh that follows reads them once, in the
        O(groups) it spends anyway when W changes."""
        self._pending = source
        self._heaviest = 0  # recomputed at the next refresh
        self._refresh_at = -math.inf

    def refresh(self, now: float, busy: Iterable[tuple[int, int]]) -> None:
        """At most once a ``REFRESH_S``: the groups with work now (``busy``: group id
        and the threads of it holding workers) are seen; W is the heaviest group
        seen within ``RECENT_S``, and each lane is relative to it, lowered for a
        limited group to what its limit allows (:func:`limit_lane`). O(groups)
        when W changes, else O(busy) (with limits, the lanes they lowered too)."""
        if now < self._refresh_at:
            return
        if self._pending is not None:
            self.set_weights(*self._pending())
        self._refresh_at = now + REFRESH_S
        seen = self._seen
        limits = self._limits
        threads: dict[int, int] = {}
        for gid, held in busy:
            seen[gid] = now
            if held:
                threads[gid] = held
        weights = self._weights
        heaviest = max(
            (weights.get(gid, 1) for gid, t in seen.items() if now - t <= RECENT_S), default=1
        )
        if heaviest != self._heaviest:
            self._heaviest = heaviest
            self._by_weight = {gid: lane_for(w, heaviest) for gid, w in weights.items()}
            # a copy where limits may lower lanes in place (below), O(groups) only here
            self._lanes = dict(self._by_weight) if limits else self._by_weight
            self._lowered = set()
        if limits:  # O(busy): the lanes lowered last time are put back, then lowered anew
            lanes, by_weight = self._lanes, self._by_weight
            for gid in self._lowered:
                lanes[gid] = by_weight[gid]
            self._lowered = set()
            total = sum(threads.values())
            for gid, held in threads.items():
                cores = limits.get(gid)
                if cores is not None and gid in lanes:
                    lane = limit_lane(cores, held, total, self.cpus)
                    if lane > lanes[gid]:
                        lanes[gid] = lane
                        self._lowered.add(gid)

    def note(self, group_id: int, now: float) -> None:
        """``group_id`` has work now (it asks for its lane): it competes; a group
        heavier than W recomputes the lanes at the next :meth:`refresh`. O(1)."""
        self._seen[group_id] = now
        if self._weights.get(group_id, 0) > self._heaviest:
            self._refresh_at = -math.inf

    def lane(self, group_id: int) -> int:
        """The lane ``group_id``'s work runs at now (0 while lanes are off)."""
        return self._lanes.get(group_id, 0) if self.on else 0

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

    def enter(self, lane: int, held: Restore | None) -> Restore | None:
        """On a query's own thread holding a worker (as it takes it, and at each slice
        end): run at ``lane`` when the process may come back from it. ``held`` is
        what an earlier call returned; returns what :meth:`leave` restores (None:
        untouched). No syscall unless the lane changed, none at all at lane 0
        for a thread untouched."""
        if held is not None:
            if held.lane == lane:
                return held
            if not lane:  # back at the top: its own nice again
                self.leave(held)
                return None
        if not lane or self.privilege is not Privilege.FULL:
            return held
        try:
            own = held.nice if held is not None else _get_nice()
            target = self.nice(lane)
            if own >= target:  # already weaker than its lane: its own nice
                self.leave(held)
                return None
            _set_nice(target)
        except OSError:  # a seccomp filter or a changed limit: the query runs as is
            return held
        return Restore(threading.current_thread(), threading.get_native_id(), own, lane)

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
    nice: int  # its own, before its lane
    lane: int  # the lane it runs at now
