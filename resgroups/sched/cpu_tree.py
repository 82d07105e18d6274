"""The group tree of the CPU scheduler (SPEC §7, §14): an ALTER applied online,
a group moved under another parent, a group dropped, and the pick down the
tree. Functions of the scheduler (``sched/cpu.py``), which calls them from
:meth:`CpuScheduler.configure`, :meth:`CpuScheduler.forget` and, with a
parent anywhere, ``CpuScheduler._pick``; its memo states the symbols, the
pick rule and I7, the invariant of the tree these keep.

Reparent (ALTER SET/RESET parent, online)
    D(g)'s held workers and counted work move with it (caps above may be
    exceeded as by an ALTER: nothing is taken back); its virtual time is
    meaningless in the new frame, so v_g := min v of its new runnable
    siblings, or, if none is runnable, max v of its new siblings (it brings
    neither a lead nor a debt); CPU charged before the move stays charged
    to the old ancestors (their budgets and shares), and what follows goes
    to the new ones.

Full sync
    A catalog sync configures the groups in any order: a parent not
    configured yet is made under a placeholder name, as gone (its own
    configure keeps it, else it goes with its last child), and a would-be
    cycle puts the would-be parent at the top until its own configure.

Costs
    An ALTER: O(depth + siblings), and the share window told of the busy
    groups. A pick down the tree: O(runnable paths x depth), taken only
    while a group has a parent (``nested``); the flat pick is ``cpu.py``'s.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from resgroups.sched.cpu_records import GroupCpu, Runner

if TYPE_CHECKING:
    from resgroups.sched.cpu import CpuScheduler


def configure(
    s: CpuScheduler,
    group_id: int,
    name: str,
    weight: int,
    limit_cores: float | None,
    policy: str,
    now: float,
    *,
    parent: int | None = None,
) -> list[Runner]:
    """:meth:`CpuScheduler.configure`: the new settings, then the move if the
    parent changed, then a dispatch of what they allow."""
    g = s.group(group_id, name)
    g.gone = False  # configured: a group of the catalog (or a dropped one's queries)
    g.refill(now)
    was_fractional = g.fractional
    g.name, g.weight, g.limit_cores, g.policy = name, weight, limit_cores, policy
    if g.held > g.cap:  # ALTER cancels nothing: workers held stay held
        g.held_over_cap = max(g.held_over_cap, g.held)
    if g.fractional and not was_fractional:
        g.budget_ns = g.burst
    g.budget_ns = min(g.budget_ns, g.burst)
    old = g.parent
    if (None if old is None else old.group_id) != parent:
        reparent(s, g, None if parent is None else parent_group(s, parent), now)
    # weights, limits and the tree apply from now on
    s.shares.reconfigured([h for h in s.busy if not h.idle], now)
    return s.dispatch(now)


def parent_group(s: CpuScheduler, group_id: int) -> GroupCpu:
    """The group a child names as its parent. One not configured yet (a full
    sync goes in any order; a dropped group's late query) is made now, as
    gone: its own configure keeps it, else it goes with its last child."""
    parent = s.groups.get(group_id)
    if parent is None:
        parent = s.group(group_id, f"#{group_id}")
        parent.gone = True
    return parent


def reparent(s: CpuScheduler, g: GroupCpu, parent: GroupCpu | None, now: float) -> None:
    """Move g and its subtree under ``parent`` (None: the top), online: its
    held workers and busy state go along; its virtual time enters the new
    frame level with the new siblings (no lead, no debt). O(depth + siblings)."""
    if parent is g:  # the catalog refuses it (a cycle); never a loop here
        parent = None
    if parent is not None and parent in g.subtree():
        # only mid-way through a full sync of a reshaped tree: the would-be
        # parent goes to the top for now; its own configure puts it in place
        reparent(s, parent, None, now)
    was_busy = g in s.busy
    old = g.parent
    if old is not None:
        if was_busy:
            old.active_children -= 1
            s._unmark(old)
        for n in old.path():
            n.held -= g.held
            n.held_over_cap = min(n.held_over_cap, n.held)
        old.children.remove(g)
        s.nested -= 1
    g.parent = parent
    if parent is not None:
        parent.children.append(g)
        s.nested += 1
        for n in parent.path():
            n.held += g.held
            if n.held > n.cap:  # nothing is taken back, as by an ALTER (I3)
                n.held_over_cap = max(n.held_over_cap, n.held)
    siblings = [h for h in _siblings(s, g) if h is not g]
    runnable = [h.vtime for h in siblings if h in s.busy]
    if parent is not None and parent in s.busy and not parent.own_idle:
        runnable.append(parent.own_vtime)
    if runnable:
        g.vtime = min(runnable)
    elif siblings:
        g.vtime = max(h.vtime for h in siblings)
    g.refresh_path()
    if was_busy and parent is not None:
        parent.active_children += 1
        if parent not in s.busy:
            if s.engaged:
                s._place_chain(parent)
            s._mark(parent)
    # (the share window learns of the new tree from configure: reconfigured)


def _siblings(s: CpuScheduler, g: GroupCpu) -> list[GroupCpu]:
    """S(g) and g: its parent's children, or the top-level groups."""
    if g.parent is not None:
        return g.parent.children
    return [h for h in s.groups.values() if h.parent is None]


def forget(s: CpuScheduler, group_id: int) -> None:
    """Drop the state of a group that is gone and idle (a group with children
    still running goes after them)."""
    g = s.groups.get(group_id)
    if g is None or not g.own_idle:
        return
    g.gone = True
    while g is not None and g.gone and g.idle and not g.children:
        del s.groups[g.group_id]
        s._unmark(g)  # busy while nobody looked (disengaged): leaves, and its parent counts it out
        parent = g.parent
        if parent is not None:
            parent.children.remove(g)
            s.nested -= 1
            g.parent = None
        g = parent


def pick_nested(s: CpuScheduler, groups: list[GroupCpu], pool: str, now: float) -> Runner | None:
    """The pick down the tree: at each node the entry of least virtual time
    among those with a runner that may run below (O(runnable paths x depth))."""
    eligible: dict[GroupCpu, list[Runner]] = {}
    for g in groups:
        candidates = [r for r in g.waiting[pool] if s._may_run(r, now)]
        if candidates:
            eligible[g] = candidates
    paths = [g.path() for g in eligible]
    node: GroupCpu | None = None
    depth = 0
    while paths:
        best: GroupCpu | None = None
        best_key: tuple[float, int] | None = None
        own = False
        for path in paths:
            if len(path) > depth:
                entry = path[depth]
                key = (entry.vtime if entry.charged else -math.inf, entry.group_id)
                mine = False
            else:  # the node's own work
                assert node is not None
                entry, key, mine = node, (node.own_vtime, node.group_id), True
            if best_key is None or key < best_key:
                best, best_key, own = entry, key, mine
        assert best is not None
        if own:
            return s._pick_in_group(best, eligible[best])
        paths = [p for p in paths if len(p) > depth and p[depth] is best]
        node, depth = best, depth + 1
    return None
