"""The reconcile loop: every ``interval`` seconds, check the counters against the
ground truth and repair what drifted (``Engine.reconcile``).

A thread of its own, like the catalog follower; a failure is logged and the
loop goes on at its next turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from resgroups.background import Background

log = logging.getLogger("resgroups.reconcile")


class Reconciler(Background):
    thread_name = "resgroups-reconcile"

    def __init__(self, check: Callable[[], int], *, interval: float) -> None:
        super().__init__()
        self._check = check
        self._interval = interval

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._check()
            except Exception:  # the next turn tries again
                log.exception("reconcile failed; retrying in %ss", self._interval)
