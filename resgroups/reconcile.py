"""The reconcile loop: every ``interval`` seconds, check the counters against the
ground truth and repair what drifted (``Engine.reconcile``).

A thread of its own, like the catalog follower; a failure is logged and the
loop goes on at its next turn.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("resgroups.reconcile")


class Reconciler:
    def __init__(self, check: Callable[[], int], *, interval: float) -> None:
        self._check = check
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="resgroups-reconcile", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except Exception:  # the next turn tries again
                log.exception("reconcile failed; retrying in %ss", self._interval)
