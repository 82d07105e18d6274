"""PostgreSQL protocol v3 framing: reading frontend messages, writing backend ones.

Every frontend message after the startup packet is a type byte and an int32
length that counts itself; the startup packet has no type byte. A length
that lies (below 4, above the limit) ends the connection with a protocol
error before anything is read or allocated for it, so a 1 GB claim costs
nothing.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from resgroups.errors import Error

PROTOCOL_V3: Final = 196608  # 3.0
SSL_REQUEST: Final = 80877103
GSSENC_REQUEST: Final = 80877104
CANCEL_REQUEST: Final = 80877102

MAX_STARTUP: Final = 10_000  # PostgreSQL's limit for a startup packet
MAX_MESSAGE: Final = 64 * 1024 * 1024  # a query text or Bind message beyond this is refused

_I16: Final = struct.Struct("!h")
_U16: Final = struct.Struct("!H")
_I32: Final = struct.Struct("!i")
_HEADER: Final = struct.Struct("!ci")


class ProtocolViolation(Error):
    """The client broke the protocol (08P01): the connection ends."""

    sqlstate = "08P01"


async def read_startup(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(protocol code, rest of the packet) of a startup-phase packet."""
    (length,) = _I32.unpack(await reader.readexactly(4))
    if not 8 <= length <= MAX_STARTUP:
        raise ProtocolViolation(
            f"invalid startup packet length {length} (allowed 8..{MAX_STARTUP})"
        )
    body = await reader.readexactly(length - 4)
    (code,) = _I32.unpack_from(body)
    return code, body[4:]


async def read_message(
    reader: asyncio.StreamReader, limit: int = MAX_MESSAGE
) -> tuple[bytes, bytes]:
    """(type byte, body) of the next message."""
    kind, length = _HEADER.unpack(await reader.readexactly(5))
    if not 4 <= length <= limit:
        raise ProtocolViolation(
            f"invalid message length {length} for message {kind!r} (allowed 4..{limit})"
        )
    return kind, await reader.readexactly(length - 4)


class Framer:
    """Frontend messages out of the bytes a socket gives, however they are cut:
    each chunk is framed in O(its length) and only a message's missing part
    waits. A length that lies stops the framing at that message
    (``violation``), after the messages before it."""

    def __init__(self, limit: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._limit = limit
        self.violation: ProtocolViolation | None = None

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """The messages ``data`` completes, in order. With nothing buffered (the
        common case) they are framed off ``data`` itself and only a message's
        part that has not arrived is kept."""
        buf = self._buf
        if not buf:
            out, at = self._frame(data)
            if at < len(data):
                buf += memoryview(data)[at:]
            return out
        buf += data
        out, at = self._frame(buf)
        del buf[:at]
        return out

    def _frame(self, data: bytes | bytearray) -> tuple[list[tuple[bytes, bytes]], int]:
        """The whole messages at the start of ``data``, and where they end."""
        out = []
        at, size, header, limit = 0, len(data), _HEADER.unpack_from, self._limit
        while size - at >= 5 and self.violation is None:
            kind, length = header(data, at)
            if not 4 <= length <= limit:
                self.violation = ProtocolViolation(
                    f"invalid message length {length} for message {kind!r} (allowed 4..{limit})"
                )
                break
            end = at + 1 + length
            if size < end:
                break
            out.append((kind, bytes(data[at + 5 : end])))  # a slice of bytes is not copied again
            at = end
        return out, at


class Body:
    """Reads the fields of one message body; ProtocolViolation when it runs short."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.data):
            raise ProtocolViolation("message body shorter than its fields")
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def _number(self, field: struct.Struct) -> int:
        at = self.at
        try:
            (value,) = field.unpack_from(self.data, at)
        except struct.error:  # fewer bytes left than the field's
            raise ProtocolViolation("message body shorter than its fields") from None
        self.at = at + field.size
        return int(value)

    def int16(self) -> int:
        return self._number(_I16)

    def uint16(self) -> int:
        """A count (of parameters, formats, values): unsigned, up to 65535, as
        PostgreSQL reads it."""
        return self._number(_U16)

    def int32(self) -> int:
        return self._number(_I32)

    def byte(self) -> bytes:
        return self._take(1)

    def raw(self, n: int) -> bytes:
        return self._take(n)

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.at)
        if end < 0:
            raise ProtocolViolation("string field without its terminating zero byte")
        raw = self.data[self.at : end]
        self.at = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolViolation(
                f"invalid UTF-8 in a string field at byte {exc.start}"
            ) from None

    def rest(self) -> bytes:
        chunk = self.data[self.at :]
        self.at = len(self.data)
        return chunk


def startup_parameters(body: bytes) -> dict[str, str]:
    """The name/value pairs of a StartupMessage."""
    fields = Body(body)
    params: dict[str, str] = {}
    while True:
        name = fields.cstring()
        if not name:
            return params
        params[name] = fields.cstring()


# ---- backend messages ----------------------------------------------------------------


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + _I32.pack(len(payload) + 4) + payload


def cstr(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def int32(value: int) -> bytes:
    return _I32.pack(value)


def int16(value: int) -> bytes:
    return _I16.pack(value)


AUTH_OK: Final = message(b"R", int32(0))
AUTH_CLEARTEXT: Final = message(b"R", int32(3))
PARSE_COMPLETE: Final = message(b"1")
BIND_COMPLETE: Final = message(b"2")
CLOSE_COMPLETE: Final = message(b"3")
NO_DATA: Final = message(b"n")
PORTAL_SUSPENDED: Final = message(b"s")
EMPTY_QUERY: Final = message(b"I")


def auth_md5(salt: bytes) -> bytes:
    return message(b"R", int32(5) + salt)


def auth_sasl(mechanisms: Iterable[str]) -> bytes:
    return message(b"R", int32(10) + b"".join(cstr(m) for m in mechanisms) + b"\0")


def auth_sasl_continue(data: bytes) -> bytes:
    return message(b"R", int32(11) + data)


def auth_sasl_final(data: bytes) -> bytes:
    return message(b"R", int32(12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", int32(pid) + int32(secret))


def ready_for_query(status: bytes) -> bytes:
    return message(b"Z", status)


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", _U16.pack(len(oids)) + b"".join(int32(o) for o in oids))


def row_description(fields: Sequence[tuple[str, int, int, int]]) -> bytes:
    """``fields``: (name, type oid, type size, format code) per column."""
    parts = [int16(len(fields))]
    for name, oid, size, fmt in fields:
        parts.append(cstr(name) + int32(0) + int16(0) + int32(oid) + int16(size) + int32(-1))
        parts.append(int16(fmt))
    return message(b"T", b"".join(parts))


def data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [int16(len(values))]
    for value in values:
        parts.append(int32(-1) if value is None else int32(len(value)) + value)
    return message(b"D", b"".join(parts))


def notice_fields(severity: str, sqlstate: str, text: str, position: int = 0) -> bytes:
    body = b"S" + cstr(severity) + b"V" + cstr(severity) + b"C" + cstr(sqlstate) + b"M" + cstr(text)
    if position:
        body += b"P" + cstr(str(position))
    return body + b"\0"


def error_response(sqlstate: str, text: str, position: int = 0, severity: str = "ERROR") -> bytes:
    return message(b"E", notice_fields(severity, sqlstate, text, position))


def notice_response(text: str, sqlstate: str = "00000", severity: str = "NOTICE") -> bytes:
    return message(b"N", notice_fields(severity, sqlstate, text))
