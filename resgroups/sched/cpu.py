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

    Its parts: the records, :class:`Runner`, :class:`GroupCpu` and
    :class:`Decision` (``cpu_records.py``, importable from here); the
    group tree's maintenance (configure, reparent, forget) and the pick
    down a tree (``cpu_tree.py``); the slice-end rule, renew or yield and
    to whom (``cpu_yield.py``); the invariant checks
    (``cpu_invariants.py``). What a query's path runs (the grants, the
    counted workers, the hand-over, charging, the flat pick) is here.

Symbols
    w_g   cpu_weight of group g
    P(g)  the parent of g (None: top level; SPEC §14); S(g) its siblings,
          the groups with the same parent; A(g) g and its ancestors up to
          the root (the *path*); D(g) g and its descendants (the *subtree*)
    c_g   CPU charged to g (ns), the sum of every runner's thread CPU between
          its grant and its slice end (charged however long that was)
    v_g   virtual time of g *among its siblings*: every charge c of a runner
          anywhere in D(g) adds c * 100 / w_g, so a top-level group of weight
          100 with no children has v_g = c_g; virtual times are compared only
          between siblings (each level is a frame of its own)
    o_g   own virtual time of an inner group g: its own queries (those running
          when it gained its first child) compete with its children as one more
          child of weight w_g; o_g += c * 100 / w_g for each charge c of them
    E(n)  the entries of a node n (n = the root, or an inner group): its
          children with work in their subtree, plus n's own work when it has
          any (key o_n); at the root, the top-level groups with work
    R     the runnable groups: a runner running or waiting (a node is runnable
          when any group of its subtree is)
    G     granularity (default 50 ms of CPU, in the units of v)
    L_g   cpu_limit of g in cores (None: none); cap_g = ceil(L_g) workers
    b_g   CPU budget of g (ns) for a fractional L_g: refills continuously at
          L_g * 1e9 ns per second, at most B_g = 0.1 s * L_g * 1e9 (burst)
    h_g   held_g: the scheduled runners holding workers in D(g), all pools, and
          the metered counted workers there; a limit caps the subtree: every
          charge in D(g) spends b_g

Counted workers
    A runner exists for a thread that must wait, or be sliced. A query
    granted a worker at once takes a *counted* worker instead
    (:meth:`count_in`: the pool's free count and its group's ``counted``, no
    runner) and gives it back by count (:meth:`count_out`); it counts as work
    running in its group (not idle) and keeps its worker until it leaves.
    While scheduling is not engaged (or is degraded) it is COUNTED: never
    sliced or charged, as an unscheduled runner is not; nothing then reads
    which groups are busy but the dispatch of waiting runners, so a group
    whose counted workers all came back stays in ``busy`` until scheduling
    engages (``set_engaged`` prunes it). While engaged it is METERED, and
    only where a grant would take nothing a runner would not (no cap or
    budget on the path, a fifo group, a pool not oversubscribed): it counts
    in ``held`` at every level of its path (``metered``; a cap an ALTER puts
    above it counts it), its query's CPU is charged as it comes back, and a
    query that reaches its first slice end is promoted to a runner holding
    that worker (:meth:`promote`), sliced from there.

Hand-over
    A query leaving a full group gives its slot to the next query queued at
    the gate; :meth:`hand_over` gives that query its worker too, as
    :meth:`release_running` then :meth:`grant_now` would, in one step, when
    nothing could come between the two (nobody waits in the pool, no cap or
    budget on the path, the pool neither oversubscribed nor owed, and the
    group keeps other work, so it neither leaves ``busy`` nor is placed
    again). Every counter ends where the two calls leave it
    (``tests/test_cpu_core.py`` compares them); the worker never passes
    through the free count.

Invariants (``_check_invariants``: ``cpu_invariants.py``)
    I1 per pool: free + held + counted == size and free >= 0, where held is
       the runners running in it and counted its counted workers; the
       counted workers of every pool sum to those of every group; size
       changes online (``resize``, priority lanes): a shrink owes the workers
       held beyond it and takes each back as it returns, owing none while one
       is free;
    I2 each runner is in exactly one place: waiting in one group's queue of
       one pool, running (holding one worker), or done;
    I3 for every group g, h_g (the scheduled runners holding workers in
       D(g), all pools, and the metered counted workers there) <= cap_g,
       plus one task while every running query of D(g) is a CTAS; an ALTER
       that lowers cap_g, or a reparent that puts running work under a lower
       cap, takes no worker back, so until enough leave, h_g may stay at
       what it was (and nothing new is granted in D(g) meanwhile); a group
       runs at most one task beyond a cap;
    I4 work conservation: after any operation no pool has a free worker
       while a runner that may take it waits there;
    I5 b_g <= B_g;
    I6 ``busy`` holds every charged group with work in its subtree (a runner
       running or waiting, or a counted worker, in D(g)), and while engaged
       nothing else; ``active_children`` of each group counts its children
       in ``busy``;
    I7 P is acyclic, each group is among its parent's ``children`` exactly
       once, and ``path_limited`` / ``single_threaded`` of every group are
       those of its path. Once a catalog version is applied the tree is the
       catalog's; mid-way through a full sync (any order) a parent not
       configured yet exists under a placeholder name, and a would-be cycle
       puts the would-be parent at the top until its own configure;
    I8 ``held_by`` counts each (pool, user)'s scheduled runners running in
       g, and ``held_by_query`` each (pool, query)'s, kept only while g is
       fair (the fair order alone reads it; empty in a fifo group).

Rules
    May run: a runner of g may take a worker when, for every n in A(g),
    h_n < cap_n (or the CTAS exception holds for D(n)) and b_n > 0 (unless
    the runner is a task and L_n > 1 core: tasks above one core do not wait
    for that level's budget). A limit at any level so caps its subtree, the
    worker cap and the budget alike. In a pool oversubscribed beyond its
    configured size (priority lanes, ``resize``), g also holds fewer than that
    size there: the extra workers are room for the other groups. Except for
    a hand-over: a runner of another group yielding to r at its slice end,
    with no other worker of the pool free, gives r its worker even past that
    size (it adds no thread), so weights still split the CPU where each group
    holds its count.

    Pick (a worker is free in pool p): walk down from the root; at each node
    n take, among the entries of E(n) with a runner waiting in p that may
    run somewhere below, the least virtual time (v_c for a child, o_n for
    n's own work; ties: the group created first, n's own work by n's id);
    stop at a group whose own work was taken. Inside that group, fifo takes
    arrival order, fair takes the user holding fewest of g's workers in p,
    then that user's query holding fewest, ties to a runner that has not run
    in p yet, then arrival order. With no parent anywhere this is the flat
    rule: the least v_g among the groups with a runner that may run (the
    walk down a tree is ``cpu_tree.pick_nested``).

    No banking, at every level: when a node n goes from idle (nothing
    running, nothing waiting in D(n)) to runnable, v_n := max(v_n, min of v
    over its runnable siblings and of o_P(n) if P(n)'s own work is
    runnable); when an inner group's own work goes from idle to runnable,
    o_n := max(o_n, min of v over its runnable children). A node that
    becomes runnable because a descendant did is placed the same way, from
    the top of the newly runnable part down. A busy node keeps its lead or
    its debt.

    Reparent (ALTER SET/RESET parent, online): D(g) moves with its held
    workers and counted work, and its virtual time enters the new frame
    with neither a lead nor a debt (``cpu_tree.py``).

    Slice end of runner r of group g (``slice_end``): charge its CPU (a
    CTAS's debt is capped at what L_g refills in 10 s), then renew in place
    or yield by the rule in ``cpu_yield.py`` (budget spent on the path; new
    or lagging work of another group; fair groups: a user holding fewer).
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
    Yielding at every slice end (round robin): see ``cpu_yield.py``. A
    timer thread to refill budgets: waiting runners wake themselves at the
    next refill instead.
    Flattening the tree into effective weights (w_g * share of the parent,
    one virtual time per leaf): an idle sibling's share would have to be
    recomputed for every group on each change of the runnable set, and a
    subtree's limit would still need its own cap and budget; one virtual
    time per level costs a walk of the path per charge (depth, at slice
    ends only) and nothing on the counted fast path. Giving an inner
    group's own queries priority over its children: they may run for hours,
    so they compete as a child of the group's weight instead (o_g).

Costs
    A charge, a placement and a may-run check walk the path (its depth); a
    pick walks down the tree over the runnable nodes of the pool. With no
    parent anywhere every path is one group and every rule takes its flat
    code (``nested == 0``): the counted fast path (count_in, count_out) is
    O(1) as before. A tree means two groups or more, so scheduling is
    engaged and counted workers are metered: each counts in ``held`` and is
    charged along its path, and a group's first counted worker marks its
    path busy and its last unmarks it, O(depth).

Share window
    An inner group's entitlement (``shares.py``) is its subtree's: the
    window water-fills the top-level groups with work by weight under their
    limits, then each group's fraction among its children with work the
    same way; a subtree's limit is its cap, lowered to what its children
    could take when every one is capped. An inner group's own queries take
    no part of that split (they are the rare leftovers of a group that
    gained children), but their CPU counts in its used share.

Known races
    None inside: the pool layer calls every method under one lock. The CPU a
    runner reports is its own thread's; a body that never checkpoints is
    charged when it releases its worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from resgroups.errors import InternalError
from resgroups.sched import cpu_tree
from resgroups.sched.cpu_invariants import check_invariants
from resgroups.sched.cpu_records import (
    _SEQ,
    BURST_S,
    COUNTED,
    CTAS_DEBT_S,
    DEFAULT_GRANULARITY_NS,
    METERED,
    NS,
    RUNNER_DONE,
    RUNNER_RUNNING,
    RUNNER_WAITING,
    Decision,
    GroupCpu,
    Runner,
    RunnerState,
    _decrement,
)
from resgroups.sched.cpu_tree import pick_nested
from resgroups.sched.cpu_yield import yield_reason
from resgroups.sched.shares import Share, ShareWindow, tree_fill

# the records live in cpu_records.py; importable from here as they always were
__all__ = [
    "BURST_S",
    "COUNTED",
    "CTAS_DEBT_S",
    "DEFAULT_GRANULARITY_NS",
    "METERED",
    "NS",
    "RUNNER_DONE",
    "RUNNER_RUNNING",
    "RUNNER_WAITING",
    "CpuScheduler",
    "Decision",
    "GroupCpu",
    "Runner",
    "RunnerState",
]


def _group_id(g: GroupCpu) -> int:
    return g.group_id


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
        self.shares = ShareWindow(
            cpus or float(sum(pools.values())), window_s=share_window_s, fill=tree_fill
        )
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
        self.nested = 0  # groups with a parent: 0 keeps every rule on its flat path
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
        *,
        parent: int | None = None,
    ) -> list[Runner]:
        """ALTER online (``parent``: the id of the group it is nested in, None at
        the top; a change moves it, its subtree and their runners, waiting or
        running); returns runners granted because of it (a raised limit).
        The group tree's maintenance is ``cpu_tree.py``'s."""
        return cpu_tree.configure(
            self, group_id, name, weight, limit_cores, policy, now, parent=parent
        )

    def forget(self, group_id: int) -> None:
        """Drop the state of a group that is gone and idle (a group with children
        still running goes after them): ``cpu_tree.forget``."""
        cpu_tree.forget(self, group_id)

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
        """No banking: g's own work goes from idle to runnable. An inner group's own
        work is placed level with its runnable children; every node of the path
        that becomes runnable with it, level with its runnable siblings."""
        if g.active_children:
            children = [c.vtime for c in g.children if c in self.busy]
            if children:
                g.own_vtime = max(g.own_vtime, min(children))
        self._place_chain(g)

    def _place_chain(self, g: GroupCpu) -> None:
        n: GroupCpu | None = g
        while n is not None and n not in self.busy:
            parent = n.parent
            # flat: every busy group is a sibling
            others = [h.vtime for h in self.busy if h.parent is parent and h is not n]
            if parent is not None and parent in self.busy and not parent.own_idle:
                others.append(parent.own_vtime)
            if others:
                n.vtime = max(n.vtime, min(others))
            n = parent

    def submit(self, runner: Runner, now: float) -> list[Runner]:
        """``runner`` (new work: a query starting or resuming, a task) wants a worker
        of its pool. Returns the runners granted (``runner`` among them if it got one)."""
        if runner.state is not RUNNER_DONE:
            raise InternalError(f"{runner!r} submitted while {runner.state.value}")
        if runner.pool not in self.sizes:
            raise InternalError(f"no pool {runner.pool!r}")
        g = runner.group
        if self.engaged and g.charged and g.own_idle:
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
            if g not in self.busy or (g.active_children and g.own_idle):
                self._place(g)  # an idle group becoming runnable: no banking
        runner.runnable_since = now
        self._grant(runner, now)
        return True

    def count_in(self, g: GroupCpu, pool: str, now: float) -> int:
        """A counted worker of ``pool`` for a query of ``g``: one is free and nobody
        waits there. Not engaged (or degraded), it is never sliced or charged
        (COUNTED). Engaged, it is METERED: only with no cap or budget on g's
        path, g fifo and the pool not oversubscribed, so that it takes nothing a
        runner would not; it counts in ``held`` (I3), its query's CPU is
        charged as it leaves, and it becomes a runner at the query's first
        slice end (:meth:`promote`). Otherwise nothing changes (0). O(1), or
        O(depth) while engaged."""
        free = self.free
        if not free[pool] or self.waiting_in[pool]:
            return 0
        taken = COUNTED
        if self.engaged and not self.degraded:
            if not self.meterable(g, pool):
                return 0
            if g not in self.busy or (g.active_children and g.own_idle):
                self._place(g)  # an idle group becoming runnable: no banking
            g.metered += 1
            n: GroupCpu | None = g
            while n is not None:
                n.held += 1
                n = n.parent
            taken = METERED
        free[pool] -= 1
        self.counted[pool] += 1
        g.counted += 1
        if g.charged and g not in self.busy:
            self._busy(g, now)
        return taken

    def meterable(self, g: GroupCpu, pool: str) -> bool:
        """May a query of ``g`` take a METERED worker of ``pool`` while engaged: no
        cap or budget on g's path, g fifo, the pool not oversubscribed, so that
        it takes nothing a runner would not. O(1)."""
        return (
            g.charged
            and not g.path_limited
            and not g.fair
            and self.sizes[pool] <= self.configured[pool]
        )

    def promote(
        self, g: GroupCpu, runner: Runner, now: float, granted_at: float | None = None
    ) -> bool:
        """A METERED worker of ``g`` (taken at ``granted_at``, default now) becomes
        ``runner``'s, running and scheduled (True): its query reached its first
        slice end while engaged. Its grant is the worker's, so work that arrived
        since is fresh to the slice end that follows. It stays in ``held`` (an
        ALTER or a reparent since may have put it over a cap: I3 takes nothing
        back). Otherwise (not engaged, or degraded) nothing changes (False).
        O(1)."""
        if not self.engaged or self.degraded:
            return False
        pool = runner.pool
        if runner.group is not g or runner.state is not RUNNER_DONE:
            raise InternalError(f"{runner!r} promoted from a counted worker of {g.name}")
        if not g.metered or not self.counted[pool]:
            raise InternalError(f"a metered worker of {g.name} in {pool} promoted, none held")
        g.metered -= 1
        g.counted -= 1
        self.counted[pool] -= 1
        runner.state = RUNNER_RUNNING
        runner.scheduled = True
        runner.fresh = True
        runner.runnable_since = runner.granted_at = now if granted_at is None else granted_at
        runner.ran_in_pools += (pool,)
        user = (pool, runner.user)
        g.held_by[user] = g.held_by.get(user, 0) + 1
        if g.fair:
            query = (pool, runner.query_id)
            g.held_by_query[query] = g.held_by_query.get(query, 0) + 1
        g.running.add(runner)
        return True

    def count_out(
        self,
        g: GroupCpu,
        pool: str,
        now: float,
        cpu_ns: int = 0,
        user: str = "",
        metered: bool = False,
    ) -> list[Runner]:
        """A counted worker of ``g`` in ``pool`` comes back (``metered``: METERED, as
        :meth:`count_in` said), charging ``cpu_ns`` of ``user``'s query while
        engaged; the runners granted it."""
        if not g.counted or not self.counted[pool]:
            raise InternalError(f"a counted worker of {g.name} in {pool} given back, none held")
        if metered:
            if not g.metered:
                raise InternalError(f"a metered worker of {g.name} given back, none held")
            g.metered -= 1
            n: GroupCpu | None = g
            while n is not None:
                n.held -= 1
                n.held_over_cap = min(n.held_over_cap, n.held)
                n = n.parent
            if cpu_ns < 0:
                raise InternalError(f"negative CPU {cpu_ns} for a query of {g.name}")
            if cpu_ns and self.engaged and g.charged:  # never sliced: its debt capped
                self._charge_group(g, user, cpu_ns, now, unsliced=True)
        g.counted -= 1
        self.counted[pool] -= 1
        if self.owed[pool]:  # _returned(pool), written out: every counted query's path
            self.owed[pool] -= 1
            self.sizes[pool] -= 1
        else:
            self.free[pool] += 1
        if self.engaged and not g.counted:  # disengaged, busy may keep it (I6)
            self._maybe_idle(g, now)
        if self.waiting_in[pool] or g.path_limited:
            return self.dispatch(now, None if g.path_limited else (pool,))
        return []

    def release_running(self, runner: Runner, cpu_ns: int, now: float) -> list[Runner]:
        """:meth:`release` of a runner that holds its worker, dispatching the freed
        worker only when somebody may take it (someone waits in its pool, or its
        group's cap spans pools)."""
        self._charge(runner, cpu_ns, now)
        self._unhold(runner, now)
        runner.state = RUNNER_DONE
        if self.waiting_in[runner.pool] or runner.group.path_limited:
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
        if self.engaged and g.charged and g.own_idle:
            self._place(g)
        runner.fresh = True
        runner.runnable_since = now
        self._grant(runner, now)
        return True

    def hand_over(self, old: Runner, cpu_ns: int, new: Runner, now: float) -> bool:
        """:meth:`release_running` of ``old`` (charging ``cpu_ns``), then
        :meth:`grant_now` of ``new``, in one step (True), when nothing could come
        between the two: ``new`` arrives now in ``old``'s group and pool (a
        query given the slot ``old``'s query gave back), nobody waits there
        for a worker, no cap or budget is on the group's path, the pool is
        neither oversubscribed nor owed a worker, and the group keeps other
        work of its own, so neither call moves it in or out of ``busy`` (no
        placement, no change of shares). The worker goes from one to the other
        without passing through the free count, and every counter ends as the
        two calls leave it. Otherwise nothing changes (False). O(depth)."""
        g = old.group
        pool = old.pool
        if (
            new.group is not g
            or new.pool != pool
            or new.state is not RUNNER_DONE
            or old.state is not RUNNER_RUNNING
            or not old.scheduled
            or not self.engaged
            or self.degraded
            or not g.charged
            or g.path_limited
            or self.waiting_in[pool]
            or self.owed[pool]
            or self.sizes[pool] > self.configured[pool]
            or (len(g.running) < 2 and not g.counted)
        ):
            return False
        self._charge(old, cpu_ns, now)
        running = g.running
        running.discard(old)
        old.state = RUNNER_DONE
        old.extra = False
        n: GroupCpu | None = g
        while n is not None:  # held: one less, then one more (no cap: never extra)
            if n.held_over_cap >= n.held:
                n.held_over_cap = n.held - 1
            n = n.parent
        if new.user != old.user:
            _decrement(g.held_by, (pool, old.user))
            user = (pool, new.user)
            g.held_by[user] = g.held_by.get(user, 0) + 1
        if g.fair:
            by_query = g.held_by_query
            _decrement(by_query, (pool, old.query_id))
            query = (pool, new.query_id)
            by_query[query] = by_query.get(query, 0) + 1
        new.seq = next(_SEQ)  # it arrives now (grant_now)
        new.fresh = True
        new.runnable_since = new.granted_at = now
        new.cpu_since_grant_ns = 0
        new.state = RUNNER_RUNNING
        new.scheduled = True
        new.extra = False
        if pool not in new.ran_in_pools:
            new.ran_in_pools += (pool,)
        running.add(new)
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
        group's cap, or an ancestor's, counts workers across pools (None: all)."""
        return None if runner.group.path_limited else (runner.pool,)

    def _unwait(self, runner: Runner, now: float) -> None:
        queue = runner.group.waiting.get(runner.pool, [])
        queue.remove(runner)
        self.waiting_in[runner.pool] -= 1
        self._maybe_idle(runner.group, now)

    def _busy(self, g: GroupCpu, now: float) -> None:
        if g.charged and g not in self.busy:
            self._mark(g)
            if self.engaged:  # disengaged, no CPU is sampled: nothing to share out
                self.shares.changed(self.busy, now)

    def _mark(self, g: GroupCpu) -> None:
        """g has work: it and every ancestor not yet busy become busy (I6)."""
        n = g
        while n not in self.busy:
            self.busy.add(n)
            parent = n.parent
            if parent is None:
                return
            parent.active_children += 1
            n = parent

    def _unmark(self, g: GroupCpu) -> None:
        """g may be idle now: it and every ancestor left idle leave ``busy``."""
        n: GroupCpu | None = g
        while n is not None and n.idle and n in self.busy:
            self.busy.discard(n)
            n = n.parent
            if n is not None:
                n.active_children -= 1

    def _maybe_idle(self, g: GroupCpu, now: float) -> None:
        if g.idle and g in self.busy:
            self._unmark(g)
            if self.engaged:
                self.shares.changed(self.busy, now)

    def set_engaged(self, engaged: bool, now: float) -> None:
        """Slicing starts or stops; the share window follows only while engaged."""
        self.engaged = engaged
        if engaged:  # groups left busy while nobody looked (I6): from their own work
            stale = self.busy
            for g in stale:
                g.active_children = 0
            self.busy = set()
            for g in stale:
                if not g.own_idle:
                    self._mark(g)
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
        found = yield_reason(self, runner, now)
        if found is None:
            runner.granted_at = now
            runner.fresh = False
            return Decision(True, "renew")
        reason, owed_to = found
        none_free = not self.free[runner.pool]  # then the worker r frees is the only one
        self._unhold(runner, now)
        self._enqueue(runner, now, fresh=False)  # still runnable: no placement
        granted = []
        if (
            owed_to is not None
            and none_free
            and self.free[owed_to.pool]
            and self.sizes[owed_to.pool] > self.configured[owed_to.pool]
            and not self._may_run(owed_to, now)
        ):
            # oversubscribed: the group it yields to holds the configured count, which a
            # free worker would not pass; the worker handed over is the pool's only free
            # one, so the threads holding workers stay as many as before
            self._grant(owed_to, now)
            granted.append(owed_to)
        granted += self.dispatch(now, pools=self._freed(runner))
        if runner in granted:  # it was the one the rules picked after all
            granted.remove(runner)
            return Decision(True, "renew", granted)
        return Decision(False, reason, granted)

    def _fair_key(self, r: Runner) -> tuple[int, int]:
        """(workers r's user holds of its group in r's pool, workers r's query holds)."""
        g = r.group
        return (
            g.held_by.get((r.pool, r.user), 0),
            g.held_by_query.get((r.pool, r.query_id), 0),
        )

    # ---- charging ---------------------------------------------------------------------------

    def _charge(self, runner: Runner, cpu_ns: int, now: float) -> None:
        if cpu_ns < 0:
            raise InternalError(f"negative CPU {cpu_ns} for {runner!r}")
        if not runner.scheduled:
            return
        runner.cpu_since_grant_ns += cpu_ns
        g = runner.group
        if g.charged:
            unsliced = runner.kind == "ctas" and not runner.is_task
            self._charge_group(g, runner.user, cpu_ns, now, unsliced)

    def _charge_group(
        self, g: GroupCpu, user: str, cpu_ns: int, now: float, unsliced: bool = False
    ) -> None:
        """``cpu_ns`` of a query of ``user`` run in g. ``unsliced``: a CTAS's own
        thread, or a metered counted worker's query, which no slice end held
        back: the budget's debt it leaves is capped (``CTAS_DEBT_S``). The caller
        has refused a negative ``cpu_ns``."""
        g.cpu_ns_total += cpu_ns
        g.cpu_by_user[user] = g.cpu_by_user.get(user, 0) + cpu_ns
        g.own_vtime += cpu_ns * 100 / g.weight
        n: GroupCpu | None = g
        while n is not None:  # every level of the path: its frame, its limit, its share
            self.shares.charge(n.group_id, cpu_ns, now)
            n.vtime += cpu_ns * 100 / n.weight
            if n.fractional:
                n.refill(now)
                n.budget_ns -= cpu_ns
                if unsliced:
                    n.budget_ns = max(n.budget_ns, -n.rate * CTAS_DEBT_S)
            n = n.parent

    # ---- dispatch ------------------------------------------------------------------------

    def _groups_waiting(self, pool: str) -> list[GroupCpu]:
        if not self.waiting_in[pool]:
            return []
        gs = sorted((g for g in self.busy if g.waiting.get(pool)), key=_group_id)
        if self.outside.waiting.get(pool):
            gs.append(self.outside)
        return gs

    def _may_run(
        self,
        r: Runner,
        now: float,
        freed: set[GroupCpu] | None = None,
        replacing: Runner | None = None,
    ) -> bool:
        """May ``r`` take a worker now (the cap and budget of every level of its
        path), if one is free? ``freed``: the path of a runner whose worker counts
        as given back (a slice end deciding whether to yield); ``replacing``: the
        runner whose worker it would take at that slice end (in an oversubscribed
        pool: one of r's group leaves r's count as it is; one of another group's
        hands over a worker, which the room of the extra workers does not limit)."""
        g = r.group
        if not self.engaged or self.degraded or not g.charged:
            return True
        room = self.configured[r.pool]
        if self.sizes[r.pool] > room and not (
            replacing is not None and replacing.pool == r.pool and replacing.group is not g
        ):  # (a worker another group's runner hands over adds no thread: no room needed)
            swap = replacing is not None and replacing.group is g and replacing.pool == r.pool
            if self._held_in(g, r.pool) - swap >= room:
                return False  # oversubscribed: the extra workers are for other groups
        n: GroupCpu | None = g
        while n is not None:
            held = n.held - 1 if freed is not None and n in freed else n.held
            if held >= n.cap:
                # the one task beyond the cap while every running query is a CTAS
                if not (r.is_task and n.all_running_are_ctas() and not n.runs_extra()):
                    return False
            elif not (r.is_task and n.limit_cores is not None and n.limit_cores > 1) and (
                not n.budget_ok(now)  # (tasks above one core do not wait: the query repays)
            ):
                return False
            n = n.parent
        return True

    @staticmethod
    def _held_in(g: GroupCpu, pool: str) -> int:
        """Workers ``g`` holds in ``pool``. O(users of g holding workers)."""
        return sum(n for (p, _), n in g.held_by.items() if p == pool)

    def _pick(self, pool: str, now: float) -> Runner | None:
        groups = self._groups_waiting(pool)
        if not self.engaged or self.degraded:
            waiting = [r for g in groups for r in g.waiting[pool]]
            return min(waiting, key=lambda r: r.seq) if waiting else None
        if self.nested:
            return pick_nested(self, groups, pool, now)
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
        if not g.fair:
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
            n: GroupCpu | None = g
            r.extra = False
            while n is not None:  # a cap counts the workers of its whole subtree
                r.extra = r.extra or n.held >= n.cap
                n.held += 1
                n = n.parent
            g.held_by[(r.pool, r.user)] = g.held_by.get((r.pool, r.user), 0) + 1
            if g.fair:
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
            n: GroupCpu | None = g
            while n is not None:
                n.held -= 1
                n.held_over_cap = min(n.held_over_cap, n.held)
                n = n.parent
            _decrement(g.held_by, (r.pool, r.user))
            if g.fair:
                _decrement(g.held_by_query, (r.pool, r.query_id))
        r.extra = False

    def blocked_by(self, runner: Runner, now: float) -> str | None:
        """Why a waiting runner has no worker (None: it is not waiting): its group's
        CPU budget is spent ("cpu_budget"), its group holds as many workers as its
        CPU limit allows ("cpu_limit"), or the pool has none free for it now
        ("worker": all busy, or others are ahead by weight or arrival)."""
        if runner.state is not RUNNER_WAITING:
            return None
        path = runner.group.path()  # its own limit, or one above it (SPEC §14)
        for g in path:
            if g.fractional:
                budget = min(g.burst, g.budget_ns + (now - g.budget_at) * g.rate)
                if budget <= 0:
                    return "cpu_budget"
        if any(g.held >= g.cap for g in path):
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
        """When a waiting runner may next be able to run because a budget refills; inf
        if none is spent. A runner held back by a cap or by no free worker is woken
        by the worker's return (``dispatch``), not by the clock: a group's queries
        waiting for its one capped worker while its budget is positive do not poll."""
        times = [
            t
            for g in self.busy
            if g.fractional
            and (g.active_children or any(g.waiting.values()))
            and (t := g.refill_time(now)) > now
        ]
        return min(times, default=math.inf)

    # ---- invariants ----------------------------------------------------------------------

    def _check_invariants(self, now: float) -> None:
        """I1-I8, checked (``cpu_invariants.py``); InternalError if one is broken."""
        check_invariants(self, now)
