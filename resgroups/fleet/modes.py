"""Admission modes: how a query's slot is held beyond this process (SPEC §11).

An engine chooses one when it starts and every query asks it, never which
mode it is in:

=========  ==================================================================
local      no fleet: the local gate is the whole limit
lease      a lease row per query of a limited group, after the local slot
quota      this instance's share of each limit, set as the local gate's limit
=========  ==================================================================

The interface, in the order a query meets it::

    fresh()                whether ``prepare`` would return at once (asked first,
                           so the common case costs one clock read)
    prepare(group, left)   before the gate: wait (up to ``left`` seconds) until
                           what this instance holds is valid
    queued                 called when the query queues at the gate (or None)
    fast                   whether the fast path may take slot and worker at once
    after_slot(held, ...)  with the local slot held: what the fleet needs too
    after_slot_holds       whether ``after_slot`` takes anything (False: not called)
    give_back(held)        what ``after_slot`` took, however the query ended
    valid_until            the fence: past it (time.monotonic), a query fails
                           at its next checkpoint with CoordinationUnavailable
    counts(), quotas()     what resource_groups() shows (fleet_active_queries,
                           fleet_quota), by group identity

:class:`~resgroups.query.Holdings` owns what a query holds (ticket, runner,
lease), so the query, the registry and the reconcile loop read one record.

Fencing (both fleet modes)
    The coordinator renews this instance's row and leases every heartbeat; a
    renewal that started at ``t`` makes them valid until ``t + 0.9 expiry``,
    strictly before the sweep of any other instance could reclaim them
    (``t + expiry`` on the database's clock, which ran at least from ``t``).
    Past that, nothing is admitted and running queries fail at the checkpoint
    armed for that moment. A renewal after such a lapse fails every query
    admitted before it (their leases may be gone; those that held nothing in
    the fleet, admitted while their group had no limit, may have been left
    out of a limit that appeared meanwhile) before the instance is valid
    again, so a query that wakes after a pause cannot pass a checkpoint on
    what it held.

Limits that appear
    A query admitted while its group had no limit holds no lease or quota.
    When ``max_active_queries`` appears (``GroupDef.limited_since``), each
    instance first adopts what it runs there (lease mode: a lease for each,
    whatever the count; quota mode: a quota never below what it runs), then
    reports the catalog version through which it has done so; the database
    admits nobody on that limit while a live instance of the same log is
    behind it (``resgroups_fleet_behind``). A lowered limit needs no barrier:
    every running query already holds its lease or quota.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from resgroups.errors import CoordinationUnavailable, QueueTimeout

if TYPE_CHECKING:
    from resgroups.catalog.model import GroupDef
    from resgroups.config import EngineConfig
    from resgroups.fleet.coordinator import FleetCoordinator
    from resgroups.fleet.quotas import GroupDemand, QuotaKeeper
    from resgroups.fleet.store import Barrier, FleetGroup
    from resgroups.query import Holdings
    from resgroups.sched.runtime import GroupRuntime


class Fenced(Protocol):
    """Anything with a fence: until when (time.monotonic) what it guards is valid."""

    @property
    def valid_until(self) -> float: ...


def seconds_left(fence: Fenced) -> float:
    """How long ``fence`` stays valid, in seconds from now (<= 0: it has passed).
    The fence's clock is real monotonic time; a query adds this to its own
    clock, so that its fields stay on one clock."""
    return fence.valid_until - time.monotonic()


class _Earliest:
    """Two fences as one: valid until the earlier passes."""

    def __init__(self, first: Fenced, second: Fenced) -> None:
        self._first, self._second = first, second

    @property
    def valid_until(self) -> float:
        first, second = self._first.valid_until, self._second.valid_until
        return first if first < second else second


class Runtimes(Protocol):
    """What a mode reads of the engine's live groups (sched.groups.GroupRuntimes)."""

    def all(self) -> list[GroupRuntime]: ...

    def get(self, group_id: int) -> GroupRuntime | None: ...


def path_of(runtimes: Runtimes, runtime: GroupRuntime) -> list[GroupRuntime]:
    """A runtime and its ancestors' (SPEC §14), root first."""
    path = [runtime]
    seen = {runtime.group_id}
    while (parent_id := path[-1].definition.parent_id) is not None and parent_id not in seen:
        parent = runtimes.get(parent_id)
        if parent is None:
            break
        seen.add(parent_id)
        path.append(parent)
    path.reverse()
    return path


def _path_limited(runtimes: Runtimes, group: GroupDef) -> bool:
    """Has the group, or any ancestor, a max_active_queries?"""
    if group.max_active_queries is not None:
        return True
    parent_id, seen = group.parent_id, {group.id}
    while parent_id is not None and parent_id not in seen:
        parent = runtimes.get(parent_id)
        if parent is None:
            return False
        if parent.definition.max_active_queries is not None:
            return True
        seen.add(parent_id)
        parent_id = parent.definition.parent_id
    return False


class AdmissionMode:
    """Local admission: the local gate is the limit, nothing more is held."""

    name = "local"
    fast = True  # the fast path may be tried before the gate
    fenced = False  # queries need not check valid_until
    after_slot_holds = False  # after_slot takes nothing: the query path need not call it
    queued: Callable[[], None] | None = None  # called when a query queues at the gate
    valid_until = math.inf

    def fresh(self) -> bool:
        """Whether ``prepare`` would return at once (the query path asks it first)."""
        return True

    def fence_for(self, group: GroupDef) -> Fenced:
        """The fence a query of ``group`` runs on (fleet modes)."""
        return self

    def prepare(self, group: GroupDef, left: float) -> None:
        """Before the gate: wait until what this instance holds is valid."""
        return None

    def after_slot(
        self,
        held: Holdings,
        runtime: GroupRuntime,
        *,
        deadline: float,
        queue_deadline: float,
        cancelled: Callable[[], bool],
        now: Callable[[], float],
    ) -> None:
        """With the local slot held: what the fleet needs too (lease mode: a lease)."""
        return None

    def give_back(self, held: Holdings) -> None:
        """What ``after_slot`` took, however the query ended."""
        return None

    def recheck(self, held: Holdings) -> None:
        """After a wait for the fence: raise if what the query took before it may
        have been reclaimed meanwhile."""
        return None

    def wake_lease_waiters(self) -> None:
        """A query was cancelled: wake a wait for the fleet, if any."""

    def counts(self) -> dict[str, int] | None:
        """Fleet-wide running (leases or quotas) by group key; None: no fleet."""
        return None

    def quotas(self) -> dict[str, int] | None:
        """This instance's usable quota by group key; None: not quota mode."""
        return None

    def stray_leases(self) -> list[str]:
        """For the reconcile loop: fleet rows of this instance that no live query
        holds, deleted; what it deleted."""
        return []


def fleet_group(group: GroupDef) -> FleetGroup:
    from resgroups.fleet.store import FleetGroup

    return FleetGroup(group.uid, group.name)


class _FleetMode(AdmissionMode):
    """What both fleet modes share: the instance fence and the catalog barrier."""

    fenced = True

    def __init__(
        self,
        coordinator: FleetCoordinator,
        holdings: Callable[[], Iterable[Holdings]],
        runtimes: Runtimes,
        catalog: Callable[[], tuple[str, int]],
    ) -> None:
        self.coordinator = coordinator
        self._holdings = holdings  # every open query's holdings (the engine's registry)
        self._runtimes = runtimes
        self._catalog = catalog  # (the log's identity, the version its runtimes apply)
        coordinator.admission = self.name
        coordinator.held_leases = self._held_leases
        coordinator.on_lost = self._lost
        coordinator.on_lapse = self._lapsed

    @property
    def valid_until(self) -> float:  # type: ignore[override]
        return self.coordinator.fence.valid_until

    def fresh(self) -> bool:
        """Nothing in the way of admitting (no other admission mode in the fleet);
        the query checks its own fence (``fence_for``) beside it."""
        return self.coordinator.conflict is None

    def fence_for(self, group: GroupDef) -> Fenced:
        """The heartbeat's fence: what every query of this instance runs on."""
        return self.coordinator.fence

    def prepare(self, group: GroupDef, left: float) -> None:
        """Wait until this instance's heartbeat is valid (a lapse: what it holds may
        have been reclaimed); CoordinationUnavailable at the end of ``left``, or at
        once while an older instance of the fleet admits in another mode."""
        if not self.coordinator.fence.wait_fresh(time.monotonic() + max(0.0, left)):
            raise CoordinationUnavailable(
                f"this instance's fleet heartbeat could not be renewed before the "
                f"timeout [group={group.name}]: fleet coordination unreachable?"
            )
        conflict = self.coordinator.conflict
        if conflict is not None:
            raise CoordinationUnavailable(
                f"this engine admits with fleet_admission={self.name!r}, but fleet instance "
                f"{conflict} admits otherwise and started first [group={group.name}]: one "
                "fleet must use one admission mode (stop the others, or use theirs)"
            )

    def wake_lease_waiters(self) -> None:
        self.coordinator.wake_waiters()

    def counts(self) -> dict[str, int] | None:
        return self.coordinator.counts

    def barrier(self, group: GroupDef) -> Barrier:
        """Who must have adopted before anyone admits on ``group``'s limit."""
        uid, version = self._catalog()
        return uid, group.limited_since, self.coordinator.expiry, version

    def stray_leases(self) -> list[str]:
        fleet = self.coordinator

        def live() -> set[str]:
            leases = {held.lease_id for held in self._holdings() if held.lease_id}
            return leases | fleet.releases.pending()  # given back, DELETE not sent yet

        return fleet.reconcile(live)

    # ---- fencing callbacks (the coordinator's maintenance thread) ----------------------

    def _held_leases(self) -> set[str]:
        return {h.lease_id for h in self._holdings() if h.leased and h.lease_id is not None}

    def _lost(self, lost: set[str]) -> None:
        """Leases a sweep reclaimed while this instance's heartbeat lapsed."""
        for held in self._holdings():
            if held.lease_id in lost:
                held.fail(
                    CoordinationUnavailable(
                        f"the fleet lease of query {held.query_id} [group={held.group}] was "
                        "reclaimed while this instance's heartbeat lapsed; the query cannot "
                        "go on without it"
                    )
                )

    def _lapsed(self) -> None:
        """The heartbeat lapsed past the fence, and a renewal is about to make the
        instance valid again: every query admitted before fails at its next
        checkpoint (and one inside native code at once, through on_cancel)."""
        error = CoordinationUnavailable(
            "this instance's fleet heartbeat lapsed past the fence (a paused or "
            "partitioned process?): what its queries held may have been given to others"
        )
        for held in self._holdings():
            if held.fenced:  # running on the fence (queued ones wait for the renewal)
                held.fail(error)


class LeaseAdmission(_FleetMode):
    """A lease row per query of a limited group, taken after the local slot."""

    name = "lease"
    fast = False  # the lease comes between the slot and the worker
    after_slot_holds = True  # a lease per query

    def __init__(
        self,
        coordinator: FleetCoordinator,
        holdings: Callable[[], Iterable[Holdings]],
        runtimes: Runtimes,
        catalog: Callable[[], tuple[str, int]],
    ) -> None:
        super().__init__(coordinator, holdings, runtimes, catalog)
        self._adopted = catalog()[1]  # at start nothing runs: nothing to adopt
        coordinator.synced = (catalog()[0], self._adopted)
        coordinator.on_tick = self._sync  # the maintenance thread's alone
        coordinator.start()

    def after_slot(
        self,
        held: Holdings,
        runtime: GroupRuntime,
        *,
        deadline: float,
        queue_deadline: float,
        cancelled: Callable[[], bool],
        now: Callable[[], float],
    ) -> None:
        """A fleet-wide lease for a group with a max_active_queries (the limit this
        engine's catalog holds); none, and no round trip, for a group without.
        Waiting for it counts as queued, within the queue and query timeouts."""
        coordinator = self.coordinator
        lease = held.lease_id = coordinator.new_lease_id()  # released at the end
        with runtime.gate.lock:  # against _sync's scan: decided and marked at once
            if not self._levels(runtime):
                held.unleased = True
                return
            runtime.fleet_waiting += 1
            held.seeking = True

        def now_held() -> list[tuple[FleetGroup, int, Barrier]]:  # re-read at each try
            return [
                (fleet_group(g), g.max_active_queries, self.barrier(g))
                for g in self._levels(runtime)
                if g.max_active_queries is not None
            ]

        def ready() -> bool:
            return all(self._adopted >= g.limited_since for g in self._levels(runtime))

        try:
            while not coordinator.acquire(
                lease,
                now_held,
                deadline=deadline,
                queue_deadline=queue_deadline,
                cancelled=cancelled,
                now=now,
                ready=ready,
            ):
                with runtime.gate.lock:  # the limits went while waiting: none needed
                    if not self._levels(runtime):
                        held.unleased = True
                        return
            held.leased = True
        except QueueTimeout:
            runtime.fleet_timed_out()
            raise
        finally:
            held.seeking = False
            runtime.fleet_wait(-1)

    def _levels(self, runtime: GroupRuntime) -> list[GroupDef]:
        """The limited levels of a query's path, root first (SPEC §14: a lease at
        each); a flat group: itself if limited."""
        group = runtime.definition
        if group.parent_id is None:
            return [group] if group.max_active_queries is not None else []
        return [
            r.definition
            for r in path_of(self._runtimes, runtime)
            if r.definition.max_active_queries is not None
        ]

    def recheck(self, held: Holdings) -> None:
        """A lease taken before a lapse may have been swept while the process was
        away, and the renewal that follows need not know it was taken: ask."""
        from resgroups.fleet.store import StoreUnavailable

        lease = held.lease_id
        if not held.leased or lease is None:
            return
        try:
            held_still = self.coordinator.store.holds(lease)
        except StoreUnavailable as exc:
            raise CoordinationUnavailable(
                f"cannot tell whether the fleet lease of query {held.query_id} survived this "
                f"instance's lapse [group={held.group}]: {exc}"
            ) from None
        if not held_still:
            raise CoordinationUnavailable(
                f"the fleet lease of query {held.query_id} [group={held.group}] was "
                "reclaimed while this instance's heartbeat lapsed; the query cannot go on "
                "without it"
            )

    def give_back(self, held: Holdings) -> None:
        """The lease goes to the batcher (a missing lease is a no-op there), and only
        then leaves the holdings: the reconcile loop always finds it in one."""
        lease = held.lease_id
        if lease is not None:
            self.coordinator.release(lease)
        held.lease_id = None
        held.leased = held.unleased = False

    def _sync(self) -> None:
        """The maintenance thread, at each turn: when the catalog moved, adopt the
        queries admitted without a lease in groups whose limit appeared since, then
        say so (the barrier the other instances wait on)."""
        uid, version = self._catalog()
        if version <= self._adopted:
            return
        for runtime in self._runtimes.all():
            group = runtime.definition
            if group.max_active_queries is None or group.limited_since <= self._adopted:
                continue
            with runtime.gate.lock:  # its subtree's queries: a row at this level each
                orphans = [
                    (h, h.lease_id)
                    for h in self._holdings()
                    if h.lease_id is not None
                    and (h.unleased or h.leased)
                    and h.runtime is not None
                    and runtime in path_of(self._runtimes, h.runtime)
                ]
            if not orphans:
                continue
            self.coordinator.store.adopt(fleet_group(group), [i for _, i in orphans])
            for held, lease in orphans:
                with runtime.gate.lock:
                    adopted = held.lease_id == lease and (held.unleased or held.leased)
                    if adopted:
                        held.unleased, held.leased = False, True
                if not adopted:  # it ended meanwhile: its new row goes again
                    self.coordinator.release(lease)
        self.coordinator.store.synced(uid, version)
        self._adopted = version
        self.coordinator.synced = (uid, version)
        self.coordinator.wake_waiters()


class QuotaAdmission(_FleetMode):
    """This instance's share of each limit (fleet/quotas.py), as the gate's limit."""

    name = "quota"

    def __init__(
        self,
        coordinator: FleetCoordinator,
        holdings: Callable[[], Iterable[Holdings]],
        runtimes: Runtimes,
        catalog: Callable[[], tuple[str, int]],
        *,
        hold: float,
    ) -> None:
        super().__init__(coordinator, holdings, runtimes, catalog)
        coordinator.synced = catalog()
        self.keeper: QuotaKeeper = coordinator.start_quotas(
            hold=hold,
            demand=self._demand,
            limit_to=self._limit_to,
            running=self._running,
            lost=self._quota_lost,
            catalog=catalog,
        )
        self.queued = self.keeper.look_now  # queued here: the keeper asks for more at once
        self._both = _Earliest(coordinator.fence, self.keeper.fence)
        coordinator.start()

    @property
    def valid_until(self) -> float:  # type: ignore[override]
        return self._both.valid_until

    def fence_for(self, group: GroupDef) -> Fenced:
        """A limited group's queries (or a limited parent's, SPEC §14) run on
        their quota too: the earlier fence."""
        limited = _path_limited(self._runtimes, group)
        return self._both if limited else self.coordinator.fence

    def prepare(self, group: GroupDef, left: float) -> None:
        super().prepare(group, left)
        if _path_limited(self._runtimes, group) and not self.keeper.wait_fresh(
            time.monotonic() + max(0.0, left)
        ):
            raise CoordinationUnavailable(
                f"the fleet quota of group {group.name} could not be renewed before the "
                "timeout (fleet coordination unreachable?)"
            )

    def quotas(self) -> dict[str, int] | None:
        return self.keeper.usable

    def _runtime(self, key: str) -> GroupRuntime | None:
        return next((r for r in self._runtimes.all() if r.definition.uid == key), None)

    def _demand(self) -> dict[str, GroupDemand]:
        from resgroups.fleet.quotas import GroupDemand

        out: dict[str, GroupDemand] = {}
        for runtime in self._runtimes.all():
            group = runtime.definition
            limit = group.max_active_queries
            if limit is None:  # a dropped group's queries still finish under its limit
                continue
            gate = runtime.gate.gate  # an inner group's demand is its subtree's
            queued = gate.queued + gate.waiting_below
            now = gate.load + queued
            peak, gate.demand_peak = max(gate.demand_peak, now), now
            out[group.uid] = GroupDemand(
                fleet_group(group), limit, gate.load, queued, peak, runtime.quota,
                self.barrier(group),
            )  # fmt: skip
        return out

    def _limit_to(self, key: str, quota: int) -> None:
        """This instance admits at most ``quota`` queries of the group at once from
        now on."""
        runtime = self._runtime(key)
        if runtime is not None:
            runtime.set_quota(quota)

    def _running(self, key: str) -> int:
        """The queries of the group holding a slot here now."""
        runtime = self._runtime(key)
        return 0 if runtime is None else runtime.gate.gate.load

    def _quota_lost(self, keys: set[str]) -> None:
        """This instance's quota in these groups was reclaimed while its heartbeat
        lapsed: the queries running on it fail at their next checkpoint."""
        for held in self._holdings():
            runtime = held.runtime
            if (
                held.admitted
                and runtime is not None
                and any(r.definition.uid in keys for r in path_of(self._runtimes, runtime))
            ):
                held.fail(
                    CoordinationUnavailable(
                        f"the fleet quota of group {held.group} on this instance was "
                        "reclaimed while its heartbeat lapsed; the query cannot go on on it"
                    )
                )


def open_fleet(
    config: EngineConfig,
    instance_id: str,
    *,
    holdings: Callable[[], Iterable[Holdings]],
    runtimes: Runtimes,
    catalog: Callable[[], tuple[str, int]],
) -> tuple[FleetCoordinator, _FleetMode]:
    """The coordinator for ``config.coordination`` and the admission mode
    ``config.fleet_admission`` names, over the engine's registry of open queries
    (``holdings``), its live groups and the catalog it follows."""
    from resgroups.fleet.coordinator import FleetCoordinator

    assert config.coordination is not None
    fleet = FleetCoordinator(
        config.coordination,
        instance_id,
        heartbeat=config.lease_heartbeat,
        expiry=config.lease_expiry,
        sweep_interval=config.sweep_interval,
        pool_size=int(config.coordination_pool),
    )
    if config.fleet_admission == "quota":
        return fleet, QuotaAdmission(fleet, holdings, runtimes, catalog, hold=config.quota_hold)
    return fleet, LeaseAdmission(fleet, holdings, runtimes, catalog)
