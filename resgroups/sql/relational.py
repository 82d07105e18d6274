"""A small relational engine over relations in memory: FROM lists and joins,
subqueries, and PostgreSQL's reading of untyped literals.

It answers the introspection queries clients send (psql's ``\\d`` family,
SQLAlchemy's ``inspect()``, pgcli's completion, JDBC's metadata) over the
catalog's rows, with the one expression semantics of
:mod:`resgroups.sql.semantics`; nothing here knows any client. GROUP BY,
row_number() and ORDER BY are :mod:`resgroups.sql.select`'s; UNION is
``statements.dispatch.union`` over two of these.

What it does: ``FROM a x, b y`` (a cross product), ``[INNER] JOIN ... ON`` and
``LEFT [OUTER] JOIN ... ON`` as nested loops (every relation is a catalog of a
few hundred rows at most: O(|a|·|b|) per join is the design, not an
accident); scalar subqueries, ``EXISTS`` and ``ARRAY(...)``, correlated or not
(a subquery's relations are read once; its WHERE runs per enclosing row,
and a FROM function whose arguments name the enclosing row is read per
row); derived tables ``(SELECT ...) AS x``; ``generate_series`` and
``unnest`` in FROM; a string literal compared with a number, a boolean or an
array, or given to IN beside one, is read as that type, as PostgreSQL
resolves an unknown-typed literal.

Non-goals: RIGHT and FULL joins, LATERAL, JOIN ... USING, WITH, hash or
merge joins (the relations are small; a join over large executor tables is
slow, not wrong).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Final

from resgroups.errors import (
    CardinalityViolation,
    DatatypeMismatch,
    InvalidParameter,
    UndefinedColumn,
    UndefinedTable,
)
from resgroups.sql import ast
from resgroups.sql.expr import EvalContext, Evaluator, Row, Scope, compile_expr
from resgroups.sql.select import Relation, run_select
from resgroups.sql.semantics import (
    ARRAY,
    BOOL,
    COMPARISON,
    FLOAT,
    INT,
    PgArray,
    infer,
    parse_array,
)

# a relation by its name, or a table function's rows for its argument values
Resolve = Callable[[ast.TableName | ast.TableFunction, tuple[Any, ...]], Relation]
Outer = tuple[Scope, Row] | None  # the enclosing query's scope and row (correlated FROM)


def _generate_series(args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if len(args) not in (2, 3) or any(type(a) is not int for a in args if a is not None):
        raise DatatypeMismatch("generate_series() takes 2 or 3 integers")
    if None in args:
        return []
    start, stop, step = (*args, 1)[:3]
    if step == 0:
        raise InvalidParameter("step size cannot equal zero")
    return [(i,) for i in range(start, stop + (1 if step > 0 else -1), step)]


def _unnest(args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    if len(args) != 1:
        raise DatatypeMismatch(f"unnest() takes 1 array, got {len(args)} arguments")
    (array,) = args
    if isinstance(array, str):
        array = parse_array(array)
    return [] if array is None else [(v,) for v in array]


# set-returning functions of the SQL layer itself: name -> (column type, rows)
SERIES: Final = {
    "generate_series": ("int", _generate_series),
    "unnest": ("unknown", _unnest),
}


def run_query(select: ast.Select, resolve: Resolve, ctx: EvalContext) -> Relation:
    """Evaluate ``select``, its FROM resolved to relations by ``resolve``."""
    ctx = dataclasses.replace(ctx, subquery=_subquery_compiler(resolve))
    source = from_relation(select.source, resolve, ctx)
    return run_select(coerce_literals(select, _scope(source)), source, ctx)


def _scope(source: Relation) -> Scope:
    return Scope(source.columns, source.types, source.tables, source.local)


def from_relation(
    source: ast.Source | None, resolve: Resolve, ctx: EvalContext, outer: Outer = None
) -> Relation:
    """The rows of a FROM clause, each column tagged with its relation's name.
    A function's arguments may name the enclosing query's columns (``outer``)."""
    match source:
        case None:
            return Relation((), [()])
        case ast.TableFunction(name=name, args=args, alias=alias):
            scope, row = outer if outer is not None else (Scope(()), ())
            values = tuple(compile_expr(a, scope, ctx)(row) for a in args)
            if name in SERIES:
                kind, produce = SERIES[name]
                rel = Relation((name,), produce(values), (kind,))
            else:
                rel = resolve(source, values)
            label = name if alias is None else alias.text
            columns = rel.columns
            if alias is not None and columns == (name,):  # FROM f(...) s: its one column is s
                columns = (alias.text,)
            return Relation(columns, rel.rows, rel.types, (label,) * len(columns))
        case ast.TableName(name=name, alias=alias):
            rel = resolve(source, ())
            label = (alias or name).text
            return Relation(rel.columns, rel.rows, rel.types, (label,) * len(rel.columns))
        case ast.DerivedTable(select=inner, alias=alias):
            rel = run_query(inner, resolve, ctx)
            width = len(rel.columns)
            return Relation(rel.columns, rel.rows, rel.types, (alias.text,) * width)
        case ast.Join(left=left, right=right, kind=kind, on=on):
            a = from_relation(left, resolve, ctx, outer)
            b = from_relation(right, resolve, ctx, outer)
            return _join(a, b, kind, on, ctx)
    raise TypeError(f"not a FROM item: {source!r}")


def _join(a: Relation, b: Relation, kind: str, on: ast.Expr | None, ctx: EvalContext) -> Relation:
    joined = Relation(
        a.columns + b.columns,
        [],
        _pad(a.types, len(a.columns)) + _pad(b.types, len(b.columns)),
        a.tables + b.tables,
    )
    scope = _scope(joined)
    if on is not None:
        on = coerce_expr(on, scope)
        infer(on, scope.column_type, where="in JOIN ... ON")
    matches: Evaluator = (lambda row: True) if on is None else compile_expr(on, scope, ctx)
    nulls = (None,) * len(b.columns)
    rows = joined.rows
    for x in a.rows:
        found = False
        for y in b.rows:
            row = x + y
            if matches(row) is True:
                rows.append(row)
                found = True
        if kind == "left" and not found:
            rows.append(x + nulls)
    return joined


def _pad(types: tuple[str | None, ...], n: int) -> tuple[str | None, ...]:
    return types + (None,) * (n - len(types))


# ---- subqueries ------------------------------------------------------------------------


def _subquery_compiler(
    resolve: Resolve,
) -> Callable[[ast.Subquery, Scope, EvalContext], Evaluator]:
    def compile_subquery(sub: ast.Subquery, outer: Scope, ctx: EvalContext) -> Evaluator:
        source = sub.select.source
        try:
            inner = from_relation(source, resolve, ctx)
            correlated = False
        except (UndefinedColumn, UndefinedTable):  # FROM f(outer.x): read per enclosing row
            inner = from_relation(source, resolve, ctx, (outer, (None,) * len(outer.names)))
            correlated = True
        width = len(inner.columns)
        nested = Relation(
            inner.columns + outer.names,
            [],
            _pad(inner.types, width) + _pad(outer.types, len(outer.names)),
            _pad(inner.tables, width) + _pad(outer.tables, len(outer.names)),
            local=width,
        )
        select = coerce_literals(sub.select, _scope(nested))
        run_select(select, nested, ctx)  # type-checked now, with no rows

        def evaluate(row: Any) -> Any:
            rel = from_relation(source, resolve, ctx, (outer, row)) if correlated else inner
            rows = [r + tuple(row) for r in rel.rows]
            out = run_select(select, dataclasses.replace(nested, rows=rows), ctx)
            if sub.kind == "exists":
                return bool(out.rows)
            if sub.kind == "array":
                return PgArray(r[0] for r in out.rows)
            if len(out.rows) > 1:
                raise CardinalityViolation(
                    "more than one row returned by a subquery used as an expression"
                )
            return out.rows[0][0] if out.rows else None

        return evaluate

    return compile_subquery


# ---- untyped literals ---------------------------------------------------------------------

_NUMBERS: Final = {INT: int, FLOAT: float}


def coerce_literals(select: ast.Select, scope: Scope) -> ast.Select:
    """``select`` with each string literal compared with a number (or a boolean)
    cast to that type: ``c.oid = '1259'`` compares integers, as in PostgreSQL."""
    items = select.items
    if items is not None:
        items = tuple(dataclasses.replace(i, expr=coerce_expr(i.expr, scope)) for i in items)
    where = None if select.where is None else coerce_expr(select.where, scope)
    return dataclasses.replace(select, items=items, where=where)


def coerce_expr(expr: ast.Expr, scope: Scope) -> ast.Expr:
    def walk(e: Any) -> Any:
        if isinstance(e, ast.Subquery):
            return e  # coerced against its own scope when compiled
        if dataclasses.is_dataclass(e) and not isinstance(e, type):
            changes = {f.name: walk(getattr(e, f.name)) for f in dataclasses.fields(e)}
            e = dataclasses.replace(e, **changes)
        elif isinstance(e, tuple):
            return tuple(walk(x) for x in e)
        else:
            return e
        match e:
            case ast.Binary(op=op, left=left, right=right) if op in COMPARISON:
                return dataclasses.replace(
                    e, left=_as_type_of(left, right, scope), right=_as_type_of(right, left, scope)
                )
            case ast.InList(operand=operand, items=items):
                return dataclasses.replace(
                    e, items=tuple(_as_type_of(i, operand, scope) for i in items)
                )
        return e

    result: ast.Expr = walk(expr)
    return result


def _as_type_of(literal: ast.Expr, other: ast.Expr, scope: Scope) -> ast.Expr:
    if not (isinstance(literal, ast.Literal) and isinstance(literal.value, str)):
        return literal
    if isinstance(other, ast.Literal):
        return literal
    try:
        t = infer(other, scope.column_type)
    except Exception:  # the comparison reports its own errors when it is checked
        return literal
    if t in (INT, FLOAT, BOOL, ARRAY):
        written = {INT: "bigint", FLOAT: "double precision", ARRAY: "text[]"}.get(t, "boolean")
        return ast.Cast(literal, t, written)
    return literal
