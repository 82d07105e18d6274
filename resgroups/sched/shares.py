"""Fairness as data: each group's entitled and used share of the CPU over a window.

The entitlement is exact over time. Whenever the set of groups that want CPU
(work running or waiting: the scheduler's ``busy`` set) changes, the time
since the last change is shared among the groups that wanted CPU during it:
by weight, each capped at its CPU limit, what a cap leaves over going to the
others by weight (water-filling). CPU charged at slice ends is the use. Both
go into buckets of a twentieth of the window; a reading sums the last ``window_s`` seconds
(fewer while the engine is younger than that), so a group that goes idle
hands its entitlement to the others within one window.

Shares are percentages of the CPUs available to the process: a group that
runs fewer threads than its share of cores cannot use its entitlement and
shows a negative error.

Nested groups (SPEC §14, :func:`tree_fill`): the wanting set then holds every
group with work in its subtree; the top-level ones share the CPUs as above,
and each group's fraction is shared among its wanting children the same way,
so an inner group's entitlement is its subtree's. Its used CPU is its
subtree's too: the scheduler charges every group of the path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple, Protocol

from resgroups.errors import InvalidParameter

NS: Final = 1_000_000_000


class Wanting(Protocol):
    """What the window needs of a group (``GroupCpu``)."""

    @property
    def group_id(self) -> int: ...

    @property
    def weight(self) -> int: ...

    @property
    def limit_cores(self) -> float | None: ...


class Nested(Wanting, Protocol):
    """A group in a tree (``GroupCpu``): what :func:`tree_fill` needs."""

    @property
    def parent(self) -> Nested | None: ...


class Share(NamedTuple):
    entitled_pct: float
    used_pct: float


def water_fill(groups: Iterable[Wanting], cpus: float) -> dict[int, float]:
    """Each group's fraction of the CPUs: by weight, capped at its limit, the
    excess redistributed by weight among the uncapped."""
    left = {g.group_id: g for g in groups}
    if len(left) == 1:  # the common case: one group alone takes what its limit allows
        ((gid, g),) = left.items()
        return {gid: 1.0 if g.limit_cores is None else min(1.0, g.limit_cores / cpus)}
    return _fill({gid: (g.weight, _cap(g, cpus)) for gid, g in left.items()}, 1.0)


def _cap(g: Wanting, cpus: float) -> float | None:
    return None if g.limit_cores is None else min(1.0, g.limit_cores / cpus)


def _fill(left: dict[int, tuple[int, float | None]], amount: float) -> dict[int, float]:
    """Share ``amount`` by weight, each entry capped at its cap (a fraction of
    the CPUs; None: none), what a cap leaves over going to the others."""
    share: dict[int, float] = {}
    remaining = amount
    while left:
        total = sum(weight for weight, _ in left.values())
        capped = {
            gid: cap
            for gid, (weight, cap) in left.items()
            if cap is not None and remaining * weight / total >= cap
        }
        if not capped:
            for gid, (weight, _) in left.items():
                share[gid] = remaining * weight / total
            break
        left = {gid: entry for gid, entry in left.items() if gid not in capped}
        for gid, cap in capped.items():
            share[gid] = cap
            remaining -= cap
        remaining = max(0.0, remaining)
    return share


def tree_fill(groups: Iterable[Nested], cpus: float) -> dict[int, float]:
    """:func:`water_fill` level by level: the top-level groups share the CPUs,
    each group's fraction is shared among its wanting children. A group's cap
    is its limit, lowered to the sum of its wanting children's caps when every
    one of them is capped (what its subtree could take). With no parent among
    ``groups`` this is :func:`water_fill`. O(n) per level."""
    wanting = list(groups)
    if all(g.parent is None for g in wanting):
        return water_fill(wanting, cpus)
    ids = {g.group_id for g in wanting}
    children: dict[int | None, list[Nested]] = {}
    for g in wanting:
        parent = g.parent
        key = parent.group_id if parent is not None and parent.group_id in ids else None
        children.setdefault(key, []).append(g)
    caps: dict[int, float | None] = {}

    def cap(g: Nested) -> float | None:
        if g.group_id not in caps:
            own = _cap(g, cpus)
            below = [cap(c) for c in children.get(g.group_id, [])]
            if below and all(c is not None for c in below):
                subtree = sum(c for c in below if c is not None)
                own = subtree if own is None else min(own, subtree)
            caps[g.group_id] = own
        return caps[g.group_id]

    share: dict[int, float] = {}
    level = [(children.get(None, []), 1.0)]
    while level:
        nodes, amount = level.pop()
        fill = _fill({g.group_id: (g.weight, cap(g)) for g in nodes}, amount)
        share.update(fill)
        for g in nodes:
            below = children.get(g.group_id)
            if below:
                level.append((below, fill[g.group_id]))
    return share


class ShareWindow:
    """Entitled and used CPU per group over a sliding window. Not thread-safe:
    the scheduling core calls it under its lock."""

    def __init__(
        self,
        cpus: float,
        *,
        window_s: float = 10.0,
        fill: Callable[..., dict[int, float]] = water_fill,
    ) -> None:
        """``fill``: how a wanting set shares the CPUs (:func:`tree_fill` for a
        scheduler's groups, which may be nested)."""
        if not window_s > 0:
            raise InvalidParameter(f"cpu_share_window={window_s!r}: expected seconds > 0")
        self.cpus = cpus
        self._fill = fill
        self.window_s = window_s
        self.bucket_s = window_s / 20  # a reading's edge is off by at most 5 %
        self._buckets: dict[int, dict[int, list[float]]] = {}  # index -> gid -> [ent, cpu]
        self._since: float | None = None  # when the current set of wanting groups began
        self._started: float | None = None
        self._shares: dict[int, float] = {}  # the current set's fractions
        self._fills: dict[frozenset[Wanting], dict[int, float]] = {}  # by wanting set

    def _bucket(self, index: int) -> dict[int, list[float]]:
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = {}
            oldest = index - math.ceil(self.window_s / self.bucket_s) - 1
            for old in [i for i in self._buckets if i < oldest]:
                del self._buckets[old]
        return bucket

    def _spread(self, start: float, end: float, shares: dict[int, float]) -> None:
        """Add ``shares`` x seconds of [start, end) to the buckets it covers."""
        if not shares:
            return
        index = math.floor(start / self.bucket_s)
        if end <= (index + 1) * self.bucket_s:  # the common case: within one bucket
            bucket = self._bucket(index)
            for gid, fraction in shares.items():
                entry = bucket.get(gid)
                if entry is None:
                    entry = bucket[gid] = [0.0, 0.0]
                entry[0] += fraction * (end - start)
            return
        start = max(start, end - self.window_s - self.bucket_s)
        # integer bucket indices, not a walk by float boundaries: a boundary that
        # rounds onto ``start`` must not stop the walk (it once looped forever)
        first, last = math.floor(start / self.bucket_s), math.floor(end / self.bucket_s)
        for index in range(first, last + 1):
            low = max(start, index * self.bucket_s)
            high = min(end, (index + 1) * self.bucket_s)
            if high <= low:
                continue
            bucket = self._bucket(index)
            for gid, fraction in shares.items():
                bucket.setdefault(gid, [0.0, 0.0])[0] += fraction * (high - low)

    def changed(self, wanting: Iterable[Wanting], now: float) -> None:
        """The set of groups that want CPU is now ``wanting``."""
        if self._started is None:
            self._started = now
        if self._since is not None:
            self._spread(self._since, now, self._shares)
        self._since = now
        key = frozenset(wanting)  # the groups themselves: hashing them is cheap
        shares = self._fills.get(key)
        if shares is None:
            if len(self._fills) > 1024:
                self._fills.clear()
            shares = self._fills[key] = self._fill(key, self.cpus)
        self._shares = shares

    def reconfigured(self, wanting: Iterable[Wanting], now: float) -> None:
        """A group's weight or limit changed: new shares from now on."""
        self._fills.clear()
        self.changed(wanting, now)

    def charge(self, group_id: int, cpu_ns: int, now: float) -> None:
        """``group_id`` used ``cpu_ns`` at ``now``. O(1) (every runner's release)."""
        if self._started is None:
            self._started = now
        index = math.floor(now / self.bucket_s)
        bucket = self._buckets.get(index)
        if bucket is None:  # a new bucket: the oldest go
            bucket = self._bucket(index)
        entry = bucket.get(group_id)
        if entry is None:
            entry = bucket[group_id] = [0.0, 0.0]
        entry[1] += cpu_ns

    def read(self, now: float) -> dict[int, Share]:
        """Each group's entitled and used percentage over the window ending now."""
        if self._started is None:
            return {}
        if self._since is not None:  # the open interval counts up to now
            self._spread(self._since, now, self._shares)
            self._since = now
        span = min(self.window_s, now - self._started)
        first = math.floor((now - span) / self.bucket_s)
        totals: dict[int, list[float]] = {}
        for index, bucket in self._buckets.items():
            if index < first:
                continue
            # the oldest bucket counts only for the part inside the window (of the
            # part that holds data: nothing was recorded before the first event)
            weight = 1.0
            if index == first and span > 0:
                end = (index + 1) * self.bucket_s
                held = end - max(index * self.bucket_s, self._started)
                inside = end - (now - span)
                weight = max(0.0, min(1.0, inside / held)) if held > 0 else 1.0
            for gid, (entitled, cpu) in bucket.items():
                total = totals.setdefault(gid, [0.0, 0.0])
                total[0] += entitled * weight
                total[1] += cpu * weight
        if span <= 0:
            return {gid: Share(self._shares.get(gid, 0.0) * 100, 0.0) for gid in totals}
        return {
            gid: Share(entitled / span * 100, cpu / (span * self.cpus * NS) * 100)
            for gid, (entitled, cpu) in totals.items()
        }
