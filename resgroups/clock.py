"""Clocks. Engine code never calls ``time.monotonic()`` directly: it asks its clock,
so tests can drive time by hand (:class:`ManualClock`)."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a monotonic scale."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic``."""

    monotonic = staticmethod(time.monotonic)


class ManualClock:
    """A clock that moves only when told to (for deterministic tests).

    Threads waiting on real condition variables still wait in real time; use
    it with the pure state machines (the admission gate) or with short real
    waits around :meth:`advance`.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        with self._lock:
            self._now += seconds
