"""The CPU scheduler's records (SPEC §7): a runner, a group's CPU state, a slice
end's decision, and the constants they share. ``sched/cpu.py`` holds the
scheduler that keeps them; its memo states the design, the symbols and the
invariants (I1-I8) these fields carry.

Fields and symbols
    A :class:`GroupCpu` holds, for one group g, the symbols of ``cpu.py``'s
    memo: w_g ``weight``, c_g ``cpu_ns_total``, v_g ``vtime``, o_g
    ``own_vtime``, L_g ``limit_cores`` (cap_g ``cap``), b_g ``budget_ns``
    (refilled at ``rate`` up to ``burst``, B_g), h_g ``held``; P(g)
    ``parent``, its children ``children``; what follows from the limits of
    its path (``path_limited``, ``single_threaded``) is computed when a
    limit or the tree changes (``refresh_path``, I7), not when it is read.
    A :class:`Runner` is one thread of work that needs a worker; its
    ``state`` is one of the module constants ``RUNNER_WAITING``,
    ``RUNNER_RUNNING``, ``RUNNER_DONE`` (I2).

Arrival order
    ``_SEQ`` numbers every runner as it is made, and again when it arrives
    anew (``CpuScheduler.grant_now``, ``hand_over``): fifo and the ties of
    every pick go by it, and a parked runner keeps its number, so it goes
    back to its place in the queue.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, TypeVar

K = TypeVar("K")
NS: Final = 1_000_000_000
DEFAULT_GRANULARITY_NS: Final = 50_000_000
BURST_S: Final = 0.1
CTAS_DEBT_S: Final = 10.0


def _decrement(table: dict[K, int], key: K) -> None:
    table[key] -= 1
    if not table[key]:
        del table[key]


class RunnerState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


# The states as module constants, as the ticket's (sched/admission_records.py)
RUNNER_WAITING: Final = RunnerState.WAITING
RUNNER_RUNNING: Final = RunnerState.RUNNING
RUNNER_DONE: Final = RunnerState.DONE

# What CpuScheduler.count_in took: a counted worker, never sliced or charged (not
# engaged), or a metered one (engaged: in ``held``, charged, promoted at a slice end)
COUNTED: Final = 1
METERED: Final = 2


_SEQ: Final = itertools.count(1)


class Runner:
    """One thread of work that needs a worker and may wait for it or be sliced: a
    query's own thread, or one task (a query granted a worker at once while
    scheduling is not engaged holds a counted worker instead: ``count_in``)."""

    __slots__ = (
        "cpu_since_grant_ns",
        "extra",
        "fresh",
        "granted_at",
        "group",
        "is_task",
        "kind",
        "lane",
        "pending_cpu_ns",
        "pool",
        "query_id",
        "ran_in_pools",
        "runnable_since",
        "scheduled",
        "seq",
        "state",
        "user",
    )

    def __init__(
        self,
        group: GroupCpu,
        pool: str,
        user: str,
        query_id: int,
        kind: str = "select",
        is_task: bool = False,
    ) -> None:
        self.group = group
        self.pool = pool
        self.user = user
        self.query_id = query_id
        self.kind = kind
        self.is_task = is_task
        self.seq = next(_SEQ)  # arrival order
        self.state = RUNNER_DONE
        self.scheduled = False  # granted while engaged: sliced and charged
        self.fresh = True  # arrived (not parked) since it last waited
        self.runnable_since = 0.0
        self.granted_at = 0.0
        self.cpu_since_grant_ns = 0  # charged since it last got a worker
        self.ran_in_pools: tuple[str, ...] = ()  # the pools it has held a worker of
        self.extra = False  # the one task beyond the cap (CTAS exception)
        self.pending_cpu_ns = 0  # a task's CPU still to charge when it releases
        # the priority lane its query's thread takes with the worker it was handed,
        # when the pool layer found it then (under its lock); None: look it up
        self.lane: int | None = None

    def __repr__(self) -> str:
        kind = "task" if self.is_task else self.kind
        where = f"{self.group.name}/{self.user}/q{self.query_id}"
        return f"<Runner #{self.seq} {where} {kind} {self.state.value}>"


class GroupCpu:
    """The CPU state of one group."""

    def __init__(
        self,
        group_id: int,
        name: str,
        weight: int = 100,
        limit_cores: float | None = None,
        policy: str = "fifo",
        *,
        charged: bool = True,
    ) -> None:
        self.group_id = group_id
        self.name = name
        self.weight = weight
        # the tree (SPEC §14): set by cpu_tree.reparent, before the limit below
        self.parent: GroupCpu | None = None
        self.children: list[GroupCpu] = []
        self.active_children = 0  # children in the scheduler's ``busy`` (I6)
        self.own_vtime = 0.0  # o_g: its own queries among its children
        self.gone = False  # forgotten while children of it still ran: dropped after them
        self.path_limited = False  # a limit here or above (refresh_path)
        self.single_threaded = False  # limited to one core or less here or above
        self.limit_cores = limit_cores
        self.running: set[Runner] = set()
        self.policy = policy  # after running: what the fair order counts follows it
        self.charged = charged  # False: the pseudo-group of uncharged CTAS tasks
        self.vtime = 0.0
        self.cpu_ns_total = 0
        self.wait_ns_total = 0
        self.cpu_by_user: dict[str, int] = {}
        self.held = 0  # scheduled runners holding workers, all pools
        self.held_over_cap = 0  # held when an ALTER lowered the cap; falls as they leave
        self.held_by: dict[tuple[str, str], int] = {}  # (pool, user) -> workers
        self.counted = 0  # counted workers (no runner) held, all pools
        self.metered = 0  # of which taken while engaged: in held (I3), charged
        self.waiting: dict[str, list[Runner]] = {}  # pool -> runners in arrival order
        self.budget_ns = self.burst  # a group starts with its burst
        self.budget_at = 0.0

    # ---- limits: what follows from limit_cores is computed once, when it is set
    @property
    def limit_cores(self) -> float | None:
        return self._limit_cores

    @limit_cores.setter
    def limit_cores(self, cores: float | None) -> None:
        self._limit_cores = cores
        self.limited = cores is not None
        # workers it may hold at once
        self.cap: float = math.inf if cores is None else math.ceil(cores - 1e-9)
        # a fractional limit also spends a CPU budget
        self.fractional = cores is not None and abs(cores - round(cores)) > 1e-9
        self.rate = 0.0 if cores is None else cores * NS  # budget refill in ns per second
        self.burst = self.rate * BURST_S
        # limited to one core or less: a query's parallel work runs on its own thread
        self.own_single_threaded = cores is not None and cores <= 1 + 1e-9
        self.refresh_path()

    @property
    def policy(self) -> str:
        return self._policy

    @policy.setter
    def policy(self, policy: str) -> None:
        self._policy = policy
        self.fair = policy == "fair"
        # (pool, query) -> the workers its scheduled runners hold here: only the fair
        # order reads it (_fair_key), so only a fair group keeps it (I8)
        self.held_by_query: dict[tuple[str, int], int] = {}
        if self.fair:
            for r in self.running:
                if r.scheduled:
                    key = (r.pool, r.query_id)
                    self.held_by_query[key] = self.held_by_query.get(key, 0) + 1

    def refresh_path(self) -> None:
        """What follows from the limits of the path (I7), for this group and its
        subtree: a limit above caps every group below (SPEC §14)."""
        parent = self.parent
        # a limit here or above: a freed worker may unblock any pool
        self.path_limited = self.limited or (parent is not None and parent.path_limited)
        self.single_threaded = self.own_single_threaded or (
            parent is not None and parent.single_threaded
        )
        for child in self.children:
            child.refresh_path()

    def refill(self, now: float) -> None:
        if self.fractional:
            self.budget_ns = min(self.burst, self.budget_ns + (now - self.budget_at) * self.rate)
        self.budget_at = now

    def budget_ok(self, now: float) -> bool:
        if not self.fractional:
            return True
        self.refill(now)
        return self.budget_ns > 0

    def refill_time(self, now: float) -> float:
        """When the budget is next above zero (now if it is)."""
        self.refill(now)
        if not self.fractional or self.budget_ns > 0:
            return now
        return now + (-self.budget_ns + 1) / self.rate

    # ---- state
    @property
    def own_idle(self) -> bool:
        """Nothing of its own running or waiting (its children aside)."""
        return not self.running and not self.counted and not any(self.waiting.values())

    @property
    def idle(self) -> bool:
        """Nothing running or waiting in its subtree."""
        return not self.active_children and self.own_idle

    def path(self) -> list[GroupCpu]:
        """A(g), from the root down to this group."""
        path = [self]
        while (parent := path[-1].parent) is not None:
            path.append(parent)
        path.reverse()
        return path

    def subtree(self) -> list[GroupCpu]:
        """D(g): this group and its descendants."""
        found = [self]
        for g in found:
            found.extend(g.children)
        return found

    def all_running_are_ctas(self) -> bool:
        """Every scheduled running query of the subtree is a CTAS (and one runs)."""
        running = [r for g in self.subtree() for r in g.running]
        return bool(running) and all(
            r.kind == "ctas" and not r.is_task for r in running if r.scheduled
        )

    def runs_extra(self) -> bool:
        """Does a task beyond a cap run in the subtree?"""
        return any(r.extra for g in self.subtree() for r in g.running)

    def __repr__(self) -> str:
        return f"<GroupCpu {self.name} v={self.vtime:.0f} held={self.held} b={self.budget_ns:.0f}>"


@dataclass
class Decision:
    """What a slice end decided: renew in place, or yield (and to whom)."""

    renew: bool
    reason: str
    granted: list[Runner] = field(default_factory=list)
