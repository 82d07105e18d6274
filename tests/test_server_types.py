"""Values on the wire checked against a real client's codecs: what resgroups sends
psycopg must load as the same value, and what psycopg sends resgroups must
decode as the same value (numeric, timestamptz, the integer and float types),
plus parameter binding that can never splice a value in as SQL."""

from __future__ import annotations

import decimal
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.adapt import PyFormat
from psycopg.types.datetime import TimestamptzBinaryLoader
from psycopg.types.numeric import NumericBinaryLoader

from resgroups.errors import InvalidParameter
from resgroups.server import types
from resgroups.sql.params import UndefinedParameter, bind, placeholders
from resgroups.sql.parser import parse_one

_CTX = psycopg.adapt.Transformer()
decimals = st.decimals(allow_nan=False, allow_infinity=False, places=None).filter(
    lambda d: abs(d.adjusted()) < 120
)


@given(decimals)
def test_numeric_binary_matches_psycopg_both_ways(value: Decimal) -> None:
    ours = types.numeric_binary(value)
    with decimal.localcontext(prec=300):  # psycopg builds its Decimal in the current context
        assert NumericBinaryLoader(types.NUMERIC, _CTX).load(ours) == value
    theirs = _CTX.get_dumper(value, PyFormat.BINARY).dump(value)
    assert types.numeric_from_binary(bytes(theirs)) == value


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)))
def test_timestamptz_binary_matches_psycopg_both_ways(naive: datetime) -> None:
    value = naive.replace(tzinfo=UTC)
    ours = types.encode_binary(value, types.TIMESTAMPTZ)
    loaded = TimestamptzBinaryLoader(types.TIMESTAMPTZ, _CTX).load(ours)
    assert loaded == value
    theirs = _CTX.get_dumper(value, PyFormat.BINARY).dump(value)
    assert types.decode_parameter(bytes(theirs), types.TIMESTAMPTZ, 1, 1) == value


@given(st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.booleans()))
def test_binary_parameters_psycopg_sends_decode_exactly(value: int | float | bool) -> None:
    dumper = _CTX.get_dumper(value, PyFormat.BINARY)
    decoded = types.decode_parameter(bytes(dumper.dump(value)), dumper.oid, 1, 1)
    assert decoded == value
    assert type(decoded) is type(value)


def test_timestamptz_text_is_postgresql_shape() -> None:
    value = datetime(2026, 11, 30, 1, 2, 3, 456000, tzinfo=UTC)
    assert types.encode_text(value) == b"2026-11-30 01:02:03.456+00"  # as PostgreSQL prints it
    assert types.encode_text(value + timedelta(hours=1)).endswith(b"+00")


@pytest.mark.parametrize(
    ("data", "oid", "fmt", "message"),
    [
        (b"\x00\x01\x02", types.INT4, 1, "3 bytes are not a binary integer"),
        (b"abc", types.INT8, 0, "invalid input syntax for type bigint"),
        (b"\x00", types.BYTEA, 1, "binary format of type bytea is not supported"),
        (b"\xff", types.TEXT, 0, "invalid UTF-8"),
    ],
)
def test_bad_parameters_say_which_and_why(data: bytes, oid: int, fmt: int, message: str) -> None:
    with pytest.raises((types.InvalidBinaryRepresentation, types.InvalidTextRepresentation)) as bad:
        types.decode_parameter(data, oid, fmt, 2)
    assert "parameter $2" in str(bad.value)
    assert message in str(bad.value)


@pytest.fixture(scope="module", autouse=True)
def _parser_built() -> None:
    """Build the parser (about a second on a loaded machine) before any timed
    hypothesis example: its first example would pay for it."""
    parse_one("SELECT 1")


@given(st.text())
def test_a_bound_text_value_is_always_one_string_literal(value: str) -> None:
    sql = "SELECT $1 AS v, x FROM long_sequence(2) -- $2 is in a comment"
    bound, _ = bind(sql, [value])
    stmt = parse_one(bound)
    first = stmt.items[0].expr  # type: ignore[union-attr]
    assert first.value == value


def test_placeholders_inside_strings_names_and_comments_are_text() -> None:
    sql = "SELECT '$1', \"$2\" /* $3 */ FROM t WHERE a = $1 -- $4"
    assert placeholders(sql) == 1
    bound, original = bind(sql, [-5])
    assert bound.endswith("a =  -5 -- $4")
    assert original(bound.index("-5")) == sql.index("$1", sql.index("a ="))
    with pytest.raises(UndefinedParameter, match=r"there is no parameter \$2"):
        bind("SELECT $2", [1])
    with pytest.raises(InvalidParameter, match="infinite"):
        bind("SELECT $1", [float("inf")])
