"""The vectorised evaluator: expressions over numpy morsels.

The same trees and the same semantics as the row evaluator
(:mod:`resgroups.sql.semantics`): the executor type-checks every expression
with ``semantics.infer`` before the first morsel, so the operators here only
compute. Integers are int64 and exact: +, -, *, unary minus, abs and
division check for overflow and raise the semantics' NumericOverflow instead
of wrapping; sums are combined as Python ints (:func:`exact_sum`), so they
are exact beyond 2^53 and fail past int64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

import numpy as np

from resgroups.errors import DatatypeMismatch, DivisionByZero, NumericOverflow, UndefinedFunction
from resgroups.sql import ast
from resgroups.sql.expr import CONTEXT_FUNCTIONS, EvalContext, Scope
from resgroups.sql.semantics import (
    AGGREGATES,
    BOOL,
    FLOAT,
    INT,
    INT64_MIN,
    NARROW_INTS,
    TEXT,
    check_int64,
    children,
    float_to_int,
    int_literal,
    overflow,
    shown,
    value_type,
)

Array = np.ndarray[Any, Any]


def dtype_type(dtype: np.dtype[Any]) -> str:
    """The SQL type of a numpy column."""
    if dtype == np.bool_:
        return BOOL
    if np.issubdtype(dtype, np.integer):
        return INT
    if np.issubdtype(dtype, np.floating):
        return FLOAT
    return TEXT


def _kind(a: Array) -> str:
    return dtype_type(a.dtype)


def _both_int(a: Array, b: Array) -> bool:
    return _kind(a) == _kind(b) == INT


def _add(a: Array, b: Array) -> Array:
    if _both_int(a, b):
        r = a + b  # wraps silently; same-sign inputs with a flipped sign overflowed
        if np.any(((a >= 0) == (b >= 0)) & ((r >= 0) != (a >= 0))):
            raise overflow("+")
        return r
    return a.astype(np.float64) + b.astype(np.float64)


def _sub(a: Array, b: Array) -> Array:
    if _both_int(a, b):
        r = a - b
        if np.any(((a >= 0) != (b >= 0)) & ((r >= 0) != (a >= 0))):
            raise overflow("-")
        return r
    return a.astype(np.float64) - b.astype(np.float64)


def _mul(a: Array, b: Array) -> Array:
    if _both_int(a, b):
        with np.errstate(all="ignore"):
            r = a * b
            # exact check: r == a*b unless it wrapped; dividing back finds out
            nonzero = a != 0
            safe_a = np.where(nonzero, a, 1)
            back_ok = np.where(nonzero, (r // safe_a == b) & (r % safe_a == 0), True)
        edge = (a == -1) & (b == INT64_MIN) | (b == -1) & (a == INT64_MIN)
        if not np.all(back_ok) or np.any(edge):
            raise overflow("*")
        return r
    return a.astype(np.float64) * b.astype(np.float64)


def _div(a: Array, b: Array) -> Array:
    if np.any(b == 0):
        raise DivisionByZero("division by zero")
    if _both_int(a, b):
        if np.any((a == INT64_MIN) & (b == -1)):
            raise overflow("/")
        q: Array = a // b
        # floor division rounds toward -inf; SQL truncates toward zero
        q += (a % b != 0) & ((a < 0) != (b < 0))
        return q
    return a.astype(np.float64) / b.astype(np.float64)


def _mod(a: Array, b: Array) -> Array:
    if np.any(b == 0):
        raise DivisionByZero("division by zero")
    if _both_int(a, b):
        return np.fmod(a, b)  # the sign of the dividend, as in SQL
    return np.fmod(a.astype(np.float64), b.astype(np.float64))


BINARY: Final[dict[str, Callable[[Array, Array], Array]]] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": _div,
    "%": _mod,
    "=": np.equal,
    "<>": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


def _abs(a: Array) -> Array:
    if _kind(a) == INT and np.any(a == INT64_MIN):
        raise overflow("abs")
    return np.abs(a)


def _round(a: Array, digits: Array | None = None) -> Array:
    if _kind(a) == INT:
        return a
    return np.round(a, int(digits[0]) if digits is not None and len(digits) else 0)


VECTOR_FUNCTIONS: Final[dict[str, tuple[tuple[int, int], Callable[..., Array]]]] = {
    "abs": ((1, 1), _abs),
    "round": ((1, 2), _round),
}


def _literal(value: object, n: int) -> Array:
    if value is None:
        raise DatatypeMismatch("NULL is not supported by the executor (its columns have no NULLs)")
    if isinstance(value, bool):
        return np.full(n, value, dtype=np.bool_)
    if isinstance(value, int):
        return np.full(n, check_int64(value, "integer literal"), dtype=np.int64)
    if isinstance(value, float):
        return np.full(n, value, dtype=np.float64)
    raise DatatypeMismatch(_unsupported_value(value))


def _unsupported_value(value: object) -> str:
    """Why a value the executor's columns cannot hold is refused, naming its SQL
    type (never a Python repr: a bound parameter is a datetime, a Decimal ...)."""
    if isinstance(value, datetime):
        return "a timestamptz value is not supported by the executor (its columns are numbers)"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:40] + "..."
        return "text literal '" + text.replace("'", "''") + "' is not supported by the executor"
    return f"a value of type {shown(value_type(value))} is not supported by the executor"


@dataclass
class Morsel:
    """Columns of one morsel: name -> array, all of length ``n``."""

    scope: Scope
    arrays: list[Array]
    n: int
    ctx: EvalContext = field(default_factory=EvalContext)


def supported(expr: ast.Expr) -> None:
    """Refuse, before the first morsel, what the semantics allows but this
    evaluator does not compute (its columns are numbers and have no NULLs)."""
    if int_literal(expr) is not None:
        return
    match expr:
        case ast.Literal(value=None):
            raise DatatypeMismatch(
                "NULL is not supported by the executor (its columns have no NULLs)"
            )
        case ast.Literal(value=str() | datetime() as value):
            raise DatatypeMismatch(_unsupported_value(value))
        case ast.Binary(op="like"):
            raise DatatypeMismatch("LIKE needs text; the executor's columns are numbers")
        case ast.Cast(type="text", written=written):
            raise DatatypeMismatch(f"a cast to {written} is not supported by the executor")
        case ast.Call(name=name) if (
            name not in VECTOR_FUNCTIONS
            and name not in AGGREGATES
            and name not in CONTEXT_FUNCTIONS
        ):
            raise UndefinedFunction(
                f"function {name}() is not available in the executor; it has "
                + ", ".join(f"{f}()" for f in [*VECTOR_FUNCTIONS, *AGGREGATES, *CONTEXT_FUNCTIONS])
            )
    for child in children(expr):
        supported(child)


def evaluate(expr: ast.Expr, m: Morsel) -> Array:
    """``expr`` over every row of the morsel (type-checked and :func:`supported`)."""
    literal = int_literal(expr)
    if literal is not None:
        return np.full(m.n, literal, dtype=np.int64)
    match expr:
        case ast.Literal(value=value):
            return _literal(value, m.n)
        case ast.Column(name=name):
            return m.arrays[m.scope.index(name)]
        case ast.Unary(op="-", operand=operand):
            a = evaluate(operand, m)
            if _kind(a) == INT and np.any(a == INT64_MIN):
                raise overflow("unary -")
            return -a
        case ast.Unary(op="not", operand=operand):
            return ~evaluate(operand, m)
        case ast.Binary(op="and", left=left, right=right):
            return evaluate(left, m) & evaluate(right, m)
        case ast.Binary(op="or", left=left, right=right):
            return evaluate(left, m) | evaluate(right, m)
        case ast.Binary(op=op, left=left, right=right):
            return BINARY[op](evaluate(left, m), evaluate(right, m))
        case ast.IsNull(negated=negated):
            return np.full(m.n, negated, dtype=np.bool_)  # no NULLs in executor columns
        case ast.InList(operand=operand, items=items, negated=negated):
            a = evaluate(operand, m)
            hits = np.zeros(m.n, dtype=np.bool_)
            for item in items:
                hits |= BINARY["="](a, evaluate(item, m))
            return ~hits if negated else hits
        case ast.Cast(operand=operand, type=target, written=written):
            return _cast(evaluate(operand, m), target, written)
        case ast.Call(name=name) if name in CONTEXT_FUNCTIONS:
            return np.full(m.n, CONTEXT_FUNCTIONS[name](m.ctx), dtype=object)
        case ast.Call(name=name, args=args) if name in VECTOR_FUNCTIONS:
            return VECTOR_FUNCTIONS[name][1](*(evaluate(a, m) for a in args))
    raise TypeError(f"not an expression the executor computes: {expr!r}")


def _cast(a: Array, target: str, written: str = "") -> Array:
    """A cast over a morsel's column (semantics.cast_value, vectorised); a cast to
    ``int4``/``smallint`` checks their range, as cast_value does."""
    out = _cast_kind(a, target)
    if target == INT and written in NARROW_INTS:
        name, bound = NARROW_INTS[written]
        if out.size and (int(out.min()) < -bound or int(out.max()) >= bound):
            raise NumericOverflow(f"{name} out of range")
    return out


def _cast_kind(a: Array, target: str) -> Array:
    source = _kind(a)
    if source == target:
        return a
    if target == BOOL:
        return np.not_equal(a, 0)
    if target == FLOAT:
        return a.astype(np.float64)
    if source == FLOAT:  # to int: half to even, as np.rint, and it must fit int64
        rounded = np.rint(a)
        bad = ~np.isfinite(rounded) | (rounded < -(2.0**63)) | (rounded >= 2.0**63)
        if np.any(bad):
            float_to_int(float(a[bad][0]))  # raises, naming the value
        return rounded.astype(np.int64)
    return a.astype(np.int64)  # from bool


# ---- aggregates: exact partials per morsel, combined in Python -------------------------


def exact_sum(a: Array) -> int:
    """The exact sum of an int64 array as a Python int (no wrap-around).

    Each value splits into a high and a low 32-bit half; summing the halves
    in int64 cannot overflow for fewer than 2^31 values.
    """
    if len(a) >= 2**31:
        half = len(a) // 2
        return exact_sum(a[:half]) + exact_sum(a[half:])
    high = np.right_shift(a, 32).sum(dtype=np.int64)
    low = np.bitwise_and(a, 0xFFFFFFFF).sum(dtype=np.int64)
    return int(high) * 2**32 + int(low)


@dataclass
class Partial:
    """One aggregate over one morsel."""

    count: int = 0
    total: int | float = 0
    low: Any = None
    high: Any = None
    integer: bool = True


def partial(call: ast.Call, m: Morsel) -> Partial:
    """One aggregate over one morsel (the call was type-checked by the semantics)."""
    if call.star:
        return Partial(count=m.n)
    a = evaluate(call.args[0], m)
    p = Partial(count=len(a), integer=_kind(a) == INT)
    if call.name in ("sum", "avg"):
        p.total = exact_sum(a) if p.integer else float(np.sum(a, dtype=np.float64))
    elif call.name in ("min", "max") and len(a):
        if _kind(a) == TEXT:
            raise DatatypeMismatch(f"{call.name}() of text is not supported by the executor")
        p.low, p.high = a.min().item(), a.max().item()
    return p


def merge(a: Partial, b: Partial) -> Partial:
    """Two partials of one aggregate as one (exact: integer totals are Python ints)."""
    lows = [v for v in (a.low, b.low) if v is not None]
    highs = [v for v in (a.high, b.high) if v is not None]
    return Partial(
        count=a.count + b.count,
        total=a.total + b.total,
        low=min(lows) if lows else None,
        high=max(highs) if highs else None,
        integer=a.integer and b.integer,
    )


def combine(call: ast.Call, parts: list[Partial]) -> Any:
    """The aggregate's value from its morsel partials (exact for integers)."""
    count = sum(p.count for p in parts)
    if call.name == "count":
        return count
    if call.name in ("sum", "avg"):
        if not count:
            return None
        total: int | float = sum(p.total for p in parts)
        if isinstance(total, int) and call.name == "sum":
            check_int64(total, "sum")
        return total if call.name == "sum" else total / count
    values = [p.low if call.name == "min" else p.high for p in parts if p.count]
    if not values:
        return None
    return min(values) if call.name == "min" else max(values)
