"""The HTTP listener's sockets: an exact cap, fair between source addresses,
and accept throttled when clients reconnect faster than room is made.

What it does
    The server accepts HTTP connections itself (a reader on the listening
    socket) and counts every socket from its accept to its close, so the cap
    (``serve --max-http-sockets``; default half the descriptors the process
    may open) holds exactly: the other half stays for the wire listener,
    the catalog and the log, whatever HTTP clients do. Below the cap a
    connection is handed to aiohttp. At the cap a newcomer gets room only by
    closing an idle socket (keep-alive between requests, or never a whole
    request sent; a request in progress is never closed) of the address
    holding the most, and only when the newcomer's own address holds at
    least two fewer: one address cannot push out a lighter one, and equally
    heavy addresses cannot churn each other's sockets. A newcomer may also
    take the place of its own address's oldest idle socket (a client's pool
    of idle keep-alive connections does not lock it out), at most
    ``SWAPS_PER_S`` times a second: past that, or with nothing idle to
    close, the newcomer is refused at once with a fixed ``503`` (SQLSTATE
    53300, "too many connections from this address" or "... at once"),
    written without parsing anything.

Symbols
    C   the cap; n  sockets open (accepted, not yet closed); n_a  those from
    address a; a* the address with the largest n_a.

Invariants
    I1  n = Σ_a n_a ≤ C (``_check_invariants``).
    I2  a socket is counted from its accept until its transport is closed,
        once: by its eviction, or by the protocol wrapper's
        ``connection_lost``. An evicted socket's descriptor is closed a loop
        turn later, so the process holds at most C + ACCEPT_BURST of them.
    I3  at the cap, a newcomer from a is admitted only by closing an idle
        socket: of a* if n_a + 1 < n_a*, else of a itself within the swap
        budget (a token bucket of SWAPS_PER_S, as deep).

Throttled accept
    A client that reconnects as soon as it is refused would make the loop
    accept and refuse without end. Once ``REFUSALS_BEFORE_PAUSE`` refusals
    come within one accept burst, the listener stops accepting for
    ``PAUSE_S``: the kernel's queue (backlog 4096) fills, further SYNs wait
    and back off in TCP, and the loop spends nothing on them. Sockets
    already open are served meanwhile; a newcomer waits at most the pause
    plus its place in the queue.

Alternatives rejected
    Counting aiohttp's own table of connections (``web.Server._connections``):
    a connection appears there a loop turn after asyncio accepted it, and
    asyncio accepts up to the backlog at once, so a burst overshot the cap
    by thousands and the process ran out of descriptors (both listeners
    then failed every accept). Evicting the oldest idle socket whatever its
    address: clients that reconnect what is closed turned every eviction
    into an accept, an eviction and a reconnect, without end. Accepting and
    refusing as fast as clients reconnect, with no pause: under 20,000
    reconnecting idle clients pgbench and HTTP together fell to 0.11x of
    calm (0.84x with 0.2 s pauses; 0.30x with 20 ms ones). asyncio's
    ``connect_accepted_socket`` per connection: a task, a future and checks
    each time; the transport is made as asyncio's own accept makes it.

Known races
    While accepting is paused, a well-behaved newcomer waits in the same
    kernel queue as the reconnecting clients; once the queue is full its
    SYN is dropped and TCP retries it after 1 s, 3 s, ... So under a storm
    new connections are slow, while open ones are served.

Cost
    An accept, refusal or close is O(1) but for a* at the cap: found in
    O(addresses) once per accept burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import socket
from typing import Any, Final

from aiohttp import web

log = logging.getLogger("resgroups.server")

ACCEPT_BURST: Final = 256  # accepts per readiness of the listening socket
REFUSALS_BEFORE_PAUSE: Final = 64  # refusals in one burst that pause accepting
PAUSE_S: Final = 0.2  # how long accepting stops then (and after EMFILE: 1 s)
WARN_EVERY_S: Final = 60.0  # at most one warning a minute while clients are refused
SWAPS_PER_S: Final = 20.0  # at the cap, newcomers that may replace their own address's idle socket
_OUT_OF_DESCRIPTORS: Final = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def _refusal(message: str) -> bytes:
    body = json.dumps(
        {"error": {"sqlstate": "53300", "message": message, "position": None}}
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class HttpSockets:
    """The HTTP listener: accepts, counts and caps sockets for ``server`` (aiohttp's)."""

    def __init__(self, server: web.Server | None, cap: int) -> None:
        assert server is not None
        if cap < 1:
            raise ValueError(f"cap={cap!r}: expected at least 1 socket")
        self._server = server
        self.cap = cap
        self.open = 0
        # address -> its open sockets, oldest first (dicts keep insertion order)
        self._by_address: dict[str, dict[_Counted, None]] = {}
        self.admitted = 0
        self.evicted = 0
        self.refused = 0
        self._warned: tuple[float, int] | None = None  # when, and refused by then
        self._swaps = SWAPS_PER_S  # the budget's tokens, refilled at SWAPS_PER_S a second
        self._swaps_at = 0.0
        self.pauses = 0
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._full = _refusal(f"too many HTTP connections at once (max_http_sockets = {cap})")
        self._crowded = _refusal(
            f"too many connections from this address (max_http_sockets = {cap}, "
            "shared fairly between addresses)"
        )

    # ---- listening ------------------------------------------------------------------

    def listen(self, host: str, port: int, backlog: int = 4096) -> int:
        """Listen on ``host:port`` (0: any free port) on the running loop; the port."""
        self._loop = asyncio.get_running_loop()
        listener = socket.create_server((host, port), backlog=backlog)
        listener.setblocking(False)
        self._listener = listener
        self._loop.add_reader(listener.fileno(), self._accept)
        return int(listener.getsockname()[1])

    def close(self) -> None:
        """Stop listening (open sockets stay until aiohttp closes them)."""
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        if self._listener is not None and self._loop is not None:
            self._loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None

    def _pause(self, seconds: float) -> None:
        assert self._loop is not None
        assert self._listener is not None
        self.pauses += 1
        self._loop.remove_reader(self._listener.fileno())
        self._paused = self._loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        self._paused = None
        if self._listener is not None and self._loop is not None:
            self._loop.add_reader(self._listener.fileno(), self._accept)
            self._accept()

    # ---- accepting ------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        heaviest: str | None = None
        refused = 0
        for _ in range(ACCEPT_BURST):
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_DESCRIPTORS:
                    log.warning("HTTP accept paused for 1 s: %s", exc)
                    self._pause(1.0)
                    return
                raise
            address = str(peer[0]) if isinstance(peer, tuple) else "local"
            if self.open >= self.cap:
                if heaviest is None:
                    heaviest = max(self._by_address, key=lambda a: len(self._by_address[a]))
                if not self._make_room(address, heaviest):
                    self._refuse(sock, address, heaviest)
                    refused += 1
                    if refused >= REFUSALS_BEFORE_PAUSE:
                        self._pause(PAUSE_S)
                        return
                    continue
                heaviest = None  # the counts moved
            self._admit(sock, address, peer)

    def _make_room(self, address: str, heaviest: str) -> bool:
        """At the cap: close an idle socket for ``address``, of ``heaviest`` or,
        within the swap budget, of its own (I3)."""
        held = self._by_address[heaviest]
        own = self._by_address.get(address, {})
        if len(own) + 1 < len(held):
            return self._evict_from(held)
        assert self._loop is not None
        now = self._loop.time()
        self._swaps = min(SWAPS_PER_S, self._swaps + (now - self._swaps_at) * SWAPS_PER_S)
        self._swaps_at = now
        if self._swaps < 1.0 or not self._evict_from(own):
            return False
        self._swaps -= 1.0
        return True

    def _evict_from(self, held: dict[_Counted, None]) -> bool:
        for counted in held:
            if counted.idle():
                self.gone(counted)  # now: its descriptor closes within a loop turn
                counted.evict()
                self.evicted += 1
                return True
        return False

    def _refuse(self, sock: socket.socket, address: str, heaviest: str) -> None:
        self.refused += 1
        self._warn()
        crowded = address == heaviest or len(self._by_address.get(address, ())) > 0
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(self._crowded if crowded else self._full)
        sock.close()

    def _warn(self) -> None:
        """At most once every WARN_EVERY_S while clients are refused: the counts."""
        assert self._loop is not None
        now = self._loop.time()
        if self._warned is not None and now - self._warned[0] < WARN_EVERY_S:
            return
        since = self.refused - (self._warned[1] if self._warned else 0)
        log.warning(
            "HTTP sockets at the cap (%d open, max_http_sockets = %d): %d connections "
            "refused since the last warning (%d admitted, %d idle ones closed for room, "
            "accepting paused %d times in all)",
            self.open, self.cap, since, self.admitted, self.evicted, self.pauses,
        )  # fmt: skip
        self._warned = (now, self.refused)

    def _admit(self, sock: socket.socket, address: str, peer: Any) -> None:
        assert self._loop is not None
        sock.setblocking(False)
        counted = _Counted(self._server(), self, address)
        self.open += 1
        self.admitted += 1
        self._by_address.setdefault(address, {})[counted] = None
        make_transport = getattr(self._loop, "_make_socket_transport", None)
        if make_transport is not None:
            # what asyncio's own accept does, without its task, future and checks
            # per connection (a third of an accept's cost under a reconnect storm)
            make_transport(sock, counted, extra={"peername": peer})
            return
        task = self._loop.create_task(self._connect(sock, counted))  # another loop
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: socket.socket, counted: _Counted) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(lambda: counted, sock)
        except OSError:
            sock.close()
            self.gone(counted)  # never made: give its count back

    def gone(self, counted: _Counted) -> None:
        """``counted``'s socket is closed: its count comes back (once, I2)."""
        held = self._by_address.get(counted.address)
        if held is None or counted not in held:
            return
        del held[counted]
        if not held:
            del self._by_address[counted.address]
        self.open -= 1

    def _check_invariants(self) -> None:
        counts = {a: len(h) for a, h in self._by_address.items()}
        assert self.open == sum(counts.values()), (self.open, counts)
        assert self.open <= self.cap, (self.open, self.cap)
        assert all(counts.values()), counts


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one socket, counted by :class:`HttpSockets` from
    accept to close. Every call of the transport is passed on unchanged."""

    def __init__(self, inner: Any, sockets: HttpSockets, address: str) -> None:
        self.inner = inner
        self.sockets = sockets
        self.address = address
        self.transport: asyncio.Transport | None = None

    def idle(self) -> bool:
        """Between requests, or no whole request yet: closing it loses nothing."""
        return self.transport is not None and not getattr(self.inner, "_request_in_progress", True)

    def evict(self) -> None:
        self.inner.force_close()
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()  # type: ignore[no-any-return]

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.sockets.gone(self)
        self.transport = None
        self.inner.connection_lost(exc)
