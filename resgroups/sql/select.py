"""SELECT over rows: projection, WHERE, GROUP BY and aggregates, ORDER BY, LIMIT and OFFSET.

The source is a relation in memory (column names plus rows of plain Python
values), such as a table function over engine state. ORDER BY accepts an
output column's position (``ORDER BY 2``), an output name or alias, or any
expression over the source columns; NULLs sort last ascending and first
descending, as in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from resgroups.errors import FeatureNotSupported, InvalidParameter, UndefinedColumn
from resgroups.sql import ast
from resgroups.sql.expr import (
    AGGREGATES,
    EvalContext,
    Row,
    Scope,
    compile_aggregate,
    compile_expr,
    find_aggregates,
)
from resgroups.sql.semantics import check_select_list, children, result_type


@dataclass(frozen=True)
class Relation:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    types: tuple[str | None, ...] = ()  # declared types where known ("int", "text", ...)
    tables: tuple[str | None, ...] = ()  # each column's relation name or alias (joins)
    local: int | None = None  # a subquery's own columns, before the enclosing row's


def output_name(item: ast.SelectItem) -> str:
    if item.alias is not None:
        return item.alias.text
    match item.expr:
        case ast.Column(name=name):
            return name.text
        case ast.Call(name=name):
            return name
    return "?column?"


def _items(select: ast.Select, scope: Scope) -> tuple[ast.SelectItem, ...]:
    if select.items is not None:
        return select.items
    count = len(scope.names) if scope.local is None else scope.local
    return tuple(
        ast.SelectItem(
            ast.Column(
                ast.Ident(n, quoted=True),
                None if t is None else ast.Ident(t, quoted=True),
            )
        )
        for n, t in itertools.zip_longest(scope.names[:count], scope.tables[:count])
    )


@dataclass(frozen=True)
class Shape:
    """What a SELECT returns, known before any row is read."""

    items: tuple[ast.SelectItem, ...]  # the select list, * expanded
    names: tuple[str, ...]
    types: tuple[str, ...]  # result types ("int", "text", ...)


def select_shape(select: ast.Select, scope: Scope) -> Shape:
    """The select list of ``select`` over ``scope`` expanded, named and typed (and
    its WHERE checked): the same for both evaluators and for a description."""
    items = _items(select, scope)
    types = check_select_list([i.expr for i in items], select.where, scope.column_type)
    return Shape(items, tuple(output_name(i) for i in items), tuple(result_type(t) for t in types))


def _compare_keys(
    descending: Sequence[bool],
    a: tuple[tuple[Any, ...], tuple[Any, ...]],
    b: tuple[tuple[Any, ...], tuple[Any, ...]],
) -> int:
    """Compare two (sort key, row) pairs key by key."""
    for desc, x, y in zip(descending, a[0], b[0], strict=True):
        if x == y:
            continue
        if x is None or y is None:  # NULLs last ascending, first descending
            result = 1 if x is None else -1
            return -result if desc else result
        result = -1 if x < y else 1
        return -result if desc else result
    return 0


def run_select(
    select: ast.Select, source: Relation, ctx: EvalContext, shape: Shape | None = None
) -> Relation:
    """Evaluate ``select`` over ``source``; raises the expression layer's errors.

    Every expression is type-checked before any row is read, so an empty
    source gives typed columns and the same errors as a full one. ``shape``:
    ``select_shape(select, scope of source)`` when the caller has it (a
    statement of no source, kept per statement), else computed here.
    """
    scope = Scope(source.columns, source.types, source.tables, source.local)
    if select.group_by:
        listed = _items(select, scope)
        items, order_by = _grouped(select, listed)
        grouping = tuple(_position(e, listed) for e in select.group_by)
        select = dataclasses.replace(select, items=items, order_by=order_by, group_by=grouping)
        shape = None
    if shape is None:
        shape = select_shape(select, scope)
    items, names = shape.items, shape.names
    rows = source.rows
    if select.where is not None:
        predicate = compile_expr(select.where, scope, ctx)
        rows = [r for r in rows if predicate(r) is True]
    windows = [w for i in items for w in _windows(i.expr)]
    if windows:  # each window's value becomes a column of every row
        items, scope, rows = _with_windows(items, windows, scope, rows, ctx)

    order_by = select.order_by
    aggregates = [call for item in items for call in find_aggregates(item.expr)]
    aggregates += [call for o in order_by for call in find_aggregates(o.expr)]
    if aggregates or select.group_by:
        # one output row per group (without GROUP BY, one group of every row)
        slots = {call: i for i, call in enumerate(dict.fromkeys(aggregates))}
        folds = [compile_aggregate(call, scope, ctx) for call in slots]
        projections = [compile_expr(i.expr, scope, ctx, aggregate_slots=slots) for i in items]
        sources = [tuple(f(group) for f in folds) for group in _groups(select, rows, scope, ctx)]
        keys = [_order_key(o, names, scope, ctx, aggregate_slots=slots) for o in order_by]
    else:
        projections = [compile_expr(i.expr, scope, ctx) for i in items]
        sources = list(rows)
        keys = [_order_key(o, names, scope, ctx) for o in order_by]
    outputs = [tuple(p(r) for p in projections) for r in sources]
    if keys:
        keyed: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = [
            (tuple(k(out, src) for k in keys), out)
            for out, src in zip(outputs, sources, strict=True)
        ]
        descending = [o.descending for o in order_by]
        keyed.sort(key=functools.cmp_to_key(functools.partial(_compare_keys, descending)))
        outputs = [out for _, out in keyed]

    outputs = outputs[select.offset :]
    if select.limit is not None:
        outputs = outputs[: select.limit]
    return Relation(names, outputs, shape.types)


def _windows(expr: ast.Expr) -> list[ast.Window]:
    if isinstance(expr, ast.Window):
        return [expr]
    return [w for child in children(expr) for w in _windows(child)]


def _with_windows(
    items: tuple[ast.SelectItem, ...],
    windows: list[ast.Window],
    scope: Scope,
    rows: list[tuple[Any, ...]],
    ctx: EvalContext,
) -> tuple[tuple[ast.SelectItem, ...], Scope, list[tuple[Any, ...]]]:
    """``row_number() OVER (PARTITION BY p ORDER BY o)`` over the rows WHERE kept:
    each window's numbers as a new column, the items reading that column."""
    if scope.local is not None:  # a correlated subquery's columns end with the outer row's
        raise FeatureNotSupported("window functions in a subquery are not supported")
    columns: dict[ast.Window, str] = {}
    extra: list[list[int]] = []
    for w in dict.fromkeys(windows):
        columns[w] = f"\x00window{len(columns)}"
        parts = [compile_expr(e, scope, ctx) for e in w.partition_by]
        keys = [compile_expr(o.expr, scope, ctx) for o in w.order_by]
        descending = [o.descending for o in w.order_by]
        numbers = [0] * len(rows)
        partitions: dict[tuple[Any, ...], list[int]] = {}
        for i, row in enumerate(rows):
            partitions.setdefault(tuple(p(row) for p in parts), []).append(i)
        for members in partitions.values():
            keyed = [(tuple(k(rows[i]) for k in keys), i) for i in members]
            keyed.sort(key=functools.cmp_to_key(functools.partial(_compare_keys, descending)))
            for n, (_, i) in enumerate(keyed, 1):
                numbers[i] = n
        extra.append(numbers)
    rows = [(*row, *(e[i] for e in extra)) for i, row in enumerate(rows)]
    names = (*scope.names, *columns.values())
    types = (*_padded(scope.types, len(scope.names)), *(["int"] * len(columns)))
    tables = (*_padded(scope.tables, len(scope.names)), *([None] * len(columns)))
    local = None

    def replaced(expr: ast.Expr) -> ast.Expr:
        if isinstance(expr, ast.Window):
            return ast.Column(ast.Ident(columns[expr], quoted=True))
        return _map_children(expr, replaced)

    new_items = tuple(dataclasses.replace(i, expr=replaced(i.expr)) for i in items)
    return new_items, Scope(names, types, tables, local), rows


def _padded(values: tuple[Any, ...], n: int) -> tuple[Any, ...]:
    return values + (None,) * (n - len(values))


def _groups(
    select: ast.Select, rows: list[tuple[Any, ...]], scope: Scope, ctx: EvalContext
) -> list[list[tuple[Any, ...]]]:
    """The rows by their GROUP BY key, groups in order of first appearance (no
    GROUP BY: one group, empty or not, as an aggregate over no rows has a row)."""
    if not select.group_by:
        return [rows]
    keys = [compile_expr(e, scope, ctx) for e in select.group_by]
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault(tuple(k(row) for k in keys), []).append(row)
    return list(groups.values())


def _grouped(
    select: ast.Select, items: tuple[ast.SelectItem, ...]
) -> tuple[tuple[ast.SelectItem, ...], tuple[ast.OrderItem, ...]]:
    """Items and ORDER BY of a grouped query with each GROUP BY expression read
    as min(expr): every row of a group has the same value of it, so its minimum
    is that value (NULL for a NULL key), and the aggregate path computes it."""
    keys = {_position(e, items) for e in select.group_by}

    def over_groups(expr: ast.Expr) -> ast.Expr:
        if expr in keys:
            return ast.Call("min", (expr,))
        aggregate = isinstance(expr, ast.Call) and expr.name in AGGREGATES
        if aggregate or isinstance(expr, ast.Subquery):
            return expr
        return _map_children(expr, over_groups)

    return (
        tuple(dataclasses.replace(i, expr=over_groups(i.expr)) for i in items),
        tuple(dataclasses.replace(o, expr=over_groups(o.expr)) for o in select.order_by),
    )


_EXPR_TYPES: Final = typing.get_args(ast.Expr)


def _map_children(expr: ast.Expr, fn: Callable[[ast.Expr], ast.Expr]) -> ast.Expr:
    """``expr`` with ``fn`` applied to each expression directly inside it."""
    changes = {}
    for f in dataclasses.fields(expr):
        value = getattr(expr, f.name)
        if isinstance(value, tuple):  # arguments, IN lists, CASE's (when, then) pairs
            value = tuple(
                tuple(fn(x) for x in v) if isinstance(v, tuple) else fn(v) if _is_expr(v) else v
                for v in value
            )
        elif _is_expr(value):
            value = fn(value)
        changes[f.name] = value
    return dataclasses.replace(expr, **changes)


def _position(expr: ast.Expr, items: tuple[ast.SelectItem, ...]) -> ast.Expr:
    """``GROUP BY 2``: the second select item's expression."""
    if isinstance(expr, ast.Literal) and type(expr.value) is int:
        if not 1 <= expr.value <= len(items):
            raise InvalidParameter(
                f"GROUP BY position {expr.value} is not in the select list (1..{len(items)})"
            )
        return items[expr.value - 1].expr
    return expr


def _is_expr(value: object) -> bool:
    return isinstance(value, _EXPR_TYPES)


def _order_key(
    item: ast.OrderItem,
    names: tuple[str, ...],
    scope: Scope,
    ctx: EvalContext,
    *,
    aggregate_slots: dict[ast.Call, int] | None = None,
) -> Callable[[Row, Row], Any]:
    """A function (output row, source row) -> sort key value."""
    expr = item.expr
    if isinstance(expr, ast.Literal) and type(expr.value) is int:
        position = expr.value
        if not 1 <= position <= len(names):
            raise InvalidParameter(
                f"ORDER BY position {position} is not in the select list (1..{len(names)})"
            )
        return lambda out, src: out[position - 1]
    if isinstance(expr, ast.Column) and expr.table is None:
        with contextlib.suppress(UndefinedColumn):
            i = Scope(names).index(expr.name)
            return lambda out, src: out[i]
    evaluator = compile_expr(expr, scope, ctx, aggregate_slots=aggregate_slots)
    return lambda out, src: evaluator(src)
