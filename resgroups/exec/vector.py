"""Vectorised evaluation of the expression layer over numpy morsels.

The same trees, scope and function names as the row-at-a-time evaluator of
:mod:`resgroups.sql.expr`, evaluated a morsel at a time. Integers are int64
and exact: +, -, *, unary minus, abs and division check for overflow and
raise NumericOverflow instead of wrapping; sums are combined as Python ints
(:func:`exact_sum`), so they are exact beyond 2^53 and fail past int64.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from resgroups.errors import (
    DatatypeMismatch,
    DivisionByZero,
    GroupingError,
    NumericOverflow,
    UndefinedFunction,
    did_you_mean,
)
from resgroups.sql import ast
from resgroups.sql.expr import AGGREGATES, CONTEXT_FUNCTIONS, EvalContext, Scope

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

Array = np.ndarray[Any, Any]


def _kind(a: Array) -> str:
    if a.dtype == np.bool_:
        return "boolean"
    if np.issubdtype(a.dtype, np.integer):
        return "integer"
    if np.issubdtype(a.dtype, np.floating):
        return "double"
    return "text"


def _numeric(op: str, *arrays: Array) -> None:
    for a in arrays:
        if _kind(a) not in ("integer", "double"):
            kinds = " and ".join(_kind(x) for x in arrays)
            raise DatatypeMismatch(f"operator {op} needs numbers, got {kinds}")


def _overflow(op: str) -> NumericOverflow:
    return NumericOverflow(f"integer out of range for bigint in {op}")


def _add(a: Array, b: Array) -> Array:
    _numeric("+", a, b)
    if _kind(a) == _kind(b) == "integer":
        r = a + b  # wraps silently; same-sign inputs with a flipped sign overflowed
        if np.any(((a >= 0) == (b >= 0)) & ((r >= 0) != (a >= 0))):
            raise _overflow("+")
        return r
    return a.astype(np.float64) + b.astype(np.float64)


def _sub(a: Array, b: Array) -> Array:
    _numeric("-", a, b)
    if _kind(a) == _kind(b) == "integer":
        r = a - b
        if np.any(((a >= 0) != (b >= 0)) & ((r >= 0) != (a >= 0))):
            raise _overflow("-")
        return r
    return a.astype(np.float64) - b.astype(np.float64)


def _mul(a: Array, b: Array) -> Array:
    _numeric("*", a, b)
    if _kind(a) == _kind(b) == "integer":
        with np.errstate(all="ignore"):
            r = a * b
            # exact check: r == a*b unless it wrapped; dividing back finds out
            nonzero = a != 0
            safe_a = np.where(nonzero, a, 1)
            back_ok = np.where(nonzero, (r // safe_a == b) & (r % safe_a == 0), True)
        edge = (a == -1) & (b == INT64_MIN) | (b == -1) & (a == INT64_MIN)
        if not np.all(back_ok) or np.any(edge):
            raise _overflow("*")
        return r
    return a.astype(np.float64) * b.astype(np.float64)


def _div(a: Array, b: Array) -> Array:
    _numeric("/", a, b)
    if np.any(b == 0):
        raise DivisionByZero("division by zero")
    if _kind(a) == _kind(b) == "integer":
        if np.any((a == INT64_MIN) & (b == -1)):
            raise _overflow("/")
        q: Array = a // b
        # floor division rounds toward -inf; SQL truncates toward zero
        q += (a % b != 0) & ((a < 0) != (b < 0))
        return q
    return a.astype(np.float64) / b.astype(np.float64)


def _mod(a: Array, b: Array) -> Array:
    _numeric("%", a, b)
    if np.any(b == 0):
        raise DivisionByZero("division by zero")
    if _kind(a) == _kind(b) == "integer":
        return np.fmod(a, b)  # the sign of the dividend, as in SQL
    return np.fmod(a.astype(np.float64), b.astype(np.float64))


def _compare(op: str, fn: Callable[[Array, Array], Array]) -> Callable[[Array, Array], Array]:
    def compare(a: Array, b: Array) -> Array:
        ka, kb = _kind(a), _kind(b)
        numeric = {"integer", "double"}
        if not (ka == kb or (ka in numeric and kb in numeric)):
            raise DatatypeMismatch(f"cannot compare {ka} {op} {kb}")
        return fn(a, b)

    return compare


BINARY: Final[dict[str, Callable[[Array, Array], Array]]] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": _div,
    "%": _mod,
    "=": _compare("=", np.equal),
    "<>": _compare("<>", np.not_equal),
    "<": _compare("<", np.less),
    "<=": _compare("<=", np.less_equal),
    ">": _compare(">", np.greater),
    ">=": _compare(">=", np.greater_equal),
}


def _boolean(op: str, a: Array) -> Array:
    if _kind(a) != "boolean":
        raise DatatypeMismatch(f"argument of {op.upper()} must be boolean, not {_kind(a)}")
    return a


def _abs(a: Array) -> Array:
    _numeric("abs", a)
    if _kind(a) == "integer" and np.any(a == INT64_MIN):
        raise _overflow("abs")
    return np.abs(a)


def _round(a: Array, digits: Array | None = None) -> Array:
    _numeric("round", a)
    if _kind(a) == "integer":
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
        if not INT64_MIN <= value <= INT64_MAX:
            raise NumericOverflow(f"integer literal {value} is out of range for bigint")
        return np.full(n, value, dtype=np.int64)
    if isinstance(value, float):
        return np.full(n, value, dtype=np.float64)
    raise DatatypeMismatch(f"text literal {value!r} is not supported by the executor")


@dataclass
class Morsel:
    """Columns of one morsel: name -> array, all of length ``n``."""

    scope: Scope
    arrays: list[Array]
    n: int
    ctx: EvalContext = field(default_factory=EvalContext)


def evaluate(expr: ast.Expr, m: Morsel) -> Array:
    """``expr`` over every row of the morsel."""
    match expr:
        case ast.Literal(value=value):
            return _literal(value, m.n)
        case ast.Column(name=name):
            return m.arrays[m.scope.index(name)]
        case ast.Unary(op="-", operand=operand):
            a = evaluate(operand, m)
            _numeric("-", a)
            if _kind(a) == "integer" and np.any(a == INT64_MIN):
                raise _overflow("unary -")
            return -a
        case ast.Unary(op="not", operand=operand):
            return ~_boolean("not", evaluate(operand, m))
        case ast.Binary(op="and", left=left, right=right):
            return _boolean("and", evaluate(left, m)) & _boolean("and", evaluate(right, m))
        case ast.Binary(op="or", left=left, right=right):
            return _boolean("or", evaluate(left, m)) | _boolean("or", evaluate(right, m))
        case ast.Binary(op="like"):
            raise DatatypeMismatch("LIKE needs text; the executor's columns are numbers")
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
        case ast.Call(name=name) if name in AGGREGATES:
            raise GroupingError(f"aggregate function {name}() is not allowed here")
        case ast.Call(name=name, args=args) if name in CONTEXT_FUNCTIONS:
            if args:
                raise DatatypeMismatch(f"{name}() takes no arguments")
            return np.full(m.n, CONTEXT_FUNCTIONS[name](m.ctx), dtype=object)
        case ast.Call(name=name, args=args):
            if name not in VECTOR_FUNCTIONS:
                raise UndefinedFunction(
                    f"function {name}() is not available in the executor."
                    + did_you_mean(name, [*VECTOR_FUNCTIONS, *AGGREGATES])
                )
            (low, high), fn = VECTOR_FUNCTIONS[name]
            if not low <= len(args) <= high:
                raise DatatypeMismatch(f"{name}() takes {low} to {high} arguments, got {len(args)}")
            return fn(*(evaluate(a, m) for a in args))
    raise TypeError(f"not an expression: {expr!r}")


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
    if call.star:
        if call.name != "count":
            raise DatatypeMismatch(f"{call.name}(*) is not allowed; only count(*) takes *")
        return Partial(count=m.n)
    if len(call.args) != 1:
        raise DatatypeMismatch(f"{call.name}() takes 1 argument, got {len(call.args)}")
    a = evaluate(call.args[0], m)
    p = Partial(count=len(a), integer=_kind(a) == "integer")
    if call.name in ("sum", "avg"):
        _numeric(call.name, a)
        p.total = exact_sum(a) if p.integer else float(np.sum(a, dtype=np.float64))
    elif call.name in ("min", "max") and len(a):
        if _kind(a) == "text":
            raise DatatypeMismatch(f"{call.name}() of text is not supported by the executor")
        p.low, p.high = a.min().item(), a.max().item()
    return p


def combine(call: ast.Call, parts: list[Partial]) -> Any:
    """The aggregate's value from its morsel partials (exact for integers)."""
    count = sum(p.count for p in parts)
    if call.name == "count":
        return count
    if call.name in ("sum", "avg"):
        if not count:
            return None
        total: int | float = sum(p.total for p in parts)
        if isinstance(total, int) and call.name == "sum" and not INT64_MIN <= total <= INT64_MAX:
            raise NumericOverflow(f"sum {total} is out of range for bigint")
        return total if call.name == "sum" else total / count
    values = [p.low if call.name == "min" else p.high for p in parts if p.count]
    if not values:
        return None
    return min(values) if call.name == "min" else max(values)
