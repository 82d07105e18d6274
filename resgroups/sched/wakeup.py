"""Waking one waiting thread: a queued query, or one parked for a worker."""

from __future__ import annotations

from _thread import allocate_lock


class Wakeup:
    """The wake-up of one waiting thread: any thread may ``set`` it, its one owner
    ``wait``s on it. A raw lock held while unset: ``set`` is one C call and
    ``wait`` one blocking acquire, where a ``threading.Event`` runs a Python
    condition variable, Python code on every hand-off under contention."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        try:  # noqa: SIM105 (contextlib.suppress is a Python context manager: slower)
            self._lock.release()
        except RuntimeError:  # set already, and not yet consumed: one wake-up is enough
            pass

    def wait(self, timeout: float) -> bool:
        """Until set, or ``timeout`` seconds; consumes the wake-up (True: it came)."""
        return self._lock.acquire(True, timeout)
