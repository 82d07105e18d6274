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
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
import secrets
import time
import urllib.parse
from concurrent.futures import Executor
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from resgroups.access import Identity
from resgroups.errors import (
    AdmissionRejected,
    AuthenticationFailed,
    Error,
    QueryTimeout,
    QueueTimeout,
    SqlSyntaxError,
)
from resgroups.result import Result
from resgroups.server import dashboard
from resgroups.session import Session

if TYPE_CHECKING:
    from resgroups.engine import Engine

LOGIN_CACHE_SECONDS: Final = 60.0  # a checked password is not hashed again for this long
MAX_QUERY_BYTES: Final = 1024 * 1024

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


class HttpFront:
    """The aiohttp application over one engine."""

    def __init__(
        self, engine: Engine, executor: Executor, history: dashboard.History | None = None
    ) -> None:
        self.engine = engine
        self.executor = executor
        self.history = history if history is not None else dashboard.History()
        self.closing = False
        self._logins: dict[tuple[str, bytes], tuple[float, Identity]] = {}
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

    # ---- sessions ----------------------------------------------------------------

    def _login(self, request: web.Request) -> Session:
        """A session for the request's basic-auth login (any name when access
        control is off; the admin when no credentials are sent and access
        control is off or the admin has no password)."""
        header = request.headers.get("Authorization", "")
        user, password = self.engine.admin_user, None
        if header.startswith("Basic "):
            try:
                decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                raise AuthenticationFailed("malformed basic authorization header") from None
            user, _, password = decoded.partition(":")
        elif self.engine.access_control and not self.engine.authenticator.open_admin:
            # (an admin without a password would pass with any: no credentials is it)
            raise AuthenticationFailed("authentication required: send HTTP basic auth")
        key = (user, hmac.digest(self._key, (password or "").encode("utf-8", "replace"), "sha256"))
        cached = self._logins.get(key)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return Session(self.engine, cached[1])
        session = self.engine.connect(user=user, password=password)
        if len(self._logins) > 10_000:
            self._logins.clear()
        self._logins[key] = (now + LOGIN_CACHE_SECONDS, session.identity)
        return session

    async def _params(self, request: web.Request) -> dict[str, str]:
        params = dict(request.query)
        if request.method == "POST" and request.can_read_body:
            if request.content_type == "application/json":
                try:
                    body = await request.json()
                except ValueError:
                    raise _BadRequest("the request body is not valid JSON") from None
                if not isinstance(body, dict):
                    raise _BadRequest('the JSON body must be an object like {"query": "..."}')
                params.update({k: str(v) for k, v in body.items() if v is not None})
            else:  # a form with query=..., or the SQL itself (curl -d 'SELECT 1')
                text = await request.text()
                form = urllib.parse.parse_qs(text) if "query=" in text else {}
                if request.content_type == "application/x-www-form-urlencoded" and form:
                    params.update({k: v[-1] for k, v in form.items()})
                elif text.strip():
                    params.setdefault("query", text)
        if not params.get("query", "").strip():
            raise _BadRequest("missing query: pass ?query=... (or POST it)")
        return params

    async def _run(self, request: web.Request) -> tuple[dict[str, str], Result]:
        params = await self._params(request)
        if self.closing:
            raise _Unavailable("the server is shutting down")
        loop = asyncio.get_running_loop()
        session = await loop.run_in_executor(self.executor, self._login, request)
        group = params.get("resource_group")

        def work() -> Result:
            if group:
                session.execute("SET RESOURCE GROUP " + '"' + group.replace('"', '""') + '"')
            return session.execute(params["query"])

        future = loop.run_in_executor(self.executor, work)
        try:
            return params, await asyncio.shield(future)
        except asyncio.CancelledError:  # the client went away: stop its query
            session.cancel()
            raise

    # ---- handlers ------------------------------------------------------------------

    async def execute(self, request: web.Request) -> web.Response:
        try:
            _, result = await self._run(request)
        except Error as exc:
            return _error(exc)
        except _HttpError as exc:
            return _plain_error(exc)
        body = {
            "columns": [
                {"name": n, "type": t} for n, t in zip(result.columns, result.types, strict=True)
            ],
            "rows": [list(r) for r in result.rows],
            "status": result.status,
            "group": result.group,
            "timings": result.timings,
        }
        return web.json_response(body, dumps=_dumps)

    async def exec_questdb(self, request: web.Request) -> web.Response:
        query = request.query.get("query", "")
        try:
            _, result = await self._run(request)
        except Error as exc:
            body: dict[str, Any] = {"query": query, "error": exc.brief}
            if isinstance(exc, SqlSyntaxError):
                body["position"] = exc.position
            return web.json_response(body, status=status_of(exc), dumps=_dumps)
        except _HttpError as exc:
            return web.json_response({"query": query, "error": str(exc)}, status=exc.status)
        if not result.columns:
            return web.json_response({"ddl": "OK"}, dumps=_dumps)
        return web.json_response(
            {
                "query": query,
                "columns": [
                    {"name": n, "type": _QUESTDB_TYPES.get(t, "VARCHAR")}
                    for n, t in zip(result.columns, result.types, strict=True)
                ],
                "timestamp": -1,
                "dataset": [list(r) for r in result.rows],
                "count": len(result.rows),
            },
            dumps=_dumps,
        )

    async def metrics(self, request: web.Request) -> web.Response:
        text = await asyncio.get_running_loop().run_in_executor(
            self.executor, self.engine.metrics_text
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

    async def page(self, request: web.Request) -> web.Response:
        """The live page, for the same login as /execute."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self._login, request)
        except Error as exc:
            return _error(exc)
        return await dashboard.serve_static_named("index.html")

    async def api_state(self, request: web.Request) -> web.Response:
        """What the page shows, as JSON: groups, their history, queries."""
        loop = asyncio.get_running_loop()

        def work() -> dict[str, Any]:
            return dashboard.state(self._login(request), self.history)

        try:
            body = await loop.run_in_executor(self.executor, work)
        except Error as exc:
            return _error(exc)
        return web.json_response(body, dumps=_dumps, headers={"Cache-Control": "no-store"})


class _HttpError(Exception):
    status = 400


class _BadRequest(_HttpError):
    status = 400


class _Unavailable(_HttpError):
    status = 503


def _error(exc: Error) -> web.Response:
    position = exc.position + 1 if isinstance(exc, SqlSyntaxError) else None
    body = {"error": {"sqlstate": exc.sqlstate, "message": exc.brief, "position": position}}
    headers = {"WWW-Authenticate": 'Basic realm="resgroups"'} if status_of(exc) == 401 else None
    return web.json_response(body, status=status_of(exc), headers=headers, dumps=_dumps)


def _plain_error(exc: _HttpError) -> web.Response:
    body = {"error": {"sqlstate": "08P01", "message": str(exc), "position": None}}
    return web.json_response(body, status=exc.status, dumps=_dumps)
