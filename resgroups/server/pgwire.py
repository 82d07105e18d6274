"""The PostgreSQL wire protocol v3: one :class:`Connection` per client socket.

What it does
    The event loop only moves bytes: a reader task per connection frames the
    client's messages (bounded: INPUT_LIMIT bytes waiting), and each burst of
    messages (a simple query, or Parse/Bind/Describe/Execute/Sync as a driver
    sends them together) is handled on a request thread, which encodes the
    replies and sends them on the socket itself, then goes on with the
    messages that arrived meanwhile, and reads the client's next burst itself
    for a moment (LINGER) before it leaves (``pg_framing``: a client that
    sends its next statement at once costs the loop nothing; the loop takes
    part only when a burst arrives at an idle connection, and takes the
    reading back from a burst that lasts). Queries never run on the loop.
    The phases live in their own modules, mixed into :class:`Connection` here:

    ``pg_startup``   startup and authentication (throttle, connection slots)
    ``pg_framing``   framing and back-pressure: the queue in, the output waits
    ``pg_simple``    simple query and the connection-statement interpreter
    ``pg_portals``   portals and cursors: streamed and paged results
    ``pg_extended``  the extended protocol
    ``pg_state``     what they share: the state, the limits, TxStatus

The state machine
    startup  --StartupMessage + auth-->  authenticated  --slot taken-->  ready
      SSLRequest/GSSENCRequest: answered N, still startup (at most 3 packets)
      CancelRequest: cancels connection (pid, secret) and ends this one
      a login refused, a throttled address, no slot, a bad startup setting:
        FATAL, the end (STARTUP_TIMEOUT bounds the whole phase)
    ready: each burst runs on a request thread (the admin's own pool for a
      RESOURCE GROUP ADMIN principal), then ReadyForQuery(tx) where
      tx is TxStatus: IDLE -BEGIN-> BLOCK -error-> FAILED -COMMIT/ROLLBACK-> IDLE
      simple Query: ReadyForQuery after its statements, whatever failed
      extended: an error sets ``skipping``: every message but Sync is
        discarded; Sync clears it and answers ReadyForQuery
    what ends a connection:
      Terminate or EOF/reset (the running query is cancelled, cursors closed)
      a protocol violation (a malformed message, an unknown type, a bad
        length): FATAL 08P01 after the replies so far, nothing more is read
      the client not reading past a deadline (below): no message, the socket
        is aborted
      shutdown: FATAL 57P01 once the current request is done

How output waits meet query timeouts
    A streamed SELECT's thread waits for the socket while its query holds a
    slot and a worker; it passes the query's checkpoint every OUTPUT_POLL,
    so the query's own deadline (query_timeout) or a cancel fails it with
    its usual error (57014), the thread gives everything back and the
    connection ends: a client that stops reading holds nothing past its
    query's timeout. With no query running, output is handed to the loop
    without waiting (up to OUTPUT_LIMIT bytes unwritten), and the loop's
    write timeout (``write_timeout``, WRITE_TIMEOUT by default) ends a
    connection whose client reads nothing. Past OUTPUT_LIMIT a thread waits,
    bounded by the write timeout, only while fewer than a quarter of the
    general threads do (``max_output_waiters``); past that the connection
    ends. So non-readers pin at most that quarter, plus the threads of
    queries that their own deadlines bound.

Alternatives rejected
    One module with one 34-method class (what this was); an async generator
    per request (a query's body is synchronous engine code; the thread is
    where it runs, so the wait belongs to it). Statements on the loop (a
    round trip about 1.6x faster in an experiment): a statement can queue for
    admission or run long, and the loop must never wait on one. A request
    thread that owns the reading for good (a thread per idle connection, and
    nobody reads while a statement runs); instead the thread reads only while
    it lingers or runs a short burst, and the loop's look every
    WATCH_INTERVAL takes the reading back from a burst still running, so that
    a client's departure cancels it within about two intervals. A lighter
    wake-up than the executor's for each hand-over (the loop still woke,
    then woke a thread: two wake-ups a round trip, where PostgreSQL has one).

Known races
    A cancel that reaches a connection running no query sets ``interrupted``,
    which a parse checks every 1024 tokens; it is forgotten when the next
    burst of messages starts (a cancel of an idle connection cancels
    nothing, as in PostgreSQL). A cancel or a deadline ends an output wait
    within OUTPUT_POLL (plus a CPU slice, if the checkpoint yields the
    worker). Logins from one address that are in flight together all pass
    the throttle's check before any of them fails, so the throttle bounds
    what an address costs to ``free`` failures plus its concurrent attempts
    per window, not exactly ``free``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import socket
import threading
from collections import OrderedDict
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Final

from resgroups.errors import Error, FeatureNotSupported
from resgroups.server import wire
from resgroups.server.limits import ConnectionSlots, LoginThrottle
from resgroups.server.pg_extended import Extended
from resgroups.server.pg_framing import WATCH_INTERVAL, Framing, Handler
from resgroups.server.pg_portals import Portals
from resgroups.server.pg_simple import SimpleQuery
from resgroups.server.pg_startup import StartupPhase
from resgroups.server.pg_state import STARTUP_TIMEOUT, WRITE_TIMEOUT, TxStatus
from resgroups.server.wire import ProtocolViolation

if TYPE_CHECKING:
    from resgroups.engine import Engine

__all__ = ["AUTH_METHODS", "Backend", "Connection", "TxStatus"]

log = logging.getLogger("resgroups.server.pgwire")

AUTH_METHODS: Final = ("scram-sha-256", "md5", "password")
OUTPUT_WAITERS: Final = 4  # with an executor whose size is unknown
KEEPALIVE: Final = {"TCP_KEEPIDLE": 60, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 6}


class Backend:
    """What the wire connections of one server share: the engine, the threads
    that run their requests, the auth method, the limits, and who may be
    cancelled.

    ``executor`` may be a :class:`~resgroups.server.limits.RequestThreads`:
    then admins' requests run on its admin pool. ``admins_only``: the admin
    port's backend, where anyone else's login ends with FATAL 42501. ``max_connections`` (or
    ``slots``, shared with the HTTP listener) caps connections with a reserve
    for admins; ``throttle`` refuses an address after repeated failed logins.
    """

    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        *,
        auth_method: str = "scram-sha-256",
        max_connections: int | None = None,
        throttle: LoginThrottle | None = None,
        slots: ConnectionSlots | None = None,
        write_timeout: float = WRITE_TIMEOUT,
        admins_only: bool = False,
        first_pid: int = 1,
    ) -> None:
        if auth_method not in AUTH_METHODS:
            raise FeatureNotSupported(
                f"auth method {auth_method!r} is not one of {', '.join(AUTH_METHODS)}"
            )
        if not write_timeout > 0:
            raise ValueError(f"write_timeout={write_timeout!r}: expected seconds > 0")
        self.engine = engine
        self.executor = executor
        self.auth_method = auth_method
        if slots is None and max_connections is not None:
            slots = ConnectionSlots(max_connections)
        self.slots = slots
        self.throttle = throttle
        self.write_timeout = write_timeout
        # threads that may wait on clients that do not read, with no query running
        self.max_output_waiters = max(1, _pool_size(executor) // 4)
        self.output_waiters = threading.BoundedSemaphore(self.max_output_waiters)
        self.connections: dict[int, Connection] = {}
        # the admin port's backend: only RESOURCE GROUP ADMIN principals log in
        self.admins_only = admins_only
        self._pids = iter(range(first_pid, 2**31))
        self.closing = False
        self._unknown_salt = secrets.token_bytes(16)  # fake SCRAM salts for unknown names
        self._readers: set[Framing] = set()  # connections whose request thread reads
        self._watching = False

    def watch_readers(self, conn: Framing) -> None:
        """Look at ``conn`` every WATCH_INTERVAL while a request thread reads its
        socket (on the loop): one timer for all such connections."""
        self._readers.add(conn)
        if not self._watching:
            self._watching = True
            asyncio.get_running_loop().call_later(WATCH_INTERVAL, self._watch)

    def _watch(self) -> None:
        for conn in list(self._readers):
            if not conn.watch_reading():
                self._readers.discard(conn)
        self._watching = bool(self._readers)
        if self._watching:
            asyncio.get_running_loop().call_later(WATCH_INTERVAL, self._watch)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``asyncio.start_server``'s callback: serve one client until it leaves."""
        await Connection(self, reader, writer).serve()

    def executor_for(self, admin: bool) -> Executor:
        """Where a principal's requests run: admins have threads of their own."""
        for_admin = getattr(self.executor, "for_admin", None)
        return self.executor if for_admin is None else for_admin(admin)

    def next_pid(self) -> int:
        return next(self._pids)

    def cancel(self, pid: int, secret: int) -> bool:
        """A CancelRequest: cancel what connection ``pid`` runs, if ``secret`` is its."""
        conn = self.connections.get(pid)
        if conn is None or not hmac.compare_digest(
            conn.secret.to_bytes(4, "big", signed=True), secret.to_bytes(4, "big", signed=True)
        ):
            return False
        conn.cancel()
        return True

    def fake_salt(self, name: str) -> bytes:
        """A salt for a name that cannot log in: the same on every attempt, so that
        SCRAM's challenge does not tell unknown names from known ones."""
        return hmac.digest(self._unknown_salt, name.encode("utf-8", "replace"), "sha256")[:16]


def _pool_size(executor: Executor) -> int:
    """The general threads of ``executor`` (a RequestThreads or a ThreadPoolExecutor)."""
    pool = getattr(executor, "general", executor)
    size = getattr(pool, "_max_workers", None)
    return size if isinstance(size, int) else OUTPUT_WAITERS


def _keepalive(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in KEEPALIVE.items():
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:  # not a TCP socket (a test's socketpair)
        pass


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return str(peer or "local")


class Connection(StartupPhase, Framing, SimpleQuery, Portals, Extended):
    """One client connection: startup, authentication, then its requests."""

    def __init__(
        self, backend: Backend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.backend = backend
        self.engine = backend.engine
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.executor = backend.executor_for(False)
        self.pid = backend.next_pid()
        self.secret = secrets.randbits(31)
        self.peer = _peer(writer)
        self.session = None
        self.settings = {}
        self.tx = TxStatus.IDLE
        self.savepoints = []
        self.statements = {}
        self.portals = {}
        self.statement_memory = None
        self.skipping = False
        self.busy = False
        self.gone = False
        self.interrupted = False
        self.streaming = None
        self._plans = OrderedDict()
        self._templates = OrderedDict()
        self.init_framing()
        _keepalive(writer)

    async def serve(self) -> None:
        reader_task: asyncio.Task[None] | None = None
        try:
            if not await asyncio.wait_for(self.startup(), STARTUP_TIMEOUT):
                return
            self.backend.connections[self.pid] = self
            self.open_socket()
            reader_task = asyncio.create_task(self.read_loop())
            await self.requests()
        except ProtocolViolation as exc:
            await self._fatal(exc.sqlstate, exc.brief)
        except Error as exc:  # a login refused, a startup setting out of range
            await self._fatal(exc.sqlstate, exc.brief)
        except TimeoutError:
            if self.session is not None:  # logged in, then read nothing for write_timeout
                log.warning(
                    "connection %d ended: the client read nothing for %g s",
                    self.pid,
                    self.backend.write_timeout,
                )
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self.gone = True
            self.close_socket()  # first: nothing below may skip it
            if reader_task is not None:
                reader_task.cancel()
            self.backend.connections.pop(self.pid, None)
            if self.portals or self.statements:
                await self.loop.run_in_executor(self.executor, self._release_all)
            if self.slot_taken and self.backend.slots is not None:
                self.backend.slots.give_back()
            if self.writer.transport.get_write_buffer_size():
                self.writer.transport.abort()  # nobody reads it: drop it, do not wait
            else:
                self.writer.close()

    def _release_all(self) -> None:
        self.close_portals(True)
        self.drop_statements()
        if self.statement_memory is not None:
            self.statement_memory.close()

    async def _fatal(self, sqlstate: str, text: str) -> None:
        try:
            self.writer.write(wire.error_response(sqlstate, text, severity="FATAL"))
            await asyncio.wait_for(self.writer.drain(), 5)
        except (ConnectionError, TimeoutError):
            pass

    def end(self, reason: Error) -> None:
        """End the connection with a FATAL ``reason`` once its current request is done."""
        self.arrive(reason)

    def cancel(self) -> None:
        """Cancel what this connection is running (from the loop or any thread)."""
        if self.session is not None and not self.session.cancel():
            self.interrupted = True  # no query runs: a long parse, say, ends instead


HANDLERS: Final[dict[bytes, Handler]] = {
    b"Q": Connection.query_message,  # type: ignore[dict-item]
    b"P": Connection.parse_message,  # type: ignore[dict-item]
    b"B": Connection.bind_message,  # type: ignore[dict-item]
    b"D": Connection.describe_message,  # type: ignore[dict-item]
    b"E": Connection.execute_message,  # type: ignore[dict-item]
    b"C": Connection.close_message,  # type: ignore[dict-item]
    b"S": Connection.sync_message,  # type: ignore[dict-item]
    b"H": Connection.flush_message,  # type: ignore[dict-item]
    b"F": Connection.function_call_message,  # type: ignore[dict-item]
}
Framing.handlers.update(HANDLERS)
