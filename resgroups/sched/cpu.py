"""Cooperative CPU scheduling on shared worker pools (SPEC §7): the core.

What it does
    Every pool has a fixed number of workers that serve every group. A
    *runner* is one thread of work that needs a worker: a query's own thread,
    or one parallel task of its ``map``. The scheduler decides which waiting
    runner gets a freed worker, and, at the end of each slice, whether the
    running one keeps its worker (renews in place) or yields it.

    This module is pure: every method takes ``now`` (seconds) and the CPU
    the caller measured (nanoseconds of thread CPU); nothing here sleeps,
    reads a clock or wakes a thread. ``resgroups/sched/pool.py`` drives it
    for real threads; the scenario tests drive it by hand.

Symbols
    w_g   cpu_weight of group g
    c_g   CPU charged to g (ns), the sum of every runner's thread CPU between
          its grant and its slice end (charged however long that was)
    v_g   virtual time of g: v_g += c * 100 / w_g for each charge c, so a
          group of weight 100 has v_g = c_g
    R     the runnable groups: a runner running or waiting
    G     granularity (default 50 ms of CPU, in the units of v)
    L_g   cpu_limit of g in cores (None: none); cap_g = ceil(L_g) workers
    b_g   CPU budget of g (ns) for a fractional L_g: refills continuously at
          L_g * 1e9 ns per second, at most B_g = 0.1 s * L_g * 1e9 (burst)

Counted workers
    A runner exists for a thread that must wait, or be sliced and charged.
    A query granted a worker at once while scheduling is not engaged (or is
    degraded) is neither: it takes a *counted* worker (:meth:`count_in`:
    the pool's free count and its group's ``counted``, no runner) and gives
    it back by count (:meth:`count_out`). It is never sliced or charged, as
    an unscheduled runner is not; it counts as work running in its group
    (not idle), and it keeps its worker until it leaves. While scheduling is
    not engaged nothing reads which groups are busy but the dispatch of
    waiting runners, so a group whose counted workers all came back stays
    in ``busy`` until scheduling engages (``set_engaged`` prunes it): the
    uncontended query does not move its group in and out of the set.

Invariants (``_check_invariants``)
    I1 per pool: free + held + counted == size and free >= 0, where held is
       the runners running in it and counted its counted workers; the
       counted workers of every pool sum to those of every group; size
       changes online (``resize``, priority lanes): a shrink owes the workers
       held beyond it and takes each back as it returns, owing none while one
       is free;
    I2 each runner is in exactly one place: waiting in one group's queue of
       one pool, running (holding one worker), or done;
    I3 held_g (scheduled runners of g holding workers, all pools) <= cap_g,
       plus one task while every running query of g is a CTAS; an ALTER that
       lowers cap_g takes no worker back, so until enough leave, held_g may
       stay at what it was (and nothing new is granted meanwhile);
    I4 work conservation: after any operation no pool has a free worker
       while a runner that may take it waits there;
    I5 b_g <= B_g;
    I6 ``busy`` holds every charged group with work (a runner running or
       waiting, or a counted worker), and while engaged nothing else.

Rules
    Pick (a worker is free in pool p): among groups with a runner waiting in
    p that may run (held_g < cap_g, b_g > 0 unless the runner is a task of a
    group limited above one core, and in a pool oversubscribed beyond its
    configured size g holds fewer than that size there), the least v_g (ties: the group
    created first); inside it, fifo takes arrival order, fair takes the
    user holding fewest of g's workers in p, then that user's query holding
    fewest, ties to a runner that has not run in p yet, then arrival order.

    No banking: when g goes from idle (nothing running, nothing waiting) to
    runnable, v_g := max(v_g, min over the other runnable groups of v). A
    busy group keeps its lead or its debt.

    Slice end of runner r of group g (after charging its CPU):
      - a CTAS renews (it never gives up its worker); its debt is capped at
        what L_g refills in 10 s; a parallel task renews too (tasks are
        short, and a parked task would hold a pool thread without a worker);
      - b_g <= 0 (fractional limit, budget spent): yield, wait for budget;
      - a waiting runner q of another group h in the same pool, h allowed to
        run, yields r's worker to it when
          (a) q is *fresh* (arrived, not parked) since r's grant and
              v_h <= v_g: new work entitled to go first, or
          (b) (v_g - v_h) * w_h / 100 > G: h lags by more than the
              granularity, in CPU time it would take h to catch up;
      - fair groups: a waiting runner of g in the same pool whose user holds
        fewer of g's workers (or, same user, whose query holds fewer) takes
        the worker when it is fresh since r's grant or r has used more than
        G of CPU since it last got a worker;
      - otherwise r renews in place.
    A yielded runner waits again (not fresh) with its arrival order.

Engagement
    Scheduling is engaged while the engine says so (two or more groups, a
    CPU limit or a fair policy somewhere, or queries of dropped groups
    still running). Runners granted while disengaged are not *scheduled*:
    they are never sliced, never charged, and grants go in arrival order. A
    runner keeps the mode it was granted in until it next waits.

Degraded
    After an internal fault the scheduler grants in arrival order and slices
    nobody (the pool layer stops calling slice_end); admission and memory
    are not affected.

Alternatives rejected
    Yielding at every slice end (round robin): measured 17-20 % throughput
    lost to thread hand-offs on 2 cores. A timer thread to refill budgets:
    waiting runners wake themselves at the next refill instead.

Known races
    None inside: the pool layer calls every method under one lock. The CPU a
    runner reports is its own thread's; a body that never checkpoints is
    charged when it releases its worker.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, TypeVar

from resgroups.errors import InternalError
from resgroups.sched.shares import Share, ShareWindow

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


# The states as module constants, as the ticket's (sched/admission.py)
RUNNER_WAITING: Final = RunnerState.WAITING
RUNNER_RUNNING: Final = RunnerState.RUNNING
RUNNER_DONE: Final = RunnerState.DONE


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
        self.limit_cores = limit_cores
        self.policy = policy
        self.charged = charged  # False: the pseudo-group of uncharged CTAS tasks
        self.vtime = 0.0
        self.cpu_ns_total = 0
        self.wait_ns_total = 0
        self.cpu_by_user: dict[str, int] = {}
        self.held = 0  # scheduled runners holding workers, all pools
        self.held_over_cap = 0  # held when an ALTER lowered the cap; falls as they leave
        self.held_by: dict[tuple[str, str], int] = {}  # (pool, user) -> workers
        self.held_by_query: dict[tuple[str, int], int] = {}  # (pool, query) -> workers
        self.running: set[Runner] = set()
        self.counted = 0  # counted workers (no runner) held, all pools
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
        self.single_threaded = cores is not None and cores <= 1 + 1e-9

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
    def idle(self) -> bool:
        return not self.running and not self.counted and not any(self.waiting.values())

    def all_running_are_ctas(self) -> bool:
        return bool(self.running) and all(
            r.kind == "ctas" and not r.is_task for r in self.running if r.scheduled
        )

    def __repr__(self) -> str:
        return f"<GroupCpu {self.name} v={self.vtime:.0f} held={self.held} b={self.budget_ns:.0f}>"


def _group_id(g: GroupCpu) -> int:
    return g.group_id


@dataclass
class Decision:
    """What a slice end decided: renew in place, or yield (and to whom)."""

    renew: bool
    reason: str
    granted: list[Runner] = field(default_factory=list)


class CpuScheduler:
    """The scheduling core for every pool of one engine. Not thread-safe."""

    def __init__(
        self,
        pools: dict[str, int],
        *,
        slice_ms: float = 10.0,
        granularity_ns: int = DEFAULT_GRANULARITY_NS,
        cpus: float | None = None,
        share_window_s: float = 10.0,
    ) -> None:
        self.sizes = dict(pools)
        # entitled and used CPU per group over a sliding window (shares.py)
        self.shares = ShareWindow(cpus or float(sum(pools.values())), window_s=share_window_s)
        self.free = dict(pools)
        self.counted = dict.fromkeys(pools, 0)  # counted workers held, per pool
        self.owed = dict.fromkeys(pools, 0)  # workers a shrunk pool takes back as they return
        # the configured sizes: in a pool oversubscribed beyond them (resize), one group
        # holds no more than this, so the extra workers are room for the others
        self.configured = dict(pools)
        self.waiting_in = dict.fromkeys(pools, 0)  # runners waiting, per pool
        self.slice_s = slice_ms / 1000
        self.granularity_ns = granularity_ns
        self.groups: dict[int, GroupCpu] = {}
        # the groups with work running or waiting: what dispatch looks at, so its
        # cost follows the work in flight, not the number of groups in the catalog
        self.busy: set[GroupCpu] = set()
        self.outside = GroupCpu(-1, "(outside)", charged=False)
        self.engaged = False
        self.degraded = False

    # ---- groups -------------------------------------------------------------------

    def group(self, group_id: int, name: str) -> GroupCpu:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = GroupCpu(group_id, name)
        return g

    def configure(
        self,
        group_id: int,
        name: str,
        weight: int,
        limit_cores: float | None,
        policy: str,
        now: float,
    ) -> list[Runner]:
        """ALTER online; returns runners granted because of it (a raised limit)."""
        g = self.group(group_id, name)
        g.refill(now)
        was_fractional = g.fractional
        g.name, g.weight, g.limit_cores, g.policy = name, weight, limit_cores, policy
        if g.held > g.cap:  # ALTER cancels nothing: workers held stay held
            g.held_over_cap = max(g.held_over_cap, g.held)
        if g.fractional and not was_fractional:
            g.budget_ns = g.burst
        g.budget_ns = min(g.budget_ns, g.burst)
        # weights and limits apply from now on
        self.shares.reconfigured([h for h in self.busy if not h.idle], now)
        return self.dispatch(now)

    def forget(self, group_id: int) -> None:
        """Drop the state of a group that is gone and idle."""
        g = self.groups.get(group_id)
        if g is not None and g.idle:
            del self.groups[group_id]
            self.busy.discard(g)

    # ---- pool sizes -------------------------------------------------------------------

    def resize(self, pool: str, size: int, now: float) -> list[Runner]:
        """The pool has ``size`` workers from now on (priority lanes oversubscribe
        while engaged, ``lanes.py``). Growing hands the new workers out; shrinking
        takes free workers back at once and the others as they come back
        (``owed``), taking none from whoever holds one. Returns the runners granted."""
        grow = size - self.sizes[pool]
        if grow >= 0:
            self.owed[pool] = 0
            self.sizes[pool] = size
            self.free[pool] += grow
            return self.dispatch(now, pools=(pool,))
        self.owed[pool] = -grow
        taken = min(self.free[pool], self.owed[pool])
        self.free[pool] -= taken
        self.sizes[pool] -= taken
        self.owed[pool] -= taken
        return []

    def _returned(self, pool: str) -> None:
        """A worker comes back to ``pool``: free, or taken back by a shrink."""
        if self.owed[pool]:
            self.owed[pool] -= 1
            self.sizes[pool] -= 1
        else:
            self.free[pool] += 1

    # ---- becoming runnable -------------------------------------------------------------

    def _place(self, g: GroupCpu) -> None:
        """No banking: an idle group becoming runnable is placed level with the others."""
        others = [h.vtime for h in self.busy if h is not g]
        if others:
            g.vtime = max(g.vtime, min(others))

    def submit(self, runner: Runner, now: float) -> list[Runner]:
        """``runner`` (new work: a query starting or resuming, a task) wants a worker
        of its pool. Returns the runners granted (``runner`` among them if it got one)."""
        if runner.state is not RUNNER_DONE:
            raise InternalError(f"{runner!r} submitted while {runner.state.value}")
        if runner.pool not in self.sizes:
            raise InternalError(f"no pool {runner.pool!r}")
        g = runner.group
        if self.engaged and g.charged and g.idle:
            self._place(g)
        if self.free[runner.pool] and not self.waiting_in[runner.pool]:
            # the uncontended path: nobody else waits, a worker is free
            runner.fresh = True
            runner.runnable_since = now
            if self._may_run(runner, now):
                self._grant(runner, now)
                return [runner]
        self._enqueue(runner, now, fresh=True)
        return self.dispatch(now, pools=(runner.pool,))

    def may_grant_now(self, runner: Runner, now: float) -> bool:
        """Would :meth:`submit` grant ``runner`` a worker at once: one is free in its
        pool, nobody waits there, and its group's cap and budget allow it."""
        pool = runner.pool
        return bool(self.free[pool]) and not self.waiting_in[pool] and self._may_run(runner, now)

    def grant_at_once(self, runner: Runner, now: float) -> bool:
        """:meth:`submit` for the case it grants at once (True: a worker free in the
        runner's pool, nobody waiting there, its group's cap and budget allow
        it); otherwise nothing changes (False). The fast path's half
        (``Dispatcher.admit_at_once``), for a runner that has never waited."""
        pool = runner.pool
        if not self.free[pool] or self.waiting_in[pool]:
            return False
        g = runner.group
        if g.charged and self.engaged and not self.degraded:
            if not self._may_run(runner, now):  # its group's CPU cap or budget
                return False
            if g not in self.busy:
                self._place(g)  # an idle group becoming runnable: no banking
        runner.runnable_since = now
        self._grant(runner, now)
        return True

    def count_in(self, g: GroupCpu, pool: str, now: float) -> bool:
        """A counted worker of ``pool`` for a query of ``g`` (True): one is free,
        nobody waits there, and a grant now would not be scheduled (not engaged,
        or degraded), so no runner is needed; otherwise nothing changes (False).
        O(1)."""
        free = self.free
        if not free[pool] or self.waiting_in[pool] or (self.engaged and not self.degraded):
            return False
        free[pool] -= 1
        self.counted[pool] += 1
        g.counted += 1
        if g.charged and g not in self.busy:
            self._busy(g, now)
        return True

    def count_out(self, g: GroupCpu, pool: str, now: float) -> list[Runner]:
        """A counted worker of ``g`` in ``pool`` comes back; the runners granted it."""
        if not g.counted or not self.counted[pool]:
            raise InternalError(f"a counted worker of {g.name} in {pool} given back, none held")
        g.counted -= 1
        self.counted[pool] -= 1
        self._returned(pool)
        if self.engaged and not g.counted:  # disengaged, busy may keep it (I6)
            self._maybe_idle(g, now)
        if self.waiting_in[pool] or g.limited:
            return self.dispatch(now, None if g.limited else (pool,))
        return []

    def release_running(self, runner: Runner, cpu_ns: int, now: float) -> list[Runner]:
        """:meth:`release` of a runner that holds its worker, dispatching the freed
        worker only when somebody may take it (someone waits in its pool, or its
        group's cap spans pools)."""
        self._charge(runner, cpu_ns, now)
        self._unhold(runner, now)
        runner.state = RUNNER_DONE
        if self.waiting_in[runner.pool] or runner.group.limited:
            return self.dispatch(now, self._freed(runner))
        return []

    def grant_now(self, runner: Runner, now: float) -> bool:
        """:meth:`submit` for a runner that arrives now, when it would be granted a
        worker at once (True); otherwise nothing changes (False). Its arrival
        order counts from now."""
        if runner.state is not RUNNER_DONE or not self.may_grant_now(runner, now):
            return False
        runner.seq = next(_SEQ)
        g = runner.group
        if self.engaged and g.charged and g.idle:
            self._place(g)
        runner.fresh = True
        runner.runnable_since = now
        self._grant(runner, now)
        return True

    def _enqueue(self, runner: Runner, now: float, *, fresh: bool) -> None:
        runner.state = RUNNER_WAITING
        runner.fresh = fresh
        runner.runnable_since = now
        self.waiting_in[runner.pool] += 1
        queue = runner.group.waiting.setdefault(runner.pool, [])
        self._busy(runner.group, now)
        # arrival order: a parked runner goes back to its place, not to the end
        index = len(queue)
        while index > 0 and queue[index - 1].seq > runner.seq:
            index -= 1
        queue.insert(index, runner)

    def release(self, runner: Runner, cpu_ns: int, now: float) -> list[Runner]:
        """``runner`` is done with its worker (finished, or a query suspends); charges
        its last CPU. Returns the runners granted the freed worker."""
        if runner.state is RUNNER_WAITING:
            self._unwait(runner, now)
            runner.state = RUNNER_DONE
            return []
        if runner.state is not RUNNER_RUNNING:
            raise InternalError(f"{runner!r} released while {runner.state.value}")
        self._charge(runner, cpu_ns, now)
        self._unhold(runner, now)
        runner.state = RUNNER_DONE
        return self.dispatch(now, pools=self._freed(runner))

    def _freed(self, runner: Runner) -> tuple[str, ...] | None:
        """The pools a freed worker may unblock: its own, or every pool when the
        group's cap counts workers across pools (None: all)."""
        return None if runner.group.limited else (runner.pool,)

    def _unwait(self, runner: Runner, now: float) -> None:
        queue = runner.group.waiting.get(runner.pool, [])
        queue.remove(runner)
        self.waiting_in[runner.pool] -= 1
        self._maybe_idle(runner.group, now)

    def _busy(self, g: GroupCpu, now: float) -> None:
        if g.charged and g not in self.busy:
            self.busy.add(g)
            if self.engaged:  # disengaged, no CPU is sampled: nothing to share out
                self.shares.changed(self.busy, now)

    def _maybe_idle(self, g: GroupCpu, now: float) -> None:
        if g.idle and g in self.busy:
            self.busy.discard(g)
            if self.engaged:
                self.shares.changed(self.busy, now)

    def set_engaged(self, engaged: bool, now: float) -> None:
        """Slicing starts or stops; the share window follows only while engaged."""
        self.engaged = engaged
        if engaged:  # groups left busy while nobody looked (I6)
            self.busy = {g for g in self.busy if not g.idle}
        self.shares.changed(self.busy if engaged else (), now)

    # ---- slices ---------------------------------------------------------------------------

    def slice_end(self, runner: Runner, cpu_ns: int, now: float) -> Decision:
        """The first checkpoint after ``runner``'s slice: charge, then renew or yield."""
        if runner.state is not RUNNER_RUNNING:
            raise InternalError(f"slice end of {runner!r} while {runner.state.value}")
        if not runner.scheduled or self.degraded:
            runner.granted_at = now
            return Decision(True, "unscheduled")
        self._charge(runner, cpu_ns, now)
        reason = self._yield_reason(runner, now)
        if reason is None:
            runner.granted_at = now
            runner.fresh = False
            return Decision(True, "renew")
        self._unhold(runner, now)
        self._enqueue(runner, now, fresh=False)  # still runnable: no placement
        granted = self.dispatch(now, pools=self._freed(runner))
        if runner in granted:  # it was the one the rules picked after all
            granted.remove(runner)
            return Decision(True, "renew", granted)
        return Decision(False, reason, granted)

    def _yield_reason(self, runner: Runner, now: float) -> str | None:
        g = runner.group
        if runner.is_task or runner.kind == "ctas":
            return None  # tasks are short and a CTAS cannot give up its worker
        if g.fractional and not g.budget_ok(now):
            return "budget"
        for h in self._groups_waiting(runner.pool):
            if h is g:
                continue
            candidates = [q for q in h.waiting.get(runner.pool, []) if self._may_run(q, now)]
            if not candidates:
                continue
            if h.vtime <= g.vtime and any(
                q.fresh and q.runnable_since > runner.granted_at for q in candidates
            ):
                return f"fresh work of {h.name}"
            if (g.vtime - h.vtime) * h.weight / 100 > self.granularity_ns:
                return f"{h.name} lags"
        if g.policy == "fair":
            overdue = runner.cpu_since_grant_ns > self.granularity_ns
            for q in g.waiting.get(runner.pool, []):
                arrived = q.fresh and q.runnable_since > runner.granted_at
                if (
                    (arrived or overdue)
                    and self._holds_fewer(q, runner)
                    and self._may_run(q, now, replacing=runner)
                ):
                    return f"fair: {q.user} holds fewer"
        return None

    def _fair_key(self, r: Runner) -> tuple[int, int]:
        """(workers r's user holds of its group in r's pool, workers r's query holds)."""
        g = r.group
        return (
            g.held_by.get((r.pool, r.user), 0),
            g.held_by_query.get((r.pool, r.query_id), 0),
        )

    def _holds_fewer(self, q: Runner, r: Runner) -> bool:
        """Fair: does waiting q's user (or, for the same user, q's query) hold fewer
        of the group's workers in the pool than running r's?"""
        qk, rk = self._fair_key(q), self._fair_key(r)
        return qk[0] < rk[0] if q.user != r.user else qk[1] < rk[1]

    # ---- charging ---------------------------------------------------------------------------

    def _charge(self, runner: Runner, cpu_ns: int, now: float) -> None:
        if cpu_ns < 0:
            raise InternalError(f"negative CPU {cpu_ns} for {runner!r}")
        if not runner.scheduled:
            return
        g = runner.group
        runner.cpu_since_grant_ns += cpu_ns
        if not g.charged:
            return
        g.cpu_ns_total += cpu_ns
        self.shares.charge(g.group_id, cpu_ns, now)
        g.cpu_by_user[runner.user] = g.cpu_by_user.get(runner.user, 0) + cpu_ns
        g.vtime += cpu_ns * 100 / g.weight
        if g.fractional:
            g.refill(now)
            g.budget_ns -= cpu_ns
            if runner.kind == "ctas" and not runner.is_task:
                g.budget_ns = max(g.budget_ns, -g.rate * CTAS_DEBT_S)

    # ---- dispatch ------------------------------------------------------------------------

    def _groups_waiting(self, pool: str) -> list[GroupCpu]:
        if not self.waiting_in[pool]:
            return []
        gs = sorted((g for g in self.busy if g.waiting.get(pool)), key=_group_id)
        if self.outside.waiting.get(pool):
            gs.append(self.outside)
        return gs

    def _may_run(self, r: Runner, now: float, replacing: Runner | None = None) -> bool:
        """May ``r`` take a worker now (cap and budget), if one is free (or, in an
        oversubscribed pool, the one ``replacing`` of its group would yield)?"""
        g = r.group
        if not self.engaged or self.degraded or not g.charged:
            return True
        room = self.configured[r.pool]
        swap = replacing is not None and replacing.group is g and replacing.pool == r.pool
        if self.sizes[r.pool] > room and self._held_in(g, r.pool) - swap >= room:
            return False  # oversubscribed: the extra workers are for other groups
        if g.held >= g.cap:
            # the one task beyond the cap while every running query is a CTAS
            return r.is_task and g.all_running_are_ctas() and not any(x.extra for x in g.running)
        if r.is_task and g.limit_cores is not None and g.limit_cores > 1:
            return True  # tasks above one core do not wait for budget; the query repays
        return g.budget_ok(now)

    @staticmethod
    def _held_in(g: GroupCpu, pool: str) -> int:
        """Workers ``g`` holds in ``pool``. O(users of g holding workers)."""
        return sum(n for (p, _), n in g.held_by.items() if p == pool)

    def _pick(self, pool: str, now: float) -> Runner | None:
        groups = self._groups_waiting(pool)
        if not self.engaged or self.degraded:
            waiting = [r for g in groups for r in g.waiting[pool]]
            return min(waiting, key=lambda r: r.seq) if waiting else None
        best: Runner | None = None
        best_key: tuple[float, int] | None = None
        for g in groups:
            candidates = [r for r in g.waiting[pool] if self._may_run(r, now)]
            if not candidates:
                continue
            key = (g.vtime if g.charged else -math.inf, g.group_id)
            if best_key is None or key < best_key:
                best_key = key
                best = self._pick_in_group(g, candidates)
        return best

    def _pick_in_group(self, g: GroupCpu, candidates: list[Runner]) -> Runner:
        if g.policy != "fair":
            return min(candidates, key=lambda r: r.seq)
        return min(
            candidates,
            key=lambda r: (
                *self._fair_key(r),
                r.pool in r.ran_in_pools,  # not run in this pool yet goes first
                r.seq,
            ),
        )

    def dispatch(self, now: float, pools: Iterable[str] | None = None) -> list[Runner]:
        """Hand every free worker to the runner the rules pick; the runners granted."""
        granted = []
        for pool in pools if pools is not None else list(self.sizes):
            while self.free[pool] > 0 and self.waiting_in[pool]:
                r = self._pick(pool, now)
                if r is None:
                    break
                self._grant(r, now)
                granted.append(r)
        return granted

    def _grant(self, r: Runner, now: float) -> None:
        g = r.group
        if r.state is RUNNER_WAITING:
            self._unwait(r, now)
        self.free[r.pool] -= 1
        r.state = RUNNER_RUNNING
        r.scheduled = self.engaged and not self.degraded
        r.granted_at = now
        r.cpu_since_grant_ns = 0
        if r.pool not in r.ran_in_pools:
            r.ran_in_pools += (r.pool,)
        if r.scheduled:
            if g.charged:
                g.wait_ns_total += max(0, round((now - r.runnable_since) * NS))
            r.extra = g.held >= g.cap
            g.held += 1
            g.held_by[(r.pool, r.user)] = g.held_by.get((r.pool, r.user), 0) + 1
            key = (r.pool, r.query_id)
            g.held_by_query[key] = g.held_by_query.get(key, 0) + 1
        g.running.add(r)
        self._busy(g, now)

    def _unhold(self, r: Runner, now: float) -> None:
        g = r.group
        g.running.discard(r)
        self._maybe_idle(g, now)
        self._returned(r.pool)
        if r.scheduled:
            g.held -= 1
            g.held_over_cap = min(g.held_over_cap, g.held)
            _decrement(g.held_by, (r.pool, r.user))
            _decrement(g.held_by_query, (r.pool, r.query_id))
        r.extra = False

    def blocked_by(self, runner: Runner, now: float) -> str | None:
        """Why a waiting runner has no worker (None: it is not waiting): its group's
        CPU budget is spent ("cpu_budget"), its group holds as many workers as its
        CPU limit allows ("cpu_limit"), or the pool has none free for it now
        ("worker": all busy, or others are ahead by weight or arrival)."""
        if runner.state is not RUNNER_WAITING:
            return None
        g = runner.group
        if g.fractional:
            budget = min(g.burst, g.budget_ns + (now - g.budget_at) * g.rate)
            if budget <= 0:
                return "cpu_budget"
        if g.held >= g.cap:
            return "cpu_limit"
        return "worker"

    def fairness(self, now: float) -> dict[int, Share]:
        """Each group's entitled and used CPU percentage over the share window."""
        return self.shares.read(now)

    def budget(self, group_id: int, now: float) -> float | None:
        """A fractional-limit group's CPU budget now, in ns (negative: debt); None
        for other groups."""
        g = self.groups.get(group_id)
        if g is None or not g.fractional:
            return None
        return min(g.burst, g.budget_ns + (now - g.budget_at) * g.rate)

    def next_wakeup(self, now: float) -> float:
        """When a waiting runner may next be able to run (a budget refills); inf if never."""
        times = [g.refill_time(now) for g in self.busy if any(g.waiting.values()) and g.fractional]
        return min(times, default=math.inf)

    # ---- invariants ----------------------------------------------------------------------

    def _check_invariants(self, now: float) -> None:
        problems: list[str] = []
        everyone = [*self.groups.values(), self.outside]
        for pool, size in self.sizes.items():
            held = sum(1 for g in everyone for r in g.running if r.pool == pool)
            counted = self.counted[pool]
            if self.free[pool] < 0 or self.free[pool] + held + counted != size:
                problems.append(
                    f"pool {pool}: free {self.free[pool]} + held {held} + counted {counted} "
                    f"!= {size}"
                )
            if self.owed[pool] < 0 or (self.owed[pool] and self.free[pool]):
                problems.append(f"pool {pool}: owes {self.owed[pool]} with {self.free[pool]} free")
        for pool in self.sizes:
            waiting = sum(len(g.waiting.get(pool, [])) for g in everyone)
            if waiting != self.waiting_in[pool]:
                problems.append(f"pool {pool}: {waiting} waiting, counted {self.waiting_in[pool]}")
        if sum(self.counted.values()) != sum(g.counted for g in everyone):
            problems.append(f"counted workers {self.counted} are not the groups' sum")
        seen: set[int] = set()
        for g in everyone:
            runners = [*g.running, *(r for q in g.waiting.values() for r in q)]
            for r in runners:
                if id(r) in seen:
                    problems.append(f"{r!r} is in two places")
                seen.add(id(r))
                if r.group is not g:
                    problems.append(f"{r!r} filed under {g.name}")
            if any(r.state is not RUNNER_RUNNING for r in g.running):
                problems.append(f"{g.name}: a running runner is not RUNNING")
            for pool, queue in g.waiting.items():
                if any(r.state is not RUNNER_WAITING or r.pool != pool for r in queue):
                    problems.append(f"{g.name}: a waiting runner is misfiled")
            scheduled = sum(1 for r in g.running if r.scheduled)
            if g.held != scheduled:
                problems.append(f"{g.name}: held {g.held} != scheduled running {scheduled}")
            extra = sum(1 for r in g.running if r.extra)
            allowed = max(g.cap, g.held_over_cap)
            if self.engaged and not self.degraded and g.charged and g.held - extra > allowed:
                problems.append(f"{g.name}: holds {g.held} workers above its cap {g.cap}")
            if extra > 1:
                problems.append(f"{g.name}: {extra} tasks beyond the cap")
            if g.budget_ns > g.burst + 1e-6:
                problems.append(f"{g.name}: budget {g.budget_ns} above burst {g.burst}")
        busy = {g for g in self.groups.values() if g.charged and not g.idle}
        if not busy <= self.busy or (self.engaged and busy != self.busy):
            problems.append(f"busy groups {self.busy} are not those with work {busy} (I6)")
        for pool in self.sizes:
            if self.free[pool] > 0 and self._pick(pool, now) is not None:
                problems.append(f"pool {pool}: a worker is free while a runner may take it")
        if problems:
            raise InternalError(
                "CPU scheduler broken: " + "; ".join(problems) + f"; groups={everyone}"
            )
