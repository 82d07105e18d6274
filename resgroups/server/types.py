"""PostgreSQL types on the wire: the OID of each result type, values in text and
binary format, and bound parameters decoded from either.

Result types are the names a :class:`~resgroups.result.Result` carries; each
maps to the PostgreSQL type a driver converts natively (int8 to int, float8
to float, numeric to Decimal, timestamptz to an aware datetime, ...).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from resgroups.errors import Error, NumericOverflow
from resgroups.sql.semantics import DatetimeOverflow, parse_timestamp, timestamptz_text, to_utc

BOOL: Final = 16
BYTEA: Final = 17
INT8: Final = 20
INT2: Final = 21
INT4: Final = 23
TEXT: Final = 25
OID: Final = 26
FLOAT4: Final = 700
FLOAT8: Final = 701
UNKNOWN: Final = 705
VARCHAR: Final = 1043
TIMESTAMP: Final = 1114
TIMESTAMPTZ: Final = 1184
NUMERIC: Final = 1700

TEXT_FORMAT: Final = 0
BINARY_FORMAT: Final = 1

# result type name -> (oid, size on the wire: -1 variable)
RESULT_TYPES: Final[dict[str, tuple[int, int]]] = {
    "int": (INT8, 8),
    "int4": (INT4, 4),  # what the wire says of integers PostgreSQL types int4 (wire_kinds)
    "int2": (INT2, 2),
    "float": (FLOAT8, 8),
    "text": (TEXT, -1),
    "bool": (BOOL, 1),
    "timestamptz": (TIMESTAMPTZ, 8),
    "numeric": (NUMERIC, -1),
}

_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_Q: Final = struct.Struct("!q")
_I: Final = struct.Struct("!i")
_H: Final = struct.Struct("!h")
_D: Final = struct.Struct("!d")


class InvalidBinaryRepresentation(Error):
    """A bound parameter's bytes are not a value of its type (22P03)."""

    sqlstate = "22P03"


# PostgreSQL's numeric: up to 131072 digits before the point, 16383 after
NUMERIC_MAX_WEIGHT_DIGITS: Final = 131072
NUMERIC_MAX_SCALE: Final = 16383
_NUMERIC_MAX_TEXT: Final = NUMERIC_MAX_WEIGHT_DIGITS + NUMERIC_MAX_SCALE + 16  # sign, point, exp
_INT_RANGES: Final = {21: ("smallint", 2**15), 23: ("integer", 2**31), 20: ("bigint", 2**63)}


def _shown(text: str, limit: int = 40) -> str:
    """A client's value as an error message quotes it: never all of a long one."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text):,} chars)"


class InvalidTextRepresentation(Error):
    """A bound parameter's text is not a value of its type (22P02)."""

    sqlstate = "22P02"


def oid_of(type_name: str) -> tuple[int, int]:
    return RESULT_TYPES.get(type_name, (TEXT, -1))


# a parameter's type (its oid) -> the result type of a column that is that parameter:
# what decode_parameter makes of its values (a timestamp is read as a timestamptz)
_PARAMETER_KINDS: Final = {
    INT8: "int", INT4: "int4", INT2: "int2", OID: "int", FLOAT4: "float", FLOAT8: "float",
    BOOL: "bool", NUMERIC: "numeric", TIMESTAMPTZ: "timestamptz", TIMESTAMP: "timestamptz",
}  # fmt: skip


def parameter_kind(oid: int) -> str:
    """The result type a bare ``$n`` of type ``oid`` is described and sent as."""
    return _PARAMETER_KINDS.get(oid, "text")


# ---- results -------------------------------------------------------------------------


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def encode_text(value: Any) -> bytes:
    """A value's text format (what psql prints)."""
    if value is True or value is False:
        return b"t" if value else b"f"
    if isinstance(value, float):
        return _float_text(value).encode()
    if isinstance(value, datetime):
        return timestamptz_text(value).encode()
    return str(value).encode("utf-8")


def encode_binary(value: Any, oid: int) -> bytes:
    """A value's binary format for the column's type ``oid``."""
    if oid == INT8:
        return _Q.pack(value)
    if oid in (INT4, INT2):
        name, bound = _INT_RANGES[oid]
        if not -bound <= value < bound:
            raise NumericOverflow(f"{name} out of range")
        return (_I if oid == INT4 else _H).pack(value)
    if oid == FLOAT8:
        return _D.pack(value)
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid == TIMESTAMPTZ:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return _Q.pack((value - _EPOCH) // timedelta(microseconds=1))
    if oid == NUMERIC:  # a float's shortest repr: 0.1 is 0.1, not its binary expansion
        return numeric_binary(Decimal(repr(value) if isinstance(value, float) else value))
    return str(value).encode("utf-8")


def numeric_binary(value: Decimal) -> bytes:
    """PostgreSQL's binary numeric: base-10000 digits with a weight, sign and scale."""
    if value.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if value.is_infinite():
        return struct.pack("!hhHh", 0, 0, 0xF000 if value < 0 else 0xD000, 0)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    text = "".join(map(str, digits))
    int_len = len(text) + exponent  # digits before the point (may be <= 0)
    if int_len > 0:
        int_part, frac_part = text[:int_len], text[int_len:]
    else:
        int_part, frac_part = "", "0" * -int_len + text
    int_part = int_part.rjust((len(int_part) + 3) // 4 * 4, "0")
    frac_part = frac_part.ljust((len(frac_part) + 3) // 4 * 4, "0")
    groups = [int(int_part[i : i + 4]) for i in range(0, len(int_part), 4)]
    weight = len(groups) - 1
    groups += [int(frac_part[i : i + 4]) for i in range(0, len(frac_part), 4)]
    while groups and groups[0] == 0:  # leading zero groups lower the weight
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    head = struct.pack("!hhHh", len(groups), weight, 0x4000 if sign else 0, dscale)
    return head + b"".join(struct.pack("!H", g) for g in groups)


def numeric_from_binary(data: bytes) -> Decimal:
    """PostgreSQL's binary numeric, checked as numeric_recv checks it; linear in its
    size (no int of its digits is ever converted to text)."""
    ndigits, weight, sign, dscale = struct.unpack_from("!hhHh", data)
    if sign == 0xC000:
        return Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return Decimal("-Infinity" if sign == 0xF000 else "Infinity")
    if len(data) != 8 + 2 * ndigits or sign not in (0, 0x4000) or ndigits < 0:
        raise InvalidBinaryRepresentation("invalid binary numeric")
    if not 0 <= dscale <= NUMERIC_MAX_SCALE:
        raise InvalidBinaryRepresentation(
            f"invalid scale in a binary numeric: {dscale} (0 .. {NUMERIC_MAX_SCALE})"
        )
    groups = struct.unpack_from(f"!{ndigits}H", data, 8)
    if any(g > 9999 for g in groups):
        raise InvalidBinaryRepresentation("invalid digit group in a binary numeric")
    # value = digits * 10**exponent; shown with exactly dscale digits after the point
    digits = "".join(f"{g:04d}" for g in groups) or "0"
    exponent = 4 * (weight + 1 - ndigits)
    if exponent > -dscale:
        digits += "0" * (exponent + dscale)
    elif exponent < -dscale:
        digits = digits[: len(digits) - (-dscale - exponent)] or "0"  # beyond dscale: zeros
    if len(digits) - dscale > NUMERIC_MAX_WEIGHT_DIGITS:
        raise NumericOverflow("value overflows numeric format")
    return Decimal((1 if sign == 0x4000 else 0, tuple(map(int, digits)), -dscale))


def _numeric_text(text: str) -> Decimal:
    """A numeric's text, refused in linear time past PostgreSQL's precision
    (``1e999999999`` is 22003, not a billion digits)."""
    if len(text) > _NUMERIC_MAX_TEXT:
        raise NumericOverflow(f"numeric value of {len(text):,} characters overflows numeric format")
    value = Decimal(text.strip())
    if value.is_finite() and value:
        exponent = value.as_tuple().exponent
        assert isinstance(exponent, int)
        if value.adjusted() >= NUMERIC_MAX_WEIGHT_DIGITS or -exponent > NUMERIC_MAX_SCALE:
            raise NumericOverflow(
                f"value overflows numeric format: {_shown(text)} (at most "
                f"{NUMERIC_MAX_WEIGHT_DIGITS} digits before the point, "
                f"{NUMERIC_MAX_SCALE} after)"
            )
    return value


def _int_text(oid: int) -> Callable[[str], int]:
    name, bound = _INT_RANGES.get(oid, ("oid", 2**32))

    def convert(text: str) -> int:
        stripped = text.strip()
        if len(stripped.lstrip("+-").lstrip("0")) > 20:
            raise NumericOverflow(f"value {_shown(text)} is out of range for type {name}")
        number = int(stripped)
        low = 0 if oid == OID else -bound
        if not low <= number < bound:
            raise NumericOverflow(f"value {_shown(text)} is out of range for type {name}")
        return number

    return convert


def _timestamp_binary(data: bytes) -> datetime:
    try:
        return _EPOCH + timedelta(microseconds=_Q.unpack(data)[0])
    except OverflowError:
        raise DatetimeOverflow("timestamp out of range") from None


def local_time(value: datetime, zone: str) -> bytes:
    """A timestamptz's text in the session's TimeZone."""
    return timestamptz_text(value, zone).encode()


# ---- parameters -----------------------------------------------------------------------

_BINARY: Final[dict[int, Callable[[bytes], Any]]] = {
    INT2: lambda b: struct.unpack("!h", b)[0],
    INT4: lambda b: struct.unpack("!i", b)[0],
    INT8: lambda b: _Q.unpack(b)[0],
    OID: lambda b: struct.unpack("!I", b)[0],
    FLOAT4: lambda b: struct.unpack("!f", b)[0],
    FLOAT8: lambda b: _D.unpack(b)[0],
    BOOL: lambda b: {b"\x00": False, b"\x01": True}[b],
    NUMERIC: numeric_from_binary,
    TIMESTAMPTZ: _timestamp_binary,
    TIMESTAMP: lambda b: _timestamp_binary(b).replace(tzinfo=None),
    TEXT: lambda b: b.decode("utf-8"),
    VARCHAR: lambda b: b.decode("utf-8"),
    UNKNOWN: lambda b: b.decode("utf-8"),
}

_TRUE: Final = frozenset({"t", "true", "on", "yes", "y", "1"})
_FALSE: Final = frozenset({"f", "false", "off", "no", "n", "0"})


def _bool_text(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(text)


_TEXT: Final[dict[int, Callable[[str], Any]]] = {
    INT2: _int_text(INT2),
    INT4: _int_text(INT4),
    INT8: _int_text(INT8),
    OID: _int_text(OID),
    FLOAT4: float,
    FLOAT8: float,
    BOOL: _bool_text,
    NUMERIC: _numeric_text,
    TIMESTAMPTZ: parse_timestamp,
    TIMESTAMP: parse_timestamp,
}

NAMES: Final = {
    BOOL: "boolean", BYTEA: "bytea", INT8: "bigint", INT2: "smallint", INT4: "integer",
    TEXT: "text", OID: "oid", FLOAT4: "real", FLOAT8: "double precision", UNKNOWN: "unknown",
    VARCHAR: "varchar", TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz", NUMERIC: "numeric",
}  # fmt: skip


def decode_parameter(data: bytes | None, oid: int, fmt: int, index: int, zone: str = "UTC") -> Any:
    """Parameter ``index`` (1-based) as a Python value. Text of an unspecified
    type (oid 0) stays text, as an untyped literal would. A timestamp (and a
    timestamptz's text without an offset) is read in the session's ``zone``, as
    PostgreSQL converts a timestamp to a timestamptz: every one is aware."""
    value = _decode(data, oid, fmt, index)
    if isinstance(value, datetime):
        if oid == TIMESTAMP:
            value = value.replace(tzinfo=None)
        try:
            value = to_utc(value, zone)
        except DatetimeOverflow as exc:
            exc.message = f"parameter ${index}: {exc.message}"
            raise
    return value


def _decode(data: bytes | None, oid: int, fmt: int, index: int) -> Any:
    if data is None:
        return None
    name = NAMES.get(oid, f"oid {oid}")
    if fmt == BINARY_FORMAT:
        decode = _BINARY.get(oid)
        if decode is None:
            raise InvalidBinaryRepresentation(
                f"parameter ${index}: binary format of type {name} is not supported "
                f"(binary parameters: {', '.join(NAMES[o] for o in _BINARY)})"
            )
        try:
            return decode(data)
        except (struct.error, KeyError, UnicodeDecodeError, InvalidOperation, ValueError):
            raise InvalidBinaryRepresentation(
                f"parameter ${index}: {len(data)} bytes are not a binary {name}"
            ) from None
        except Error as exc:
            exc.message = f"parameter ${index}: {exc.message}"
            raise
    if fmt != TEXT_FORMAT:
        raise InvalidBinaryRepresentation(f"parameter ${index}: unknown format code {fmt}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidTextRepresentation(f"parameter ${index}: invalid UTF-8") from None
    convert = _TEXT.get(oid)
    if convert is None:
        return text
    try:
        return convert(text)
    except Error as exc:
        exc.message = f"parameter ${index}: {exc.message}"
        raise
    except (ValueError, InvalidOperation):
        raise InvalidTextRepresentation(
            f"parameter ${index}: invalid input syntax for type {name}: {_shown(text)}"
        ) from None
