"""One expression semantics: types, operators, overflow, functions and aggregates.

Both evaluators — the row-at-a-time one of :mod:`resgroups.sql.expr` (table
functions, SELECT without FROM, the final expressions over aggregates) and
the vectorised one of :mod:`resgroups.exec.vector` (the executor's morsels) —
type-check every expression with :func:`infer` before evaluating anything,
and build their errors from the helpers here. So the same statement fails
with the same error whichever path computes it, and an empty input is typed
like a full one.

Types (the names :class:`~resgroups.result.Result` carries):

=========  ================================  ============================
type       values                            arithmetic
=========  ================================  ============================
int        integers in [-2^63, 2^63 - 1]     exact; a result outside the
                                             range raises NumericOverflow
float      IEEE doubles                      int op float is float
text       strings                           none (LIKE, comparison)
bool       TRUE, FALSE                       AND, OR, NOT
unknown    the NULL literal                  takes the other operand's type
=========  ================================  ============================

Integer division truncates toward zero and ``%`` takes the dividend's sign,
as in PostgreSQL. NULL propagates through arithmetic and comparison.

Casts (``x::int``, ``CAST(x AS double precision)``) take PostgreSQL's usual
spellings of these four types (:data:`CAST_TYPES`) and convert as it does:
a double to an integer rounds half to even and must fit int64; text is read
as the target type reads its input (``' 42 '`` is 42, ``'yes'`` is TRUE,
``'abc'::int`` is 22P02); a double as text is its shortest round-trip form
(``1.0::text`` is ``'1'``, ``1e20`` is ``'1e+20'``); boolean and double do not
convert to each other (42846), as in PostgreSQL.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from decimal import Decimal
from typing import Any, Final
from zoneinfo import ZoneInfo

from resgroups.errors import (
    DatatypeMismatch,
    Error,
    FeatureNotSupported,
    GroupingError,
    InvalidTextRepresentation,
    NumericOverflow,
    UndefinedFunction,
    UndefinedType,
    did_you_mean,
)
from resgroups.sql import ast

INT: Final = "int"
FLOAT: Final = "float"
TEXT: Final = "text"
BOOL: Final = "bool"
UNKNOWN: Final = "unknown"  # the NULL literal
TIMESTAMPTZ: Final = "timestamptz"  # now(), current_timestamp, the catalog's times
ARRAY: Final = "array"  # ARRAY(...), array_agg, the catalog's array columns: sent as text
NUMERIC: Final = frozenset({INT, FLOAT})

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

_SHOWN: Final = {INT: "integer", FLOAT: "double", TEXT: "text", BOOL: "boolean", UNKNOWN: "null"}


def shown(t: str) -> str:
    """A type as error messages name it ("integer", "double", ...)."""
    return _SHOWN.get(t, t)


def value_type(value: object) -> str:
    if value is None:
        return UNKNOWN
    if isinstance(value, datetime):  # a bound timestamptz parameter
        return TIMESTAMPTZ
    return {bool: BOOL, int: INT, float: FLOAT, str: TEXT}.get(type(value), TEXT)


def result_type(t: str) -> str:
    """The type a result column shows: a column of bare NULLs is text, as in PostgreSQL."""
    return TEXT if t == UNKNOWN else t


# ---- integers stay int64 -------------------------------------------------------------


def overflow(op: str) -> NumericOverflow:
    return NumericOverflow(f"integer out of range for bigint in {op}")


def check_int64(value: int, op: str) -> int:
    """``value`` if it fits int64, else NumericOverflow naming the operation."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    raise overflow(op)


def int_literal(expr: ast.Expr) -> int | None:
    """The value of an integer literal, or of a negated one (``-9223372036854775808``
    is the smallest bigint, though 9223372036854775808 alone is out of range)."""
    negate = False
    if isinstance(expr, ast.Unary) and expr.op == "-":
        expr, negate = expr.operand, True
    if isinstance(expr, ast.Literal) and type(expr.value) is int:
        value = -expr.value if negate else expr.value
        if not INT64_MIN <= value <= INT64_MAX:
            raise NumericOverflow(f"integer literal {value} is out of range for bigint")
        return value
    return None


def truncated_div(a: int, b: int) -> int:
    """Integer division toward zero (SQL), on Python ints."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b >= 0) else -quotient


# ---- operator typing -------------------------------------------------------------------

ARITHMETIC: Final = frozenset({"+", "-", "*", "/", "%"})
REGEX: Final = frozenset({"~", "!~", "~*", "!~*"})  # POSIX regular expressions, as psql uses
COMPARISON: Final = frozenset({"=", "<>", "<", "<=", ">", ">="})


def arithmetic_type(op: str, a: str, b: str) -> str:
    for t in (a, b):
        if t not in NUMERIC and t != UNKNOWN:
            raise DatatypeMismatch(f"operator {op} needs numbers, got {shown(a)} {op} {shown(b)}")
    known = {a, b} - {UNKNOWN}
    if not known:
        return UNKNOWN
    return INT if known == {INT} else FLOAT


def comparable(op: str, a: str, b: str) -> None:
    if UNKNOWN in (a, b) or a == b or (a in NUMERIC and b in NUMERIC):
        return
    if op == "= ANY" and b in (ARRAY, TEXT):
        return
    raise DatatypeMismatch(f"cannot compare {shown(a)} {op} {shown(b)}")


def boolean_operand(op: str, t: str) -> None:
    if t not in (BOOL, UNKNOWN):
        raise DatatypeMismatch(f"argument of {op.upper()} must be boolean, not {shown(t)}")


def binary_type(op: str, a: str, b: str) -> str:
    if op == "||":
        return TEXT  # anything || text, as PostgreSQL's textanycat
    if op in ARITHMETIC:
        return arithmetic_type(op, a, b)
    if op in COMPARISON:
        comparable(op, a, b)
        return BOOL
    if op == "like" or op in REGEX:
        if a not in (TEXT, UNKNOWN) or b not in (TEXT, UNKNOWN):
            word = op.upper()
            raise DatatypeMismatch(f"{word} needs text, got {shown(a)} {word} {shown(b)}")
        return BOOL
    if op == "= any":
        if b not in (ARRAY, UNKNOWN, TEXT):  # text: an array's text form, as a parameter
            raise DatatypeMismatch(f"op ANY (array) needs an array, got {shown(b)}")
        return BOOL
    if op in ("distinct", "not distinct"):
        comparable(f"IS {op.upper()} FROM", a, b)
        return BOOL
    boolean_operand(op, a)
    boolean_operand(op, b)
    return BOOL


# ---- functions --------------------------------------------------------------------------


def _numeric_arg(name: str, t: str) -> None:
    if t not in NUMERIC and t != UNKNOWN:
        raise DatatypeMismatch(f"{name}() needs a number, got {shown(t)}")


def _text_arg(name: str, t: str) -> None:
    if t not in (TEXT, UNKNOWN):
        raise DatatypeMismatch(f"{name}() needs text, got {shown(t)}")


def _text_to(result: str) -> Callable[[str, Sequence[str]], str]:
    def typed(name: str, args: Sequence[str]) -> str:
        _text_arg(name, args[0])
        return result

    return typed


def _same_number(name: str, args: Sequence[str]) -> str:
    for t in args:
        _numeric_arg(name, t)
    return args[0]


def _returns(result: str) -> Callable[[str, Sequence[str]], str]:
    return lambda name, args: result


def _coalesce(name: str, args: Sequence[str]) -> str:
    known = [t for t in args if t != UNKNOWN]
    for t in known[1:]:
        if t != known[0] and not (t in NUMERIC and known[0] in NUMERIC):
            raise DatatypeMismatch(f"{name}() arguments must share a type, got {shown(t)}")
    if not known:
        return UNKNOWN
    return FLOAT if FLOAT in known else known[0]


def union_type(column: int, first: str | None, other: str | None) -> str | None:
    """A UNION column's type from two branches' (PostgreSQL's resolution, for
    these types): NULL's unknown or an unknown type takes the other; integer
    and double make double; other pairs cannot be matched (42804)."""
    if first == other or other in (None, UNKNOWN):
        return first
    if first in (None, UNKNOWN):
        return other
    if first in NUMERIC and other in NUMERIC:
        return FLOAT
    raise DatatypeMismatch(
        f"UNION types {shown(first)} and {shown(other)} cannot be matched (column {column + 1})"
    )


@dataclass(frozen=True)
class Function:
    """A scalar function's signature: its arity and its result type."""

    arity: tuple[int, int]  # min, max arguments
    typed: Callable[[str, Sequence[str]], str]  # (name, argument types) -> result type


FUNCTIONS: Final[Mapping[str, Function]] = {
    "lower": Function((1, 1), _text_to(TEXT)),
    "upper": Function((1, 1), _text_to(TEXT)),
    "length": Function((1, 1), _text_to(INT)),
    "abs": Function((1, 1), _same_number),
    "round": Function((1, 2), _same_number),
    "coalesce": Function((1, 255), _coalesce),
    # the catalog's functions (statements/pg_catalog.py answers those over its rows)
    "pg_table_is_visible": Function((1, 1), _returns(BOOL)),
    "pg_function_is_visible": Function((1, 1), _returns(BOOL)),
    "pg_type_is_visible": Function((1, 1), _returns(BOOL)),
    "pg_get_userbyid": Function((1, 1), _returns(TEXT)),
    "format_type": Function((2, 2), _returns(TEXT)),
    "pg_get_function_result": Function((1, 1), _returns(TEXT)),
    "pg_get_function_arguments": Function((1, 1), _returns(TEXT)),
    "pg_get_function_identity_arguments": Function((1, 1), _returns(TEXT)),
    "obj_description": Function((1, 2), _returns(TEXT)),
    "col_description": Function((2, 2), _returns(TEXT)),
    "shobj_description": Function((2, 2), _returns(TEXT)),
    "pg_get_expr": Function((2, 3), _returns(TEXT)),
    "pg_encoding_to_char": Function((1, 1), _returns(TEXT)),
    "array_to_string": Function((2, 3), _returns(TEXT)),
    "pg_get_constraintdef": Function((1, 2), _returns(TEXT)),
    "pg_get_serial_sequence": Function((2, 2), _returns(TEXT)),
    "pg_collation_is_visible": Function((1, 1), _returns(BOOL)),
    "like_escape": Function((2, 2), _returns(TEXT)),
    "json_build_object": Function((0, 100), _returns(TEXT)),
    "array_element": Function((2, 2), _returns(UNKNOWN)),
    "array_upper": Function((2, 2), _returns(INT)),
    "array_length": Function((2, 2), _returns(INT)),
    "pg_relation_is_publishable": Function((1, 1), _returns(BOOL)),
    "pg_get_statisticsobjdef_columns": Function((1, 1), _returns(TEXT)),
    "pg_get_indexdef": Function((1, 3), _returns(TEXT)),
    "current_schemas": Function((1, 1), _returns(ARRAY)),
    "pg_get_viewdef": Function((1, 2), _returns(TEXT)),
    "nullif": Function((2, 2), lambda name, args: _coalesce(name, args)),
    "replace": Function((3, 3), _returns(TEXT)),
    "regtype_name": Function((1, 1), _returns(TEXT)),
    "regclass_name": Function((1, 1), _returns(TEXT)),
    "regnamespace_name": Function((1, 1), _returns(TEXT)),
    "to_regtype": Function((1, 1), _returns(INT)),
    # the session's settings (SHOW's and SET's): expr.EvalContext.settings answers them
    "current_setting": Function((1, 2), _returns(TEXT)),
    "set_config": Function((3, 3), _returns(TEXT)),
}
# what the query running an expression knows (what drivers ask on connecting)
CONTEXT_FUNCTIONS: Final[Mapping[str, str]] = {
    "current_resource_group": TEXT,
    "version": TEXT,
    "current_user": TEXT,
    "session_user": TEXT,
    "current_schema": TEXT,
    "current_database": TEXT,
    "now": TIMESTAMPTZ,
    "pg_advisory_unlock_all": TEXT,
    "current_timestamp": TIMESTAMPTZ,
}
AGGREGATES: Final = ("count", "sum", "avg", "min", "max", "array_agg", "string_agg")


def all_function_names() -> list[str]:
    return [*FUNCTIONS, *CONTEXT_FUNCTIONS, *AGGREGATES]


def function_type(call: ast.Call, args: Sequence[str]) -> str:
    """The result type of a scalar or context function call (arity and types checked)."""
    if call.star:
        raise DatatypeMismatch(f"{call.name}(*) is not allowed; only count(*) takes *")
    if call.name in CONTEXT_FUNCTIONS:
        if args:
            raise DatatypeMismatch(f"{call.name}() takes no arguments")
        return CONTEXT_FUNCTIONS[call.name]
    fn = FUNCTIONS.get(call.name)
    if fn is None:
        raise UndefinedFunction(
            f"function {call.name}() does not exist."
            + did_you_mean(call.name, all_function_names())
        )
    low, high = fn.arity
    if not low <= len(args) <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        raise DatatypeMismatch(f"{call.name}() takes {expected} arguments, got {len(args)}")
    return fn.typed(call.name, args)


def aggregate_type(call: ast.Call, arg: str | None) -> str:
    """The result type of an aggregate over an argument of type ``arg`` (None: ``*``):
    NULL over no rows, of this type (count is 0)."""
    if call.star:
        if call.name != "count":
            raise DatatypeMismatch(f"{call.name}(*) is not allowed; only count(*) takes *")
        return INT
    if call.name == "string_agg":
        if len(call.args) != 2:
            raise DatatypeMismatch(f"string_agg() takes 2 arguments, got {len(call.args)}")
        return TEXT
    if len(call.args) != 1 or arg is None:
        raise DatatypeMismatch(f"{call.name}() takes 1 argument, got {len(call.args)}")
    if call.name == "count":
        return INT
    if call.name == "array_agg":
        return ARRAY
    if call.name in ("sum", "avg"):
        if arg not in NUMERIC and arg != UNKNOWN:
            raise DatatypeMismatch(f"{call.name}() needs numbers, got {shown(arg)}")
        return FLOAT if call.name == "avg" or arg == FLOAT else INT
    return arg  # min, max


def is_aggregate(expr: ast.Expr) -> bool:
    return isinstance(expr, ast.Call) and expr.name in AGGREGATES


def children(expr: ast.Expr) -> tuple[ast.Expr, ...]:
    match expr:
        case ast.Unary(operand=operand) | ast.IsNull(operand=operand):
            return (operand,)
        case ast.Cast(operand=operand):
            return (operand,)
        case ast.Binary(left=left, right=right):
            return (left, right)
        case ast.InList(operand=operand, items=items):
            return (operand, *items)
        case ast.Call(args=args):
            return args
        case ast.Case(operand=operand, whens=whens, default=default):
            parts = [operand, *(e for pair in whens for e in pair), default]
            return tuple(e for e in parts if e is not None)
    return ()  # a subquery's aggregates are its own


def find_aggregates(expr: ast.Expr) -> list[ast.Call]:
    """The aggregate calls inside ``expr`` (not descending into their arguments)."""
    if is_aggregate(expr):
        assert isinstance(expr, ast.Call)
        return [expr]
    found: list[ast.Call] = []
    for child in children(expr):
        found += find_aggregates(child)
    return found


# ---- the type of an expression -----------------------------------------------------------


def infer(
    expr: ast.Expr,
    column_type: Callable[..., str],  # (name[, table]) -> type
    *,
    over_aggregates: bool = False,
    where: str = "here",
) -> str:
    """The type of ``expr``, checking every operator, function and aggregate.

    ``column_type`` gives a column's type (raising UndefinedColumn when there
    is none). With ``over_aggregates`` the expression is a select item of an
    aggregate query: aggregates are allowed and a bare column is a
    GroupingError (there is no GROUP BY); otherwise an aggregate is a
    GroupingError naming ``where`` ("here", "in WHERE").
    """

    def walk(e: ast.Expr) -> str:
        return infer(e, column_type, over_aggregates=over_aggregates, where=where)

    literal = int_literal(expr)
    if literal is not None:
        return INT
    match expr:
        case ast.Literal(value=value):
            return value_type(value)
        case ast.Param():
            return UNKNOWN  # typed by its context (sql/param_types.py), like NULL here
        case ast.Column(name=name, table=table):
            t = column_type(name) if table is None else column_type(name, table)
            if over_aggregates:
                raise GroupingError(
                    f"column {name.text} must appear inside an aggregate function "
                    "(there is no GROUP BY)"
                )
            return t
        case ast.Unary(op="-", operand=operand):
            return arithmetic_type("-", INT, walk(operand))
        case ast.Unary(op="not", operand=operand):
            boolean_operand("not", walk(operand))
            return BOOL
        case ast.Binary(op=op, left=left, right=right):
            return binary_type(op, walk(left), walk(right))
        case ast.IsNull(operand=operand):
            walk(operand)
            return BOOL
        case ast.InList(operand=operand, items=items):
            t = walk(operand)
            for item in items:
                comparable("IN", t, walk(item))
            return BOOL
        case ast.Call(name=name) if name in AGGREGATES:
            if not over_aggregates:
                raise GroupingError(f"aggregate function {name}() is not allowed {where}")
            if expr.star:
                return aggregate_type(expr, None)
            for arg in expr.args:
                if find_aggregates(arg):
                    raise GroupingError(f"aggregate calls cannot be nested inside {name}()")
            args = [infer(a, column_type) for a in expr.args]
            return aggregate_type(expr, args[0] if args else None)
        case ast.Call():
            return function_type(expr, [walk(a) for a in expr.args])
        case ast.Cast(operand=operand, type=target, written=written):
            return cast_type(walk(operand), target, written)
        case ast.Case(operand=operand, whens=whens, default=default):
            subject = None if operand is None else walk(operand)
            for condition, _ in whens:
                if subject is None:
                    boolean_operand("case when", walk(condition))
                else:
                    comparable("CASE ... WHEN", subject, walk(condition))
            results = [walk(r) for _, r in whens] + ([walk(default)] if default else [])
            return _coalesce("CASE", results)
        case ast.Window():
            if over_aggregates:
                raise GroupingError("a window function over an aggregate query is not supported")
            for e in expr.partition_by:
                walk(e)
            for o in expr.order_by:
                walk(o.expr)
            return INT  # row_number
        case ast.Subquery(kind=kind):
            # typed when run (statements/pg_catalog.py); a scalar subquery's column
            # is unknown here, an ARRAY(...) is sent as its text form
            return {"exists": BOOL, "array": ARRAY}.get(kind, UNKNOWN)
    raise TypeError(f"not an expression: {expr!r}")


# ---- arrays ----------------------------------------------------------------------------


class PgArray(tuple[Any, ...]):
    """An array value (ARRAY(...), array_agg): sent in PostgreSQL's text form ``{a,b}``."""

    __slots__ = ()

    def __str__(self) -> str:
        return "{" + ",".join("NULL" if v is None else _array_item(v) for v in self) + "}"


def _array_item(value: Any) -> str:
    text = ("t" if value else "f") if isinstance(value, bool) else str(value)
    if text == "" or text.upper() == "NULL" or any(c in text for c in ' ,{}"\\'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def parse_array(text: str) -> PgArray:
    """An array's text form ``{a,"b c",NULL}`` read back (elements are text)."""
    if not (text.startswith("{") and text.endswith("}")):
        raise InvalidTextRepresentation(f'malformed array literal: "{text}"')
    items: list[str | None] = []
    body, i = text[1:-1], 0
    while i < len(body):
        if body[i] == '"':
            chars, i = [], i + 1
            while i < len(body) and body[i] != '"':
                if body[i] == "\\":
                    i += 1
                chars.append(body[i : i + 1])
                i += 1
            items.append("".join(chars))
            i += 2  # the closing quote and the comma
        else:
            end = body.find(",", i)
            end = len(body) if end < 0 else end
            bare = body[i:end].strip()
            items.append(None if bare.upper() == "NULL" else bare)
            i = end + 1
    return PgArray(items)


# ---- casts ---------------------------------------------------------------------------

# PostgreSQL's spellings of the four types (numeric and real are doubles here)
CAST_TYPES: Final = {
    **dict.fromkeys(("int", "int2", "int4", "int8", "integer", "bigint", "smallint"), INT),
    **dict.fromkeys(
        ("float", "float4", "float8", "double precision", "real", "numeric", "decimal"), FLOAT
    ),
    **dict.fromkeys(("text", "varchar", "character varying", "char", "name", "bpchar"), TEXT),
    **dict.fromkeys(("bool", "boolean"), BOOL),
    "timestamptz": TIMESTAMPTZ,
    # object identifiers are integers here (a cast to regclass gives the oid, not its name)
    **dict.fromkeys(("oid", "regclass", "regtype", "regproc", "regnamespace", "regrole"), INT),
}
# types PostgreSQL has and the executor does not
_ABSENT: Final = frozenset(
    {"timestamp", "date", "time", "timetz", "interval", "bytea", "json", "jsonb"}
)
MAX_TYPE_MODIFIER: Final = 10_485_760  # PostgreSQL's largest varchar(n)


def cast_target(words: str, modifiers: Sequence[str] = ()) -> tuple[str, str]:
    """The type a cast names, and how it was written (``varchar(20)``)."""
    written = words + (f"({', '.join(modifiers)})" if modifiers else "")
    target = CAST_TYPES.get(words)
    if target is None:
        if words in _ABSENT:
            raise FeatureNotSupported(f"type {words} is not supported by resgroups' executor")
        raise UndefinedType(
            f'type "{words}" does not exist; casts take '
            + ", ".join(sorted(CAST_TYPES))
            + did_you_mean(words, CAST_TYPES)
        )
    if len(modifiers) > (2 if target == FLOAT else 1) or (modifiers and target in (INT, BOOL)):
        raise InvalidTextRepresentation(f"type {words} takes no such modifier: {written}")
    for modifier in modifiers:
        if not modifier.isdigit() or not 0 < int(modifier) <= MAX_TYPE_MODIFIER:
            raise InvalidTextRepresentation(
                f"type modifier {modifier} of {written}: expected an integer 1..{MAX_TYPE_MODIFIER}"
            )
    return target, written


# integer spellings PostgreSQL types narrower than bigint: a cast to one is range
# checked, and the wire describes its result (and a parameter cast to it) in it
INT4_SPELLINGS: Final = frozenset({"int", "int4", "integer"})
INT2_SPELLINGS: Final = frozenset({"int2", "smallint"})
NARROW_INTS: Final = {
    **dict.fromkeys(INT4_SPELLINGS, ("integer", 2**31)),
    **dict.fromkeys(INT2_SPELLINGS, ("smallint", 2**15)),
}


def cast_type(source: str, target: str, written: str) -> str:
    """The type of ``source::target``, refusing what PostgreSQL refuses."""
    if (
        {source, target} == {BOOL, FLOAT}
        or (target == TIMESTAMPTZ and source not in (TIMESTAMPTZ, TEXT, UNKNOWN))
        or (source == TIMESTAMPTZ and target not in (TIMESTAMPTZ, TEXT))
    ):
        raise DatatypeMismatch(f"cannot cast type {shown(source)} to {written}", sqlstate="42846")
    return target


class DatetimeOverflow(Error):
    """A timestamp outside what the server represents (22008): Python's years
    1 to 9999, UTC."""

    sqlstate = "22008"


_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_EPOCH_ORDINAL: Final = _PG_EPOCH.toordinal()
_DAY_US: Final = 86_400_000_000
_CYCLE_DAYS: Final = 146_097  # 400 Gregorian years: the calendar repeats
_PROBE: Final = timedelta(days=3)


@functools.lru_cache(maxsize=64)
def time_zone(name: str) -> tzinfo:
    """The zone a TimeZone setting names (checked when it was set)."""
    return UTC if name.upper() == "UTC" else ZoneInfo(name)


def _utc_offset(value: datetime, zone: tzinfo) -> timedelta:
    """The zone's UTC offset at the instant ``value`` (aware, UTC). At the ends of
    the representable range, where the local time itself is past them, the
    offset a few days inward (zones do not change their offset there)."""
    try:
        return value.astimezone(zone).utcoffset() or timedelta(0)
    except OverflowError:
        probe = value - _PROBE if value.year > 1 else value + _PROBE
        return probe.astimezone(zone).utcoffset() or timedelta(0)


def _offset_text(offset: timedelta) -> str:
    """A UTC offset as PostgreSQL prints it: +HH, +HH:MM, +HH:MM:SS (a zone's
    local mean time has seconds: Tokyo's before 1888 is +09:18:59)."""
    total = int(offset.total_seconds())
    sign = "-" if total < 0 else "+"
    minutes, seconds = divmod(abs(total), 60)
    hours, minutes = divmod(minutes, 60)
    text = f"{sign}{hours:02d}"
    if minutes or seconds:
        text += f":{minutes:02d}"
    if seconds:
        text += f":{seconds:02d}"
    return text


def timestamptz_text(value: datetime, zone: str = "UTC") -> str:
    """A timestamptz as PostgreSQL prints it (DateStyle ISO) in the session's
    TimeZone ``zone``: local time, trailing zeros of the fraction dropped, the
    offset; a local time past year 9999 or before year 1 is printed, not
    converted (``10000-01-01 08:00:00+09``, ``0001-12-31 19:33:58-04:56:02 BC``)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    offset = _utc_offset(value, time_zone(zone))
    # microseconds since 2000-01-01 in local time: no datetime, so no overflow
    local = (value - _PG_EPOCH) // timedelta(microseconds=1) + offset // timedelta(microseconds=1)
    days, micros = divmod(local, _DAY_US)
    ordinal, years = _EPOCH_ORDINAL + days, 0
    while ordinal > date.max.toordinal():
        ordinal, years = ordinal - _CYCLE_DAYS, years + 400
    while ordinal < 1:
        ordinal, years = ordinal + _CYCLE_DAYS, years - 400
    day = date.fromordinal(ordinal)
    year = day.year + years
    seconds, fraction = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    text = f"{max(year, 1 - year):04d}-{day.month:02d}-{day.day:02d}"
    text += f" {hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += "." + f"{fraction:06d}".rstrip("0")
    text += _offset_text(offset)
    return text if year > 0 else text + " BC"


_FRACTION: Final = re.compile(r"(?<=:\d\d)\.(\d{7,})")


def to_utc(value: datetime, zone: str = "UTC") -> datetime:
    """A timestamp as the instant it is: a naive one is local time in ``zone`` (the
    session's TimeZone), as PostgreSQL reads a timestamp without an offset;
    DatetimeOverflow (22008) when that instant is outside years 1 to 9999 UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=time_zone(zone))
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise DatetimeOverflow("timestamp out of range") from None


def parse_timestamp(text: str, written: str = "timestamp with time zone") -> datetime:
    """A timestamp's text (ISO 8601 as PostgreSQL prints and reads it: a date, then
    a time, then an offset), naive without an offset; a fraction past
    microseconds is rounded, as PostgreSQL rounds it."""
    word = text.strip()
    if word.lower() in ("infinity", "-infinity", "+infinity"):
        raise DatetimeOverflow(f"timestamp {word} is not supported (a finite one is)")
    extra = timedelta(0)
    long_fraction = _FRACTION.search(word)
    if long_fraction is not None:
        digits = long_fraction.group(1)
        micros = round(Decimal("0." + digits) * 1_000_000)
        extra = timedelta(microseconds=micros)
        word = word[: long_fraction.start()] + word[long_fraction.end() :]
    try:
        value = datetime.fromisoformat(word)
    except ValueError as exc:
        shown = text if len(text) <= 64 else text[:64] + "..."
        if "Invalid isoformat" not in str(exc):  # the form is right, a field is not
            raise DatetimeOverflow(f'date/time field value out of range: "{shown}"') from None
        raise InvalidTextRepresentation(
            f'invalid input syntax for type {written}: "{shown}"', sqlstate="22007"
        ) from None
    if extra:
        try:
            value += extra
        except OverflowError:
            raise DatetimeOverflow("timestamp out of range") from None
    return value


def parse_timestamptz(
    text: str, zone: str = "UTC", written: str = "timestamp with time zone"
) -> datetime:
    """A timestamptz's text as the instant (aware, UTC) it names: without an
    offset, local time in ``zone`` (the session's TimeZone), as PostgreSQL."""
    return to_utc(parse_timestamp(text, written), zone)


_TRUE: Final = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE: Final = frozenset({"f", "false", "n", "no", "off", "0"})


def float_text(value: float) -> str:
    """A double as PostgreSQL prints it: its shortest round-trip form."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def float_to_int(value: float) -> int:
    """Round half to even, as PostgreSQL's float8 -> int8; NumericOverflow outside int64."""
    if not math.isfinite(value) or not INT64_MIN <= round(value) <= INT64_MAX:
        raise NumericOverflow(f"{float_text(value)} is out of range for bigint")
    return round(value)


def _to_int(value: object, written: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return float_to_int(value)
    if isinstance(value, str):
        text = value.strip()
        body = text[1:] if text[:1] in "+-" else text
        if not body.isascii() or not body.isdigit():
            raise InvalidTextRepresentation(f'invalid input syntax for type {written}: "{value}"')
        return check_int64(int(text), f"{written} input")
    return value  # type: ignore[return-value]  # an int


def cast_value(value: object, target: str, written: str, zone: str = "UTC") -> object:
    """``value::target`` (NULL stays NULL); a timestamptz is read from and printed
    to text in ``zone``, the session's TimeZone."""
    if value is None:
        return None
    if target == ARRAY:
        return value if isinstance(value, tuple) else parse_array(str(value))
    if target == TIMESTAMPTZ:
        if isinstance(value, datetime):
            return value
        return parse_timestamptz(str(value), zone)
    if target == TEXT:
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, datetime):
            text = timestamptz_text(value, zone)
        else:
            text = float_text(value) if isinstance(value, float) else str(value)
        if written.endswith(")"):  # varchar(n): an explicit cast cuts to n characters
            text = text[: int(written[written.index("(") + 1 : -1].split(",")[0])]
        return text
    if target == INT:
        whole = _to_int(value, written)
        narrow = NARROW_INTS.get(written)
        if narrow is not None and not -narrow[1] <= whole < narrow[1]:
            raise NumericOverflow(f"{narrow[0]} out of range")
        return whole
    if target == FLOAT:
        if isinstance(value, str):
            text = value.strip().lower()
            special = {
                "nan": math.nan,
                "infinity": math.inf,
                "+infinity": math.inf,
                "-infinity": -math.inf,
                "inf": math.inf,
                "+inf": math.inf,
                "-inf": -math.inf,
            }
            if text in special:
                return special[text]
            try:
                number = float(text) if text and "_" not in text else None
            except ValueError:
                number = None
            if number is None or (math.isinf(number) and "inf" not in text):
                if number is not None:  # 1e999: a number, out of range
                    raise NumericOverflow(f'"{value}" is out of range for type {written}')
                raise InvalidTextRepresentation(
                    f'invalid input syntax for type {written}: "{value}"'
                )
            return number
        return float(value)  # type: ignore[arg-type]  # int (bool refused by cast_type)
    # BOOL
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise InvalidTextRepresentation(f'invalid input syntax for type boolean: "{value}"')
    return value != 0 if isinstance(value, int) and not isinstance(value, bool) else value


def check_select_list(
    items: Sequence[ast.Expr], where: ast.Expr | None, column_type: Callable[..., str]
) -> list[str]:
    """The types of a select list (and a check of its WHERE), for both evaluators."""
    if where is not None:
        boolean_operand("where", infer(where, column_type, where="in WHERE"))
    over_aggregates = any(find_aggregates(e) for e in items)
    return [infer(e, column_type, over_aggregates=over_aggregates) for e in items]
