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

import functools
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from resgroups.errors import (
    AmbiguousColumn,
    DivisionByZero,
    Error,
    FeatureNotSupported,
    InvalidParameter,
    InvalidRegularExpression,
    UndefinedColumn,
    UndefinedTable,
    did_you_mean,
)
from resgroups.sql import ast
from resgroups.sql.semantics import (
    AGGREGATES,
    INT,
    UNKNOWN,
    PgArray,
    cast_value,
    check_int64,
    find_aggregates,
    infer,
    int_literal,
    parse_array,
    truncated_div,
)
from resgroups.version import VERSION_STRING

__all__ = [
    "AGGREGATES",
    "EvalContext",
    "Evaluator",
    "PgArray",
    "Row",
    "Scope",
    "compile_aggregate",
    "compile_expr",
    "find_aggregates",
    "like_pattern",
]

Row = Sequence[Any]
Evaluator = Callable[[Row], Any]


class Catalog(Protocol):
    """What the catalog's functions (pg_get_userbyid, format_type, ...) read."""

    def call(self, name: str, args: Sequence[Any]) -> Any: ...


class Settings(Protocol):
    """A session's settings, as SHOW and SET know them (the wire connection's)."""

    def get(self, name: str) -> str:
        """The setting's value; UndefinedObject (42704) for an unknown name."""
        ...

    def set(self, name: str, value: str, local: bool) -> str:
        """SET name = value (``local``: for the current transaction); the new value."""
        ...


@dataclass(frozen=True)
class EvalContext:
    """What an expression may ask of the query running it."""

    current_group: str | None = None
    user: str | None = None  # the session's principal (current_user, session_user)
    database: str = "resgroups"  # what a wire client named at startup (current_database)
    # now() and current_timestamp: when the statement started (None: when asked)
    statement_start: datetime | None = None
    catalog: Catalog | None = None  # answers the catalog's functions (None: none here)
    settings: Settings | None = None  # current_setting(), set_config() (None: defaults)
    # compiles a subquery against the scope around it (None: no subqueries here)
    subquery: Callable[[ast.Subquery, Scope, EvalContext], Evaluator] | None = None


def _same(name: str, ident: ast.Ident) -> bool:
    return name == ident.text or (not ident.quoted and name.casefold() == ident.text.casefold())


@dataclass(frozen=True)
class Scope:
    """The columns a row holds, by position, and their types where known.

    In a join each column also has its relation's name or alias (``tables``),
    so ``c.relname`` finds it. A subquery's scope is its own columns then the
    enclosing query's (``local`` counts its own): a name is looked up in the
    innermost level that has it, and two matches in one level are ambiguous.
    """

    names: tuple[str, ...]
    types: tuple[str | None, ...] = ()
    tables: tuple[str | None, ...] = ()
    local: int | None = None  # columns [0, local) are this query's; the rest enclose it

    def index(self, ident: ast.Ident, table: ast.Ident | None = None) -> int:
        levels = [range(len(self.names))]
        if self.local is not None:
            levels = [range(self.local), range(self.local, len(self.names))]
        for level in levels:
            found = [
                i
                for i in level
                if _same(self.names[i], ident)
                and (table is None or (i < len(self.tables) and _table_is(self.tables[i], table)))
            ]
            exact = [i for i in found if self.names[i] == ident.text]
            if len(found) > 1 and len(exact) != 1:
                raise AmbiguousColumn(f'column reference "{ident.text}" is ambiguous')
            if found:
                return exact[0] if exact else found[0]
        shown = ident.text if table is None else f"{table.text}.{ident.text}"
        if table is not None and not any(
            t is not None and _table_is(t, table) for t in self.tables
        ):
            raise UndefinedTable(
                f'missing FROM-clause entry for table "{table.text}".'
                + did_you_mean(table.text, {t for t in self.tables if t is not None})
            )
        return self._missing(ident, shown)

    def _missing(self, ident: ast.Ident, shown: str) -> int:
        raise UndefinedColumn(
            f"column {shown} does not exist; columns: {', '.join(self.names) or '(none)'}."
            + did_you_mean(ident.text, self.names)
        )

    def column_type(self, ident: ast.Ident, table: ast.Ident | None = None) -> str:
        i = self.index(ident, table)
        return (self.types[i] if i < len(self.types) else None) or UNKNOWN


def _table_is(name: str | None, ref: ast.Ident) -> bool:
    return name is not None and _same(name, ref)


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
    """SQL LIKE (% any run, _ one character, a backslash takes the next character
    as itself, as PostgreSQL's default ESCAPE) as an anchored regular expression."""
    parts = []
    chars = iter(pattern)
    for c in chars:
        if c == "\\":
            parts.append(re.escape(next(chars, "\\")))
        else:
            parts.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
    return re.compile("".join(parts), re.DOTALL)


def like_escape(pattern: str, escape: str) -> str:
    """``LIKE pattern ESCAPE escape`` as a pattern with PostgreSQL's default escape."""
    if escape == "\\":
        return pattern
    if len(escape) > 1:
        raise InvalidParameter(f"invalid escape string {escape!r}: it must be one character")
    out = []
    chars = iter(pattern)
    for c in chars:
        if escape and c == escape:
            out.append("\\" + next(chars, ""))
        else:
            out.append("\\\\" if c == "\\" else c)
    return "".join(out)


def _concat(a: Any, b: Any) -> str:
    return f"{cast_value(a, 'text', 'text')}{cast_value(b, 'text', 'text')}"


def _json_build_object(*pairs: Any) -> str:
    if len(pairs) % 2:
        raise InvalidParameter("json_build_object() takes an even number of arguments")
    return json.dumps({str(pairs[i]): pairs[i + 1] for i in range(0, len(pairs), 2)}, default=str)


@functools.lru_cache(maxsize=256)
def regex_pattern(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """A POSIX regular expression as PostgreSQL's ARE basics read it, compiled by
    Python's re: anchors, classes, groups, alternation, quantifiers and the
    bracket classes [[:alpha:]] and the like. Not supported: ARE's word
    boundaries \\m \\M \\y, back references and embedded options."""
    for posix, python in _POSIX_CLASSES.items():
        pattern = pattern.replace(posix, python)
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise InvalidRegularExpression(f"invalid regular expression {pattern!r}: {exc}") from None


_POSIX_CLASSES: Final = {
    "[:alpha:]": "a-zA-Z", "[:digit:]": "0-9", "[:alnum:]": "a-zA-Z0-9",
    "[:upper:]": "A-Z", "[:lower:]": "a-z", "[:space:]": "\\s", "[:punct:]": "!-/:-@\\[-`{-~",
    "[:xdigit:]": "0-9A-Fa-f",
}  # fmt: skip


BINARY: Final[dict[str, Callable[[Any, Any], Any]]] = {
    "+": _exact("+", lambda a, b: a + b),
    "-": _exact("-", lambda a, b: a - b),
    "*": _exact("*", lambda a, b: a * b),
    "/": _divide,
    "%": _modulo,
    "||": _concat,
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "like": lambda a, b: like_pattern(b).fullmatch(a) is not None,
    "~": lambda a, b: regex_pattern(b).search(a) is not None,
    "!~": lambda a, b: regex_pattern(b).search(a) is None,
    "~*": lambda a, b: regex_pattern(b, re.IGNORECASE).search(a) is not None,
    "!~*": lambda a, b: regex_pattern(b, re.IGNORECASE).search(a) is None,
}


# ---- functions --------------------------------------------------------------------


def _round(x: Any, digits: Any = 0) -> Any:
    if isinstance(x, int):
        return x
    return float(round(x, int(digits)))


def _abs(x: Any) -> Any:
    return check_int64(abs(x), "abs") if isinstance(x, int) else abs(x)


def _element(array: Any, index: Any) -> Any:
    return array[index - 1] if 1 <= index <= len(array) else None


# name -> (implementation, NULL in gives NULL out); signatures: semantics.FUNCTIONS
SCALAR_FUNCTIONS: Final[dict[str, tuple[Callable[..., Any], bool]]] = {
    "lower": (str.lower, True),
    "upper": (str.upper, True),
    "length": (len, True),
    "abs": (_abs, True),
    "round": (_round, True),
    "coalesce": (lambda *xs: next((x for x in xs if x is not None), None), False),
    "like_escape": (like_escape, True),
    "array_element": (_element, True),
    "nullif": (lambda a, b: None if a is not None and a == b else a, False),
    "replace": (str.replace, True),
    "array_upper": (lambda array, dim: len(array) if dim == 1 and array else None, True),
    "array_length": (lambda array, dim: len(array) if dim == 1 and array else None, True),
    "json_build_object": (_json_build_object, False),
}
# the catalog's functions: answered by ``ctx.catalog``; what each gives without one
CATALOG_FUNCTIONS: Final[dict[str, Any]] = {
    "pg_table_is_visible": None,
    "pg_function_is_visible": None,
    "pg_type_is_visible": None,
    "pg_get_userbyid": None,
    "format_type": None,
    "pg_get_function_result": None,
    "pg_get_function_arguments": None,
    "pg_get_function_identity_arguments": None,
    "obj_description": None,
    "col_description": None,
    "shobj_description": None,
    "pg_get_expr": None,
    "pg_encoding_to_char": None,
    "array_to_string": None,
    "pg_get_constraintdef": None,
    "pg_get_serial_sequence": None,
    "pg_collation_is_visible": None,
    "regclass": None,  # 'name'::regclass, read in the catalog
    "pg_relation_is_publishable": None,
    "pg_get_statisticsobjdef_columns": None,
    "pg_get_indexdef": None,
    "current_schemas": None,
    "pg_get_viewdef": None,
    # the text of an oid cast to regtype, regclass or regnamespace: its name
    "regtype_name": None,
    "regclass_name": None,
    "regnamespace_name": None,
    "to_regtype": None,
}
CONTEXT_FUNCTIONS: Final[dict[str, Callable[[EvalContext], Any]]] = {
    "current_resource_group": lambda ctx: ctx.current_group,
    "version": lambda ctx: VERSION_STRING,
    "current_user": lambda ctx: ctx.user,
    "session_user": lambda ctx: ctx.user,
    "current_schema": lambda ctx: "public",  # the one schema of the executor's tables
    "current_database": lambda ctx: ctx.database,
    "now": lambda ctx: ctx.statement_start or datetime.now(UTC),
    # there are no advisory locks to hold: asyncpg's pool releases them all (void)
    "pg_advisory_unlock_all": lambda ctx: "",
    "current_timestamp": lambda ctx: ctx.statement_start or datetime.now(UTC),
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
        case ast.Column(name=name, table=table):
            i = scope.index(name, table)
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
        case ast.Binary(op="= any", left=left, right=right):
            return _any(sub(left), sub(right))
        case ast.Binary(op="distinct" | "not distinct" as op, left=left, right=right):
            lhs, rhs, same = sub(left), sub(right), op == "not distinct"
            return lambda row: (lhs(row) == rhs(row)) == same  # NULL is not distinct from NULL
        case ast.Binary(op="||", left=left, right=right):
            lhs, rhs, settings = sub(left), sub(right), ctx.settings

            def concat(row: Row) -> Any:  # a timestamptz's text is in the session's zone
                a, b = lhs(row), rhs(row)
                if a is None or b is None:
                    return None
                zone = session_zone(settings) if datetime in (type(a), type(b)) else "UTC"
                return f"{cast_value(a, 'text', 'text', zone)}{cast_value(b, 'text', 'text', zone)}"

            return concat
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
        case ast.Cast(operand=operand, type=target, written="regclass" | "regtype" as written):
            inner, catalog = sub(operand), ctx.catalog

            def object_id(row: Row) -> Any:
                value = inner(row)
                if isinstance(value, str) and catalog is not None:
                    return catalog.call(written, [value])
                return cast_value(value, target, written)

            return object_id
        case ast.Cast(
            operand=ast.Cast(written="regtype" | "regclass" | "regnamespace" as reg),
            type="text",
        ):
            # an object identifier's text is its name, as PostgreSQL's reg* output
            return sub(ast.Call(f"{reg}_name", (expr.operand,)))
        case ast.Cast(operand=operand, type="timestamptz" | "text" as target, written=written):
            # a timestamptz is read from text and printed to it in the session's
            # TimeZone (asked as each row is: set_config() may change it)
            inner, settings = sub(operand), ctx.settings

            def zoned(row: Row) -> Any:
                value = inner(row)
                if target == "text" and not isinstance(value, datetime):
                    return cast_value(value, target, written)
                return cast_value(value, target, written, session_zone(settings))

            return zoned
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
        case ast.Call(name="current_setting" | "set_config" as function, args=call_args):
            setting_args = [sub(a) for a in call_args]
            settings = ctx.settings
            return lambda row: _setting_call(settings, function, [a(row) for a in setting_args])
        case ast.Call(name=str() as function, args=call_args) if function in CATALOG_FUNCTIONS:
            catalog_args = [sub(a) for a in call_args]
            catalog = ctx.catalog

            def catalog_call(row: Row) -> Any:
                values = [a(row) for a in catalog_args]
                if catalog is None:
                    return CATALOG_FUNCTIONS[function]
                return catalog.call(function, values)

            return catalog_call
        case ast.Case(operand=operand, whens=whens, default=default):
            return _case(
                None if operand is None else sub(operand),
                [(sub(w), sub(t)) for w, t in whens],
                None if default is None else sub(default),
            )
        case ast.Window():
            raise FeatureNotSupported("window functions are answered in SELECT lists over FROM")
        case ast.Subquery():
            if ctx.subquery is None:
                raise FeatureNotSupported("subqueries are answered over the catalog only")
            return ctx.subquery(expr, scope, ctx)
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


def session_zone(settings: Settings | None) -> str:
    """The session's TimeZone (UTC without a session's settings)."""
    return "UTC" if settings is None else settings.get("TimeZone")


def _setting_call(settings: Settings | None, function: str, args: list[Any]) -> Any:
    """``current_setting(name [, missing_ok])`` and ``set_config(name, value, is_local)``
    (NULL in, NULL out, as PostgreSQL's strict functions)."""
    if any(a is None for a in args[:2]):
        return None
    if settings is None:
        raise FeatureNotSupported(f"{function}() needs a session's settings (a wire connection)")
    if function == "set_config":
        return settings.set(str(args[0]), str(args[1]), bool(args[2]))
    try:
        return settings.get(str(args[0]))
    except Error:
        if len(args) > 1 and args[1] is True:  # missing_ok
            return None
        raise


def _case(
    operand: Evaluator | None,
    whens: list[tuple[Evaluator, Evaluator]],
    default: Evaluator | None,
) -> Evaluator:
    def case(row: Row) -> Any:
        subject = None if operand is None else operand(row)
        for when, then in whens:
            w = when(row)
            if (w is True) if operand is None else (w is not None and w == subject):
                return then(row)
        return None if default is None else default(row)

    return case


def _any(operand: Evaluator, array: Evaluator) -> Evaluator:
    """``x = ANY (array)``: three-valued, as IN over the array's elements."""

    def any_equal(row: Row) -> Any:
        value, items = operand(row), array(row)
        if value is None or items is None:
            return None
        if isinstance(items, str):
            items = parse_array(items)
        if any(item == value for item in items if item is not None):
            return True
        return None if None in items else False

    return any_equal


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


def _nulls_last(key: Evaluator) -> Callable[[Row], tuple[bool, Any]]:
    def sort_key(row: Row) -> tuple[bool, Any]:
        value = key(row)
        return value is None, value

    return sort_key


def compile_aggregate(
    call: ast.Call, scope: Scope, ctx: EvalContext
) -> Callable[[Sequence[Row]], Any]:
    """A function of all input rows computing one aggregate call (NULL over no rows)."""
    result = infer(call, scope.column_type, over_aggregates=True)
    if call.star:
        return len
    arg = _compile(call.args[0], scope, ctx, None)
    name = call.name
    if name == "string_agg":
        separator = _compile(call.args[1], scope, ctx, None)

        def string_agg(rows: Sequence[Row]) -> Any:
            pairs = [(arg(r), separator(r)) for r in rows]
            pairs = [(v, sep) for v, sep in pairs if v is not None]
            if not pairs:
                return None
            text = str(pairs[0][0])
            for v, sep in pairs[1:]:
                text += ("" if sep is None else str(sep)) + str(v)
            return text

        return string_agg
    if name == "array_agg":
        order = [(_compile(o.expr, scope, ctx, None), o.descending) for o in call.order_by]

        def array_agg(rows: Sequence[Row]) -> Any:
            ordered = list(rows)
            for key, descending in reversed(order):  # stable sorts, last key first
                ordered.sort(key=_nulls_last(key), reverse=descending)
            return PgArray(arg(r) for r in ordered) if ordered else None

        return array_agg

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
