"""The HTTP listener's socket cap (``server/sockets.py``), in process on a real loop
with real sockets: the count is exact through bursts, a heavier address gives
way to a lighter one, a reconnect storm pauses accepting, and every count comes
back when the sockets close. ``_check_invariants`` runs after every step.

Every wait is bounded (``asyncio.timeout``); nothing sleeps for a fixed time.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

from resgroups.server import sockets as http_sockets
from resgroups.server.sockets import HttpSockets

FLOODER, NEIGHBOUR = "127.0.0.2", "127.0.0.3"


async def _until(check: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def _connect(port: int, source: str) -> socket.socket:
    """A connection the kernel completes at once (queued until the server accepts)."""
    sock = socket.create_connection(("127.0.0.1", port), 10, source_address=(source, 0))
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bool:
    """The server closed it (what it sent before, if anything, is read and dropped)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def _with_sockets(cap: int, scenario: Callable[[HttpSockets, int], Awaitable[None]]) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    server = web.Server(hello)
    capped = HttpSockets(server, cap)
    port = capped.listen("127.0.0.1", 0)
    try:
        await scenario(capped, port)
    finally:
        capped.close()
        await server.shutdown(5)


def test_a_burst_past_the_cap_is_refused_and_pauses_accepting() -> None:
    async def scenario(capped: HttpSockets, port: int) -> None:
        held = [_connect(port, FLOODER) for _ in range(8)]
        await _until(lambda: capped.open == 8)
        capped._check_invariants()
        # a burst queued before the loop looks: 8 more than the cap... and then some
        burst = [_connect(port, FLOODER) for _ in range(http_sockets.REFUSALS_BEFORE_PAUSE + 40)]
        await _until(lambda: capped.pauses >= 1)
        capped._check_invariants()
        assert capped.open == 8  # never past the cap, through the whole burst
        assert capped.refused >= http_sockets.REFUSALS_BEFORE_PAUSE
        # accepting resumes after the pause: the rest are refused in turn
        await _until(lambda: capped.refused + capped.evicted >= len(burst))
        capped._check_invariants()
        assert capped.open == 8
        refused = [s for s in burst if _closed(s)]
        assert len(refused) >= capped.refused - capped.evicted
        for sock in (*held, *burst):
            sock.close()
        await _until(lambda: capped.open == 0)
        capped._check_invariants()

    asyncio.run(asyncio.wait_for(_with_sockets(8, scenario), 60))


def test_at_the_cap_a_lighter_address_takes_an_idle_socket_of_the_heaviest() -> None:
    async def scenario(capped: HttpSockets, port: int) -> None:
        flood = [_connect(port, FLOODER) for _ in range(8)]
        await _until(lambda: capped.open == 8)
        newcomer = _connect(port, NEIGHBOUR)
        await _until(lambda: capped.evicted == 1)
        capped._check_invariants()
        assert capped.open == 8
        assert not _closed(newcomer)
        assert _closed(flood[0])  # the flooder's oldest idle one made the room
        assert not any(_closed(s) for s in flood[1:])
        # the neighbour's second socket also gets room (1 + 1 < 7); the flooder's
        # next one only within its swap budget, and never a lighter address's socket
        second = _connect(port, NEIGHBOUR)
        await _until(lambda: capped.evicted == 2)
        assert not _closed(second)
        capped._check_invariants()
        for sock in (*flood, newcomer, second):
            sock.close()
        await _until(lambda: capped.open == 0)
        capped._check_invariants()

    asyncio.run(asyncio.wait_for(_with_sockets(8, scenario), 60))
