"""Casts (``x::type``, ``CAST(x AS type)``): PostgreSQL's spellings of the four
types, one semantics (sql/semantics.py) in the row evaluator and in the
executor's vectorised one."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

import resgroups


@pytest.fixture(scope="module")
def session() -> resgroups.Session:
    engine = resgroups.Engine(workers=2)
    return engine.connect()


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1::float8", 1.0),
        ("7::double precision", 7.0),
        ("CAST(7 AS DOUBLE PRECISION)", 7.0),
        ("2.5::int", 2),  # a double here, so half to even (PostgreSQL's numeric 2.5 gives 3)
        ("3.5::bigint", 4),
        ("-2.5::int4", -2),
        ("'  42 '::bigint", 42),
        ("'-7'::int", -7),
        ("'1e3'::float8", 1000.0),
        ("' NaN '::float8", math.nan),
        ("'-Infinity'::float", -math.inf),
        ("'yes'::boolean", True),
        ("' OFF '::bool", False),
        ("'t'::bool", True),
        ("1.0::text", "1"),
        ("0.1::text", "0.1"),
        ("1e20::text", "1e+20"),
        ("true::text", "true"),
        ("12345::varchar(3)", "123"),
        ("12345::character varying", "12345"),
        ("true::int", 1),
        ("0::bool", False),
        ("(-3)::boolean", True),  # :: binds tighter than unary minus, as in PostgreSQL
        ("1.5::numeric(10, 2)", 1.5),
        ("(1 + 2)::text", "3"),
        ("NULL::int", None),
        ("'9223372036854775807'::int8", 2**63 - 1),
    ],
)
def test_a_cast_converts_as_postgresql_does(
    session: resgroups.Session, expr: str, value: object
) -> None:
    got = session.execute(f"SELECT {expr}").rows[0][0]
    if isinstance(value, float) and math.isnan(value):
        assert isinstance(got, float)
        assert math.isnan(got)
    else:
        assert got == value
        assert type(got) is type(value)


@pytest.mark.parametrize(
    ("expr", "error", "sqlstate", "needle"),
    [
        ("'abc'::int", resgroups.InvalidTextRepresentation, "22P02", 'type int: "abc"'),
        ("'1.5'::int", resgroups.InvalidTextRepresentation, "22P02", '"1.5"'),
        ("'maybe'::bool", resgroups.InvalidTextRepresentation, "22P02", "boolean"),
        ("'x'::float8", resgroups.InvalidTextRepresentation, "22P02", "float8"),
        ("'1e999'::float8", resgroups.NumericOverflow, "22003", "out of range"),
        ("'9223372036854775808'::int8", resgroups.NumericOverflow, "22003", "bigint"),
        ("1e300::int", resgroups.NumericOverflow, "22003", "out of range for bigint"),
        ("true::float8", resgroups.DatatypeMismatch, "42846", "cannot cast type boolean"),
        ("1.5::bool", resgroups.DatatypeMismatch, "42846", "to bool"),
        ("1::geometry", resgroups.UndefinedType, "42704", 'type "geometry" does not exist'),
        ("1::timestamp", resgroups.FeatureNotSupported, "0A000", "timestamp"),
        ("1::int(3)", resgroups.InvalidTextRepresentation, "22P02", "modifier"),
        ("'a'::varchar(0)", resgroups.InvalidTextRepresentation, "22P02", "1..10485760"),
    ],
)
def test_a_cast_that_cannot_be_done_says_why(
    session: resgroups.Session, expr: str, error: type[resgroups.Error], sqlstate: str, needle: str
) -> None:
    with pytest.raises(error) as failed:
        session.execute(f"SELECT {expr}")
    assert failed.value.sqlstate == sqlstate
    assert needle in failed.value.message


def test_the_executor_casts_its_columns_with_the_same_semantics(
    session: resgroups.Session,
) -> None:
    rows = session.execute(
        "SELECT sum(x::float8), max((x % 2)::bool::int), sum((x / 3.0)::int) "
        "FROM long_sequence(1000)"
    ).rows
    assert rows == [(500500.0, 1, sum(round(x / 3.0) for x in range(1, 1001)))]
    assert session.execute(
        "SELECT count(*) FROM long_sequence(100) WHERE x::float8 / 2 = (x / 2)::float8"
    ).rows == [(50,)]
    with pytest.raises(resgroups.DatatypeMismatch, match="cast to text is not supported"):
        session.execute("SELECT x::text FROM long_sequence(3)")


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e18, max_value=1e18))
def test_double_to_int_rounds_half_to_even_in_both_evaluators(value: float) -> None:
    engine = resgroups.Engine(workers=1)
    try:
        session = engine.connect()
        literal = repr(value)
        if "e" in literal or "inf" in literal:
            return
        row = session.execute(f"SELECT ({literal})::int8").rows[0][0]
        vector = session.execute(f"SELECT max((x * 0 + {literal})::int8) FROM long_sequence(1)")
        assert row == round(value) == vector.rows[0][0]
    finally:
        engine.close()


def test_what_drivers_ask_on_connecting_is_answered() -> None:
    with resgroups.Engine() as engine:
        session = engine.connect("bob")
        row = session.execute(
            "SELECT pg_catalog.version(), version(), current_user, session_user, "
            "current_schema(), current_schema, pg_catalog.current_database()"
        ).rows[0]
        assert row[0] == row[1]
        assert row[0].startswith("PostgreSQL ")
        assert row[2:] == ("bob", "bob", "public", "public", "resgroups")
        assert session.execute("SELECT current_user FROM long_sequence(2)").rows == [("bob",)] * 2
        with pytest.raises(resgroups.UndefinedFunction, match='no schema "foo"'):
            session.execute("SELECT foo.version()")
        # the words of two-word type names stay usable as names
        session.execute("CREATE RESOURCE GROUP double")
        assert session.execute("SELECT 1 AS precision, 2 varying").columns == [
            "precision",
            "varying",
        ]
