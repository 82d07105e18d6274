"""A daemon thread that loops until stopped: what the catalog follower and the
reconcile loop share."""

from __future__ import annotations

import threading


class Background:
    """Subclasses implement :meth:`_run`, looping until ``self._stop`` is set."""

    thread_name = "resgroups-background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError
