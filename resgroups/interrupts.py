"""Holding off interrupts while resgroups takes or gives back what a query holds.

Python runs signal handlers on the main thread at its eval-breaker checks: a
function's first instruction, a call of a C function, a backward jump, a wait
that a signal interrupts. So a ``KeyboardInterrupt`` (or any exception a
handler raises: ``SystemExit`` from a SIGTERM handler, a test timeout on
SIGALRM) can land at the first line of ``__exit__``, half way through handing
a worker back under the dispatcher's lock, or between taking a slot and
recording it. Landing there, it would leave a slot, a worker or bytes held
for good.

Two things decide whether a handler runs now or later, and both are read by
the one wrapper, :class:`_Deferring`, that stands in for every callable handler
of the signals below while a query is in flight or a hold is in force on the
main thread:

* **Protected frames.** :func:`protect` marks a function's code object. The
  wrapper receives the interrupted frame; when that frame or any of its
  callers (``f_back``) runs protected code, the signal is deferred. This is
  what closes the windows a counter cannot: the first instruction of
  ``Query.__exit__`` (before any statement of it has run), the calls in
  ``__enter__`` before its hold exists. ``Query.__enter__``/``__exit__`` and
  :class:`Hold`'s own entry and exit are protected, and so is everything they
  call (the walk finds them as callers). The user's body is not: between
  ``__enter__`` and ``__exit__`` a handler runs at once.
* **Holds.** ``with Hold(on_signal):`` defers handlers for the block, for code
  that runs in the body (``map``, a checkpoint's slice end, publishing memory,
  appending a catalog record). ``STATE.depth`` counts the holds in force. A
  query's ``__enter__``/``__exit__``, which know they run on the main thread,
  hold with :func:`hold_main` and end with :func:`release_main` or
  :func:`end_main` (protected too), what ``Hold`` itself is built on, with no
  object and no second thread test on every main-thread query's path.

A deferred signal is recorded once per signal number (as CPython itself
coalesces a signal that arrives again before its handler ran), the callbacks
of the holds in force run (``on_signal``: flags only, never a lock: the main
thread may hold it), and the handler runs where the protected region ends,
at a point where everything is consistent: the end of the outermost hold, or
the last lines of a protected function, which test :data:`PENDING` with no
eval-breaker check between that test and their return (so nothing can be
deferred after it: a later signal stays tripped in C, and its handler runs in
the caller's frame, which is not protected).

Wrapping lasts while it is needed only: the first hold on the main thread
wraps each callable handler it finds (the default SIGINT handler included),
and the originals go back when the last hold ends with no main-thread query in
flight (``STATE.queries``), so outside queries ``signal.getsignal`` answers
what the program installed (asyncio, for one, looks for the default SIGINT
handler there). A handler the body installs itself while a query runs is not
wrapped until the next hold begins (a ``map``, a checkpoint's slice end, a
nested query): until then it runs at once, in protected frames too.

A wait inside a hold (a query queued for a slot or a worker) stays
responsive: the query's ``on_signal`` cancels it by flag (SIGINT), its wait
notices within one poll (0.25 s at most), gives everything back, and the
deferred ``KeyboardInterrupt`` is raised as the hold ends.

Cost: marking is done once, at import; the frame walk runs only when a signal
arrives while the handlers are wrapped. Other threads never run signal
handlers: there a hold costs one comparison and nothing is wrapped.

Rejected: a hold counter alone (the window before the counter is raised is
the defect of issue 28); blocking signals with ``pthread_sigmask`` (another
thread receives the signal and trips the main thread's handler all the same);
patching ``signal.signal`` to wrap handlers installed during a query (it
changes a process-wide function for every library, and ``_signal.signal``
bypasses it).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stubs: the C half of signal
import signal
import threading
from _thread import get_ident
from collections.abc import Callable
from types import CodeType, FrameType, TracebackType
from typing import Any, Final, TypeVar

MAIN_IDENT: Final = threading.main_thread().ident  # only this thread runs signal handlers
_SIGNALS: Final = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGALRM", "SIGHUP", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)

Handler = Callable[[int, FrameType | None], Any]
F = TypeVar("F", bound=Callable[..., Any])


class _State:
    """What keeps the handlers wrapped on the main thread: the holds in force
    (``depth``) and the queries entered and not yet left (``queries``)."""

    __slots__ = ("depth", "queries")

    def __init__(self) -> None:
        self.depth = 0
        self.queries = 0


STATE: Final = _State()
# the deferred signals, one entry per signal number, in arrival order; protected
# code tests it (``while PENDING:``) as its last step
PENDING: Final[list[tuple[Handler, int, FrameType | None]]] = []
_callbacks: list[Callable[[int], None] | None] = []  # on_signal of each hold in force
# one entry per main-thread query whose handle was lost without __exit__ (appended on
# whichever thread collects it; the main thread takes them off STATE.queries)
_LOST: Final[list[None]] = []


def query_lost() -> None:
    """A query counted in ``STATE.queries`` was lost without ``__exit__`` (the
    reconcile loop found its handle collected and gave back what it held): the
    main thread stops counting it at the end of its next hold, so the program's
    handlers go back once no query is really in flight. Any thread."""
    _LOST.append(None)


_PROTECTED: Final[set[CodeType]] = set()


def protect(fn: F) -> F:
    """Mark ``fn`` protected: a signal that arrives while it, or anything it calls,
    runs on the main thread is deferred (see the module's docstring). What is
    deferred must be run before the protected region ends, so that no signal is
    left waiting: ``fn`` ends with ``while PENDING:`` (run them) as its last
    step, or runs inside a hold, or ends one."""
    _PROTECTED.add(fn.__code__)
    return fn


def _protected(frame: FrameType | None) -> bool:
    """The interrupted frame or one of its callers runs protected code. O(stack
    depth); runs only when a signal arrives."""
    while frame is not None:
        if frame.f_code in _PROTECTED:
            return True
        frame = frame.f_back
    return False


class _Deferring:
    """A signal handler that defers the one it wraps while a hold is in force or
    the interrupted frame is protected, and calls it at once otherwise."""

    __slots__ = ("inner",)

    def __init__(self, inner: Handler) -> None:
        self.inner = inner

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        if not STATE.depth and not _protected(frame):
            return self.inner(signum, frame)
        if all(entry[1] != signum for entry in PENDING):
            PENDING.append((self.inner, signum, frame))
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
# handlers it found, what it installed, and what ``getsignal`` answers once it is
# installed (those found, each callable one replaced by its wrapper)
_found: tuple[object, ...] = ()
_plan: tuple[tuple[int, object, _Deferring], ...] = ()
_planned: tuple[object, ...] = ()
# while wrapped (``_installed``): what ``getsignal`` answered once everything was,
# so that a hold begun while a query is in flight finds in one read whether the
# program installed a handler meanwhile
_wrapped: tuple[object, ...] = ()


def _wrap_handlers() -> None:
    """Wrap every callable handler (the outermost hold begins). Costs one C-level
    read of the handlers, and one store per callable handler, while the program's
    handlers are the ones the last wrap found (the common case); while they stay
    wrapped (a main-thread query in flight), one read and nothing else unless the
    program installed a handler meanwhile."""
    global _found, _plan, _planned, _wrapped
    found = tuple(map(_getsignal, _SIGNALS))
    if _installed:  # still wrapped (a query in flight): wrap only what is new
        if found != _wrapped:
            _wrap_each()
            _wrapped = tuple(map(_getsignal, _SIGNALS))
        return
    if found != _found:
        _plan = tuple(
            (signum, handler, _Deferring(handler))
            for signum, handler in zip(_SIGNALS, found, strict=True)
            if callable(handler) and not isinstance(handler, _Deferring)
        )
        wrappers = {entry[0]: entry[2] for entry in _plan}
        _planned = tuple(
            wrappers.get(signum, handler) for signum, handler in zip(_SIGNALS, found, strict=True)
        )
        _found = found
    for entry in _plan:
        _setsignal(entry[0], entry[2])
    _installed.extend(_plan)
    _wrapped = _planned


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


def deliver() -> None:
    """Run the deferred handlers, in arrival order (the first that raises ends the
    delivery; the others stay pending). Called from protected code, so a signal
    that arrives meanwhile is deferred and run by the same loop."""
    while PENDING:
        handler, signum, frame = PENDING.pop(0)
        handler(signum, frame)


@protect
def hold_main(on_signal: Callable[[int], None] | None = None) -> None:
    """Begin a hold on the main thread: ``Hold(on_signal).__enter__()`` without the
    object or the thread test, for a caller that knows it runs on the main
    thread and ends the hold itself, with :func:`release_main` or
    :func:`end_main` (a query's ``__enter__`` and ``__exit__``: every
    main-thread query's path, so it makes nothing it can do without)."""
    if STATE.depth == 0:
        _wrap_handlers()
    _callbacks.append(on_signal)
    STATE.depth += 1
    if PENDING and on_signal is not None:  # deferred before the hold began
        for entry in list(PENDING):
            on_signal(entry[1])


def release_main() -> None:
    """End a hold of :func:`hold_main` without running what is pending
    (``Hold.release``)."""
    STATE.depth -= 1
    _callbacks.pop()


@protect
def end_main() -> None:
    """End a hold of :func:`hold_main` (``Hold.__exit__``): the outermost hold runs
    what is pending, and puts the program's handlers back unless a main-thread
    query is in flight."""
    STATE.depth -= 1
    _callbacks.pop()
    if STATE.depth == 0:  # the outermost hold: run what is pending (this frame is
        while _LOST:  # queries lost without __exit__ are not in flight
            _LOST.pop()
            STATE.queries = max(0, STATE.queries - 1)
        try:  # protected: what arrives meanwhile is deferred and run by the loop)
            if PENDING:
                deliver()
        finally:  # the program's handlers back unless a main-thread query is in
            if not STATE.queries and _installed:  # flight, and what came meanwhile
                _restore_handlers()
                if PENDING:
                    deliver()


class Hold:
    """``with Hold(on_signal):``: the block runs to its end before any Python
    signal handler; deferred handlers run as the outermost hold ends."""

    __slots__ = ("active", "on_signal")

    def __init__(self, on_signal: Callable[[int], None] | None = None) -> None:
        self.on_signal = on_signal
        self.active = False

    @protect
    def __enter__(self) -> Hold:
        if get_ident() != MAIN_IDENT:
            return self
        hold_main(self.on_signal)
        self.active = True  # a signal from here on is deferred: the hold is in force
        return self

    @property
    def interrupted(self) -> bool:
        """A signal arrived during the hold and will be delivered as it ends."""
        return self.active and bool(PENDING)

    def deliver(self) -> None:
        """Run the deferred handlers now, at a point the holder chose because
        everything is consistent there (outermost hold only; an inner hold
        leaves them to the outer one)."""
        if self.active and STATE.depth == 1:
            deliver()

    def release(self) -> None:
        """End the hold without running what is pending: for protected code,
        which runs ``PENDING`` itself as its last step (``Query.__enter__``, which
        must not raise once it holds a slot and a worker unless it gives them
        back first). The handlers stay wrapped while a query is in flight."""
        if self.active:
            self.active = False
            release_main()

    @protect
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self.active:
            return
        self.active = False
        end_main()
