"""The invariants of the CPU scheduler, checked (SPEC §7). I1-I8 are stated in
``sched/cpu.py``'s memo; :func:`check_invariants` recomputes each from the
runners and groups and raises :class:`~resgroups.errors.InternalError`
naming every one broken. ``CpuScheduler._check_invariants`` calls it, for
the scenario and stateful tests after every step and for
``Dispatcher.check_invariants``; it walks every group's subtree and runners,
and runs on no query's path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.errors import InternalError
from resgroups.sched.cpu_records import RUNNER_RUNNING, RUNNER_WAITING

if TYPE_CHECKING:
    from resgroups.sched.cpu import CpuScheduler


def check_invariants(s: CpuScheduler, now: float) -> None:
    problems: list[str] = []
    everyone = [*s.groups.values(), s.outside]
    for pool, size in s.sizes.items():
        held = sum(1 for g in everyone for r in g.running if r.pool == pool)
        counted = s.counted[pool]
        if s.free[pool] < 0 or s.free[pool] + held + counted != size:
            problems.append(
                f"pool {pool}: free {s.free[pool]} + held {held} + counted {counted} != {size}"
            )
        if s.owed[pool] < 0 or (s.owed[pool] and s.free[pool]):
            problems.append(f"pool {pool}: owes {s.owed[pool]} with {s.free[pool]} free")
    for pool in s.sizes:
        waiting = sum(len(g.waiting.get(pool, [])) for g in everyone)
        if waiting != s.waiting_in[pool]:
            problems.append(f"pool {pool}: {waiting} waiting, counted {s.waiting_in[pool]}")
    if sum(s.counted.values()) != sum(g.counted for g in everyone):
        problems.append(f"counted workers {s.counted} are not the groups' sum")
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
        below = g.subtree() if g.charged else [g]
        scheduled = sum(1 for h in below for r in h.running if r.scheduled)
        scheduled += sum(h.metered for h in below)
        if g.held != scheduled:
            problems.append(f"{g.name}: held {g.held} != scheduled running {scheduled}")
        if not 0 <= g.metered <= g.counted:
            problems.append(f"{g.name}: {g.metered} metered of {g.counted} counted")
        extra = sum(1 for h in below for r in h.running if r.extra)
        allowed = max(g.cap, g.held_over_cap)
        if s.engaged and not s.degraded and g.charged and g.held - extra > allowed:
            problems.append(f"{g.name}: holds {g.held} workers above its cap {g.cap}")
        if sum(1 for r in g.running if r.extra) > 1:
            problems.append(f"{g.name}: more than one task beyond a cap")
        by_user: dict[tuple[str, str], int] = {}
        by_query: dict[tuple[str, int], int] = {}
        for r in g.running:
            if r.scheduled:
                by_user[(r.pool, r.user)] = by_user.get((r.pool, r.user), 0) + 1
                if g.fair:
                    by_query[(r.pool, r.query_id)] = by_query.get((r.pool, r.query_id), 0) + 1
        if by_user != g.held_by or by_query != g.held_by_query:
            problems.append(f"{g.name}: held_by or held_by_query is not its runners' (I8)")
        if g.budget_ns > g.burst + 1e-6:
            problems.append(f"{g.name}: budget {g.budget_ns} above burst {g.burst}")
    busy = {n for g in s.groups.values() if g.charged and not g.own_idle for n in g.path()}
    if not busy <= s.busy or (s.engaged and busy != s.busy):
        problems.append(f"busy groups {s.busy} are not those with work {busy} (I6)")
    problems += tree_problems(s)
    for pool in s.sizes:
        if s.free[pool] > 0 and s._pick(pool, now) is not None:
            problems.append(f"pool {pool}: a worker is free while a runner may take it")
    if problems:
        raise InternalError("CPU scheduler broken: " + "; ".join(problems) + f"; groups={everyone}")


def tree_problems(s: CpuScheduler) -> list[str]:
    """I6's counts and I7: an acyclic tree, children lists that agree with the
    parents, and what follows from the limits of each path."""
    problems = []
    groups = list(s.groups.values())
    for g in groups:
        seen = {g}
        n = g.parent
        while n is not None:
            if n in seen:
                return [f"{g.name}: a cycle of parents"]
            seen.add(n)
            n = n.parent
        if g.parent is not None and g.parent.children.count(g) != 1:
            problems.append(f"{g.name}: not once among its parent's children")
        if g.parent is not None and s.groups.get(g.parent.group_id) is not g.parent:
            problems.append(f"{g.name}: its parent is not a group of the scheduler")
        if any(c.parent is not g for c in g.children):
            problems.append(f"{g.name}: a child names another parent")
        active = sum(1 for c in g.children if c in s.busy)
        if g.active_children != active:
            problems.append(f"{g.name}: active_children {g.active_children} != {active}")
        path = g.path()
        if g.path_limited != any(n.limited for n in path):
            problems.append(f"{g.name}: path_limited disagrees with its path")
        if g.single_threaded != any(n.own_single_threaded for n in path):
            problems.append(f"{g.name}: single_threaded disagrees with its path")
    if s.nested != sum(1 for g in groups if g.parent is not None):
        problems.append(f"nested {s.nested} is not the groups with a parent")
    return problems
