"""A gate moved in the tree of nested groups (SPEC §14): ALTER ... SET/RESET
(parent), online. ``Gate.set_parent`` (``sched/admission.py``) calls
:func:`set_parent`; the symbols (A, B, G, L) and I7-I9 are that module's.

Reparent
    What the moved subtree holds and queues (its load A + B, its queued
    tickets, each user's slots) leaves every old ancestor and joins every
    new one. Nothing is taken back: a new ancestor that ends above its
    limit keeps what it holds, grandfathered as for a lowered limit (G, I9),
    and admits nobody new until its load falls below the limit. Each gate
    whose children changed is ``nested`` or not again (``_renest``); then
    the old tree and the new one admit what they now can (``_admit_tree``).
    O(depth x users holding slots in the subtree), on no query's path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from resgroups.sched.admission_records import Ticket

if TYPE_CHECKING:
    from resgroups.sched.admission import Gate


def set_parent(child: Gate, parent: Gate | None, now: float) -> list[Ticket]:
    """:meth:`Gate.set_parent`: ``child`` and its subtree move under ``parent``
    (None: the top); the tickets either tree now admits."""
    if parent is child.parent:
        return []
    load, waiting = child.load, child.waiting + child.waiting_below
    held = dict(child._held)
    for user, n in child._held_below.items():
        held[user] = held.get(user, 0) + n
    old = child.parent
    gate = old
    while gate is not None:
        gate.below -= load
        for user, n in held.items():
            left = gate._held_below[user] - n
            if left:
                gate._held_below[user] = left
            else:
                del gate._held_below[user]
        gate.waiting_below -= waiting
        if gate._grandfathered > gate.load:
            gate._grandfathered = gate.load
        gate = gate.parent
    if old is not None:
        old.children.remove(child)
        old._renest()
    child.parent = parent
    if parent is not None:
        parent.children.append(child)
    gate = parent
    while gate is not None:
        gate.below += load
        for user, n in held.items():
            gate._held_below[user] = gate._held_below.get(user, 0) + n
        gate.waiting_below += waiting
        gate._renest()
        if gate.config.max_active is not None and gate.load > gate.config.max_active:
            gate._grandfathered = max(gate._grandfathered, gate.load)
        gate = gate.parent
    child._renest()
    admitted = old._admit_tree(now) if old is not None else []
    return admitted + child._admit_tree(now)
