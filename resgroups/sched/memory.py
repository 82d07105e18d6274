"""Memory budgets with batched per-thread accounting (SPEC §8).

Goals
    Tracked native query memory is accounted at three levels: the query,
    its group, the process. ``allocate``/``release`` cost a few attribute
    operations on the common path and take no lock: each thread of a query
    (its own thread, each ``map`` task) has its own :class:`MemoryCounter`
    whose pending delta is published to the shared budgets when it reaches
    64 KiB of change either way, and when the task (or the query) ends.

Symbols
    P_t    the pending delta of counter t (not yet published), |P_t| < 64 KiB
           after every call
    U_q    the published bytes of query q; U_g = sum of U_q over g's queries,
           U_p = sum over every group (the process)
    C_q    the query's ceiling, fixed when it starts (None: none): the smallest
           memory_limit on its group's path to the root among its limits
    L_g    the group's memory_limit, read live (0: none); L_p the process budget

Nested groups (SPEC §14)
    A group's budget may have a ``parent`` budget (its parent group's). U_g
    is then its subtree's: its own queries' bytes plus its children's U, so
    publishing moves a delta at every level of the path, and a parent's
    L_g bounds its whole subtree. U_p is the sum of the top-level U_g.

Invariants (``MemoryLedger._check_invariants``)
    I1 U_g = sum of U_q of its live queries plus its children's U_g, U_p =
       sum of the top-level U_g: publishing moves the same delta at every
       level under one lock;
    I2 nothing is published below zero;
    I3 a check fails only the request that crossed a limit: the pending
       bytes published with it had already been granted, and are counted;
    I4 overshoot: U_g <= L_g + k * 64 KiB with k threads running g's work
       (each may hold up to 64 KiB unpublished beyond the last check).

A failed request raises MemoryLimitExceeded at once (it never waits) and
marks the query failed, so its other tasks raise at their next checkpoint.
When a query ends every byte it still holds is returned; bytes left over
are logged and counted as a leak.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, Protocol

from resgroups.errors import InternalError, InvalidParameter, MemoryLimitExceeded
from resgroups.interrupts import Hold

log = logging.getLogger("resgroups.memory")

CHUNK: Final = 64 * 1024


class HasNbytes(Protocol):
    @property
    def nbytes(self) -> int: ...


@dataclass
class Budget:
    """A shared, published counter with an optional limit (0: none)."""

    name: str
    used: int = 0  # its subtree's, in a tree of groups
    limit: int = 0
    parent: Budget | None = None

    def path(self) -> Iterator[Budget]:
        """This budget and its ancestors'."""
        budget: Budget | None = self
        while budget is not None:
            yield budget
            budget = budget.parent

    def path_limit(self) -> int:
        """The smallest limit from here to the root (0: none)."""
        if self.parent is None:  # a flat group: every query's placement asks
            return self.limit
        limits = [b.limit for b in self.path() if b.limit]
        return min(limits) if limits else 0

    def add(self, delta: int) -> None:
        """``delta`` bytes more (or fewer) here and at every ancestor."""
        for budget in self.path():
            budget.used += delta


class MemoryLedger:
    """The process budget and every group's, behind one lock (taken once per 64 KiB)."""

    def __init__(self, process_limit: int) -> None:
        self.lock = threading.Lock()
        self.process = Budget("process", limit=process_limit)
        self.groups: dict[int, Budget] = {}
        self.leaks = 0
        self.leaked_bytes = 0

    def group(self, group_id: int, name: str) -> Budget:
        budget = self.groups.get(group_id)  # the common case: no lock
        if budget is not None:
            return budget
        with self.lock:
            budget = self.groups.get(group_id)
            if budget is None:
                budget = self.groups[group_id] = Budget(name)
            return budget

    def set_group_limit(self, group_id: int, name: str, limit: int) -> None:
        """ALTER online: later allocations see the new limit; nothing fails at once."""
        budget = self.group(group_id, name)
        with self.lock:
            budget.name, budget.limit = name, limit

    def set_parent(self, group_id: int, name: str, parent_id: int | None, parent: str) -> None:
        """Nest a group's budget under its parent's (None: top level), online: what
        its subtree holds leaves the old ancestors for the new ones (which may
        then be above their limits; later requests fail, nothing held is lost)."""
        budget = self.group(group_id, name)
        above = None if parent_id is None else self.group(parent_id, parent)
        with self.lock:
            if budget.parent is above:
                return
            if budget.parent is not None:
                budget.parent.add(-budget.used)
            budget.parent = above
            if above is not None:
                above.add(budget.used)

    def forget(self, group_id: int) -> None:
        with self.lock:
            budget = self.groups.get(group_id)
            if budget is not None and budget.used == 0:  # it stays linked to its parent's
                del self.groups[group_id]

    def _check_invariants(self, queries: list[QueryMemory]) -> None:
        with self.lock:
            by_group: dict[int, int] = {}
            for q in queries:
                by_group[q.group_id] = by_group.get(q.group_id, 0) + q.published
            problems = []
            below: dict[int, int] = {}
            for budget in self.groups.values():
                if budget.parent is not None:
                    below[id(budget.parent)] = below.get(id(budget.parent), 0) + budget.used
            for gid, budget in self.groups.items():
                expected = by_group.get(gid, 0) + below.get(id(budget), 0)
                if budget.used != expected:
                    problems.append(f"group {budget.name}: {budget.used} != {expected}")
                if budget.used < 0:
                    problems.append(f"group {budget.name} below zero")
            total = sum(b.used for b in self.groups.values() if b.parent is None)
            if self.process.used != total:
                problems.append(f"process {self.process.used} != groups {total}")
            if problems:
                raise InternalError("memory ledger broken: " + "; ".join(problems))


class QueryMemory:
    """The published state of one query: its ceiling and bytes, at every level."""

    def __init__(
        self,
        ledger: MemoryLedger,
        group_id: int,
        group: Budget,
        ceiling: int | None,
        describe: str,
        on_failure: Callable[[MemoryLimitExceeded], None],
    ) -> None:
        self.ledger = ledger
        self.group_id = group_id
        self.group = group
        self.ceiling = ceiling
        self.describe = describe
        self.published = 0
        self.peak = 0  # the high-water mark of published, for rules on memory (SPEC §16)
        self._on_failure = on_failure

    def publish(self, delta: int, request: int) -> None:
        """Move ``delta`` to the shared counters. ``request`` (> 0) is the part that
        may be refused: if it crosses a limit, only ``delta - request`` is published."""
        ledger = self.ledger
        with ledger.lock:
            if request > 0:
                error = self._check(delta, request)
                if error is not None:
                    self._apply(delta - request)
                    self._on_failure(error)
                    raise error
            if self.published + delta < 0:
                raise InvalidParameter(
                    f"release of {-delta} bytes exceeds the {self.published} bytes "
                    f"{self.describe} has published"
                )
            self._apply(delta)

    def _apply(self, delta: int) -> None:
        self.published += delta
        if self.published > self.peak:
            self.peak = self.published
        group = self.group
        group.used += delta
        parent = group.parent
        while parent is not None:  # a tree of groups: every ancestor's too
            parent.used += delta
            parent = parent.parent
        self.ledger.process.used += delta

    def _check(self, delta: int, request: int) -> MemoryLimitExceeded | None:
        granted = delta - request  # pending bytes already granted, published with it
        checks = [
            ("query", "", self.ceiling or 0, self.published),
            ("group", "", self.group.limit, self.group.used),
        ]
        parent = self.group.parent
        while parent is not None:  # a parent's limit bounds its subtree (SPEC §14)
            checks.append(("group", f", parent={parent.name}", parent.limit, parent.used))
            parent = parent.parent
        checks.append(("process", "", self.ledger.process.limit, self.ledger.process.used))
        for scope, where, limit, used in checks:
            if limit and used + delta > limit:
                return MemoryLimitExceeded(
                    f"query memory limit exceeded [scope={scope}, {self.describe}{where}, "
                    f"limit={limit}, used={used + granted}, request={request}]"
                )
        return None

    def move_to(self, group_id: int, group: Budget, describe: str) -> None:
        """A runaway-query rule moved the query to another group (SPEC §16): what it
        has published leaves its group's budget for ``group``'s, or, when that
        budget cannot take it, MemoryLimitExceeded (scope=group) and nothing moves."""
        ledger = self.ledger
        with ledger.lock:
            held = self.published
            leaving = set(map(id, self.group.path()))
            for budget in group.path():  # the levels it is not already counted in
                if id(budget) not in leaving and budget.limit and budget.used + held > budget.limit:
                    where = "" if budget is group else f", parent={budget.name}"
                    raise MemoryLimitExceeded(
                        f"query memory limit exceeded [scope=group, {describe}{where}, "
                        f"limit={budget.limit}, used={budget.used}, request={held}]: the "
                        "query holds more than the group it is moved to can take"
                    )
            self.group.add(-held)
            group.add(held)
            self.group, self.group_id, self.describe = group, group_id, describe

    def finish(self) -> int:
        """The query ended: return every byte it still holds; the bytes leaked."""
        with self.ledger.lock:
            leaked = self.published
            if leaked:
                self._apply(-leaked)
                self.ledger.leaks += 1
                self.ledger.leaked_bytes += leaked
        if leaked:
            log.warning(
                "%s ended holding %d tracked bytes: returned, counted as a leak",
                self.describe,
                leaked,
            )
        return leaked


class MemoryCounter:
    """The accountant of one thread of a query: ``q.memory`` and ``task.memory``.

    ``allocate``/``release`` take no lock until 64 KiB of change has gathered.
    """

    __slots__ = ("_pending", "_query")

    def __init__(self, query: QueryMemory | None) -> None:
        self._query = query
        self._pending = 0

    def allocate(self, nbytes: int) -> None:
        """Account ``nbytes`` more; MemoryLimitExceeded (not counted) past a limit."""
        if nbytes < 0:
            raise InvalidParameter(f"allocate({nbytes}): bytes must be >= 0")
        pending = self._pending + nbytes
        if pending < CHUNK or self._query is None:
            self._pending = pending
            return
        self._flush(pending, nbytes)

    def release(self, nbytes: int) -> None:
        if nbytes < 0:
            raise InvalidParameter(f"release({nbytes}): bytes must be >= 0")
        pending = self._pending - nbytes
        if pending > -CHUNK or self._query is None:
            if self._query is None and pending < 0:
                raise InvalidParameter(
                    f"release({nbytes}) exceeds the {self._pending} bytes this query holds"
                )
            self._pending = pending
            return
        self._flush(pending, 0)

    def _flush(self, pending: int, request: int) -> None:
        """Publish ``pending``; on MemoryLimitExceeded the granted part is published
        and the request dropped; on any other error nothing changes."""
        query = self._query
        assert query is not None
        with Hold():  # the local and shared counters move together, interrupt or not
            before = self._pending
            self._pending = 0
            try:
                query.publish(pending, request)
            except MemoryLimitExceeded:
                raise
            except BaseException:
                self._pending = before
                raise

    def flush(self) -> None:
        """Publish whatever is pending (a task or the query ends)."""
        with Hold():
            if self._pending:
                pending, self._pending = self._pending, 0
                if self._query is not None:
                    self._query.publish(pending, 0)

    @property
    def used(self) -> int:
        """The query's published bytes plus this thread's pending delta."""
        published = self._query.published if self._query is not None else 0
        return published + self._pending

    @contextmanager
    def track(self, array: HasNbytes) -> Iterator[Any]:
        """Account an array's ``nbytes`` for the lifetime of the block."""
        nbytes = int(array.nbytes)
        self.allocate(nbytes)
        try:
            yield array
        finally:
            self.release(nbytes)


def query_ceiling(
    own: int | None,
    acl_limits: list[int],
    instance: int | None,
    group_limit: int,
    process_limit: int,
) -> int | None:
    """SPEC §8: the first set of (own limit, smallest ACL-group limit, instance
    default), then lowered by the group's limit and the process budget."""
    base = own if own is not None else min(acl_limits) if acl_limits else instance
    caps = [c for c in (base, group_limit or None, process_limit or None) if c is not None]
    return min(caps) if caps else None
