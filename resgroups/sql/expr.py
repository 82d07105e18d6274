"""The row evaluator: compile an expression tree into a function of a row.

``compile_expr(expr, scope, ctx)`` type-checks the tree once with
:func:`resgroups.sql.semantics.infer` (the semantics the vectorised
evaluator shares), resolves every column and function, and returns a closure
``row -> value``; evaluating it costs a few Python calls per node. NULL
(None) propagates through arithmetic and comparison; AND/OR are
three-valued; integer results outside int64 raise NumericOverflow, as the
vectorised evaluator's do. Aggregates (count, sum, avg, min, max) are
compiled by :func:`compile_aggregate` and read back through
``aggregate_slots``.

Row-at-a-time evaluation serves the table functions over engine state,
SELECT without FROM, and the final expressions over an executor query's
aggregates.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from resgroups.errors import DivisionByZero, UndefinedColumn, did_you_mean
from resgroups.sql import ast
from resgroups.sql.semantics import (
    AGGREGATES,
    INT,
    UNKNOWN,
    cast_value,
    check_int64,
    find_aggregates,
    infer,
    int_literal,
    truncated_div,
)
from resgroups.version import VERSION_STRING

__all__ = [
    "AGGREGATES",
    "EvalContext",
    "Evaluator",
    "Row",
    "Scope",
    "compile_aggregate",
    "compile_expr",
    "find_aggregates",
    "like_pattern",
]

Row = Sequence[Any]
Evaluator = Callable[[Row], Any]


@dataclass(frozen=True)
class EvalContext:
    """What an expression may ask of the query running it."""

    current_group: str | None = None
    user: str | None = None  # the session's principal (current_user, session_user)
    database: str = "resgroups"  # what a wire client named at startup (current_database)


@dataclass(frozen=True)
class Scope:
    """The columns a row holds, by position, and their types where known."""

    names: tuple[str, ...]
    types: tuple[str | None, ...] = ()

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

    def column_type(self, ident: ast.Ident) -> str:
        i = self.index(ident)
        return (self.types[i] if i < len(self.types) else None) or UNKNOWN


# ---- operators (operands already type-checked; None is NULL) -----------------------


def _divide(a: Any, b: Any) -> Any:
    if b == 0:
        raise DivisionByZero(f"division by zero: {a} / {b}")
    if isinstance(a, int) and isinstance(b, int):
        return check_int64(truncated_div(a, b), "/")
    return a / b


def _modulo(a: Any, b: Any) -> Any:
    if b == 0:
        raise DivisionByZero(f"division by zero: {a} % {b}")
    if isinstance(a, int) and isinstance(b, int):
        return a - b * truncated_div(a, b)
    return math.fmod(a, b)


def _exact(op: str, fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def apply(a: Any, b: Any) -> Any:
        result = fn(a, b)
        return check_int64(result, op) if type(result) is int else result

    return apply


def like_pattern(pattern: str) -> re.Pattern[str]:
    """SQL LIKE (% any run, _ one character) as an anchored regular expression."""
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.compile("".join(parts), re.DOTALL)


BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": _exact("+", lambda a, b: a + b),
    "-": _exact("-", lambda a, b: a - b),
    "*": _exact("*", lambda a, b: a * b),
    "/": _divide,
    "%": _modulo,
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "like": lambda a, b: like_pattern(b).fullmatch(a) is not None,
}


# ---- functions --------------------------------------------------------------------


def _round(x: Any, digits: Any = 0) -> Any:
    if isinstance(x, int):
        return x
    return float(round(x, int(digits)))


def _abs(x: Any) -> Any:
    return check_int64(abs(x), "abs") if isinstance(x, int) else abs(x)


# name -> (implementation, NULL in gives NULL out); signatures: semantics.FUNCTIONS
SCALAR_FUNCTIONS: Final[dict[str, tuple[Callable[..., Any], bool]]] = {
    "lower": (str.lower, True),
    "upper": (str.upper, True),
    "length": (len, True),
    "abs": (_abs, True),
    "round": (_round, True),
    "coalesce": (lambda *xs: next((x for x in xs if x is not None), None), False),
}
CONTEXT_FUNCTIONS: Final[dict[str, Callable[[EvalContext], Any]]] = {
    "current_resource_group": lambda ctx: ctx.current_group,
    "version": lambda ctx: VERSION_STRING,
    "current_user": lambda ctx: ctx.user,
    "session_user": lambda ctx: ctx.user,
    "current_schema": lambda ctx: "public",  # the one schema of the executor's tables
    "current_database": lambda ctx: ctx.database,
}


# ---- compilation ---------------------------------------------------------------------


def compile_expr(
    expr: ast.Expr,
    scope: Scope,
    ctx: EvalContext,
    *,
    aggregate_slots: Mapping[ast.Call, int] | None = None,
) -> Evaluator:
    """A function of a row computing ``expr``, type-checked first.

    With ``aggregate_slots`` the row is the tuple of aggregate results: each
    aggregate call reads its slot, and a bare column is a GroupingError.
    """
    infer(expr, scope.column_type, over_aggregates=aggregate_slots is not None)
    return _compile(expr, scope, ctx, aggregate_slots)


def _compile(
    expr: ast.Expr,
    scope: Scope,
    ctx: EvalContext,
    aggregate_slots: Mapping[ast.Call, int] | None,
) -> Evaluator:
    def sub(e: ast.Expr) -> Evaluator:
        return _compile(e, scope, ctx, aggregate_slots)

    literal = int_literal(expr)
    if literal is not None:
        return lambda row: literal
    match expr:
        case ast.Literal(value=value):
            return lambda row: value
        case ast.Column(name=name):
            i = scope.index(name)
            return lambda row: row[i]
        case ast.Unary(op="-", operand=operand):
            inner = sub(operand)

            def negate(row: Row) -> Any:
                v = inner(row)
                if v is None:
                    return None
                return check_int64(-v, "unary -") if type(v) is int else -v

            return negate
        case ast.Unary(op="not", operand=operand):
            inner = sub(operand)

            def negation(row: Row) -> Any:
                v = inner(row)
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
        case ast.Cast(operand=operand, type=target, written=written):
            inner = sub(operand)
            return lambda row: cast_value(inner(row), target, written)
        case ast.Call(name=name) if name in AGGREGATES:
            assert aggregate_slots is not None  # infer() allowed it
            slot = aggregate_slots[expr]
            return lambda row: row[slot]
        case ast.Call(name=name) if name in CONTEXT_FUNCTIONS:
            value = CONTEXT_FUNCTIONS[name](ctx)
            return lambda row: value
        case ast.Call(name=name, args=call_args):
            fn, null_in_null_out = SCALAR_FUNCTIONS[name]
            args = [sub(a) for a in call_args]

            def apply(row: Row) -> Any:
                values = [a(row) for a in args]
                if null_in_null_out and any(v is None for v in values):
                    return None
                return fn(*values)

            return apply
    raise TypeError(f"not an expression: {expr!r}")


def _logic(op: str, lhs: Evaluator, rhs: Evaluator) -> Evaluator:
    stop = op == "or"  # OR stops at TRUE, AND at FALSE

    def logic(row: Row) -> Any:
        a = lhs(row)
        if a is stop:
            return stop
        b = rhs(row)
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
            elif value == candidate:
                return not negated
        return None if saw_null else negated

    return in_list


# ---- aggregates ---------------------------------------------------------------------


def compile_aggregate(
    call: ast.Call, scope: Scope, ctx: EvalContext
) -> Callable[[Sequence[Row]], Any]:
    """A function of all input rows computing one aggregate call (NULL over no rows)."""
    result = infer(call, scope.column_type, over_aggregates=True)
    if call.star:
        return len
    arg = _compile(call.args[0], scope, ctx, None)
    name = call.name

    def aggregate(rows: Sequence[Row]) -> Any:
        values = [v for v in (arg(r) for r in rows) if v is not None]
        if name == "count":
            return len(values)
        if not values:
            return None
        if name in ("sum", "avg"):
            total = sum(values)  # ints stay exact
            if name == "avg":
                return total / len(values)
            return check_int64(total, "sum") if result == INT else total
        return min(values) if name == "min" else max(values)

    return aggregate
