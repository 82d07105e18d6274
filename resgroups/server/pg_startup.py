"""Startup and authentication: from the first byte to the first ReadyForQuery.

Encryption requests are answered ``N``; a CancelRequest cancels and ends;
the StartupMessage names the user, then the auth method's exchange runs
(SCRAM-SHA-256, md5 or cleartext, or none with access control off). Around
it: the login throttle (failed logins per source address; a throttled
address is refused before anything is hashed) and the connection slots (a
cap with a reserve for RESOURCE GROUP ADMIN principals, taken once the
principal is known). On the admin port only those principals log in.
Every refusal here is FATAL: the connection ends.
"""

from __future__ import annotations

import hmac
import secrets
import struct
from typing import Any

from resgroups.auth import md5_response, scram_keys
from resgroups.errors import (
    AuthenticationFailed,
    EngineClosed,
    Error,
    FeatureNotSupported,
    PermissionDenied,
)
from resgroups.server import commands, wire
from resgroups.server.limits import reserved_for
from resgroups.server.pg_state import ConnectionBase, StatementMemory, TxStatus
from resgroups.server.scram import MECHANISM, ScramFailed, ScramServer
from resgroups.server.wire import Body, ProtocolViolation
from resgroups.session import Session


class TooManyConnections(Error):
    sqlstate = "53300"


class StartupPhase(ConnectionBase):
    slot_taken: bool = False

    async def startup(self) -> bool:
        """Run the startup phase; False when the connection ends without a session
        (a CancelRequest)."""
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
        settings: dict[str, str] = {}
        for name, value in params.items():  # checked before any password is asked
            if name.lower() in commands.SETTINGS:
                commands.apply_setting(settings, name, value)
        for name, value in commands.startup_options(params.get("options", "")):
            commands.apply_setting(settings, name, value)  # an unknown name: 42704
        identity = await self._throttled_authenticate(user)
        if self.backend.admins_only and not reserved_for(self.engine, identity):
            raise PermissionDenied(
                f"Access denied for {user} [RESOURCE GROUP ADMIN]: the admin port is for "
                "RESOURCE GROUP ADMIN principals (connect to the main port)"
            )
        if self.backend.closing or self.engine.closed:
            raise EngineClosed("the server is shutting down")
        slots = self.backend.slots
        if slots is not None:
            if not slots.take(admin=identity.is_admin):
                raise TooManyConnections(slots.refusal(admin=identity.is_admin))
            self.slot_taken = True
        self.executor = self.backend.executor_for(identity.is_admin)
        self.settings.update(settings)
        self.session = Session(self.engine, identity)
        self.session.settings = ConnectionSettings(self)
        self.sync_attributes()
        self.statement_memory = StatementMemory(self.session)
        out = [wire.AUTH_OK]
        out += [wire.parameter_status(s.name, v) for s, v in self.reported().items()]
        out += [
            wire.backend_key_data(self.pid, self.secret),
            wire.ready_for_query(TxStatus.IDLE.value),
        ]
        self.writer.write(b"".join(out))
        await self.writer.drain()
        return True

    async def _throttled_authenticate(self, user: str) -> Any:
        throttle = self.backend.throttle
        authenticator = self.engine.authenticator
        if throttle is None or not authenticator.access_control:
            return await self._authenticate(user)
        wait = throttle.retry_after(self.peer)
        if wait > 0:  # refused before anything is hashed
            raise AuthenticationFailed(
                f"too many failed logins from this address: try again in {wait:.0f} s"
                if wait >= 1
                else "too many failed logins from this address: try again in a moment"
            )
        try:
            identity = await self._authenticate(user)
        except AuthenticationFailed:
            throttle.failed(self.peer)
            raise
        throttle.succeeded(self.peer)
        return identity

    async def _authenticate(self, user: str) -> Any:
        authenticator = self.engine.authenticator
        if not authenticator.access_control:
            return authenticator.login(self.engine.snapshot, user, None)
        method = self.backend.auth_method
        snap = self.engine.snapshot
        identity, stored = authenticator.credentials(snap, user)
        if identity is not None and stored is None:
            return identity  # a principal without a password needs none
        if method == "password":
            password = await self._password_message(wire.AUTH_CLEARTEXT)
            # the hash runs where the named principal's requests would: the admin's
            # login is not queued behind pinned general threads (the throttle bounds
            # what guessing the admin's name can cost)
            hashing = self.backend.executor_for(identity is not None and identity.is_admin)
            return await self.loop.run_in_executor(
                hashing, authenticator.login, self.engine.snapshot, user, password
            )
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
            raise AuthenticationFailed(f'password authentication failed for user "{user}"')
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
        failed = AuthenticationFailed(f'password authentication failed for user "{user}"')
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

    def reported(self) -> dict[commands.Setting, str]:
        return {s: self.setting(s.name) for s in commands.SETTINGS.values() if s.report}

    def sync_attributes(self) -> None:
        """The session's application name and client tags follow the connection's
        ``application_name`` and ``client_tags`` (what selectors route on, SPEC §15)."""
        if self.session is not None:
            self.session.set_application(self.setting("application_name") or None)
            self.session.set_tags(commands.client_tags(self.setting("client_tags")))

    def setting(self, name: str) -> str:
        key = name.lower()
        if key == "is_superuser":
            return "on" if self.session is not None and self.session.identity.is_admin else "off"
        if key == "session_authorization":
            return self.session.user if self.session is not None else ""
        return self.settings.get(key, commands.SETTINGS[key].default)


class ConnectionSettings:
    """A connection's settings as expressions read and set them: what
    ``current_setting(name)`` and ``set_config(name, value, is_local)`` see is what
    SHOW and SET see. ``set_config`` with ``is_local`` checks the value and keeps
    nothing (every statement here is its own transaction, unless in a block,
    where it lasts for the session, as resgroups' SET LOCAL does); a change is
    reported (ParameterStatus) after the statement."""

    def __init__(self, conn: StartupPhase) -> None:
        self._conn = conn

    def get(self, name: str) -> str:
        return self._conn.setting(commands.find_setting(name).name)

    def set(self, name: str, value: str, local: bool) -> str:
        conn = self._conn
        setting = commands.find_setting(name)
        kept = not local or conn.tx is not TxStatus.IDLE
        values = conn.settings if kept else dict(conn.settings)
        if kept and conn.settings_before is None:
            conn.settings_before = conn.reported()
            conn.settings_saved = dict(conn.settings)
        commands.apply_setting(values, setting.name, value)
        return values.get(setting.name.lower(), setting.default)
