"""The expression layer: compile an expression tree into a function of a row.

``compile_expr(expr, scope, ctx)`` resolves every column and function once
and returns a closure ``row -> value``; evaluating it costs a few Python
calls per node. SQL semantics: NULL (None) propagates through arithmetic and
comparison; AND/OR are three-valued; integer division truncates toward zero
and integers never lose precision (Python ints). Aggregates (count, sum,
avg, min, max) are compiled by :func:`compile_aggregate` and read back
through ``aggregate_slots``.

Row-at-a-time evaluation serves the table functions over engine state; the
executor's vectorised evaluation over numpy morsels reuses the same trees,
scope and function tables.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from resgroups.errors import (
    DatatypeMismatch,
    DivisionByZero,
    GroupingError,
    UndefinedColumn,
    UndefinedFunction,
    did_you_mean,
)
from resgroups.sql import ast

Row = Sequence[Any]
Evaluator = Callable[[Row], Any]


@dataclass(frozen=True)
class EvalContext:
    """What an expression may ask of the query running it."""

    current_group: str | None = None


@dataclass(frozen=True)
class Scope:
    """The columns a row holds, by position."""

    names: tuple[str, ...]

    def index(self, ident: ast.Ident) -> int:
        for i, name in enumerate(self.names):
            if name == ident.text:
                return i
        if not ident.quoted:
            for i, name in enumerate(self.names):
                if name.casefold() == ident.text.casefold():
                    return i
        raise UndefinedColumn(
            f"column {ident.text} does not exist; columns: {', '.join(self.names) or '(none)'}."
            + did_you_mean(ident.text, self.names)
        )


# ---- operators ----------------------------------------------------------------


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "double", str: "text"}.get(
        type(value), type(value).__name__
    )


def _numeric(op: str, a: Any, b: Any) -> None:
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise DatatypeMismatch(
                f"operator {op} needs numbers, got {_type_name(a)} {op} {_type_name(b)}"
            )


def _divide(a: Any, b: Any) -> Any:
    _numeric("/", a, b)
    if b == 0:
        raise DivisionByZero(f"division by zero: {a} / {b}")
    if isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)
        return quotient if (a >= 0) == (b >= 0) else -quotient
    return a / b


def _modulo(a: Any, b: Any) -> Any:
    _numeric("%", a, b)
    if b == 0:
        raise DivisionByZero(f"division by zero: {a} % {b}")
    if isinstance(a, int) and isinstance(b, int):
        return a - b * _divide(a, b)
    return math.fmod(a, b)


def _arith(op: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        _numeric(op, a, b)
        return fn(a, b)

    return apply


def _comparable(op: str, a: Any, b: Any) -> None:
    numeric = (int, float)
    a_num = isinstance(a, numeric) and not isinstance(a, bool)
    b_num = isinstance(b, numeric) and not isinstance(b, bool)
    if (a_num and b_num) or type(a) is type(b):
        return
    raise DatatypeMismatch(f"cannot compare {_type_name(a)} {op} {_type_name(b)}: {a!r}, {b!r}")


def _compare(op: str, fn: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        _comparable(op, a, b)
        return fn(a, b)

    return apply


def like_pattern(pattern: str) -> re.Pattern[str]:
    """SQL LIKE (% any run, _ one character) as an anchored regular expression."""
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


def _like(a: Any, b: Any) -> Any:
    if not isinstance(a, str) or not isinstance(b, str):
        raise DatatypeMismatch(f"LIKE needs text, got {_type_name(a)} LIKE {_type_name(b)}")
    return like_pattern(b).fullmatch(a) is not None


BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": _arith("+", lambda a, b: a + b),
    "-": _arith("-", lambda a, b: a - b),
    "*": _arith("*", lambda a, b: a * b),
    "/": _divide,
    "%": _modulo,
    "=": _compare("=", lambda a, b: a == b),
    "<>": _compare("<>", lambda a, b: a != b),
    "<": _compare("<", lambda a, b: a < b),
    "<=": _compare("<=", lambda a, b: a <= b),
    ">": _compare(">", lambda a, b: a > b),
    ">=": _compare(">=", lambda a, b: a >= b),
    "like": _like,
}


def truth(op: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise DatatypeMismatch(f"argument of {op.upper()} must be boolean, not {_type_name(value)}")


# ---- functions --------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarFunction:
    arity: tuple[int, int]  # min, max arguments
    apply: Callable[..., Any]
    null_in_null_out: bool = True


def _round(x: Any, digits: Any = 0) -> Any:
    _numeric("round", x, digits)
    if isinstance(x, int):
        return x
    return float(round(x, int(digits)))


def _text_fn(name: str, fn: Callable[[str], Any]) -> Callable[[Any], Any]:
    def apply(value: Any) -> Any:
        if not isinstance(value, str):
            raise DatatypeMismatch(f"{name}() needs text, got {_type_name(value)}")
        return fn(value)

    return apply


def _abs(x: Any) -> Any:
    _numeric("abs", x, 0)
    return abs(x)


SCALAR_FUNCTIONS: Final[dict[str, ScalarFunction]] = {
    "lower": ScalarFunction((1, 1), _text_fn("lower", str.lower)),
    "upper": ScalarFunction((1, 1), _text_fn("upper", str.upper)),
    "length": ScalarFunction((1, 1), _text_fn("length", len)),
    "abs": ScalarFunction((1, 1), _abs),
    "round": ScalarFunction((1, 2), _round),
    "coalesce": ScalarFunction(
        (1, 255), lambda *xs: next((x for x in xs if x is not None), None), False
    ),
}
CONTEXT_FUNCTIONS: Final[dict[str, Callable[[EvalContext], Any]]] = {
    "current_resource_group": lambda ctx: ctx.current_group,
}
AGGREGATES: Final = ("count", "sum", "avg", "min", "max")


def is_aggregate(expr: ast.Expr) -> bool:
    return isinstance(expr, ast.Call) and expr.name in AGGREGATES


def find_aggregates(expr: ast.Expr) -> list[ast.Call]:
    """The aggregate calls inside ``expr`` (not descending into their arguments)."""
    if is_aggregate(expr):
        assert isinstance(expr, ast.Call)
        return [expr]
    found: list[ast.Call] = []
    for child in _children(expr):
        found += find_aggregates(child)
    return found


def _children(expr: ast.Expr) -> tuple[ast.Expr, ...]:
    match expr:
        case ast.Unary(operand=operand) | ast.IsNull(operand=operand):
            return (operand,)
        case ast.Binary(left=left, right=right):
            return (left, right)
        case ast.InList(operand=operand, items=items):
            return (operand, *items)
        case ast.Call(args=args):
            return args
    return ()


def _all_function_names() -> list[str]:
    return [*SCALAR_FUNCTIONS, *CONTEXT_FUNCTIONS, *AGGREGATES]


# ---- compilation ---------------------------------------------------------------------


def compile_expr(
    expr: ast.Expr,
    scope: Scope,
    ctx: EvalContext,
    *,
    aggregate_slots: Mapping[ast.Call, int] | None = None,
) -> Evaluator:
    """A function of a row computing ``expr``.

    With ``aggregate_slots`` the row is the tuple of aggregate results: each
    aggregate call reads its slot, and a bare column is a GroupingError.
    """

    def sub(e: ast.Expr) -> Evaluator:
        return compile_expr(e, scope, ctx, aggregate_slots=aggregate_slots)

    match expr:
        case ast.Literal(value=value):
            return lambda row: value
        case ast.Column(name=name):
            if aggregate_slots is not None:
                raise GroupingError(
                    f"column {name.text} must appear inside an aggregate function "
                    "(there is no GROUP BY)"
                )
            i = scope.index(name)
            return lambda row: row[i]
        case ast.Unary(op="-", operand=operand):
            inner = sub(operand)

            def negate(row: Row) -> Any:
                v = inner(row)
                if v is None:
                    return None
                _numeric("-", 0, v)
                return -v

            return negate
        case ast.Unary(op="not", operand=operand):
            inner = sub(operand)

            def negation(row: Row) -> Any:
                v = truth("not", inner(row))
                return None if v is None else not v

            return negation
        case ast.Binary(op="and" | "or" as op, left=left, right=right):
            return _logic(op, sub(left), sub(right))
        case ast.Binary(op=op, left=left, right=right):
            fn, lhs, rhs = BINARY[op], sub(left), sub(right)

            def binary(row: Row) -> Any:
                a, b = lhs(row), rhs(row)
                return None if a is None or b is None else fn(a, b)

            return binary
        case ast.IsNull(operand=operand, negated=negated):
            inner = sub(operand)
            return lambda row: (inner(row) is None) != negated
        case ast.InList(operand=operand, items=items, negated=negated):
            return _in_list(sub(operand), [sub(i) for i in items], negated)
        case ast.Call():
            return _compile_call(expr, sub, ctx, aggregate_slots)
    raise TypeError(f"not an expression: {expr!r}")


def _logic(op: str, lhs: Evaluator, rhs: Evaluator) -> Evaluator:
    stop = op == "or"  # OR stops at TRUE, AND at FALSE

    def logic(row: Row) -> Any:
        a = truth(op, lhs(row))
        if a is stop:
            return stop
        b = truth(op, rhs(row))
        if b is stop:
            return stop
        return None if a is None or b is None else not stop

    return logic


def _in_list(operand: Evaluator, items: list[Evaluator], negated: bool) -> Evaluator:
    def in_list(row: Row) -> Any:
        value = operand(row)
        if value is None:
            return None
        saw_null = False
        for item in items:
            candidate = item(row)
            if candidate is None:
                saw_null = True
                continue
            _comparable("IN", value, candidate)
            if value == candidate:
                return not negated
        return None if saw_null else negated

    return in_list


def _compile_call(
    call: ast.Call,
    sub: Callable[[ast.Expr], Evaluator],
    ctx: EvalContext,
    aggregate_slots: Mapping[ast.Call, int] | None,
) -> Evaluator:
    if call.name in AGGREGATES:
        if aggregate_slots is None or call not in aggregate_slots:
            raise GroupingError(f"aggregate function {call.name}() is not allowed here")
        slot = aggregate_slots[call]
        return lambda row: row[slot]
    if call.star:
        raise DatatypeMismatch(f"{call.name}(*) is not allowed; only count(*) takes *")
    if call.name in CONTEXT_FUNCTIONS:
        if call.args:
            raise DatatypeMismatch(f"{call.name}() takes no arguments")
        value = CONTEXT_FUNCTIONS[call.name](ctx)
        return lambda row: value
    fn = SCALAR_FUNCTIONS.get(call.name)
    if fn is None:
        raise UndefinedFunction(
            f"function {call.name}() does not exist."
            + did_you_mean(call.name, _all_function_names())
        )
    low, high = fn.arity
    if not low <= len(call.args) <= high:
        expected = str(low) if low == high else f"{low} to {high}"
        raise DatatypeMismatch(f"{call.name}() takes {expected} arguments, got {len(call.args)}")
    args = [sub(a) for a in call.args]

    def apply(row: Row) -> Any:
        values = [a(row) for a in args]
        if fn.null_in_null_out and any(v is None for v in values):
            return None
        return fn.apply(*values)

    return apply


# ---- aggregates ---------------------------------------------------------------------


def compile_aggregate(
    call: ast.Call, scope: Scope, ctx: EvalContext
) -> Callable[[Sequence[Row]], Any]:
    """A function of all input rows computing one aggregate call."""
    if call.star:
        if call.name != "count":
            raise DatatypeMismatch(f"{call.name}(*) is not allowed; only count(*) takes *")
        return len
    if len(call.args) != 1:
        raise DatatypeMismatch(f"{call.name}() takes 1 argument, got {len(call.args)}")
    if find_aggregates(call.args[0]):
        raise GroupingError(f"aggregate calls cannot be nested inside {call.name}()")
    arg = compile_expr(call.args[0], scope, ctx)
    name = call.name

    def aggregate(rows: Sequence[Row]) -> Any:
        values = [v for v in (arg(r) for r in rows) if v is not None]
        if name == "count":
            return len(values)
        if not values:
            return None
        if name in ("sum", "avg"):
            for v in values:
                _numeric(name, v, 0)
            total = sum(values)  # ints stay exact
            return total if name == "sum" else total / len(values)
        for v in values[1:]:
            _comparable(name, values[0], v)
        return min(values) if name == "min" else max(values)

    return aggregate
