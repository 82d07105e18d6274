"""Releases off the query path: a finishing query queues its lease id and
returns; a background thread sends what has gathered as one DELETE (and one
NOTIFY). A failed batch goes back to the front of the queue and is retried
with a backoff until it goes through, so a release lost to an outage never
leaks its slot. Past ``inline_after`` queued ids (a long outage) a release
is tried inline first. ``close()`` flushes what it can."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Final

from resgroups.fleet.store import LeaseStore, StoreUnavailable

log = logging.getLogger("resgroups.fleet")

INLINE_AFTER: Final = 100_000
MAX_BATCH: Final = 10_000
MAX_BACKOFF: Final = 5.0


class BatchedReleases:
    def __init__(self, store: LeaseStore, *, inline_after: int = INLINE_AFTER) -> None:
        self._store = store
        self._inline_after = inline_after
        self._queue: deque[str] = deque()
        self._sending: list[str] = []  # the batch being deleted now
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0  # DELETE statements sent
        self.released = 0  # ids sent in them
        self.failures = 0  # batches that failed (and were retried)
        self._thread = threading.Thread(
            target=self._run, name="resgroups-fleet-releases", daemon=True
        )
        self._thread.start()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def pending(self) -> set[str]:
        """Leases given back but not deleted yet: queued, or in the batch being sent
        (the reconcile loop must not take them for zombies)."""
        with self._cond:
            return {*self._queue, *self._sending}

    def release(self, query_id: str) -> None:
        if len(self._queue) >= self._inline_after:
            try:
                self._store.release_many([query_id])
                return
            except StoreUnavailable:
                pass  # queued with the rest, retried with them
        with self._cond:
            self._queue.append(query_id)
            self._cond.notify()

    def _take(self) -> list[str] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            self._sending = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
            return self._sending

    def _run(self) -> None:
        backoff = 0.05
        while (batch := self._take()) is not None:
            try:
                self._store.release_many(batch)
            except StoreUnavailable as exc:
                self.failures += 1
                with self._cond:
                    self._queue.extendleft(reversed(batch))  # first in line again
                    self._sending = []
                    if self.failures == 1 or self.failures % 50 == 0:
                        log.warning("fleet: release batch failed, retrying: %s", exc)
                    if self._closed:
                        return
                    self._cond.wait(backoff)
                backoff = min(MAX_BACKOFF, backoff * 2)
            else:
                with self._cond:
                    self._sending = []
                self.batches += 1
                self.released += len(batch)
                backoff = 0.05

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (one more try if the store is down), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
