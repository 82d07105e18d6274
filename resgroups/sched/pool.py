"""Worker pools: a fixed number of workers shared by every group (SPEC §2, §3).

A pool of size N has N worker slots and N threads. A managed query holds one
slot from entry to exit while its body runs on the caller's own thread; the
pool's threads run the parallel tasks of ``Query.map``, each holding a slot
while it runs, so at most N threads of a pool run query work at once.

Waiting queries take free slots before queued tasks (a task's own query is
already running and its caller runs its pending tasks itself, so tasks never
starve a query into deadlock). Waiting queries are served in arrival order;
the CPU scheduler replaces this order by weights and limits.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

from resgroups.errors import EngineClosed, Error, InternalError


class Work(Protocol):
    def run_one(self) -> bool:
        """Run one pending task; False when none was left."""
        ...


class WorkerPool:
    """N worker slots, and N threads running queued tasks."""

    def __init__(self, name: str, size: int, now: Callable[[], float]) -> None:
        self.name = name
        self.size = size
        self._now = now
        self._lock = threading.Lock()  # the fast paths take it without the Condition
        self._cond = threading.Condition(self._lock)
        self._free = size
        self._waiting: deque[object] = deque()
        self._tasks: deque[Work] = deque()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"resgroups-{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    # ---- slots for queries ------------------------------------------------------

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def acquire(self, deadline: float, check: Callable[[], Error | None]) -> None:
        """Take a worker slot, waiting in arrival order.

        ``check`` is asked on every wake-up and may return an error that ends
        the wait (cancellation); passing ``deadline`` ends it too, with the
        error ``check`` gives then (it is told by the caller's deadline).
        """
        with self._lock:
            if self._free > 0 and not self._waiting:  # the uncontended path
                self._free -= 1
                return
        with self._cond:
            me = object()
            self._waiting.append(me)
            try:
                while not (self._waiting[0] is me and self._free > 0):
                    if self._closed:
                        raise EngineClosed(f"worker pool {self.name} is closed")
                    error = check()
                    if error is not None:
                        raise error
                    remaining = deadline - self._now()
                    self._cond.wait(
                        min(max(remaining, 0.001), 0.25) if remaining < math.inf else 0.25
                    )
                self._free -= 1
            finally:
                self._waiting.remove(me)
                self._cond.notify_all()

    def release(self) -> None:
        with self._lock:
            if self._free >= self.size:
                raise InternalError(f"worker pool {self.name}: more slots released than taken")
            self._free += 1
            if self._waiting or self._tasks:
                self._cond.notify_all()

    def poke(self) -> None:
        """Wake every waiter so it re-checks (a query was cancelled)."""
        with self._cond:
            self._cond.notify_all()

    # ---- tasks ----------------------------------------------------------------------

    def submit(self, work: Work, count: int) -> None:
        """Offer ``count`` tasks of ``work`` to the pool's threads."""
        with self._cond:
            self._tasks.extend([work] * count)
            self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (
                    self._tasks and self._free > 0 and not self._waiting
                ):
                    self._cond.wait()
                if self._closed:
                    return
                work = self._tasks.popleft()
                self._free -= 1
            try:
                work.run_one()
            finally:
                with self._cond:
                    self._free += 1
                    self._cond.notify_all()

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._tasks.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)
