"""HTTP (aiohttp): ``/execute``, QuestDB's ``/exec``, ``/metrics``, ``/health``, and
the live page: ``/`` and its ``/api/state`` (``dashboard.py``).

``GET|POST /execute?query=...&resource_group=...`` runs the statements of
``query`` in a session of their own (the login of HTTP basic auth when
access control is on) and answers SPEC §13's JSON: the last statement's
``columns`` (name and type), ``rows``, ``status``, ``group`` and
``timings``; an error answers ``{"error": {"sqlstate", "message",
"position"}}`` with a status that fits it. ``/exec`` answers the same query
in QuestDB's shape (``query``, ``columns``, ``dataset``, ``count``), so
QuestDB's HTTP clients work. A client that disconnects cancels its query.

The event loop only moves bytes. A request's statements run on a request
thread (the admin's reserve for RESOURCE GROUP ADMIN principals), which
also encodes the JSON: a result smaller than ``STREAM_CHUNK`` goes out as
one response, a larger one is streamed (chunked transfer encoding) a chunk
at a time, each chunk made only once the one before was written. So at most
``STREAM_ROWS`` rows and one chunk of bytes wait in memory per request, the
scan's morsels stay charged to the query's tracked memory until their rows
are sent, and a slow reader slows only its own query. A thread waiting for
a write is bounded by the query's own deadline and cancel, and by
``write_timeout`` (then the query fails as usual and the connection is
closed). An error after the first chunk went out cannot change the status
(200): the document ends with ``"error": {...}`` instead of its status.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import concurrent.futures
import hmac
import json
import logging
import math
import secrets
import time
import urllib.parse
from concurrent.futures import Executor
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from aiohttp import http_exceptions, web

from resgroups.access import Identity
from resgroups.errors import (
    AdmissionRejected,
    AuthenticationFailed,
    Error,
    PermissionDenied,
    QueryCancelled,
    QueryTimeout,
    QueueTimeout,
    SqlSyntaxError,
)
from resgroups.exec import executor as builtin
from resgroups.result import Result
from resgroups.server import dashboard
from resgroups.server.commands import client_tags
from resgroups.server.limits import (
    ConnectionSlots,
    LoginThrottle,
    RequestThreads,
    may_be_reserved,
    reserved_for,
)
from resgroups.session import Session
from resgroups.sql import ast
from resgroups.sql.parser import parse_script

if TYPE_CHECKING:
    from resgroups.engine import Engine
    from resgroups.query import Query

log = logging.getLogger("resgroups.server")

LOGIN_CACHE_SECONDS: Final = 60.0  # a checked password is not hashed again for this long
MAX_QUERY_BYTES: Final = 1024 * 1024
KEEPALIVE_TIMEOUT: Final = 15.0  # an idle connection, or one still sending its headers, closes
BODY_TIMEOUT: Final = 15.0  # a request body must arrive within this once its headers did
WRITE_TIMEOUT: Final = 30.0  # a client that reads nothing of its response for this long is cut
STREAM_CHUNK: Final = 64 * 1024  # bytes of JSON written at a time (a smaller result: one response)
STREAM_ROWS: Final = 1000  # rows fetched from a cursor at a time
_WAIT_SLICE: Final = 0.1  # how often a thread waiting for a write looks at its query's deadline
_GRACE: Final = 1.0  # after the query ended, how long its pending write may still take
_QUESTDB_TYPES: Final = {
    "int": "LONG",
    "float": "DOUBLE",
    "text": "VARCHAR",
    "bool": "BOOLEAN",
    "timestamptz": "TIMESTAMP",
    "numeric": "DOUBLE",
}


def status_of(exc: Error) -> int:
    """The HTTP status an error answers with."""
    if isinstance(exc, SqlSyntaxError):
        return 400
    if isinstance(exc, AuthenticationFailed):
        return 401
    if isinstance(exc, AdmissionRejected):
        return 429
    if isinstance(exc, QueueTimeout | QueryTimeout):
        return 504
    cls = exc.sqlstate[:2]
    return {
        "42": 403 if exc.sqlstate == "42501" else 400,
        "22": 400,
        "0A": 501,
        "25": 409,
        "55": 409,
        "53": 503,
        "57": 409 if exc.sqlstate == "57014" else 503,
        "08": 503,
        "XX": 500,
    }.get(cls, 400)


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def _dumps(body: Any) -> str:
    return json.dumps(body, default=_json_value, allow_nan=False)


class _QuietMalformed(logging.Filter):
    """aiohttp answers a request it cannot parse with 400 and logs its traceback:
    garbage sent by a client is not the server's error, so it is not logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, http_exceptions.HttpProcessingError)


protocol_log = logging.getLogger("resgroups.server.http")  # aiohttp's, for the AppRunner
protocol_log.addFilter(_QuietMalformed())


def _encode(value: Any) -> str:
    """``value`` as compact JSON; non-finite floats as QuestDB writes them."""
    try:
        return json.dumps(value, default=_json_value, allow_nan=False, separators=(",", ":"))
    except ValueError:  # NaN or an infinity somewhere: only then walk the values
        return json.dumps(_finite(value), default=_json_value, separators=(",", ":"))


def _finite(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return _json_value(value)


class HttpFront:
    """The aiohttp application over one engine.

    ``executor`` runs the blocking work (logins, queries, encoding); a
    :class:`RequestThreads` gives RESOURCE GROUP ADMIN principals its admin
    reserve. ``slots`` counts each running request as a connection (one
    session each) against ``serve --max-connections``; ``throttle`` refuses
    logins from an address after its failures; with access control on,
    ``/metrics`` needs an admin's login unless ``metrics_open``.
    """

    def __init__(
        self,
        engine: Engine,
        executor: Executor,
        history: dashboard.History | None = None,
        *,
        slots: ConnectionSlots | None = None,
        throttle: LoginThrottle | None = None,
        metrics_open: bool = False,
        write_timeout: float = WRITE_TIMEOUT,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.engine = engine
        self.executor = executor
        self.history = history if history is not None else dashboard.History()
        self.slots = slots if slots is not None else ConnectionSlots(None)
        self.throttle = throttle if throttle is not None else LoginThrottle()
        self.metrics_open = metrics_open
        self.write_timeout = write_timeout
        self.body_timeout = body_timeout
        self.closing = False
        self._logins: dict[tuple[str, bytes], tuple[float, Identity]] = {}
        # logins being checked now: their outcome, for the same login arriving meanwhile
        self._checking: dict[
            tuple[str, bytes], asyncio.Future[Identity | AuthenticationFailed]
        ] = {}
        self._key = secrets.token_bytes(32)
        self.app = web.Application(client_max_size=MAX_QUERY_BYTES)
        self.app.add_routes(
            [
                web.get("/execute", self.execute),
                web.post("/execute", self.execute),
                web.get("/exec", self.exec_questdb),
                web.post("/exec", self.exec_questdb),
                web.get("/metrics", self.metrics),
                web.get("/health", self.health),
                web.get("/", self.page),
                web.get("/api/state", self.api_state),
                web.get("/static/{name}", dashboard.serve_static),
                web.get("/favicon.ico", dashboard.favicon),
            ]
        )

    def _threads(self, admin: bool) -> Executor:
        executor = self.executor
        return executor.for_admin(admin) if isinstance(executor, RequestThreads) else executor

    def _reserved(self, request: web.Request, session: Session) -> bool:
        """Does this request get the admin reserve? With access control off a
        request without credentials is the admin's session but not the admin
        (anyone's): the reserve is for one that names the admin."""
        if not self.engine.access_control and "Authorization" not in request.headers:
            return False
        return reserved_for(self.engine, session.identity)

    # ---- sessions ----------------------------------------------------------------

    def _credentials(self, request: web.Request) -> tuple[str, str | None]:
        """The basic-auth login the request names (the admin, without a password,
        when it names none and none is needed)."""
        header = request.headers.get("Authorization", "")
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise AuthenticationFailed("malformed basic authorization header") from None
            user, _, password = decoded.partition(":")
            return user, password
        if self.engine.access_control and not self.engine.authenticator.open_admin:
            # (an admin without a password would pass with any: no credentials is it)
            raise AuthenticationFailed("authentication required: send HTTP basic auth")
        return self.engine.admin_user, None

    async def _login(self, request: web.Request) -> Session:
        """A session for the request's login. A password is hashed on a request
        thread (the admin's reserve for a name that would get it), once per
        ``LOGIN_CACHE_SECONDS``, and once for identical logins in flight
        together; an address with too many recent failures is refused before
        any hash (429)."""
        engine = self.engine
        user, password = self._credentials(request)
        if not engine.access_control:
            return engine.connect(user=user, password=password)  # no password to check
        key = (user, hmac.digest(self._key, (password or "").encode("utf-8", "replace"), "sha256"))
        cached = self._logins.get(key)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return Session(engine, cached[1])
        address = request.remote or ""
        wait = self.throttle.retry_after(address)
        if wait:
            raise _Throttled(wait)
        try:
            identity = await self._checked(key, user, password)
        except AuthenticationFailed:
            self.throttle.failed(address)
            raise
        self.throttle.succeeded(address)
        return Session(engine, identity)

    async def _checked(self, key: tuple[str, bytes], user: str, password: str | None) -> Identity:
        """The identity ``user`` logs in as with ``password``, hashed once for all
        the requests that present the same credentials while it runs (keep-alive
        clients that open together with one login cost one hash, not one each);
        the answer is remembered for ``LOGIN_CACHE_SECONDS``."""
        while (pending := self._checking.get(key)) is not None:
            try:
                outcome = await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and (task is None or not task.cancelling()):
                    continue  # the request that was checking went away: check again
                raise
            if isinstance(outcome, AuthenticationFailed):
                raise AuthenticationFailed(outcome.message)
            return outcome
        loop = asyncio.get_running_loop()
        pending = self._checking[key] = loop.create_future()
        threads = self._threads(may_be_reserved(self.engine, user))
        try:
            session = await loop.run_in_executor(threads, _connect, self.engine, user, password)
        except AuthenticationFailed as exc:
            pending.set_result(exc)
            raise
        except BaseException:
            pending.cancel()
            raise
        finally:
            del self._checking[key]
        pending.set_result(session.identity)
        if len(self._logins) > 10_000:
            self._logins.clear()
        self._logins[key] = (time.monotonic() + LOGIN_CACHE_SECONDS, session.identity)
        return session.identity

    async def _params(self, request: web.Request) -> dict[str, str]:
        """The request's parameters: its query string, and a POSTed form, JSON
        object or raw SQL. Anything malformed is a 400 (_BadRequest)."""
        params = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            try:
                async with asyncio.timeout(self.body_timeout):
                    raw = await request.read()
            except TimeoutError:
                wait = f"{self.body_timeout:g} s"
                raise _SlowBody(f"the request body did not arrive within {wait}") from None
            except web.HTTPRequestEntityTooLarge:
                too_large = f"the request body is larger than {MAX_QUERY_BYTES} bytes"
                raise _TooLarge(too_large) from None
            charset = request.charset or "utf-8"
            try:
                codecs.lookup(charset)
            except LookupError:
                raise _BadRequest(f"unknown charset {charset[:40]!r} in Content-Type") from None
            try:
                text = raw.decode(charset)
            except (UnicodeDecodeError, ValueError):
                raise _BadRequest(f"the request body is not valid {charset[:40]}") from None
            if request.content_type == "application/json":
                try:
                    body = json.loads(text)
                except (ValueError, RecursionError):
                    raise _BadRequest("the request body is not valid JSON") from None
                if not isinstance(body, dict):
                    raise _BadRequest('the JSON body must be an object like {"query": "..."}')
                for name in ("query", "resource_group", "application", "tags"):
                    value = body.get(name)
                    if value is not None and not isinstance(value, str):
                        raise _BadRequest(f'"{name}" in the JSON body must be a string')
                params.update({k: v for k, v in body.items() if isinstance(v, str)})
            else:  # a form with query=..., or the SQL itself (curl -d 'SELECT 1')
                form = urllib.parse.parse_qs(text) if "query=" in text else {}
                if request.content_type == "application/x-www-form-urlencoded" and form:
                    params.update({k: v[-1] for k, v in form.items()})
                elif text.strip():
                    params.setdefault("query", text)
        if not params.get("query", "").strip():
            raise _BadRequest("missing query: pass ?query=... (or POST it)")
        return params

    # ---- statements, on a request thread -----------------------------------------------

    async def _answer(self, request: web.Request, shape: _Shape) -> web.StreamResponse:
        """Run the request's statements and answer in ``shape``."""
        loop = asyncio.get_running_loop()
        try:
            params = await self._params(request)
            shape.query = params["query"]
            if self.closing:
                raise _Unavailable("the server is shutting down")
            session = await self._login(request)
        except Error as exc:
            return shape.error_response(exc)
        except _HttpError as exc:
            return shape.plain_response(exc)
        admin = self._reserved(request, session)
        if not self.slots.take(admin=admin):
            return shape.plain_response(_Full(self.slots.refusal(admin=admin)))
        reply = _Reply(request, loop, self.write_timeout)
        try:
            future = loop.run_in_executor(
                self._threads(admin), self._run, session, params, shape, reply
            )
        except RuntimeError:  # the request threads are shut down: the server is closing
            self.slots.give_back()
            return shape.plain_response(_Unavailable("the server is shutting down"))
        future.add_done_callback(lambda _: self.slots.give_back())
        try:
            status = await asyncio.shield(future)
        except asyncio.CancelledError:  # the client went away: stop its query
            session.cancel()
            raise
        except Exception:
            if reply.broken or reply.stream is not None:  # the client stopped reading or left
                reply.abort()
                return reply.stream or web.Response(status=500)  # (never reaches it)
            log.exception("HTTP %s: internal error", request.path)
            return shape.error_response(Error("internal error"))
        return await reply.finish(status)

    def _run(self, session: Session, params: dict[str, str], shape: _Shape, reply: _Reply) -> int:
        """The statements of one request, the last one's answer written to
        ``reply`` as it is made; the HTTP status."""
        try:
            session.clear_cancel()
            # what selectors route on (SPEC §15): the request's own, else none
            session.set_application(params.get("application") or None)
            session.set_tags(client_tags(params.get("tags", "")))
            group = params.get("resource_group")
            if group:
                session.execute("SET RESOURCE GROUP " + '"' + group.replace('"', '""') + '"')
            statements = parse_script(params["query"])
            for stmt in statements[:-1]:
                _check_cancel(session)
                _discard(session, stmt)
            _check_cancel(session)
            if not statements:
                reply.add(shape.whole(Result.command("")))
            elif isinstance(last := statements[-1], ast.Select) and _streams(last):
                self._stream(session, last, shape, reply)
            else:
                reply.add(shape.whole(session.run(last)))
            return 200
        except Error as exc:
            if reply.broken:
                raise  # the client stopped reading: the connection is cut
            if reply.stream is None:
                reply.discard()
                reply.add(shape.error_body(exc))
                return status_of(exc)
            reply.add(shape.error_tail(exc))
            return 200

    def _stream(self, session: Session, stmt: ast.Select, shape: _Shape, reply: _Reply) -> None:
        cursor = session.open_cursor(stmt, paging=False)
        assert isinstance(cursor, builtin.ScanCursor)
        reply.query = cursor.query
        try:
            reply.add(shape.head(cursor.columns, cursor.types))
            count = 0
            while not cursor.done:
                rows = cursor.fetch(STREAM_ROWS)
                # encoding runs on the query's thread, on its CPU: a checkpoint per
                # page lets the scheduler slice it (a scan's own checkpoints come
                # once per batch of morsels, millions of rows apart)
                cursor.query.checkpoint()
                if rows:
                    reply.add(("," if count else "").encode() + _encode(rows)[1:-1].encode())
                    count += len(rows)
            tail = shape.tail(f"SELECT {count}", cursor.group, cursor.timings(), count)
        finally:
            reply.query = None
            cursor.close()
        reply.add(tail)

    # ---- handlers ------------------------------------------------------------------

    async def execute(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _Execute())

    async def exec_questdb(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _QuestDB(request.query.get("query", "")))

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        """The Prometheus text; with access control on, for a RESOURCE GROUP ADMIN's
        login (it shows every group's activity) unless ``metrics_open``."""
        try:
            if self.engine.access_control and not self.metrics_open:
                session = await self._login(request)
                if not reserved_for(self.engine, session.identity):
                    raise PermissionDenied(
                        f"Access denied for {session.identity.login_name} "
                        "[RESOURCE GROUP ADMIN]: /metrics shows every group's activity"
                    )
                admin = True
            else:  # open: the reserve only for a request that names the admin
                admin = "Authorization" in request.headers and self._reserved(
                    request, await self._login(request)
                )
        except Error as exc:
            return _error(exc)
        except _HttpError as exc:
            return _plain_error(exc)
        text = await asyncio.get_running_loop().run_in_executor(
            self._threads(admin), self.engine.metrics_text
        )
        return web.Response(
            text=text, content_type="text/plain", charset="utf-8", headers={"X-Format": "0.0.4"}
        )

    async def health(self, request: web.Request) -> web.Response:
        engine = self.engine
        up = not engine.closed and not self.closing
        lag = engine.catalog_lag
        body = {
            "status": "ok" if up else "closing",
            "role": engine.role,
            "catalog_version": engine.catalog_version,
            "catalog_lag_records": lag.records,
            "catalog_lag_seconds": lag.seconds,
        }
        return web.json_response(body, status=200 if up else 503, dumps=_dumps)

    async def page(self, request: web.Request) -> web.StreamResponse:
        """The live page, for the same login as /execute."""
        try:
            await self._login(request)
        except Error as exc:
            return _error(exc)
        except _HttpError as exc:
            return _plain_error(exc)
        return await dashboard.serve_static_named("index.html")

    async def api_state(self, request: web.Request) -> web.Response:
        """What the page shows, as JSON: groups, their history, queries."""
        loop = asyncio.get_running_loop()
        try:
            session = await self._login(request)
            admin = self._reserved(request, session)
            body = await loop.run_in_executor(
                self._threads(admin), dashboard.state, session, self.history
            )
        except Error as exc:
            return _error(exc)
        except _HttpError as exc:
            return _plain_error(exc)
        return web.json_response(body, dumps=_dumps, headers={"Cache-Control": "no-store"})


_Checked = Identity | AuthenticationFailed  # a login's outcome, shared by identical ones


def _connect(engine: Engine, user: str, password: str | None) -> Session:
    return engine.connect(user=user, password=password)


def _check_cancel(session: Session) -> None:
    if session.cancel_requested:
        raise QueryCancelled("canceling statement due to user request")


def _streams(stmt: ast.Statement) -> bool:
    """Is ``stmt`` a scan of the executor's sources (rows made as they are read)?"""
    return isinstance(stmt, ast.Select) and builtin.is_executor_source(stmt)


def _discard(session: Session, stmt: ast.Statement) -> None:
    """Run a statement of the script before the last one: its rows are not
    answered, so a scan is read through and dropped a page at a time."""
    if not _streams(stmt):
        session.run(stmt)
        return
    assert isinstance(stmt, ast.Select)
    cursor = session.open_cursor(stmt, paging=False)
    try:
        while not cursor.done:
            cursor.fetch(STREAM_ROWS)
    finally:
        cursor.close()


class _Reply:
    """One response made on a request thread: sent whole when it is smaller than
    ``STREAM_CHUNK``, else streamed, each chunk written before the next is made."""

    def __init__(self, request: web.Request, loop: asyncio.AbstractEventLoop, timeout: float):
        self._request = request
        self._loop = loop
        self._timeout = timeout
        self._parts: list[bytes] = []
        self._size = 0
        self.stream: web.StreamResponse | None = None  # once the first chunk went out
        self.query: Query | None = None  # whose deadline and cancel bound a write wait
        self.broken = False  # a write failed or timed out: the connection is cut

    # on the request thread

    def add(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        if self._size >= STREAM_CHUNK:
            data = b"".join(self._parts)
            self.discard()
            self._wait(asyncio.run_coroutine_threadsafe(self._send(data), self._loop))

    def discard(self) -> None:
        self._parts.clear()
        self._size = 0

    def _wait(self, written: concurrent.futures.Future[None]) -> None:
        """Until ``written`` is done: bounded by the write timeout, and by the query's
        deadline and cancel (a checkpoint every ``_WAIT_SLICE``). When the query
        ends while its client is still reading (the write completes within
        ``_GRACE``), the stream stays whole and its error goes in the document's
        tail; otherwise the connection is cut."""
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                written.result(timeout=_WAIT_SLICE)
                return
            except concurrent.futures.TimeoutError:
                pass
            except BaseException:
                self.broken = True  # the write failed: the client is gone
                raise
            try:
                if self.query is not None:
                    self.query.checkpoint()  # QueryTimeout / QueryCancelled when due
                if time.monotonic() >= deadline:
                    raise _WriteTimeout(f"the client read nothing for {self._timeout:g} s")
            except BaseException:
                try:
                    written.result(timeout=_GRACE)
                except BaseException:
                    self.broken = True
                    written.cancel()
                raise

    # on the loop

    async def _send(self, data: bytes) -> None:
        if self.stream is None:
            stream = web.StreamResponse(headers={"Content-Type": "application/json"})
            stream.enable_chunked_encoding()
            await stream.prepare(self._request)
            self.stream = stream
        await self.stream.write(data)

    async def finish(self, status: int) -> web.StreamResponse:
        body = b"".join(self._parts)
        self.discard()
        if self.stream is None:
            return web.Response(body=body, status=status, content_type="application/json")
        await self.stream.write(body)
        return self.stream  # aiohttp writes the last chunk

    def abort(self) -> None:
        """End a response that cannot be finished: the client sees it cut short."""
        self.broken = True
        transport = self._request.transport
        if transport is not None:
            transport.abort()


class _Shape:
    """How one endpoint writes an answer: whole, or as a head, rows and a tail."""

    query = ""

    def whole(self, result: Result) -> bytes:
        raise NotImplementedError

    def head(self, columns: Any, types: Any) -> bytes:
        raise NotImplementedError

    def tail(self, status: str, group: str | None, timings: dict[str, float], count: int) -> bytes:
        raise NotImplementedError

    def error_body(self, exc: Error) -> bytes:
        raise NotImplementedError

    def error_tail(self, exc: Error) -> bytes:
        raise NotImplementedError

    def error_response(self, exc: Error) -> web.Response:
        return web.Response(
            body=self.error_body(exc),
            status=status_of(exc),
            content_type="application/json",
            headers=_auth_challenge(exc),
        )

    def plain_response(self, exc: _HttpError) -> web.Response:
        return _plain_error(exc)


def _error_object(exc: Error) -> dict[str, Any]:
    position = exc.position + 1 if isinstance(exc, SqlSyntaxError) else None
    return {"sqlstate": exc.sqlstate, "message": exc.brief, "position": position}


class _Execute(_Shape):
    """SPEC §13: ``{"columns", "rows", "status", "group", "timings"}``."""

    def whole(self, result: Result) -> bytes:
        head = self.head(result.columns, result.types)
        rows = _encode(result.rows)[1:-1].encode()
        return head + rows + self.tail(result.status, result.group, result.timings, 0)

    def head(self, columns: Any, types: Any) -> bytes:
        described = [{"name": n, "type": t} for n, t in zip(columns, types, strict=True)]
        return ('{"columns":' + _encode(described) + ',"rows":[').encode()

    def tail(self, status: str, group: str | None, timings: dict[str, float], count: int) -> bytes:
        rest = _encode({"status": status, "group": group, "timings": timings})
        return ("]," + rest[1:]).encode()

    def error_body(self, exc: Error) -> bytes:
        return _encode({"error": _error_object(exc)}).encode()

    def error_tail(self, exc: Error) -> bytes:
        return ('],"error":' + _encode(_error_object(exc)) + "}").encode()


class _QuestDB(_Shape):
    """QuestDB's ``/exec``: ``{"query", "columns", "timestamp", "dataset", "count"}``."""

    def __init__(self, query: str) -> None:
        self.query = query

    def whole(self, result: Result) -> bytes:
        if not result.columns:
            return b'{"ddl":"OK"}'
        head = self.head(result.columns, result.types)
        rows = _encode(result.rows)[1:-1].encode()
        return head + rows + self.tail(result.status, result.group, {}, len(result.rows))

    def head(self, columns: Any, types: Any) -> bytes:
        described = [
            {"name": n, "type": _QUESTDB_TYPES.get(t, "VARCHAR")}
            for n, t in zip(columns, types, strict=True)
        ]
        start = {"query": self.query, "columns": described, "timestamp": -1}
        return (_encode(start)[:-1] + ',"dataset":[').encode()

    def tail(self, status: str, group: str | None, timings: dict[str, float], count: int) -> bytes:
        return ('],"count":' + str(count) + "}").encode()

    def error_body(self, exc: Error) -> bytes:
        body: dict[str, Any] = {"query": self.query, "error": exc.brief}
        if isinstance(exc, SqlSyntaxError):
            body["position"] = exc.position
        return _encode(body).encode()

    def error_tail(self, exc: Error) -> bytes:
        return ('],"error":' + _encode(exc.brief) + "}").encode()

    def plain_response(self, exc: _HttpError) -> web.Response:
        body = _encode({"query": self.query, "error": str(exc)})
        return web.Response(
            text=body, status=exc.status, content_type="application/json", headers=exc.headers
        )


def _auth_challenge(exc: Error) -> dict[str, str] | None:
    return {"WWW-Authenticate": 'Basic realm="resgroups"'} if status_of(exc) == 401 else None


class _HttpError(Exception):
    status = 400
    sqlstate = "08P01"

    @property
    def headers(self) -> dict[str, str] | None:
        return None


class _BadRequest(_HttpError):
    status = 400


class _SlowBody(_HttpError):
    status = 408
    sqlstate = "57014"


class _TooLarge(_HttpError):
    status = 413
    sqlstate = "54000"


class _Unavailable(_HttpError):
    status = 503
    sqlstate = "57P01"


class _Full(_HttpError):
    status = 503
    sqlstate = "53300"


class _Throttled(_HttpError):
    status = 429
    sqlstate = "28000"

    def __init__(self, wait: float) -> None:
        self.wait = max(1, math.ceil(wait))
        super().__init__(f"too many failed logins from this address: try again in {self.wait} s")

    @property
    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.wait)}


class _WriteTimeout(Exception):
    """The client stopped reading its response."""


def _error(exc: Error) -> web.Response:
    body = {"error": _error_object(exc)}
    return web.json_response(
        body, status=status_of(exc), headers=_auth_challenge(exc), dumps=_dumps
    )


def _plain_error(exc: _HttpError) -> web.Response:
    body = {"error": {"sqlstate": exc.sqlstate, "message": str(exc), "position": None}}
    return web.json_response(body, status=exc.status, headers=exc.headers, dumps=_dumps)
