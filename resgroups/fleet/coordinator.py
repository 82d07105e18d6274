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
- A maintenance thread renews this instance's leases every ``heartbeat``
  seconds, sweeps every ``sweep_interval`` (one owner fleet-wide at a time:
  leases not renewed for ``expiry`` are reclaimed, drifted counters
  recounted), and reads the fleet-wide counts that ``resource_groups()``
  shows as ``fleet_active_queries``.
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
from resgroups.fleet.quotas import Demand, QuotaKeeper
from resgroups.fleet.releases import BatchedReleases
from resgroups.fleet.store import LeaseStore, StoreUnavailable

log = logging.getLogger("resgroups.fleet")

_POLL_S = 0.25


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
        # the engine's view of its leases: those acquired (checked at each heartbeat),
        # and a callback for those a sweep reclaimed while this instance was away
        self.held_leases: Callable[[], set[str]] = set
        self.on_lost: Callable[[set[str]], None] = lambda lost: None
        self.counts: dict[str, int] = {}  # fleet-wide leases (or quotas) per group, as last read
        self.quotas: QuotaKeeper | None = None  # quota mode (start_quotas); None: leases
        self._changed = threading.Condition()
        self._generation = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._listen, name="resgroups-fleet-listen", daemon=True),
            threading.Thread(target=self._maintain, name="resgroups-fleet-maintain", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def start_quotas(
        self,
        *,
        hold: float,
        demand: Demand,
        limit_to: Callable[[str, int], int],
        lost: Callable[[set[str]], None],
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
            lost=lost,
        )
        self.quotas.start()
        return self.quotas

    @staticmethod
    def new_lease_id() -> str:
        return uuid.uuid4().hex

    # ---- admission ------------------------------------------------------------------

    def acquire(
        self,
        group: str,
        lease_id: str,
        limit: int,
        *,
        deadline: float,
        queue_deadline: float,
        cancelled: Callable[[], bool],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        """Hold a fleet lease for ``lease_id`` in ``group`` before returning."""
        unavailable: str | None = None
        while True:
            with self._changed:
                seen = self._generation
            try:
                if self.store.try_acquire(group, lease_id, limit):
                    return
                unavailable = None
            except StoreUnavailable as exc:
                self.errors += 1
                unavailable = str(exc)
            if cancelled():
                raise QueryCancelled(
                    f"query cancelled while waiting for a fleet lease [group={group}]"
                )
            t = now()
            if t >= min(deadline, queue_deadline):
                if unavailable is not None:
                    raise CoordinationUnavailable(
                        f"fleet coordination unreachable until the timeout [group={group}]: "
                        f"{unavailable}"
                    )
                if t >= deadline:
                    raise QueryTimeout(
                        f"query timeout while waiting for a fleet-wide slot [group={group}]"
                    )
                raise QueueTimeout(
                    f"timed out waiting for a fleet-wide slot [group={group}, "
                    f"max_active_queries={limit} across the fleet]"
                )
            with self._changed:
                if self._generation == seen:
                    self._changed.wait(min(_POLL_S, max(0.0, min(deadline, queue_deadline) - t)))

    def release(self, lease_id: str) -> None:
        self.releases.release(lease_id)

    def poke(self) -> None:
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
                    self.poke()  # missed notifications while away: everyone re-checks
                for notify in conn.notifies(timeout=0.5, stop_after=1):
                    self.poke()
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
                    expected = self.held_leases()  # before the renew: see lost_leases
                    renewed = self.store.renew(self.host, self.pid)
                    next_renew = t + self.heartbeat
                    lost = expected - renewed
                    if lost:
                        log.error(
                            "fleet: %d lease(s) of %s were reclaimed while its heartbeat "
                            "lapsed; their queries fail at their next checkpoint",
                            len(lost),
                            self.instance_id,
                        )
                        self.on_lost(lost)
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
                        self.poke()
            except StoreUnavailable as exc:
                self.errors += 1
                log.debug("fleet maintenance: %s", exc)
            self._stop.wait(0.2)

    def instances(self) -> list[tuple[Any, ...]]:
        """The fleet's instances and their health (resource_group_instances())."""
        try:
            return self.store.instances(self.expiry)
        except StoreUnavailable as exc:
            self.errors += 1
            raise CoordinationUnavailable(f"fleet coordination: {exc}") from None

    def reconcile(self, live: set[str]) -> list[str]:
        """Delete this instance's lease rows that no live query holds (``live``:
        the lease ids of every open query, acquiring ones included)."""
        try:
            gone = self.store.orphans(sorted(live))
        except StoreUnavailable as exc:
            self.errors += 1
            log.debug("fleet reconcile: %s", exc)
            return []
        if gone:
            self.poke()
        return gone

    def close(self) -> None:
        """Flush the queued releases, release every lease and quota of this
        instance, stop."""
        if self.quotas is not None:
            self.quotas.close()
        self.releases.close()
        try:
            self.store.release_instance()
        except StoreUnavailable as exc:
            log.warning("fleet: leases of %s left to expire: %s", self.instance_id, exc)
        self._stop.set()
        self.poke()
        for thread in self._threads:
            thread.join(5)
        self.store.close()
