"""The PostgreSQL wire protocol v3: one :class:`Connection` per client socket.

The event loop only moves bytes: a reader task per connection frames the
client's messages into a bounded queue, and each burst of messages (a simple
query, or Parse/Bind/Describe/Execute/Sync as a driver sends them together)
is handled on an engine thread, which encodes the replies; big results go
out through the loop a chunk at a time, the thread waiting until each is
written (``drain``), so a slow reader slows only its own query. Queries
never run on the loop.

A dropped connection (EOF, reset) cancels what it is running and closes its
cursors on the engine thread, so every slot, worker and byte it held comes
back. A protocol violation ends only its own connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final
from zoneinfo import ZoneInfo

from resgroups.auth import md5_response, scram_keys
from resgroups.errors import (
    AuthenticationFailed,
    EngineClosed,
    Error,
    FeatureNotSupported,
    InternalError,
    SqlSyntaxError,
)
from resgroups.result import Cursor, Result
from resgroups.server import commands as wc
from resgroups.server import types, wire
from resgroups.server.scram import MECHANISM, ScramFailed, ScramServer
from resgroups.server.wire import Body, ProtocolViolation
from resgroups.session import Session
from resgroups.sql import ast
from resgroups.sql.params import bind, placeholders
from resgroups.sql.parser import parse_one
from resgroups.sql.split import split_statements

if TYPE_CHECKING:
    from resgroups.engine import Engine

log = logging.getLogger("resgroups.server.pgwire")

AUTH_METHODS: Final = ("scram-sha-256", "md5", "password")
STARTUP_TIMEOUT: Final = 60.0  # seconds a client has to log in (PostgreSQL's default)
INPUT_LIMIT: Final = 4 * 1024 * 1024  # bytes of messages read ahead of the engine
OUTPUT_CHUNK: Final = 256 * 1024  # bytes a thread hands to the loop at a time
PLAN_CACHE: Final = 128  # statement texts a connection keeps parsed
STREAM_ROWS: Final = 10_000  # rows of a streamed result made at a time


class InFailedTransaction(Error):
    sqlstate = "25P02"


class NoActiveTransaction(Error):
    """DECLARE without HOLD outside a transaction block (25P01)."""

    sqlstate = "25P01"


class DuplicateObject(Error):
    sqlstate = "42P05"


class Backend:
    """What the wire connections of one server share: the engine, the threads
    that run their requests, the auth method, and who may be cancelled."""

    def __init__(
        self, engine: Engine, executor: Executor, *, auth_method: str = "scram-sha-256"
    ) -> None:
        if auth_method not in AUTH_METHODS:
            raise FeatureNotSupported(
                f"auth method {auth_method!r} is not one of {', '.join(AUTH_METHODS)}"
            )
        self.engine = engine
        self.executor = executor
        self.auth_method = auth_method
        self.connections: dict[int, Connection] = {}
        self._pids = iter(range(1, 2**31))
        self.closing = False
        self._unknown_salt = secrets.token_bytes(16)  # fake SCRAM salts for unknown names

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """``asyncio.start_server``'s callback: serve one client until it leaves."""
        await Connection(self, reader, writer).serve()

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


# ---- statements and portals ----------------------------------------------------------

Plan = ast.Statement | wc.WireCommand | None  # None: an empty query


@dataclass
class Prepared:
    """A statement of the extended protocol (Parse)."""

    text: str
    oids: list[int]
    plan: Plan = None  # parsed at Parse when it has no placeholders
    planned: bool = False


@dataclass
class Portal:
    """A bound statement (Bind) or a DECLAREd cursor."""

    plan: Plan
    formats: list[int] = field(default_factory=list)  # result format codes as bound
    cursor: Cursor | None = None
    hold: bool = False  # survives the end of its transaction (WITH HOLD)
    executed: bool = False
    binary: bool = False  # DECLARE BINARY: rows in binary format

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()


def _formats(codes: list[int], count: int, what: str = "result") -> list[int]:
    """Bind's format codes for ``count`` values: none (all text), one for all, or one each."""
    if not codes:
        return [types.TEXT_FORMAT] * count
    if len(codes) == 1:
        return codes * count
    if len(codes) != count:
        raise ProtocolViolation(f"bind message has {len(codes)} {what} formats for {count}")
    return codes


class Connection:
    """One client connection: startup, authentication, then its requests."""

    def __init__(
        self, backend: Backend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.backend = backend
        self.engine = backend.engine
        self.reader = reader
        self.writer = writer
        self.loop = asyncio.get_running_loop()
        self.pid = backend.next_pid()
        self.secret = secrets.randbits(31)
        self.session: Session | None = None
        self.settings: dict[str, str] = {}
        self.tx = b"I"
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.skipping = False  # after an extended-protocol error: discard until Sync
        self.busy = False
        self.gone = False
        self._queue: asyncio.Queue[tuple[bytes, bytes] | Error | None] = asyncio.Queue()
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._out: list[bytes] = []
        self._out_size = 0
        self._plans: OrderedDict[str, ast.Statement | wc.WireCommand] = OrderedDict()

    # ---- lifetime ----------------------------------------------------------------

    async def serve(self) -> None:
        reader_task: asyncio.Task[None] | None = None
        try:
            if not await asyncio.wait_for(self._startup(), STARTUP_TIMEOUT):
                return
            self.backend.connections[self.pid] = self
            reader_task = asyncio.create_task(self._read_loop())
            await self._requests()
        except ProtocolViolation as exc:
            await self._fatal(exc.sqlstate, exc.message)
        except Error as exc:  # a login refused, a startup setting out of range
            await self._fatal(exc.sqlstate, exc.brief)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away (or never logged in): nothing to answer
        finally:
            self.gone = True
            if reader_task is not None:
                reader_task.cancel()
            self.backend.connections.pop(self.pid, None)
            if self.portals:
                await self.loop.run_in_executor(self.backend.executor, self._close_portals, True)
            self.writer.close()

    async def _fatal(self, sqlstate: str, text: str) -> None:
        try:
            self.writer.write(wire.error_response(sqlstate, text, severity="FATAL"))
            await asyncio.wait_for(self.writer.drain(), 5)
        except (ConnectionError, TimeoutError):
            pass

    def end(self, reason: Error) -> None:
        """End the connection with a FATAL ``reason`` once its current request is done."""
        self._queue.put_nowait(reason)

    def cancel(self) -> None:
        """Cancel what this connection is running (from the loop or any thread)."""
        if self.session is not None:
            self.session.cancel()

    # ---- startup and authentication --------------------------------------------------

    async def _startup(self) -> bool:
        for _ in range(3):  # SSLRequest and GSSENCRequest may come first
            code, body = await wire.read_startup(self.reader)
            if code in (wire.SSL_REQUEST, wire.GSSENC_REQUEST):
                self.writer.write(b"N")  # no encryption here: the client goes on in clear
                await self.writer.drain()
                continue
            if code == wire.CANCEL_REQUEST:
                pid, secret = struct.unpack("!ii", body[:8].ljust(8, b"\0"))
                self.backend.cancel(pid, secret)
                return False
            if code >> 16 != 3:
                raise FeatureNotSupported(
                    f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                    "the server supports 3.0"
                )
            return await self._login(wire.startup_parameters(body))
        raise ProtocolViolation("expected a startup message after the encryption requests")

    async def _login(self, params: dict[str, str]) -> bool:
        user = params.get("user")
        if not user:
            raise AuthenticationFailed("no user name specified in the startup packet")
        identity = await self._authenticate(user)
        if self.backend.closing or self.engine.closed:
            raise EngineClosed("the server is shutting down")
        for name, value in params.items():
            if name.lower() in wc.SETTINGS:
                wc.apply_setting(self.settings, name, value)
        self.session = Session(self.engine, identity)
        out = [wire.AUTH_OK]
        out += [wire.parameter_status(s.name, v) for s, v in self._reported().items()]
        out += [wire.backend_key_data(self.pid, self.secret), wire.ready_for_query(b"I")]
        self.writer.write(b"".join(out))
        await self.writer.drain()
        return True

    async def _authenticate(self, user: str) -> Any:
        authenticator = self.engine.authenticator
        if not authenticator.access_control:
            return authenticator.login(self.engine.snapshot, user, None)
        method = self.backend.auth_method
        if method == "password":
            password = await self._password_message(wire.AUTH_CLEARTEXT)
            return await self.loop.run_in_executor(
                self.backend.executor, authenticator.login, self.engine.snapshot, user, password
            )
        snap = self.engine.snapshot
        identity, stored = authenticator.credentials(snap, user)
        if identity is not None and stored is None:
            return identity  # a principal without a password needs none
        if method == "md5":
            _, verifier = authenticator.md5_credentials(snap, user)
            if identity is None or verifier is not None:
                return await self._md5(user, identity, verifier)
            # as in PostgreSQL: a password kept only as a SCRAM verifier is checked by SCRAM
        return await self._scram(user, identity, stored)

    async def _md5(self, user: str, identity: Any, verifier: str | None) -> Any:
        salt = secrets.token_bytes(4)
        answer = await self._password_message(wire.auth_md5(salt))
        expected = md5_response(verifier or "md5" + secrets.token_hex(16), salt)
        if identity is None or not hmac.compare_digest(answer.encode(), expected.encode()):
            raise AuthenticationFailed(f"password authentication failed for user {user!r}")
        return identity

    async def _password_message(self, request: bytes) -> str:
        self.writer.write(request)
        await self.writer.drain()
        kind, body = await wire.read_message(self.reader, wire.MAX_STARTUP)
        if kind != b"p":
            raise ProtocolViolation(f"expected a password message, got {kind!r}")
        return Body(body).cstring()

    async def _scram(self, user: str, identity: Any, stored: str | None) -> Any:
        if identity is not None and stored is not None:
            keys = scram_keys(stored)
        else:  # cannot log in: a verifier nobody's proof matches, with a stable salt
            keys = (self.backend.fake_salt(user), secrets.token_bytes(32), b"", 60_000)
        server = ScramServer(keys)
        failed = AuthenticationFailed(f"password authentication failed for user {user!r}")
        self.writer.write(wire.auth_sasl([MECHANISM]))
        await self.writer.drain()
        kind, body = await wire.read_message(self.reader, wire.MAX_STARTUP)
        fields = Body(body)
        if kind != b"p" or fields.cstring() != MECHANISM:
            raise ProtocolViolation(f"expected a SASLInitialResponse for {MECHANISM}")
        length = fields.int32()
        try:
            first = server.first(fields.raw(length).decode("utf-8"))
            self.writer.write(wire.auth_sasl_continue(first.encode()))
            await self.writer.drain()
            kind, body = await wire.read_message(self.reader, wire.MAX_STARTUP)
            if kind != b"p":
                raise ProtocolViolation(f"expected a SASLResponse, got {kind!r}")
            final = server.final(body.decode("utf-8"))
        except (ScramFailed, UnicodeDecodeError):
            raise failed from None
        if identity is None:
            raise failed
        self.writer.write(wire.auth_sasl_final(final.encode()))
        return identity

    def _reported(self) -> dict[wc.Setting, str]:
        return {s: self.setting(s.name) for s in wc.SETTINGS.values() if s.report}

    def setting(self, name: str) -> str:
        key = name.lower()
        if key == "is_superuser":
            return "on" if self.session is not None and self.session.identity.is_admin else "off"
        if key == "session_authorization":
            return self.session.user if self.session is not None else ""
        return self.settings.get(key, wc.SETTINGS[key].default)

    # ---- reading and dispatching requests -----------------------------------------------

    async def _read_loop(self) -> None:
        """Frame messages into the queue; the end of the connection cancels its query."""
        try:
            while True:
                await self._room.wait()
                kind, body = await wire.read_message(self.reader)
                self._queued_bytes += len(body) + 5
                if self._queued_bytes > INPUT_LIMIT:
                    self._room.clear()
                self._queue.put_nowait((kind, body))
                if kind == b"X":
                    return
        except ProtocolViolation as exc:
            self._queue.put_nowait(exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.gone = True
            self.cancel()  # whatever runs now ends at its next checkpoint
            self._queue.put_nowait(None)

    async def _requests(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            while not self._queue.empty() and isinstance(batch[-1], tuple):
                batch.append(self._queue.get_nowait())
            messages = [m for m in batch if isinstance(m, tuple)]
            self._queued_bytes -= sum(len(body) + 5 for _, body in messages)
            if self._queued_bytes <= INPUT_LIMIT:
                self._room.set()
            if messages:
                self.busy = True
                try:
                    out = await self.loop.run_in_executor(
                        self.backend.executor, self._process, messages
                    )
                finally:
                    self.busy = False
                self.writer.write(out)
                await self.writer.drain()
            end = batch[-1]
            if isinstance(end, Error):
                raise end
            if end is None or (isinstance(end, tuple) and end[0] == b"X") or self.gone:
                return
            if self.backend.closing:
                raise EngineClosed("terminating connection: the server is shutting down")

    # ---- on an engine thread ---------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= OUTPUT_CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Hand what is buffered to the loop and wait until the socket took it."""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if self.gone:
            raise ConnectionResetError("the client is gone")
        future = asyncio.run_coroutine_threadsafe(self._write(data), self.loop)
        future.result()

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def _process(self, messages: list[tuple[bytes, bytes]]) -> bytes:
        """Handle a burst of messages; what is left to send goes back to the loop."""
        for kind, body in messages:
            if kind == b"X":
                break
            if self.skipping and kind != b"S":
                continue
            handler = _HANDLERS.get(kind)
            if handler is None:
                self._error(ProtocolViolation(f"unsupported frontend message type {kind!r}"))
                continue
            try:
                handler(self, Body(body))
            except ConnectionError:
                self.gone = True
                break
            except Error as exc:
                self._error(exc, extended=kind != b"Q")
            except Exception as exc:  # a bug: report it, keep serving
                log.exception("internal error handling %r", kind)
                self._error(InternalError(f"internal error: {exc}"), extended=kind != b"Q")
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return data

    def _error(self, exc: Error, *, extended: bool = False, position: int = 0) -> None:
        if self.tx == b"T":
            self.tx = b"E"
        if extended:
            self.skipping = True
        self.send(wire.error_response(exc.sqlstate, exc.brief, position or _position(exc)))

    # ---- simple query ------------------------------------------------------------------

    def _query(self, body: Body) -> None:
        text = body.cstring()
        assert self.session is not None
        self.session.clear_cancel()
        try:
            plans = [self._plan(piece, offset) for offset, piece in split_statements(text)]
            if not plans:
                self.send(wire.EMPTY_QUERY)
            for plan in plans:
                self._run(plan, Portal(plan), None, describe=True)
        except Error as exc:
            self._error(exc)
        if self.tx == b"I":
            self._close_portals(False)
        self.send(wire.ready_for_query(self.tx))

    def _plan(
        self, text: str, offset: int = 0, mapping: Callable[[int], int] | None = None
    ) -> Plan:
        """What one statement's text is: a connection statement, the engine's, or empty.
        Plans are immutable, so a text seen lately is not parsed again."""
        plan = self._plans.get(text)
        if plan is not None:
            self._plans.move_to_end(text)
            return plan
        plan = self._parse_text(text, offset, mapping)
        if plan is not None:
            self._plans[text] = plan
            if len(self._plans) > PLAN_CACHE:
                self._plans.popitem(last=False)
        return plan

    def _parse_text(self, text: str, offset: int, mapping: Callable[[int], int] | None) -> Plan:
        try:
            command = wc.recognize(text)
            if command is not None:
                return command
            if not text.strip(" \t\r\n;"):
                return None
            return parse_one(text)
        except SqlSyntaxError as exc:
            at = mapping(exc.position) if mapping else exc.position
            exc.position = offset + at
            raise

    def _run(self, plan: Plan, portal: Portal, max_rows: int | None, *, describe: bool) -> None:
        """Execute ``plan`` in ``portal``, sending its rows and its command tag."""
        assert self.session is not None
        if plan is None:
            self.send(wire.EMPTY_QUERY)
            return
        if self.tx == b"E" and not (
            isinstance(plan, wc.Transaction) and plan.action in ("commit", "rollback")
        ):
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        if isinstance(plan, wc.Fetch):
            self._fetch(plan, portal.formats, describe)
            return
        if isinstance(plan, wc.WIRE_COMMANDS):
            result = self._command(plan)
        else:
            if portal.cursor is None and max_rows and isinstance(plan, ast.Select):
                portal.cursor = self.session.open_cursor(plan)
            if portal.cursor is not None:
                self._page(portal, max_rows, describe)
                return
            if portal.executed:
                self.send(wire.command_complete("SELECT 0"))
                return
            portal.executed = True
            if isinstance(plan, ast.Select) and plan.source is not None:
                self._stream(plan, portal, describe)
                return
            result = self.session.run(plan)
            self._after_engine_statement(plan)
        if result.columns:
            formats = _formats(portal.formats, len(result.columns))
            if describe:
                self.send(self._row_description(result.columns, result.types, formats))
            self._rows(result.rows, result.types, formats)
        for notice in result.notices:
            self.send(wire.notice_response(notice))
        self.send(wire.command_complete(result.status))

    def _stream(self, stmt: ast.Select, portal: Portal, describe: bool) -> None:
        """A whole SELECT streamed STREAM_ROWS at a time: rows are made as the client
        reads them (a slow reader holds back its own scan, and only STREAM_ROWS
        rows plus a chunk of bytes wait in memory)."""
        assert self.session is not None
        cursor = self.session.open_cursor(stmt, paging=False)
        try:
            formats = _formats(portal.formats, len(cursor.columns))
            if describe:
                self.send(self._row_description(cursor.columns, cursor.types, formats))
            total = 0
            while not cursor.done:
                rows = cursor.fetch(STREAM_ROWS)
                total += len(rows)
                self._rows(rows, cursor.types, formats)
        finally:
            cursor.close()
        self.send(wire.command_complete(f"SELECT {total}"))

    def _page(self, portal: Portal, max_rows: int | None, describe: bool) -> None:
        cursor = portal.cursor
        assert cursor is not None
        formats = _formats(portal.formats, len(cursor.columns))
        if describe:
            self.send(self._row_description(cursor.columns, cursor.types, formats))
        if not cursor.columns and cursor.status:
            self.send(wire.command_complete(cursor.status))
            return
        rows = self._fetch_page(portal, max_rows or None)
        self._rows(rows, cursor.types, formats)
        if cursor.done:
            self.send(wire.command_complete(f"SELECT {len(rows)}"))
        else:
            self.send(wire.PORTAL_SUSPENDED)

    def _fetch_page(self, portal: Portal, count: int | None) -> list[tuple[Any, ...]]:
        """A page of the portal's cursor. An error (a resume the gate refused, a
        cancel, a timeout) ends the cursor, and the connection stays usable."""
        assert portal.cursor is not None
        try:
            return portal.cursor.fetch(count)
        except Error:
            for name, held in list(self.portals.items()):
                if held is portal:
                    del self.portals[name]
            portal.close()
            raise

    def _after_engine_statement(self, stmt: ast.Statement) -> None:
        if isinstance(stmt, ast.ResetAll | ast.DiscardAll):
            before = self._reported()
            self.settings.clear()
            self._report_changes(before)
        if isinstance(stmt, ast.DiscardAll):
            self._close_portals(True)
            self.statements.clear()

    # ---- rows ----------------------------------------------------------------------

    def _row_description(self, columns: Sequence[str], kinds: Any, formats: list[int]) -> bytes:
        fields = []
        for name, kind, fmt in zip(columns, kinds, formats, strict=True):
            oid, size = types.oid_of(kind)
            fields.append((name, oid, size, fmt))
        return wire.row_description(fields)

    def _rows(self, rows: list[tuple[Any, ...]], kinds: Any, formats: list[int]) -> None:
        oids = [types.oid_of(k)[0] for k in kinds]
        zone = self.setting("TimeZone")
        text = types.encode_text
        for row in rows:
            values: list[bytes | None] = []
            for value, oid, fmt in zip(row, oids, formats, strict=True):
                if value is None:
                    values.append(None)
                elif fmt == types.BINARY_FORMAT:
                    values.append(types.encode_binary(value, oid))
                elif isinstance(value, datetime) and zone != "UTC":
                    values.append(_local_time(value, zone))
                else:
                    values.append(text(value))
            self.send(wire.data_row(values))

    # ---- connection statements ------------------------------------------------------------

    def _command(self, plan: wc.WireCommand) -> Result:
        match plan:
            case wc.Transaction(action="begin"):
                if self.tx != b"I":
                    return _with_notice("BEGIN", "there is already a transaction in progress")
                self.tx = b"T"
                return Result.command("BEGIN")
            case wc.Transaction(action=action):
                tag = "ROLLBACK" if action == "rollback" or self.tx == b"E" else "COMMIT"
                was = self.tx
                self.tx = b"I"
                self._close_portals(False)
                if was == b"I":
                    return _with_notice(tag, "there is no transaction in progress")
                return Result.command(tag)
            case wc.SetParameter(name=name, value=value):
                before = self._reported()
                wc.apply_setting(self.settings, name, value)
                self._report_changes(before)
                return Result.command("RESET" if value is None else "SET")
            case wc.ShowParameter(name="all"):
                rows = [(s.name, self.setting(s.name), s.description) for s in wc.SETTINGS.values()]
                return Result.table(["name", "setting", "description"], rows, ["text"] * 3)
            case wc.ShowParameter(name=name):
                setting = wc.find_setting(name)
                return Result.table([name.lower()], [(self.setting(setting.name),)], ["text"])
            case wc.Declare():
                return self._declare(plan)
            case wc.CloseCursor(name=None):
                self._close_portals(True)
                return Result.command("CLOSE CURSOR ALL")
            case wc.CloseCursor(name=str() as name):
                portal = self.portals.pop(name, None)
                if portal is None:
                    raise _no_cursor(name)
                portal.close()
                return Result.command("CLOSE CURSOR")
            case wc.CursorExists(name=name):
                return Result.table(["?column?"], [(1,)] * (name in self.portals), ["int"])
            case wc.Deallocate(name=None):
                self.statements.clear()
                return Result.command("DEALLOCATE ALL")
            case wc.Deallocate(name=str() as name):
                if self.statements.pop(name, None) is None:
                    raise wc.UndefinedObject(
                        f'prepared statement "{name}" does not exist', sqlstate="26000"
                    )
                return Result.command("DEALLOCATE")
        raise InternalError(f"unknown connection statement {plan!r}")

    def _report_changes(self, before: dict[wc.Setting, str]) -> None:
        for setting, value in self._reported().items():
            if before.get(setting) != value:
                self.send(wire.parameter_status(setting.name, value))

    def _declare(self, plan: wc.Declare) -> Result:
        assert self.session is not None
        if not plan.hold and self.tx != b"T":
            raise NoActiveTransaction("DECLARE CURSOR can only be used in transaction blocks")
        if plan.name in self.portals:
            raise DuplicateObject(f'cursor "{plan.name}" already exists', sqlstate="42P03")
        stmt = self._plan(plan.query, plan.offset)
        if not isinstance(stmt, ast.Select):
            raise SqlSyntaxError(
                "DECLARE ... CURSOR FOR takes a SELECT", line=1, column=plan.offset + 1
            )
        cursor = self.session.open_cursor(stmt)
        self.portals[plan.name] = Portal(stmt, cursor=cursor, hold=plan.hold, binary=plan.binary)
        return Result.command("DECLARE CURSOR")

    def _fetch(self, plan: wc.Fetch, codes: list[int], describe: bool) -> None:
        portal = self.portals.get(plan.name)
        if portal is None or portal.cursor is None:
            raise _no_cursor(plan.name)
        cursor = portal.cursor
        rows = self._fetch_page(portal, plan.count)
        verb = "MOVE" if plan.move else "FETCH"
        if not plan.move:
            if not codes and portal.binary:
                codes = [types.BINARY_FORMAT]
            formats = _formats(codes, len(cursor.columns))
            if describe:
                self.send(self._row_description(cursor.columns, cursor.types, formats))
            self._rows(rows, cursor.types, formats)
        self.send(wire.command_complete(f"{verb} {len(rows)}"))

    def _close_portals(self, everything: bool) -> None:
        """Close portals: all of them, or those a transaction's end closes (all
        but WITH HOLD cursors). Each gives back what its query held."""
        for name, portal in list(self.portals.items()):
            if everything or not portal.hold:
                del self.portals[name]
                try:
                    portal.close()
                except Error as exc:
                    log.warning("closing cursor %r: %s", name, exc)

    # ---- extended protocol ---------------------------------------------------------------

    def _parse(self, body: Body) -> None:
        name, text = body.cstring(), body.cstring()
        oids = [body.int32() for _ in range(body.int16())]
        if name and name in self.statements:
            raise DuplicateObject(f'prepared statement "{name}" already exists')
        pieces = list(split_statements(text))
        if len(pieces) > 1:
            raise SqlSyntaxError(
                "cannot insert multiple commands into a prepared statement",
                line=1,
                column=1,
                position=pieces[1][0],
            )
        prepared = Prepared(text, oids)
        if not placeholders(text):  # parse once, now: every Bind reuses the plan
            prepared.plan = self._plan(text)
            prepared.planned = True
        self.statements[name] = prepared
        self.send(wire.PARSE_COMPLETE)

    def _bind(self, body: Body) -> None:
        portal_name, statement_name = body.cstring(), body.cstring()
        param_formats = [body.int16() for _ in range(body.int16())]
        raw = []
        for _ in range(body.int16()):
            length = body.int32()
            raw.append(None if length == -1 else body.raw(length))
        result_formats = [body.int16() for _ in range(body.int16())]
        prepared = self.statements.get(statement_name)
        if prepared is None:
            raise wc.UndefinedObject(
                f'prepared statement "{statement_name}" does not exist', sqlstate="26000"
            )
        if portal_name and portal_name in self.portals:
            raise DuplicateObject(f'portal "{portal_name}" already exists', sqlstate="42P03")
        formats = _formats(param_formats, len(raw), "parameter")
        oids = prepared.oids + [0] * (len(raw) - len(prepared.oids))
        values = [
            types.decode_parameter(data, oid, fmt, i + 1)
            for i, (data, oid, fmt) in enumerate(zip(raw, oids, formats, strict=False))
        ]
        if prepared.planned:
            if values:
                raise ProtocolViolation(
                    f"bind message supplies {len(values)} parameters, "
                    "but the prepared statement requires 0"
                )
            plan = prepared.plan
        else:
            bound, original = bind(prepared.text, values)
            plan = self._plan(bound, 0, original)
        old = self.portals.pop(portal_name, None)
        if old is not None:
            old.close()
        self.portals[portal_name] = Portal(plan, result_formats)
        self.send(wire.BIND_COMPLETE)

    def _describe(self, body: Body) -> None:
        what, name = body.byte(), body.cstring()
        if what == b"S":
            prepared = self.statements.get(name)
            if prepared is None:
                raise wc.UndefinedObject(
                    f'prepared statement "{name}" does not exist', sqlstate="26000"
                )
            count = max(placeholders(prepared.text), len(prepared.oids))
            oids = prepared.oids + [types.TEXT] * (count - len(prepared.oids))
            self.send(wire.parameter_description([o or types.TEXT for o in oids]))
            plan = prepared.plan if prepared.planned else self._typed_plan(prepared.text, count)
            self._describe_plan(Portal(plan), [])
        elif what == b"P":
            portal = self.portals.get(name)
            if portal is None:
                raise _no_cursor(name)
            self._describe_plan(portal, portal.formats)
        else:
            raise ProtocolViolation(f"invalid DESCRIBE message subtype {what!r}")

    def _typed_plan(self, text: str, count: int) -> Plan:
        """A statement with placeholders planned for Describe before any value is
        bound: with NULL for every parameter, else 0 (``long_sequence($1)`` needs a
        number); None (NoData) when neither can be typed."""
        assert self.session is not None
        for value in (None, 0):
            try:
                bound, _ = bind(text, [value] * count)
                plan = self._parse_text(bound, 0, None)
                if isinstance(plan, ast.Select):
                    self.session.describe(plan)  # raises when it cannot be typed
                return plan
            except Error:
                continue
        return None

    def _describe_plan(self, portal: Portal, codes: list[int]) -> None:
        """RowDescription of what the portal returns, or NoData."""
        assert self.session is not None
        plan = portal.plan
        shape: tuple[Any, Any] | None = None
        if portal.cursor is not None:
            shape = (portal.cursor.columns, portal.cursor.types)
        elif isinstance(plan, ast.Select):
            shape = self.session.describe(plan)
        elif isinstance(plan, ast.Show):  # read-only: its rows are computed now
            portal.cursor = self.session.open_cursor(plan)
            shape = (portal.cursor.columns, portal.cursor.types)
        elif isinstance(plan, wc.ShowParameter):
            shape = self._command(plan).columns, ["text"] * (3 if plan.name == "all" else 1)
        elif isinstance(plan, wc.Fetch) and not plan.move:
            target = self.portals.get(plan.name)
            if target is None or target.cursor is None:
                raise _no_cursor(plan.name)
            shape = (target.cursor.columns, target.cursor.types)
        if not shape or not shape[0]:
            self.send(wire.NO_DATA)
            return
        self.send(self._row_description(shape[0], shape[1], _formats(codes, len(shape[0]))))

    def _execute(self, body: Body) -> None:
        name, max_rows = body.cstring(), body.int32()
        portal = self.portals.get(name)
        if portal is None:
            raise _no_cursor(name)
        assert self.session is not None
        self.session.clear_cancel()
        self._run(portal.plan, portal, max(0, max_rows), describe=False)

    def _close(self, body: Body) -> None:
        what, name = body.byte(), body.cstring()
        if what == b"S":
            self.statements.pop(name, None)
        elif what == b"P":
            portal = self.portals.pop(name, None)
            if portal is not None:
                portal.close()
        else:
            raise ProtocolViolation(f"invalid CLOSE message subtype {what!r}")
        self.send(wire.CLOSE_COMPLETE)

    def _sync(self, body: Body) -> None:
        self.skipping = False
        if self.tx == b"I":  # the implicit transaction ends: its portals close
            self._close_portals(False)
        self.send(wire.ready_for_query(self.tx))

    def _flush_message(self, body: Body) -> None:
        self._flush()

    def _function_call(self, body: Body) -> None:
        raise FeatureNotSupported("the fast-path function call interface is not supported")


_HANDLERS: Final[dict[bytes, Callable[[Connection, Body], None]]] = {
    b"Q": Connection._query,
    b"P": Connection._parse,
    b"B": Connection._bind,
    b"D": Connection._describe,
    b"E": Connection._execute,
    b"C": Connection._close,
    b"S": Connection._sync,
    b"H": Connection._flush_message,
    b"F": Connection._function_call,
}


def _no_cursor(name: str) -> Error:
    return wc.UndefinedObject(f'cursor "{name}" does not exist', sqlstate="34000")


def _with_notice(tag: str, notice: str) -> Result:
    return Result(status=tag, notices=[notice])


def _position(exc: Error) -> int:
    return exc.position + 1 if isinstance(exc, SqlSyntaxError) else 0


def _local_time(value: datetime, zone: str) -> bytes:
    local = value.astimezone(ZoneInfo(zone))
    offset = local.strftime("%z")
    text = local.replace(tzinfo=None).isoformat(sep=" ")
    return f"{text}{offset[:3]}{':' + offset[3:] if offset[3:] != '00' else ''}".encode()
