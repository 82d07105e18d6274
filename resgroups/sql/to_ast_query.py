"""The queries' half of the parser's transformer: SELECT, UNION, FROM and
joins, ORDER BY, LIMIT and OFFSET, the expression grammar (literals,
placeholders, operators, calls, casts, CASE, subqueries), and the statements
over the executor's tables (CREATE TABLE AS, INSERT ... SELECT, DROP TABLE).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Final

from lark import Token, Transformer, v_args

from resgroups.errors import (
    NumericOverflow,
    ProgramLimitExceeded,
    UndefinedFunction,
    UndefinedType,
)
from resgroups.sql import ast
from resgroups.sql.params import placeholder_number
from resgroups.sql.semantics import ARRAY, cast_target
from resgroups.sql.to_ast_common import (
    _check_literal,
    _literal_placeholder,
    _placeholders,
    _PositionedError,
    _PositionedParameter,
    _unquote,
)

MAX_SELECT_ITEMS: Final = 1664  # as PostgreSQL (and a RowDescription's int16 count)

_ESCAPES: Final = re.compile(r"\\(.)", re.DOTALL)
_ESCAPED: Final = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}


def _row_count(tok: Token, clause: str) -> int:
    """LIMIT's or OFFSET's count: a non-negative integer literal, or ``$n`` (an
    int placeholder, parsed as a stand-in 0 while placeholders are allowed)."""
    if tok.type == "PARAM":
        _literal_placeholder(tok, "int")
        return 0
    _check_literal(tok)
    if not tok.isdigit():
        raise _PositionedError(f"{clause} takes a non-negative integer, not {tok}", tok)
    return int(tok)


def _binary(op: str) -> Any:
    return lambda self, left, right: ast.Binary(op, left, right)


@v_args(inline=True)
class QueryToAst(Transformer[Token, Any]):
    """The queries' and expressions' callbacks, one a grammar rule (a part of
    ``parser._ToAst``; ``v_args`` here, as the decorator skips inherited methods)."""

    # ---- queries
    def select(
        self,
        items: tuple[ast.SelectItem, ...] | None,
        source: ast.Source | None,
        where: ast.Expr | None,
        group_by: tuple[ast.Expr, ...] | None,
        order_by: tuple[ast.OrderItem, ...] | None,
        limit: int | None,
        offset: int | None,
    ) -> ast.Select:
        return ast.Select(items, source, where, order_by or (), limit, offset or 0, group_by or ())

    def union(self, first: ast.Select, *rest: Any) -> ast.Union:
        selects = [first, *rest[1::2]]
        last = selects[-1]
        selects[-1] = dataclasses.replace(last, order_by=(), limit=None, offset=0)
        return ast.Union(tuple(selects), tuple(rest[0::2]), last.order_by, last.limit, last.offset)

    def union_distinct(self) -> bool:
        return False

    def union_all(self) -> bool:
        return True

    def group_clause(self, *exprs: ast.Expr) -> tuple[ast.Expr, ...]:
        return exprs

    def derived_table(self, select: ast.Select, alias: ast.Ident) -> ast.DerivedTable:
        return ast.DerivedTable(select, alias)

    def select_star(self) -> None:
        return None

    def select_list(self, *items: ast.SelectItem) -> tuple[ast.SelectItem, ...]:
        if len(items) > MAX_SELECT_ITEMS:  # PostgreSQL's own limit: 1664 (54011)
            raise ProgramLimitExceeded(
                f"target lists can have at most {MAX_SELECT_ITEMS} entries, "
                f"this one has {len(items)}",
                sqlstate="54011",
            )
        return items

    def select_item_plain(self, expr: ast.Expr) -> ast.SelectItem:
        return ast.SelectItem(expr)

    def select_item_alias(self, expr: ast.Expr, *rest: ast.Ident | None) -> ast.SelectItem:
        return ast.SelectItem(expr, rest[-1])

    def select_item_default(self, expr: ast.Expr) -> ast.SelectItem:
        return ast.SelectItem(expr, ast.Ident("default"))

    def from_clause(self, first: ast.Source, *rest: ast.Source) -> ast.Source:
        source = first
        for item in rest:  # FROM a, b, c: cross joins, left to right
            source = ast.Join(source, item, "cross")
        return source

    def join(self, left: ast.Source, kind: str, right: ast.Source, on: ast.Expr) -> ast.Join:
        return ast.Join(left, right, kind, on)

    def inner_join(self, *_: object) -> str:
        return "inner"

    def left_join(self, *_: object) -> str:
        return "left"

    def alias(self, *parts: ast.Ident | None) -> ast.Ident:
        name = parts[-1]
        assert name is not None
        return name

    def table_function(self, name: Token, *rest: Any) -> ast.TableFunction:
        *args, alias = rest
        return ast.TableFunction(name.lower(), tuple(a for a in args if a is not None), alias)

    def table_name(self, name: ast.Ident, alias: ast.Ident | None) -> ast.TableName:
        return ast.TableName(name, None, alias)

    def qualified_table(
        self, schema: ast.Ident, name: ast.Ident, alias: ast.Ident | None
    ) -> ast.TableName:
        return ast.TableName(name, schema, alias)

    def where_clause(self, expr: ast.Expr) -> ast.Expr:
        return expr

    def order_clause(self, *items: ast.OrderItem) -> tuple[ast.OrderItem, ...]:
        return items

    def order_item(self, expr: ast.Expr, descending: bool | None) -> ast.OrderItem:
        return ast.OrderItem(expr, bool(descending))

    def asc(self) -> bool:
        return False

    def desc(self) -> bool:
        return True

    def limit_clause(self, tok: Token) -> int:
        return _row_count(tok, "LIMIT")

    def offset_clause(self, tok: Token) -> int:
        return _row_count(tok, "OFFSET")

    # ---- expressions
    def number(self, tok: Token) -> ast.Literal:
        _check_literal(tok)
        if tok.isdigit():
            return ast.Literal(int(tok))
        value = float(tok)
        if not math.isfinite(value):
            raise NumericOverflow(f"numeric literal {tok} is out of range for a double")
        return ast.Literal(value)

    def string(self, tok: Token) -> ast.Literal:
        return ast.Literal(_unquote(tok, "'"))

    def escape_string(self, tok: Token) -> ast.Literal:
        """``E'...'``: PostgreSQL's escape string (backslash escapes)."""
        body = tok[2:-1].replace("''", "'")
        return ast.Literal(_ESCAPES.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), body))

    def null(self) -> ast.Literal:
        return ast.Literal(None)

    def parameter(self, tok: Token) -> ast.Param:
        if not _placeholders.allowed:
            raise _PositionedParameter(f"there is no parameter {tok}", tok)
        return ast.Param(placeholder_number(tok[1:]))

    def true(self) -> ast.Literal:
        return ast.Literal(True)

    def false(self) -> ast.Literal:
        return ast.Literal(False)

    def column(self, name: ast.Ident) -> ast.Column:
        return ast.Column(name)

    def qualified_column(self, table: ast.Ident, name: ast.Ident) -> ast.Column:
        return ast.Column(name, table)

    def schema_column(self, schema: ast.Ident, table: ast.Ident, name: ast.Ident) -> ast.Column:
        """``pg_catalog.pg_class.relname``: the relation is found by its name in FROM."""
        return ast.Column(name, table)

    def ordered_call(
        self, name: Token, arg: ast.Expr, order_by: tuple[ast.OrderItem, ...]
    ) -> ast.Call:
        return ast.Call(name.lower(), (arg,), order_by=order_by)

    def any_eq(self, left: ast.Expr, array: ast.Expr) -> ast.Binary:
        return ast.Binary("= any", left, array)

    def subscript(self, array: ast.Expr, index: ast.Expr) -> ast.Call:
        """``a[i]``: the i-th element (1-based), NULL outside the array."""
        return ast.Call("array_element", (array, index))

    def array_type(self, words: str, brackets: Token) -> tuple[str, str]:
        return ARRAY, f"{words}[]"

    def qualified_table_function(
        self, schema: ast.Ident, name: Token, *rest: Any
    ) -> ast.TableFunction:
        if schema.text.lower() != "pg_catalog":
            raise UndefinedFunction(f"function {schema.text}.{name}() does not exist")
        return self.table_function(name, *rest)

    def window_call(
        self,
        name: Token,
        partition: tuple[ast.Expr, ...] | None,
        order_by: tuple[ast.OrderItem, ...] | None,
    ) -> ast.Window:
        if name.lower() != "row_number":
            raise _PositionedError(
                f"window function {name}() is not supported (row_number is)", name
            )
        return ast.Window("row_number", partition or (), order_by or ())

    def partition_clause(self, *exprs: ast.Expr) -> tuple[ast.Expr, ...]:
        return exprs

    def current_catalog(self) -> ast.Call:
        return ast.Call("current_database")

    def concat(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("||", left, right)

    def like_escape(self, left: ast.Expr, pattern: ast.Expr, escape: ast.Expr) -> ast.Binary:
        return ast.Binary("like", left, ast.Call("like_escape", (pattern, escape)))

    def not_like_escape(self, left: ast.Expr, pattern: ast.Expr, escape: ast.Expr) -> ast.Unary:
        return ast.Unary("not", self.like_escape(left, pattern, escape))

    def case(self, operand: ast.Expr | None, *rest: Any) -> ast.Case:
        *whens, default = rest
        return ast.Case(operand, tuple(whens), default)

    def when(self, condition: ast.Expr, result: ast.Expr) -> tuple[ast.Expr, ast.Expr]:
        return condition, result

    def scalar_subquery(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("scalar", select)

    def exists(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("exists", select)

    def array_subquery(self, select: ast.Select) -> ast.Subquery:
        return ast.Subquery("array", select)

    def collate(self, operand: ast.Expr, *_: object) -> ast.Expr:
        """COLLATE is accepted and ignored: text compares by code point here."""
        return operand

    def regex(self, left: ast.Expr, op: Token, right: ast.Expr) -> ast.Binary:
        return ast.Binary(str(op), left, right)

    def operator_regex(
        self, left: ast.Expr, schema: Token, op: Token, right: ast.Expr
    ) -> ast.Binary:
        """``OPERATOR(pg_catalog.~)``: the operator by its qualified name."""
        if schema.lower() != "pg_catalog":
            raise _PositionedError(f"operator does not exist: {schema}.{op}", schema)
        return ast.Binary(str(op), left, right)

    def is_distinct(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("distinct", left, right)

    def is_not_distinct(self, left: ast.Expr, right: ast.Expr) -> ast.Binary:
        return ast.Binary("not distinct", left, right)

    def call_star(self, name: Token) -> ast.Call:
        return ast.Call(name.lower(), (), star=True)

    def call(self, name: Token, *args: ast.Expr | None) -> ast.Call:
        return ast.Call(name.lower(), tuple(a for a in args if a is not None))

    def qualified_call(self, schema: ast.Ident, name: Token, *args: ast.Expr | None) -> ast.Call:
        """``pg_catalog.version()``: the functions PostgreSQL keeps in pg_catalog are
        resgroups' own functions of those names; there is no other schema."""
        if schema.text.lower() != "pg_catalog":
            raise UndefinedFunction(
                f"function {schema.text}.{name}() does not exist: there is no schema "
                f'"{schema.text}" (functions are unqualified, or in pg_catalog)'
            )
        return self.call(name, *args)

    def current_timestamp(self) -> ast.Call:
        return ast.Call("current_timestamp")

    def current_user(self) -> ast.Call:
        return ast.Call("current_user")

    def session_user(self) -> ast.Call:
        return ast.Call("session_user")

    def current_schema(self, *_: object) -> ast.Call:
        return ast.Call("current_schema")

    def cast(self, operand: ast.Expr, target: tuple[str, str]) -> ast.Cast:
        return ast.Cast(operand, *target)

    def cast_call(self, operand: ast.Expr, target: tuple[str, str]) -> ast.Cast:
        return ast.Cast(operand, *target)

    def type_name(self, words: str, *modifiers: Token | None) -> tuple[str, str]:
        """(the semantics' type, the type as written)."""
        return cast_target(words, [str(m) for m in modifiers if m is not None])

    def two_word_type(self, first: Token, second: Token) -> str:
        words = f"{first} {second}".lower()
        if words not in ("double precision", "character varying"):
            raise UndefinedType(f'type "{words}" does not exist')
        return words

    def type_word(self, tok: Token) -> str:
        return str(tok).lower()

    def qualified_type_word(self, schema: Token, tok: Token) -> str:
        if schema.lower() != "pg_catalog":
            raise UndefinedType(f'type "{schema}.{tok}" does not exist')
        return str(tok).lower()

    def neg(self, operand: ast.Expr) -> ast.Unary:
        return ast.Unary("-", operand)

    def not_(self, operand: ast.Expr) -> ast.Unary:
        return ast.Unary("not", operand)

    def is_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand)

    def is_not_null(self, operand: ast.Expr) -> ast.IsNull:
        return ast.IsNull(operand, negated=True)

    def in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, items)

    def not_in_list(self, operand: ast.Expr, *items: ast.Expr) -> ast.InList:
        return ast.InList(operand, items, negated=True)

    def not_like(self, left: ast.Expr, right: ast.Expr) -> ast.Unary:
        return ast.Unary("not", ast.Binary("like", left, right))

    or_ = _binary("or")
    and_ = _binary("and")
    eq = _binary("=")
    ne = _binary("<>")
    lt = _binary("<")
    le = _binary("<=")
    gt = _binary(">")
    ge = _binary(">=")
    like = _binary("like")
    add = _binary("+")
    sub = _binary("-")
    mul = _binary("*")
    div = _binary("/")
    mod = _binary("%")

    # ---- executor tables
    def create_table_as(self, name: ast.Ident, query: ast.Select) -> ast.CreateTableAs:
        return ast.CreateTableAs(name, query)

    def insert_select(self, name: ast.Ident, query: ast.Select) -> ast.InsertSelect:
        return ast.InsertSelect(name, query)

    def drop_table(self, if_exists: bool | None, name: ast.Ident) -> ast.DropTable:
        return ast.DropTable(name, bool(if_exists))
