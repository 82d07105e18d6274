"""The fleet coordinator: what a managed query of a limited group calls after
its local slot (SPEC §11).

- :meth:`FleetCoordinator.acquire` takes a lease (one round trip), or waits:
  a release anywhere in the fleet (a NOTIFY per release batch, heard on a
  dedicated LISTEN connection) wakes every local waiter at once, and a poll
  every quarter second is the fallback. The wait ends at the caller's
  deadline (its queue or query timeout) or its cancellation. Fail closed:
  while the database is unreachable the wait goes on, retrying; at the
  deadline the query fails with CoordinationUnavailable, never runs.
- :meth:`release` queues the lease id for the batcher.
- A maintenance thread renews this instance's row and leases every
  ``heartbeat`` seconds (the fence: a renewal started at ``t`` makes what the
  instance holds valid until ``t + 0.9 expiry``, ``valid_until``; past it the
  queries fail at their next checkpoint, fleet/modes.py), sweeps every
  ``sweep_interval`` (one owner fleet-wide at a time: leases not renewed for
  ``expiry`` are reclaimed, drifted counters recounted), runs the admission
  mode's turn (``on_tick``: adopting queries when a limit appears), and reads
  the fleet-wide counts that ``resource_groups()`` shows as
  ``fleet_active_queries``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from resgroups.errors import (
    CoordinationUnavailable,
    QueryCancelled,
    QueryTimeout,
    QueueTimeout,
)
from resgroups.fleet.fence import Fence
from resgroups.fleet.quotas import QuotaKeeper, ReadDemand
from resgroups.fleet.releases import BatchedReleases
from resgroups.fleet.store import Barrier, FleetGroup, LeaseStore, StoreUnavailable

log = logging.getLogger("resgroups.fleet")

_POLL_S = 0.25
_RETRY_S = 0.5  # a failed renewal is tried again this soon


class FleetCoordinator:
    def __init__(
        self,
        dsn: str,
        instance_id: str,
        *,
        heartbeat: float = 60.0,
        expiry: float = 300.0,
        sweep_interval: float = 120.0,
        pool_size: int = 8,
    ) -> None:
        self.instance_id = instance_id
        self.heartbeat, self.expiry, self.sweep_interval = heartbeat, expiry, sweep_interval
        try:
            self.store = LeaseStore(dsn, instance_id, pool_size=pool_size)
        except StoreUnavailable as exc:
            raise CoordinationUnavailable(f"fleet coordination: {exc}") from None
        self.name = self.store.name
        self.releases = BatchedReleases(self.store)
        self.errors = 0  # coordination errors (resgroups_resource_groups_coordination_errors_total)
        self.host, self.pid = socket.gethostname(), os.getpid()
        # set by the admission mode (fleet/modes.py): the leases its queries hold
        # (checked at each heartbeat), what to fail when a sweep reclaimed some or
        # the heartbeat lapsed past the fence, and its turn on the maintenance thread
        self.held_leases: Callable[[], set[str]] = set
        self.on_lost: Callable[[set[str]], None] = lambda lost: None
        self.on_lapse: Callable[[], None] = lambda: None
        self.on_tick: Callable[[], None] = lambda: None
        # (the log followed, the version through which this instance has adopted its
        # queries): sent with each heartbeat (resgroups_fleet_behind)
        self.synced: tuple[str, int] = ("", 0)
        self.counts: dict[str, int] = {}  # fleet-wide leases (or quotas) per group key
        self.quotas: QuotaKeeper | None = None  # quota mode (start_quotas); None: leases
        # nothing is valid before the first heartbeat (until this instance's row says
        # which log it follows, the others' barriers cannot count it)
        self.fence = Fence(expiry)
        self.lapses = 0  # renewals that came after the fence had passed
        self.admission = ""  # the admission mode's name (set by it), sent with the heartbeat
        self.conflict: str | None = None  # an older live instance admitting in another mode
        self._changed = threading.Condition()
        self._generation = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._listen, name="resgroups-fleet-listen", daemon=True),
            threading.Thread(target=self._maintain, name="resgroups-fleet-maintain", daemon=True),
        ]

    def start(self) -> None:
        """Start listening and the heartbeat, once the admission mode has set its
        callbacks and what the first heartbeat reports (``synced``)."""
        for thread in self._threads:
            thread.start()

    def start_quotas(
        self,
        *,
        hold: float,
        demand: ReadDemand,
        limit_to: Callable[[str, int], None],
        running: Callable[[str], int],
        lost: Callable[[set[str]], None],
        catalog: Callable[[], tuple[str, int]],
    ) -> QuotaKeeper:
        """Quota mode (fleet/quotas.py): each limited group's slots are shared out
        as quotas, and the local gates admit within them."""
        self.quotas = QuotaKeeper(
            self.store,
            heartbeat=self.heartbeat,
            expiry=self.expiry,
            hold=hold,
            demand=demand,
            limit_to=limit_to,
            running=running,
            lost=lost,
            catalog=catalog,
            synced=self._synced,
        )
        self.quotas.start()
        return self.quotas

    @staticmethod
    def new_lease_id() -> str:
        return uuid.uuid4().hex

    def _synced(self, catalog: tuple[str, int]) -> None:
        self.synced = catalog
        self.wake_waiters()

    @property
    def valid_until(self) -> float:
        return self.fence.valid_until

    @property
    def total_lapses(self) -> int:
        """Renewals that came after their fence: the heartbeat's and the quotas'."""
        return self.lapses + (self.quotas.lapses if self.quotas is not None else 0)

    # ---- admission ------------------------------------------------------------------

    def acquire(
        self,
        lease_id: str,
        levels: Callable[[], list[tuple[FleetGroup, int, Barrier]]],
        *,
        deadline: float,
        queue_deadline: float,
        cancelled: Callable[[], bool],
        now: Callable[[], float] = time.monotonic,
        ready: Callable[[], bool] = lambda: True,
    ) -> bool:
        """Hold a fleet lease for ``lease_id`` before returning True. ``levels()``
        says, at each try, the limited levels of the query's path (root first; a
        flat group: itself), each with its limit as this engine's catalog holds it
        now and its barrier: a limit raised while waiting counts at once, and no
        limit left (RESET) ends the wait with False, no lease needed. While
        ``ready()`` is false (this instance has not adopted its queries since a
        limit appeared) it waits without asking."""
        unavailable: str | None = None
        while True:
            with self._changed:
                seen = self._generation
            path = levels()
            if not path:
                return False
            key, limit, since = path[-1]
            name = key.name
            try:
                if ready() and (
                    self.store.try_acquire(key, lease_id, limit, since)
                    if len(path) == 1
                    else self.store.try_acquire_path(path, lease_id)
                ):
                    return True
                unavailable = None
            except StoreUnavailable as exc:
                self.errors += 1
                unavailable = str(exc)
            if cancelled():
                raise QueryCancelled(
                    f"query cancelled while waiting for a fleet lease [group={name}]"
                )
            t = now()
            if t >= min(deadline, queue_deadline):
                if unavailable is not None:
                    raise CoordinationUnavailable(
                        f"fleet coordination unreachable until the timeout [group={name}]: "
                        f"{unavailable}"
                    )
                if t >= deadline:
                    raise QueryTimeout(
                        f"query timeout while waiting for a fleet-wide slot [group={name}]"
                    )
                raise QueueTimeout(
                    f"timed out waiting for a fleet-wide slot [group={name}, "
                    f"max_active_queries={limit} across the fleet]"
                )
            with self._changed:
                if self._generation == seen:
                    self._changed.wait(min(_POLL_S, max(0.0, min(deadline, queue_deadline) - t)))

    def release(self, lease_id: str) -> None:
        self.releases.release(lease_id)

    def wake_waiters(self) -> None:
        """Wake every local waiter (a cancel, a notification)."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    # ---- background -------------------------------------------------------------------

    def _listen(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        backoff = 0.1
        while not self._stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = self.store.listen_connection()
                    self.wake_waiters()  # missed notifications while away: everyone re-checks
                for notify in conn.notifies(timeout=0.5, stop_after=1):
                    self.wake_waiters()
                    if self.quotas is not None:
                        self.quotas.heard(notify.payload)
                backoff = 0.1
            except (psycopg.Error, StoreUnavailable) as exc:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                log.debug("fleet: listen connection lost: %s", exc)
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
        if conn is not None:
            conn.close()

    def _maintain(self) -> None:
        next_renew = next_sweep = next_count = time.monotonic()
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                if t >= next_renew:
                    next_renew = t + min(self.heartbeat, _RETRY_S)  # a failed one: soon
                    self._renew()
                    next_renew = t + self.heartbeat
                self.on_tick()
                if t >= next_count:  # fleet_active_queries, every second
                    quotas = self.quotas is not None
                    self.counts = self.store.quota_totals() if quotas else self.store.counts()
                    next_count = t + 1.0
                if t >= next_sweep:
                    swept = self.store.sweep(self.expiry)
                    next_sweep = t + self.sweep_interval
                    if swept and (swept[0] or swept[1]):
                        log.info(
                            "fleet sweep: %d expired lease(s) reclaimed, counters recounted: %s",
                            swept[0],
                            ", ".join(swept[1]) or "none",
                        )
                        self.wake_waiters()
            except StoreUnavailable as exc:
                self.errors += 1
                log.debug("fleet maintenance: %s", exc)
            except Exception:  # a bug must not stop the heartbeat: log it, go on
                self.errors += 1
                log.exception("fleet maintenance failed; it goes on")
            self._stop.wait(0.2)

    def _renew(self) -> None:
        """One heartbeat. What a lapse cost is failed before the instance is valid
        again: the leases found reclaimed, and (after a lapse past the fence)
        every query admitted before it (fleet/modes.py)."""
        started = time.monotonic()
        expected = self.held_leases()  # before the renew: leases taken during it are fresh
        renewed, other = self.store.renew(
            self.host,
            self.pid,
            self.synced,
            self.expiry,
            self.admission,
            admitting=self.conflict is None,
        )
        lapsed = self.fence.lapsed()
        if other is not None and other != self.conflict:
            log.error(
                "fleet: instance %s admits with fleet_admission=%r, while %s, which started "
                "earlier, admits otherwise (leases and quotas do not see each other): %s "
                "admits nothing until it is gone",
                self.instance_id,
                self.admission,
                other,
                self.instance_id,
            )
        conflicted = other is not None and other != self.conflict
        self.conflict = other
        lost = expected - renewed
        if lost:
            log.error(
                "fleet: %d lease(s) of %s were reclaimed while its heartbeat lapsed; "
                "their queries fail at their next checkpoint",
                len(lost),
                self.instance_id,
            )
            self.on_lost(lost)
        if lapsed:
            self.lapses += 1
            log.error(
                "fleet: the heartbeat of %s came %.1f s after its fence; the queries "
                "admitted before fail at their next checkpoint",
                self.instance_id,
                time.monotonic() - self.valid_until,
            )
        if lapsed or conflicted:  # what was admitted meanwhile may not count anywhere
            self.on_lapse()
        self.fence.renewed(started)

    def instances(self) -> list[tuple[Any, ...]]:
        """The fleet's instances and their health (resource_group_instances())."""
        try:
            return self.store.instances(self.expiry)
        except StoreUnavailable as exc:
            self.errors += 1
            raise CoordinationUnavailable(f"fleet coordination: {exc}") from None

    def reconcile(self, live: Callable[[], set[str]]) -> list[str]:
        """Delete this instance's lease rows that no live query holds. ``live()``
        gives the lease ids of every open query (acquiring ones included) and is
        read after the database's clock: only rows acquired before that instant
        are candidates, so a lease taken meanwhile is never one (its query named
        its lease id before asking for it)."""
        try:
            before = self.store.server_now()
            gone = self.store.orphans(before, sorted(live()))
        except StoreUnavailable as exc:
            self.errors += 1
            log.debug("fleet reconcile: %s", exc)
            return []
        if gone:
            self.wake_waiters()
        return gone

    def close(self, *, release: bool = True) -> None:
        """Flush the queued releases, release every lease and quota of this
        instance (``release``; False: a query still runs on them, so they are
        left to expire), stop."""
        if self.quotas is not None:
            self.quotas.close()
        self.releases.close()
        # the heartbeat stops first: a renewal in flight would stamp the row again
        # after the statement below deleted it
        self._stop.set()
        self.wake_waiters()
        for thread in self._threads:
            thread.join(5)
        if not release:
            log.warning(
                "fleet: a query of %s still holds a slot at close: its leases and quotas are "
                "left to expire (lease_expiry=%ss)",
                self.instance_id,
                self.expiry,
            )
            try:  # the row goes: a closed instance holds back no barrier
                self.store.forget_instance()
            except StoreUnavailable as exc:
                log.warning("fleet: the row of %s left to lapse: %s", self.instance_id, exc)
        else:
            try:
                self.store.release_instance()
            except StoreUnavailable as exc:
                log.warning("fleet: leases of %s left to expire: %s", self.instance_id, exc)
        self.store.close()
