"""Holding off interrupts while a query takes or gives back what it holds.

Python runs signal handlers on the main thread between two bytecodes, so a
``KeyboardInterrupt`` (or any exception a handler raises: ``SystemExit``
from a SIGTERM handler, a test timeout on SIGALRM) can land anywhere: half
way through handing a worker back under the dispatcher's lock, between
taking a slot and recording it, while ``__exit__`` waits for a lock. Landing
there, it would leave a slot, a worker or bytes held for good.

:class:`Hold` is the one mechanism against that. While any hold is in force
on the main thread, the Python handlers of the signals below are deferred: a
signal that arrives is recorded (and the hold's ``on_signal`` callback runs,
which may only set flags, never take a lock: the main thread may hold it),
and the handler runs when the outermost hold ends, at a point where
everything is consistent. Handlers are wrapped for the duration of the hold
only: the outermost hold on the main thread puts a :class:`_Deferring`
wrapper around each callable handler it finds (the default SIGINT handler
included) and puts the originals back as it ends, so outside holds
``signal.getsignal`` answers what the program installed (asyncio, for one,
looks for the default SIGINT handler there).

A wait inside a hold (a query queued for a slot or a worker) stays
responsive: the query's ``on_signal`` cancels it by flag, its wait notices
within one poll (0.25 s at most), gives everything back, and the deferred
``KeyboardInterrupt`` is raised as the hold ends.

Other threads never run signal handlers, so a hold there costs one
comparison.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stubs: the C half of signal
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Final

MAIN_IDENT: Final = threading.main_thread().ident  # only this thread runs signal handlers
_SIGNALS: Final = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGALRM", "SIGHUP", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)

Handler = Callable[[int, FrameType | None], Any]


class _State:
    """The number of holds in force on the main thread. An attribute of a slotted
    object, so that a caller can lower it inline (see :meth:`Hold.detach`): a
    C-level store, with no point between it and the caller's next line where
    CPython would run a signal handler."""

    __slots__ = ("depth",)

    def __init__(self) -> None:
        self.depth = 0


STATE: Final = _State()
_pending: list[tuple[Handler, int, FrameType | None]] = []  # deferred signals, in order
_callbacks: list[Callable[[int], None] | None] = []  # on_signal of each hold in force


class _Deferring:
    """A signal handler that defers the one it wraps while a hold is in force."""

    __slots__ = ("inner",)

    def __init__(self, inner: Handler) -> None:
        self.inner = inner

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if STATE.depth == 0:
            return self.inner(signum, frame)
        _pending.append((self.inner, signum, frame))
        for callback in _callbacks:
            if callback is not None:
                callback(signum)
        return None


# the C functions under signal.getsignal/signal: tens of nanoseconds where the
# enum-converting wrappers take microseconds, and every outermost hold calls them
_getsignal: Final[Callable[[int], object]] = _signal.getsignal
_setsignal: Final[Callable[[int, object], object]] = _signal.signal
_installed: list[tuple[int, object, _Deferring]] = []  # (signal, original, wrapper)


# the last wrap's plan, reused while the program's handlers stay the same: the
# handlers it found, and what it installed
_found: tuple[object, ...] = ()
_plan: tuple[tuple[int, object, _Deferring], ...] = ()


def _wrap_handlers() -> None:
    """Wrap every callable handler (the outermost hold begins). Costs one C-level
    read of the handlers, and one store per callable handler, while the program's
    handlers are the ones the last wrap found (the common case)."""
    global _found, _plan
    if _installed:  # still wrapped since a detached hold: wrap only what is new
        _wrap_each()
        return
    found = tuple(map(_getsignal, _SIGNALS))
    if found != _found:
        _plan = tuple(
            (signum, handler, _Deferring(handler))
            for signum, handler in zip(_SIGNALS, found, strict=True)
            if callable(handler) and not isinstance(handler, _Deferring)
        )
        _found = found
    for entry in _plan:
        _setsignal(entry[0], entry[2])
    _installed.extend(_plan)


def _wrap_each() -> None:
    """Wrap each callable handler not wrapped yet (one the program installed
    while the handlers stayed wrapped)."""
    for signum in _SIGNALS:
        handler = _getsignal(signum)
        if callable(handler) and not isinstance(handler, _Deferring):
            wrapper = _Deferring(handler)
            _setsignal(signum, wrapper)
            _installed.append((signum, handler, wrapper))


def _restore_handlers() -> None:
    """Put the original handlers back (unless someone replaced ours meanwhile)."""
    while _installed:
        signum, handler, wrapper = _installed.pop()
        if _getsignal(signum) is wrapper:
            _setsignal(signum, handler)


def _deliver() -> None:
    """Run the deferred handlers (the first that raises ends the delivery)."""
    while _pending:
        handler, signum, frame = _pending.pop(0)
        handler(signum, frame)


class Hold:
    """``with Hold(on_signal):``: the block runs to its end before any Python
    signal handler; deferred handlers run as the outermost hold ends."""

    __slots__ = ("active", "on_signal")

    def __init__(self, on_signal: Callable[[int], None] | None = None) -> None:
        self.on_signal = on_signal
        self.active = False

    def __enter__(self) -> Hold:
        if threading.get_ident() != MAIN_IDENT:
            return self
        if STATE.depth == 0:
            _wrap_handlers()
        _callbacks.append(self.on_signal)
        STATE.depth += 1
        self.active = True
        return self

    @property
    def interrupted(self) -> bool:
        """A signal arrived during the hold and will be delivered as it ends."""
        return self.active and bool(_pending)

    def deliver(self) -> None:
        """Run the deferred handlers now, at a point the holder chose because
        everything is consistent there (outermost hold only; an inner hold
        leaves them to the outer one)."""
        if self.active and STATE.depth == 1:
            _deliver()

    def detach(self) -> bool:
        """End the hold but for one step the caller does inline, as its last
        statement before returning: ``interrupts.STATE.depth -= 1`` when this
        returns True (nothing to do when it returns False: the hold was not in
        force). For ``Query.__enter__``, which must never raise once it holds a
        slot and a worker (no ``__exit__`` would follow): signals that arrive
        from here on stay pending, and run at the end of the next hold (the
        query's checkpoint or ``__exit__``); the handlers stay wrapped until then."""
        if not self.active:
            return False
        self.active = False
        _callbacks.pop()
        return True

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.active:
            return
        self.active = False
        STATE.depth -= 1
        _callbacks.pop()
        if STATE.depth == 0:
            _restore_handlers()
            if _pending:
                _deliver()
