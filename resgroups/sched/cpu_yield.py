"""The slice-end rule of the CPU scheduler (SPEC §7): renew in place, or yield,
and to whom. ``CpuScheduler.slice_end`` (``sched/cpu.py``) charges the
runner's CPU, asks :func:`yield_reason`, and carries out its answer; the
symbols (v, w, A(g), E(n), G, L_g, b_g) are those of ``cpu.py``'s memo.

Slice end of runner r of group g (after charging its CPU):
  - a CTAS renews (it never gives up its worker); its debt is capped at
    what L_g refills in 10 s (``CpuScheduler._charge``); a parallel task
    renews too (tasks are short, and a parked task would hold a pool
    thread without a worker);
  - b_n <= 0 for some fractional n in A(g): yield, wait for budget;
  - a waiting runner q of another group h in the same pool, q allowed
    to run once r's worker is free, yields r's worker to it when, with
    x and y the entries where the paths of g and h part (siblings under
    their lowest common node, or that node's own work; x = g, y = h
    with no parent anywhere),
      (a) q is *fresh* (arrived, not parked) since r's grant and
          v_y <= v_x: new work entitled to go first, or
      (b) (v_x - v_y) * w_y / 100 > G: y lags by more than the
          granularity, in CPU time it would take y to catch up;
  - fair groups: a waiting runner of g in the same pool whose user holds
    fewer of g's workers (or, same user, whose query holds fewer) takes
    the worker when it is fresh since r's grant or r has used more than
    G of CPU since it last got a worker;
  - otherwise r renews in place.
A yielded runner waits again (not fresh) with its arrival order.

Alternatives rejected
    Yielding at every slice end (round robin): measured 17-20 % throughput
    lost to thread hand-offs on 2 cores.

Costs
    One pass over the groups waiting in r's pool, each with a may-run check
    of its waiting runners; with a tree, a walk of both paths to where they
    part. Slice ends only: nothing here is on a query's admission path.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from resgroups.sched.cpu_records import GroupCpu, Runner

if TYPE_CHECKING:
    from resgroups.sched.cpu import CpuScheduler


def yield_reason(s: CpuScheduler, runner: Runner, now: float) -> tuple[str, Runner | None] | None:
    """Why ``runner`` yields at its slice end, and the waiting runner of another
    group owed its worker (None: its own group's, or the budget); None: it renews."""
    g = runner.group
    if runner.is_task or runner.kind == "ctas":
        return None  # tasks are short and a CTAS cannot give up its worker
    path = g.path() if s.nested else None
    for n in path or (g,):
        if n.fractional and not n.budget_ok(now):
            return "budget", None
    # nested: a cap shared with the waiting runner counts r's worker as free
    freed = set(path) if path is not None else None
    # among the groups owed a worker, the one a pick would choose (least v), why it
    # is owed, and its runners that may take it
    owed: tuple[tuple[float, int], str, GroupCpu, list[Runner]] | None = None
    for h in s._groups_waiting(runner.pool):
        if h is g:
            continue
        candidates = [
            q for q in h.waiting.get(runner.pool, []) if s._may_run(q, now, freed, replacing=runner)
        ]
        if not candidates:
            continue
        if path is None:
            mine, theirs, weight = g.vtime, h.vtime, h.weight
        else:
            mine, theirs, weight = _parting(path, h)
        fresh = [q for q in candidates if q.fresh and q.runnable_since > runner.granted_at]
        if theirs <= mine and fresh:
            why, entitled = f"fresh work of {h.name}", fresh
        elif (mine - theirs) * weight / 100 > s.granularity_ns:
            why, entitled = f"{h.name} lags", candidates
        else:
            continue
        key = (theirs if h.charged else -math.inf, h.group_id)
        if owed is None or key < owed[0]:
            owed = (key, why, h, entitled)
    if owed is not None:  # the worker goes as a pick would
        _, why, h, entitled = owed
        return why, s._pick_in_group(h, entitled)
    if g.fair:
        overdue = runner.cpu_since_grant_ns > s.granularity_ns
        for q in g.waiting.get(runner.pool, []):
            arrived = q.fresh and q.runnable_since > runner.granted_at
            if (
                (arrived or overdue)
                and _holds_fewer(s, q, runner)
                and s._may_run(q, now, replacing=runner)
            ):
                return f"fair: {q.user} holds fewer", None
    return None


def _holds_fewer(s: CpuScheduler, q: Runner, r: Runner) -> bool:
    """Fair: does waiting q's user (or, for the same user, q's query) hold fewer
    of the group's workers in the pool than running r's?"""
    qk, rk = s._fair_key(q), s._fair_key(r)
    return qk[0] < rk[0] if q.user != r.user else qk[1] < rk[1]


def _parting(path: list[GroupCpu], h: GroupCpu) -> tuple[float, float, int]:
    """Where the paths of g (``path``, root first) and h part: (the virtual time of
    g's entry, that of h's entry, the weight of h's entry). An entry is a
    child of the lowest common node, or that node's own work (o_n)."""
    theirs = h.path()
    i = 0
    while i < len(path) and i < len(theirs) and path[i] is theirs[i]:
        i += 1
    if i == len(path):  # g is an ancestor of h: g's own work against h's side
        return path[-1].own_vtime, theirs[i].vtime, theirs[i].weight
    if i == len(theirs):  # h is an ancestor of g: h's own work against g's side
        return path[i].vtime, h.own_vtime, h.weight
    return path[i].vtime, theirs[i].vtime, theirs[i].weight
