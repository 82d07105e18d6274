"""Fleet quotas (``fleet_admission="quota"``): a share of each limit per process.

Goal
    A fleet admits at the speed of the local gate while ``max_active_queries``
    holds exactly across it. Each instance holds, per limited group, a quota
    of slots in PostgreSQL (``resgroups_fleet_quotas``), and its local gate
    admits within it: no I/O on the query path. The sum of a group's quotas
    never exceeds its limit: ``resgroups_fleet_quota_set`` grants more only
    as far as the others' quotas leave room, under the group's advisory lock.

The keeper (one thread per instance) keeps each quota near what the
instance needs, whenever told to look now (a query queued here, a NOTIFY from another
instance) and at least every ``_TICK_S``:

    wanted  = min(limit, running + queued here)
    target  = the highest ``wanted`` of the last ``hold`` seconds (or up to
              twice that: two windows are kept), or just
              ``wanted`` once another instance said it wants slots; when the
              fleet wants more than the limit, at most this instance's fair
              share (the limit split in proportion to what each wants)
    more    : ask PostgreSQL for ``target``; the gate's limit rises to what
              was granted (a NOTIFY 'want:g' tells the others when it is short)
    less    : the local gate's limit drops to ``target`` first (running
              queries above it finish, nothing new is admitted), then the
              quota drops to max(target, running) in PostgreSQL: a slot is
              counted free elsewhere only once no query here can use it

A lowered limit (ALTER) can leave the fleet's quotas above it: a quota is
never taken below what its instance runs. Then an instance admits only on
the part of its quota that the others' quotas leave below the limit
(``usable``), which grows as they give back: the fleet admits nothing new
until it runs below the lowered limit.

Liveness and fencing
    The keeper renews its quota rows every ``heartbeat``; the sweep owner
    deletes the rows of an instance whose heartbeat lapsed past ``expiry``.
    ``valid_until`` is the start of the last successful renewal plus 0.9
    ``expiry``: past it, the quota may have been reclaimed, so queries of
    quota groups are not admitted and running ones fail at their next
    checkpoint with CoordinationUnavailable (a process stopped for longer
    than the expiry can never run past the fleet limit once it resumes). A
    renewal that finds a row gone or lower drops the gate to it and fails the
    running queries of that group at once.

Fail closed
    While PostgreSQL is unreachable the instance keeps admitting within the
    quota it holds (still exactly its share, until ``valid_until``); asks for
    more wait in the gate's queue, within the queue and query timeouts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from resgroups.fleet.fence import Fence
from resgroups.fleet.store import Barrier, FleetGroup, LeaseStore, StoreUnavailable

log = logging.getLogger("resgroups.fleet")

_TICK_S = 0.1


class GroupDemand(NamedTuple):
    """What one limited group needs here now (read without the gate's lock: the
    keeper looks again at its next tick)."""

    group: FleetGroup
    limit: int
    running: int
    queued: int
    peak: int  # the most running + queued at once since the last call
    local: int | None  # the gate's quota now
    barrier: Barrier

    @property
    def limited_since(self) -> int:
        """The catalog version at which the limit appeared (0: none): the barrier's."""
        return self.barrier[1]


# every group with a max_active_queries, by its key (GroupDef.uid)
ReadDemand = Callable[[], dict[str, GroupDemand]]


class QuotaKeeper:
    def __init__(
        self,
        store: LeaseStore,
        *,
        heartbeat: float,
        expiry: float,
        hold: float,
        demand: ReadDemand,
        limit_to: Callable[[str, int], None],
        running: Callable[[str], int],
        lost: Callable[[set[str]], None],
        catalog: Callable[[], tuple[str, int]],
        synced: Callable[[tuple[str, int]], None],
    ) -> None:
        self.store = store
        self.heartbeat, self.expiry, self.hold = heartbeat, expiry, hold
        self._demand = demand
        self._limit_to = limit_to  # set a group's local limit
        self._running = running  # the queries of a group holding a local slot now
        self._lost = lost  # fail the running queries of these groups
        self._catalog = catalog  # (the log's identity, the version the runtimes apply)
        self._synced = synced  # tell the coordinator (its heartbeat carries it)
        self._adopted = catalog()[1]  # at start nothing runs: nothing to adopt
        self.quotas: dict[str, int] = {}  # what PostgreSQL holds for this instance
        self.usable: dict[str, int] = {}  # the part of it the gate may admit on
        self.fence = Fence(expiry)  # nothing held before the first renewal
        self.errors = 0
        self.lapses = 0  # renewals that came after the fence had passed
        # group -> (most wanted in this hold window, in the one before, window start)
        self._peaks: dict[str, tuple[int, int, float]] = {}
        self._fair: dict[str, int] = {}  # group -> fair share while contended
        self._yielded: dict[str, float] = {}  # group -> when told its turn was over
        self._asked: dict[str, float] = {}  # group -> when PostgreSQL was last asked
        self._wanted_elsewhere: dict[str, float] = {}  # group -> when another said 'want'
        self._applied: dict[str, int] = {}  # group -> the quota last given its gate
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="resgroups-fleet-quota", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---- from other threads -------------------------------------------------------

    def look_now(self) -> None:
        """Look again now (a query queued here, a NOTIFY)."""
        self._wake.set()

    def heard(self, payload: str) -> None:
        """A NOTIFY on the fleet channel: 'want:<group>' from an instance that got
        less than it asked for, 'quota:<group>' when slots were given back."""
        if payload.startswith("want:"):
            self._wanted_elsewhere[payload[5:]] = time.monotonic()
        self._wake.set()

    @property
    def valid_until(self) -> float:
        return self.fence.valid_until

    def stale(self) -> bool:
        """Past the fence: the quota may have been reclaimed meanwhile."""
        return self.fence.stale()

    def wait_fresh(self, deadline: float) -> bool:
        """Until a renewal makes the quota valid again (True) or the monotonic
        ``deadline`` passes (False)."""
        return self.fence.wait_fresh(deadline, self._wake.set)

    # ---- the keeper's thread ------------------------------------------------------------

    def _run(self) -> None:
        next_renew = time.monotonic()
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_renew:
                    next_renew = now + min(self.heartbeat, 0.5)  # a failed one: retried soon
                    self._renew()
                    next_renew = time.monotonic() + self.heartbeat
                self._tick()
            except StoreUnavailable as exc:
                self.errors += 1
                log.debug("fleet quotas: %s", exc)
            except Exception:  # a bug must not stop the keeper: log it, go on
                self.errors += 1
                log.exception("fleet quotas: the keeper failed; it goes on")
            self._wake.wait(_TICK_S)
            self._wake.clear()

    def _renew(self) -> None:
        started = time.monotonic()
        held = self.store.renew_quotas()
        lost = {g for g, q in self.quotas.items() if held.get(g, 0) < q}
        if self.fence.lapsed():  # the rows may have been swept and taken meanwhile, and
            # a late quota call may have written them back: nothing held before counts
            self.lapses += 1
            lost |= set(self.quotas) | set(self._applied)
        if lost:
            log.error(
                "fleet: the quota of %s in %s was reclaimed while its heartbeat lapsed; "
                "its running queries there fail at their next checkpoint",
                self.store.instance_id,
                ", ".join(sorted(lost)),
            )
            for group in lost:
                self.quotas[group] = held.get(group, 0)
                self.usable[group] = min(self.usable.get(group, 0), self.quotas[group])
                self._apply(group, self.usable[group])
            self._lost(lost)
        self.fence.renewed(started)

    def _tick(self) -> None:
        if self.stale():
            return  # nothing is granted or given back on a quota that may be gone
        now = time.monotonic()
        uid, version = self._catalog()  # before the demand: it reflects this version
        demand = self._demand()
        for key in [g for g in self.quotas if g not in demand]:  # dropped, or no limit now
            self._set(key, FleetGroup(key, key), 0, 0, 0, 0, (uid, 0, self.expiry, version))
            for table in (self._peaks, self._fair, self._applied, self._yielded, self._asked):
                table.pop(key, None)
        for key, need in demand.items():
            # a gate that froze at a lowered limit (GroupRuntime.configure), or a limit
            # that appeared since the last adoption: check the quota again
            changed = need.local is not None and need.local != self._applied.get(key, need.local)
            changed = changed or need.limited_since > self._adopted
            self._tick_group(key, need, now, changed)
        if version > self._adopted:  # every group's floor is in: say so
            self.store.synced(uid, version)
            self._adopted = version
            self._synced((uid, version))

    def _tick_group(self, key: str, need: GroupDemand, now: float, changed: bool) -> None:
        """One group's quota toward what it needs now (the module's rules)."""
        mine = self.quotas.get(key, 0)
        usable = self.usable.get(key, 0)
        limit, running = need.limit, need.running
        wanted = min(limit, running + need.queued)

        # a limit that appeared: the quota is never set below what runs here (those
        # queries run already); otherwise it never grows past the room the others leave
        floor = running if need.limited_since > self._adopted else 0

        def ask(target: int) -> int:
            return self._set(key, need.group, target, wanted, limit, floor, need.barrier)

        target = self._target(key, wanted, min(limit, need.peak), limit, now)
        if usable < mine:  # over a lowered limit: what cannot be used goes back
            target = min(target, usable)
        turn_over = self._fair.get(key) == 0
        if turn_over and wanted > mine and now - self._yielded.get(key, now) >= self.hold:
            self._yielded[key] = now  # a turn given up: ask again, at most once a hold
            usable = ask(max(mine, wanted))
            self._apply(key, min(wanted, usable))
        elif changed:
            usable = ask(max(mine, running))
            self._apply(key, min(target, usable))
        elif wanted > usable and target > usable:  # more: ask
            usable = ask(max(target, mine))
            self._apply(key, min(target, usable))
        elif target < mine:  # less: stop using them here first, then give back
            self._apply(key, min(target, usable))  # nothing new above it from here
            running = self._running(key)
            keep = max(target, running)
            if keep < mine:
                usable = ask(keep)
                self._apply(key, min(target, usable))
        elif key in self._wanted_elsewhere and (
            key not in self._fair or now - self._asked.get(key, -math.inf) >= self.hold
        ):  # say what is wanted here; while contended, learn again whose turn it is
            usable = ask(mine)
            self._apply(key, min(target, usable))

    def _apply(self, group: str, quota: int) -> None:
        """Set the group's gate to admit on ``quota``."""
        self._applied[group] = quota
        self._limit_to(group, quota)

    def _target(self, group: str, wanted: int, recent: int, limit: int, now: float) -> int:
        """What to hold: ``recent`` is the most wanted at once since the last tick."""
        current, previous, start = self._peaks.get(group, (0, 0, now))
        if now - start > self.hold:  # a new window: the recent peak spans two
            current, previous, start = recent, current, now
        current = max(current, wanted, recent)
        self._peaks[group] = (current, previous, start)
        peak = max(current, previous)
        heard = self._wanted_elsewhere.get(group)
        if heard is not None and now - heard > max(self.hold, 1.0):
            del self._wanted_elsewhere[group]
            self._fair.pop(group, None)
            heard = None
        target = wanted if heard is not None else peak  # another waits: no hold
        fair = self._fair.get(group)
        if fair is not None:
            target = min(target, fair)
        return min(target, limit)

    def _set(
        self,
        key: str,
        group: FleetGroup,
        target: int,
        wanted: int,
        limit: int,
        floor: int,
        barrier: Barrier,
    ) -> int:
        """Ask PostgreSQL for ``target`` (never below ``floor``); the part of the
        quota granted that may be admitted on (the caller sets the gate)."""
        granted, usable, fair, contended = self.store.set_quota(
            group, target, wanted, limit, floor, barrier, self.hold
        )
        self._asked[key] = time.monotonic()
        if contended:
            if fair == 0 and self._fair.get(key) != 0:
                self._yielded[key] = time.monotonic()  # asks again after a hold
            self._fair[key] = fair
        else:
            self._fair.pop(key, None)
        if granted or wanted:
            self.quotas[key], self.usable[key] = granted, usable
        else:
            self.quotas.pop(key, None)
            self.usable.pop(key, None)
        return usable

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
