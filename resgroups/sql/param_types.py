"""The types of a prepared statement's parameters, inferred from where they stand.

A driver that leaves a parameter untyped (oid 0: node-postgres, pgbench
``-M extended``; or asks the server, as asyncpg does with Describe) expects
the type PostgreSQL infers from the parameter's context, and sends its
value in that type. The statement is parsed with its placeholders kept
(:func:`~resgroups.sql.parser.placeholders_allowed`), and one walk gives
each ``$n`` the type its first typed context wants:

=======================================  ===================================
context                                  type of ``$n``
=======================================  ===================================
``long_sequence($n)``, a table           the function's argument (int)
function's argument
``x op $n``, ``$n op x`` (arithmetic,    the other operand's type, when it
comparison, IS DISTINCT FROM, IN,        has one (``x`` a bigint column: int)
COALESCE, NULLIF, CASE results)
``$n AND ...``, ``NOT $n``, WHERE,       bool
``CASE WHEN $n``
``$n LIKE ...``, ``~``, ``||``,          text
``lower($n)``, ``length($n)``
``$n::t``, ``CAST($n AS t)``             t (``int``/``int4``: int4, as in
                                         PostgreSQL; ``smallint``: int2)
``x op $n`` with ``x`` a timestamptz     timestamptz (``started_at > $1``)
anything else (``SELECT $n``, DDL)       unknown: described as text
=======================================  ===================================

Like PostgreSQL, the first context that types a parameter wins; unlike it, a
parameter no context types is text rather than an error (``$1 + $2``), and
integers are int8 (the executor's integers) unless a cast names a narrower
one. The walk is linear
in the size of the statement, plus one type inference per operator whose
other side holds no parameter (each also linear).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from resgroups.errors import Error
from resgroups.sql import ast
from resgroups.sql.semantics import (
    ARITHMETIC,
    BOOL,
    COMPARISON,
    FLOAT,
    INT,
    INT2_SPELLINGS,
    INT4_SPELLINGS,
    NUMERIC,
    REGEX,
    TEXT,
    UNKNOWN,
    infer,
)

ColumnType = Callable[..., str]  # (name[, table]) -> type; raises when there is none
TYPED: Final = frozenset({INT, FLOAT, TEXT, BOOL, "timestamptz", "numeric", "int4", "int2"})
_TEXT_FUNCTIONS: Final = frozenset({"lower", "upper", "length"})
_SAME_TYPE_FUNCTIONS: Final = frozenset({"coalesce", "nullif"})


def cast_parameter_type(target: str, written: str) -> str:
    """What a parameter cast to ``written`` is described as: ``$1::int4`` and
    ``$1::int`` are int4, ``$1::smallint`` int2, as PostgreSQL describes them."""
    if written in INT4_SPELLINGS:
        return "int4"
    if written in INT2_SPELLINGS:
        return "int2"
    return target


def _unknown_columns(name: object, table: object = None) -> str:
    return UNKNOWN


class _Walk:
    def __init__(self, column_type: ColumnType) -> None:
        self.column_type = column_type
        self.found: dict[int, str] = {}

    def type_of(self, e: ast.Expr) -> str:
        """The type ``e`` has whatever its parameters are (UNKNOWN when it cannot be
        told here: a parameter, a column of an unknown relation, an error)."""
        for over_aggregates in (False, True):
            try:
                return infer(e, self.column_type, over_aggregates=over_aggregates)
            except Error:
                continue
        return UNKNOWN

    def common(self, exprs: Sequence[ast.Expr], wanted: str | None) -> str | None:
        for e in exprs:
            t = self.type_of(e)
            if t in TYPED:
                return FLOAT if t == INT and wanted == FLOAT else t
        return wanted

    def expr(self, e: ast.Expr | None, wanted: str | None = None) -> None:
        match e:
            case None:
                return
            case ast.Param(number=n):
                if wanted in TYPED:
                    self.found.setdefault(n, wanted)
            case ast.Binary(op=op, left=left, right=right):
                self.binary(op, left, right, wanted)
            case ast.Unary(op="not", operand=operand):
                self.expr(operand, BOOL)
            case ast.Unary(operand=operand):
                self.expr(operand, wanted if wanted in NUMERIC else None)
            case ast.IsNull(operand=operand):
                self.expr(operand)
            case ast.InList(operand=operand, items=items):
                t = self.common((operand, *items), None)
                for item in (operand, *items):
                    self.expr(item, t)
            case ast.Cast(operand=operand, type=target, written=written):
                self.expr(operand, cast_parameter_type(target, written))
            case ast.Call(name=name, args=args) if name in _TEXT_FUNCTIONS:
                for arg in args:
                    self.expr(arg, TEXT)
            case ast.Call(name=name, args=args) if name in _SAME_TYPE_FUNCTIONS:
                t = self.common(args, wanted)
                for arg in args:
                    self.expr(arg, t)
            case ast.Call(args=args, order_by=order_by):
                for arg in args:
                    self.expr(arg)
                for ordered in order_by:
                    self.expr(ordered.expr)
            case ast.Case(operand=operand, whens=whens, default=default):
                subject = None if operand is None else self.common((operand,), None)
                self.expr(operand, subject)
                results = [r for _, r in whens] + ([default] if default is not None else [])
                t = self.common(results, wanted)
                for condition, result in whens:
                    self.expr(condition, BOOL if operand is None else subject)
                    self.expr(result, t)
                self.expr(default, t)
            case ast.Subquery(select=select):
                self.select(select)
            case ast.Window(partition_by=partition_by, order_by=window_order):
                for p in partition_by:
                    self.expr(p)
                for ordered in window_order:
                    self.expr(ordered.expr)

    def binary(self, op: str, left: ast.Expr, right: ast.Expr, wanted: str | None) -> None:
        left_wants: str | None
        right_wants: str | None
        if op in ("and", "or"):
            left_wants = right_wants = BOOL
        elif op == "like" or op in REGEX or op == "||":
            left_wants = right_wants = TEXT
        elif op in ARITHMETIC or op in COMPARISON or op in ("distinct", "not distinct"):
            fallback = wanted if op in ARITHMETIC and wanted in NUMERIC else None
            left_wants = self.common((right,), fallback)
            right_wants = self.common((left,), fallback)
        else:  # = ANY (array): an array's text
            left_wants, right_wants = None, TEXT
        self.expr(left, left_wants)
        self.expr(right, right_wants)

    def select(self, stmt: ast.Select, table_arguments: Mapping[str, Sequence[str]] = {}) -> None:
        if isinstance(stmt.source, ast.TableFunction):
            wanted = table_arguments.get(stmt.source.name, ())
            for i, arg in enumerate(stmt.source.args):
                self.expr(arg, wanted[i] if i < len(wanted) else None)
        for item in stmt.items or ():
            self.expr(item.expr)
        self.expr(stmt.where, BOOL)
        for g in stmt.group_by:
            self.expr(g)
        for o in stmt.order_by:
            self.expr(o.expr)


def parameter_types(
    stmt: ast.Statement,
    column_type: ColumnType | None = None,
    table_arguments: Mapping[str, Sequence[str]] = {},
) -> dict[int, str]:
    """The type each ``$n`` of ``stmt`` takes from its context (a parameter no
    context types is left out). ``column_type`` types the columns of a SELECT's
    source (None: unknown); ``table_arguments`` gives each table function's
    argument types."""
    walk = _Walk(column_type or _unknown_columns)
    match stmt:
        case ast.Select():
            walk.select(stmt, table_arguments)
        case ast.CreateTableAs(query=query) | ast.InsertSelect(query=query):
            walk.select(query, table_arguments)
        case ast.Union(selects=selects):
            walk.column_type = _unknown_columns
            for select in selects:
                walk.select(select, table_arguments)
    return walk.found
