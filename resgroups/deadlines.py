"""One thread that fires callbacks when their deadline passes, or at once when asked.

``q.on_cancel(callback)`` (SPEC §2) must reach a query that sits inside one
native call (a DuckDB aggregation) when it is cancelled or its query timeout
passes. A thread per query would cost a thread per query; instead every
watched target sits in one heap ordered by when it is due, and one daemon
thread (started on first use) sleeps until the earliest, re-checks it (a
resumed cursor's timeout moved, a cancel made it due now), and fires it off
its own thread. A target that ``unwatch`` removed never fires afterwards,
and ``unwatch`` waits for a firing already under way to finish, so after a
query's ``__exit__`` nothing of it runs.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

log = logging.getLogger("resgroups.deadlines")

POLL_S: Final = 0.05  # the longest sleep: a hand-driven clock is re-read this often


class Target(Protocol):
    def due_at(self) -> float:
        """When it fires, on the watcher's clock: ``-inf`` now, ``inf`` never."""

    def fire(self) -> None:
        """Run on the watcher's thread once due; what it raises is logged."""


class DeadlineWatcher:
    """Fires each watched :class:`Target` once it is due, on one daemon thread."""

    def __init__(self, now: Callable[[], float], *, name: str = "resgroups-deadlines") -> None:
        self._now = now
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Target]] = []
        self._seq = itertools.count()
        self._watched: set[int] = set()  # id() of the targets that may fire
        self._firing: Target | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, target: Target) -> None:
        """Fire ``target`` when its ``due_at()`` passes (re-read when it comes up)."""
        with self._cond:
            if self._closed:
                return
            self._watched.add(id(target))
            self._push_locked(target)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def wake(self, target: Target) -> None:
        """Its ``due_at()`` changed (a cancel): look at it again now."""
        with self._cond:
            if id(target) in self._watched:
                heapq.heappush(self._heap, (-math.inf, next(self._seq), target))
                self._cond.notify()

    def unwatch(self, target: Target) -> None:
        """Never fire ``target`` from now on; wait for a firing under way to end
        (unless called from that firing itself)."""
        with self._cond:
            self._watched.discard(id(target))
            while self._firing is target and threading.current_thread() is not self._thread:
                self._cond.wait()

    def close(self, drain_s: float = 1.0) -> None:
        """Stop, after firing (for up to ``drain_s``) what is due now: the
        callbacks of the queries an engine cancels as it closes."""
        give_up = time.monotonic() + drain_s
        with self._cond:
            while self._thread is not None and (self._firing is not None or self._due_now_locked()):
                left = give_up - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, POLL_S))
            self._closed = True
            self._watched.clear()
            self._heap.clear()
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _due_now_locked(self) -> bool:
        now = self._now()
        return any(due <= now and id(t) in self._watched for due, _, t in self._heap)

    def _push_locked(self, target: Target) -> None:
        due = target.due_at()
        if due != math.inf:
            heapq.heappush(self._heap, (due, next(self._seq), target))

    def _next_locked(self) -> Target | None:
        """The next target due now (removed from the watched), or None after a wait."""
        heap = self._heap
        while heap and id(heap[0][2]) not in self._watched:
            heapq.heappop(heap)  # unwatched since: dropped lazily
        if not heap:
            self._cond.wait()
            return None
        due, _, target = heap[0]
        now = self._now()
        if due > now:
            self._cond.wait(min(due - now, POLL_S))
            return None
        heapq.heappop(heap)
        if target.due_at() > now:  # it moved (a resumed cursor): wait for it again
            self._push_locked(target)
            return None
        self._watched.discard(id(target))
        return target

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                target = self._next_locked()
                if target is None:
                    continue
                self._firing = target
            try:
                target.fire()
            except Exception:
                log.exception("a deadline callback failed (the query goes on to end as usual)")
            finally:
                with self._cond:
                    self._firing = None
                    self._cond.notify_all()
