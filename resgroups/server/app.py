"""``resgroups serve``: both listeners on one event loop, and a clean shutdown.

SIGINT or SIGTERM stops the listeners, ends idle connections (their cursors
closed, so their memory comes back), then closes the engine: queued queries
fail at once (57P01), running ones get ``grace`` seconds to finish before
they are cancelled, and every slot and worker is back before the process
exits with status 0.

What both listeners share, so that no client can take the server from the
rest (``limits.py``): one set of request threads with a reserve for RESOURCE
GROUP ADMIN principals, one connection cap (``--max-connections``) with a
reserve for them, and one failed-login throttle per source address.

The admin port (``--admin-port``, as MySQL's ``admin_port``): a third
listener, of the wire protocol, on an event loop of its own thread, where
only RESOURCE GROUP ADMIN principals log in and every request runs on the
admin's threads. However busy the main loop is (thousands of clients, a
reconnect storm), the admin's ``resource_groups()`` waits behind none of
it: only the interpreter's lock is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

from aiohttp import web

from resgroups.errors import EngineClosed, Error
from resgroups.server.dashboard import History, Sampler
from resgroups.server.http import KEEPALIVE_TIMEOUT, HttpFront, protocol_log
from resgroups.server.limits import ConnectionSlots, LoginThrottle, RequestThreads
from resgroups.server.pgwire import Backend
from resgroups.server.sockets import HttpSockets
from resgroups.sql.parser import warm

if TYPE_CHECKING:
    from resgroups.engine import Engine

log = logging.getLogger("resgroups.server")
T = TypeVar("T")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PG_PORT: Final = 8812
DEFAULT_HTTP_PORT: Final = 9000
MAX_REQUESTS: Final = 256  # requests executing at once (threads); more wait for one


ADMIN_PORT_SOCKETS: Final = 64  # sockets the admin port keeps open at once, logged in or not


@dataclass(frozen=True)
class Listeners:
    """Where the server listens, as bound (a port 0 becomes the port chosen)."""

    host: str
    pg_port: int
    http_port: int
    admin_port: int | None = None

    @property
    def page(self) -> str:
        """The live page's address."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.http_port}/"

    def describe(self) -> str:
        admin = "" if self.admin_port is None else f", admin on {self.host}:{self.admin_port}"
        return (
            f"resgroups serve: PostgreSQL wire protocol on {self.host}:{self.pg_port}, "
            f"HTTP on {self.host}:{self.http_port}{admin}"
        )


class Server:
    """The wire protocol and HTTP listeners over one engine, on the running loop."""

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = DEFAULT_HOST,
        pg_port: int = DEFAULT_PG_PORT,
        http_port: int = DEFAULT_HTTP_PORT,
        auth_method: str = "scram-sha-256",
        max_requests: int = MAX_REQUESTS,
        max_connections: int | None = None,
        metrics_open: bool = False,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
        max_http_sockets: int | None = None,
        admin_port: int | None = None,
    ) -> None:
        self.engine = engine
        # HTTP sockets open at once (idle ones included); default: half the
        # descriptors the process may open, so idle clients cannot take them all
        self.max_http_sockets = max_http_sockets or max(
            64, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2
        )
        self.host = host
        self._ports = (pg_port, http_port)
        self.keepalive_timeout = keepalive_timeout
        self.executor = RequestThreads(max_requests)
        # one cap and one throttle for both listeners: a client cannot go round
        # either by switching protocol
        self.slots = ConnectionSlots(max_connections)
        self.throttle = LoginThrottle()
        self.backend = _backend(
            engine, self.executor, auth_method=auth_method, slots=self.slots, throttle=self.throttle
        )
        self.sampler = Sampler(engine.statistics, History())
        self.http = HttpFront(
            engine,
            self.executor,
            self.sampler.history,
            slots=self.slots,
            throttle=self.throttle,
            metrics_open=metrics_open,
        )
        self.admin = (
            None
            if admin_port is None
            else AdminListener(
                Backend(
                    engine,
                    self.executor.admin,
                    auth_method=auth_method,
                    slots=self.slots,
                    throttle=self.throttle,
                    admins_only=True,
                    first_pid=2**30,
                ),
                host,
                admin_port,
            )
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._pg: asyncio.Server | None = None
        self._runner: web.AppRunner | None = None
        self.http_sockets: HttpSockets | None = None

    async def start(self) -> Listeners:
        pg_port, http_port = self._ports
        self._pg = await asyncio.start_server(self._accept, self.host, pg_port, backlog=1024)
        # keepalive_timeout also bounds how long a connection may take to send a
        # request's headers (aiohttp arms it at accept and after each response)
        self._runner = web.AppRunner(
            self.http.app,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=self.keepalive_timeout,
            logger=protocol_log,
        )
        await self._runner.setup()
        self.http_sockets = HttpSockets(self._runner.server, self.max_http_sockets)
        http_bound = self.http_sockets.listen(self.host, http_port)
        pg_bound = self._pg.sockets[0].getsockname()[1]
        admin_bound = None if self.admin is None else await self.admin.start()
        self.sampler.start(self.executor.for_admin(True))
        engine = self.engine
        if engine.access_control and engine.authenticator.open_admin:
            log.warning(
                "access control is on but the admin %r has no password: anyone can log in "
                "as the admin with any password (set RESGROUPS_ADMIN_PASSWORD)",
                engine.admin_user,
            )
        return Listeners(self.host, pg_bound, http_bound, admin_bound)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.backend.handle(reader, writer)
        finally:
            self._tasks.discard(task)

    async def shutdown(self, grace: float) -> None:
        """Stop listening, end idle connections, then close the engine."""
        loop = asyncio.get_running_loop()
        if self._pg is not None:
            self._pg.close()
        self.backend.closing = self.http.closing = True
        await self.sampler.stop()
        closing = EngineClosed("terminating connection due to administrator command")
        for conn in list(self.backend.connections.values()):
            conn.end(closing)  # an idle one ends now; a busy one after its request
        if self.admin is not None:
            await self.admin.stop_listening(closing)
        idle = [t for t in self._tasks if not t.done()]
        if idle:
            await asyncio.wait(idle, timeout=1.0)
        await loop.run_in_executor(None, self.engine.close, grace)
        if self.admin is not None:
            await self.admin.finish()
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        for task in self._tasks:
            task.cancel()
        if self.http_sockets is not None:
            self.http_sockets.close()
        if self._runner is not None:
            await self._runner.cleanup()
        self.executor.shutdown(wait=False, cancel_futures=True)


class AdminListener:
    """The admin port: a wire listener on an event loop of its own thread.

    ``backend`` is ``admins_only`` (anyone else's login ends with FATAL
    42501) and runs every request on the admin's threads; at most
    ``ADMIN_PORT_SOCKETS`` sockets are open at once (more are closed at
    accept), so a flood of this port cannot take descriptors from the rest.
    """

    def __init__(self, backend: Backend, host: str, port: int) -> None:
        self.backend = backend
        self.host = host
        self.port = port
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="resgroups-admin-loop", daemon=True
        )
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen (from the main loop); the port bound."""
        self._thread.start()
        return await self._on_own_loop(self._listen())

    async def _on_own_loop(self, work: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return await asyncio.wait_for(
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop)), timeout
        )

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port, backlog=64)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= ADMIN_PORT_SOCKETS:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.backend.handle(reader, writer)
        finally:
            self._tasks.discard(task)

    async def stop_listening(self, reason: Error) -> None:
        """Stop accepting; end idle connections (a busy one after its request)."""
        self.backend.closing = True
        await self._on_own_loop(self._stop_listening(reason))

    async def _stop_listening(self, reason: Error) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.backend.connections.values()):
            conn.end(reason)
        idle = [t for t in self._tasks if not t.done()]
        if idle:
            await asyncio.wait(idle, timeout=1.0)

    async def finish(self) -> None:
        """Once the engine is closed: the last connections end, the loop stops."""
        with contextlib.suppress(TimeoutError):
            await self._on_own_loop(self._finish(), timeout=10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10.0)
        if not self._thread.is_alive():
            self.loop.close()

    async def _finish(self) -> None:
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        for task in self._tasks:
            task.cancel()


def _backend(
    engine: Engine,
    executor: RequestThreads,
    *,
    auth_method: str,
    slots: ConnectionSlots,
    throttle: LoginThrottle,
) -> Backend:
    """The wire protocol's backend, sharing the connection cap, the login throttle
    and the request threads (with their admin reserve) with the HTTP listener."""
    return Backend(engine, executor, auth_method=auth_method, slots=slots, throttle=throttle)


class BackgroundServer:
    """A :class:`Server` on an event loop of its own thread, for a process whose
    main thread has other work (``resgroups demo --serve``)."""

    def __init__(self, engine: Engine, **options: Any) -> None:
        self._server = Server(engine, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="resgroups-serve", daemon=True
        )

    def start(self) -> Listeners:
        """Listen; where (raises OSError when a port is taken)."""
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._server.start(), self._loop)
        return started.result(timeout=30)

    def stop(self, grace: float = 5.0) -> None:
        """Stop listening, close the engine (``grace`` for running queries), end the loop."""
        stopping = asyncio.run_coroutine_threadsafe(self._server.shutdown(grace), self._loop)
        try:
            stopping.result(timeout=grace + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


def _raise_fd_limit() -> None:
    """Thousands of idle clients need thousands of descriptors: lift the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(
    engine: Engine,
    *,
    host: str = DEFAULT_HOST,
    pg_port: int = DEFAULT_PG_PORT,
    http_port: int = DEFAULT_HTTP_PORT,
    auth_method: str = "scram-sha-256",
    grace: float = 30.0,
    ready: Callable[[Listeners], None] = lambda listeners: None,
    **options: Any,
) -> int:
    """Serve until SIGINT or SIGTERM; 0 once everything is given back. ``options``
    go to :class:`Server` (``max_connections``, ``metrics_open``,
    ``keepalive_timeout``, ``admin_port``...)."""
    _raise_fd_limit()
    warm()  # the first statement is not the one that waits for the parser to be built

    async def main() -> None:
        server = Server(
            engine,
            host=host,
            pg_port=pg_port,
            http_port=http_port,
            auth_method=auth_method,
            **options,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        ready(await server.start())
        await stop.wait()
        log.info("shutting down: draining running queries for up to %ss", grace)
        await server.shutdown(grace)

    asyncio.run(main())
    return 0
