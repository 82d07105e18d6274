"""Statements back to SQL text: ``parse_one(format_sql(s)) == s`` for every statement.

Expressions are written fully parenthesised, so the text parses back to the
same tree whatever the precedence rules.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from resgroups.catalog.params import PARAMETERS
from resgroups.catalog.rules import format_conditions
from resgroups.catalog.selectors import format_conditions as format_selector_conditions
from resgroups.sql import ast


def quote_ident(ident: ast.Ident) -> str:
    if ident == ast.DEFAULT_GROUP:
        return "DEFAULT"
    if ident.quoted:
        return '"' + ident.text.replace('"', '""') + '"'
    return ident.text


def quote_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _params(params: tuple[tuple[str, ast.ParamValue], ...]) -> str:
    return ", ".join(f"{name} = {PARAMETERS[name].format(value)}" for name, value in params)


def format_expr(expr: ast.Expr) -> str:
    match expr:
        case ast.Literal(value=None):
            return "NULL"
        case ast.Literal(value=bool() as flag):
            return "TRUE" if flag else "FALSE"
        case ast.Literal(value=str() as text):
            return quote_string(text)
        case ast.Literal(value=datetime() as moment):  # a bound timestamptz parameter
            return f"CAST({quote_string(moment.isoformat())} AS timestamptz)"
        case ast.Literal(value=value):
            return repr(value)
        case ast.Column(name=name, table=None):
            return quote_ident(name)
        case ast.Column(name=name, table=ast.Ident() as table):
            return f"{quote_ident(table)}.{quote_ident(name)}"
        case ast.Case(operand=operand, whens=whens, default=default):
            parts = ["CASE"] + ([format_expr(operand)] if operand is not None else [])
            parts += [f"WHEN {format_expr(w)} THEN {format_expr(t)}" for w, t in whens]
            parts += [f"ELSE {format_expr(default)}"] if default is not None else []
            return " ".join([*parts, "END"])
        case ast.Window(name=name, partition_by=partition, order_by=order_by):
            over = []
            if partition:
                over.append("PARTITION BY " + ", ".join(format_expr(e) for e in partition))
            if order_by:
                over.append(_order_by(order_by))
            return f"{name}() OVER ({' '.join(over)})"
        case ast.Subquery(kind=kind, select=select):
            prefix = {"scalar": "", "exists": "EXISTS ", "array": "ARRAY"}[kind]
            return f"{prefix}({_select(select)})"
        case ast.Cast(operand=operand, written=written):
            return f"CAST({format_expr(operand)} AS {written})"
        case ast.Unary(op="-", operand=operand):
            return f"(-{format_expr(operand)})"
        case ast.Unary(op=op, operand=operand):
            return f"({op.upper()} {format_expr(operand)})"
        case ast.Binary(op="= any", left=left, right=right):
            return f"({format_expr(left)} = ANY ({format_expr(right)}))"
        case ast.Binary(op="distinct" | "not distinct" as op, left=left, right=right):
            return f"({format_expr(left)} IS {op.upper()} FROM {format_expr(right)})"
        case ast.Binary(op=op, left=left, right=right):
            return f"({format_expr(left)} {op.upper()} {format_expr(right)})"
        case ast.IsNull(operand=operand, negated=negated):
            return f"({format_expr(operand)} IS {'NOT ' if negated else ''}NULL)"
        case ast.InList(operand=operand, items=items, negated=negated):
            inner = ", ".join(format_expr(i) for i in items)
            return f"({format_expr(operand)} {'NOT ' if negated else ''}IN ({inner}))"
        case ast.Call(name=name, star=True):
            return f"{name}(*)"
        case ast.Call(name=name, args=(arg,), order_by=order_by) if order_by:
            return f"{name}({format_expr(arg)} {_order_by(order_by)})"
        case ast.Call(name=name, args=args):
            return f"{name}({', '.join(format_expr(a) for a in args)})"
    raise TypeError(f"not an expression: {expr!r}")


def _order_by(items: tuple[ast.OrderItem, ...]) -> str:
    return "ORDER BY " + ", ".join(
        format_expr(o.expr) + (" DESC" if o.descending else "") for o in items
    )


def _source(source: ast.Source) -> str:
    match source:
        case ast.TableFunction(name=name, args=args, alias=alias):
            text = f"{name}({', '.join(format_expr(a) for a in args)})"
        case ast.TableName(name=name, schema=schema, alias=alias):
            text = (
                quote_ident(name)
                if schema is None
                else f"{quote_ident(schema)}.{quote_ident(name)}"
            )
        case ast.DerivedTable(select=select, alias=alias):
            text = f"({_select(select)})"
        case ast.Join(left=left, right=right, kind="cross"):
            return f"{_source(left)}, {_source(right)}"
        case ast.Join(left=left, right=right, kind=kind, on=on):
            assert on is not None
            return f"({_source(left)} {kind.upper()} JOIN {_source(right)} ON {format_expr(on)})"
    return text if alias is None else f"{text} AS {quote_ident(alias)}"


def _select(s: ast.Select) -> str:
    parts = ["SELECT"]
    if s.items is None:
        parts.append("*")
    else:
        parts.append(
            ", ".join(
                format_expr(i.expr) + (f" AS {quote_ident(i.alias)}" if i.alias else "")
                for i in s.items
            )
        )
    if s.source is not None:
        parts.append(f"FROM {_source(s.source)}")
    if s.where is not None:
        parts.append(f"WHERE {format_expr(s.where)}")
    if s.group_by:
        parts.append("GROUP BY " + ", ".join(format_expr(e) for e in s.group_by))
    if s.order_by:
        parts.append(_order_by(s.order_by))
    if s.limit is not None:
        parts.append(f"LIMIT {s.limit}")
    if s.offset:
        parts.append(f"OFFSET {s.offset}")
    return " ".join(parts)


def _union(u: ast.Union) -> str:
    parts = [_select(u.selects[0])]
    for every, select in zip(u.all, u.selects[1:], strict=True):
        parts.append(("UNION ALL " if every else "UNION ") + _select(select))
    tail = ast.Select(None, None, None, u.order_by, u.limit, u.offset)
    return " ".join(parts) + _select(tail).removeprefix("SELECT *")


def _with(params: tuple[tuple[str, ast.ParamValue], ...]) -> str:
    return f" WITH ({_params(params)})" if params else ""


def _variant(v: ast.Variant) -> str:
    return quote_ident(v.name) + _with(v.params)


def _create_group(s: ast.CreateResourceGroup) -> str:
    text = "CREATE RESOURCE GROUP " + ("IF NOT EXISTS " if s.if_not_exists else "")
    text += quote_ident(s.name) + _with(s.params)
    if s.variants:
        text += f" VARIANTS ({', '.join(_variant(v) for v in s.variants)})"
    return text


def _create_rule(s: ast.CreateResourceRule) -> str:
    text = "CREATE RESOURCE RULE " + ("IF NOT EXISTS " if s.if_not_exists else "")
    text += f"{quote_ident(s.name)} ON RESOURCE GROUP {quote_ident(s.group)} WHEN "
    text += format_conditions(s.conditions) + " THEN "
    if s.target is not None:
        text += f"MOVE TO RESOURCE GROUP {quote_ident(s.target)}"
    else:
        text += s.action.upper()
    return text + (f" WITH (watch = {s.watch_ms})" if s.watch_ms else "")


def _create_selector(s: ast.CreateResourceSelector) -> str:
    text = "CREATE RESOURCE SELECTOR " + ("IF NOT EXISTS " if s.if_not_exists else "")
    text += f"{quote_ident(s.name)} WHEN {format_selector_conditions(s.conditions)} "
    text += f"THEN RESOURCE GROUP {quote_ident(s.group)}"
    return text + (f" WITH (priority = {s.priority})" if s.priority else "")


def _mapping(s: ast.SetMapping) -> str:
    head = f"ALTER {s.kind.sql} {quote_ident(s.name)}"
    if s.group is None:
        return head + " UNSET RESOURCE GROUP"
    text = f"{head} SET RESOURCE GROUP {quote_ident(s.group)}"
    return text + (f" MAPPING PRIORITY {s.priority}" if s.priority is not None else "")


def _password(password: str | None) -> str:
    return "" if password is None else f" WITH PASSWORD {quote_string(password)}"


def _use(verb: str, prep: str, group: ast.Ident | None, principal: ast.Ident) -> str:
    target = (
        "USE RESOURCE GROUP" if group is None else f"USE ON RESOURCE GROUP {quote_ident(group)}"
    )
    return f"{verb} {target} {prep} {quote_ident(principal)}"


def _names(idents: tuple[ast.Ident, ...]) -> str:
    return ", ".join(quote_ident(i) for i in idents)


_FORMATTERS: Final[dict[type, Callable[[Any], str]]] = {
    ast.CreateResourceGroup: _create_group,
    ast.AlterResourceGroupSet: lambda s: (
        f"ALTER RESOURCE GROUP {quote_ident(s.name)} SET ({_params(s.params)})"
    ),
    ast.AlterResourceGroupReset: lambda s: (
        f"ALTER RESOURCE GROUP {quote_ident(s.name)} RESET ({', '.join(s.params)})"
    ),
    ast.RenameResourceGroup: lambda s: (
        f"ALTER RESOURCE GROUP {quote_ident(s.name)} RENAME TO {quote_ident(s.new_name)}"
    ),
    ast.AddVariant: lambda s: (
        f"ALTER RESOURCE GROUP {quote_ident(s.group)} ADD VARIANT {_variant(s.variant)}"
    ),
    ast.DropVariant: lambda s: (
        f"ALTER RESOURCE GROUP {quote_ident(s.group)} DROP VARIANT "
        + ("IF EXISTS " if s.if_exists else "")
        + quote_ident(s.name)
    ),
    ast.DropResourceGroup: lambda s: (
        "DROP RESOURCE GROUP " + ("IF EXISTS " if s.if_exists else "") + quote_ident(s.name)
    ),
    ast.CreateResourceRule: _create_rule,
    ast.RenameResourceRule: lambda s: (
        f"ALTER RESOURCE RULE {quote_ident(s.name)} RENAME TO {quote_ident(s.new_name)}"
    ),
    ast.DropResourceRule: lambda s: (
        "DROP RESOURCE RULE " + ("IF EXISTS " if s.if_exists else "") + quote_ident(s.name)
    ),
    ast.CreateResourceSelector: _create_selector,
    ast.RenameResourceSelector: lambda s: (
        f"ALTER RESOURCE SELECTOR {quote_ident(s.name)} RENAME TO {quote_ident(s.new_name)}"
    ),
    ast.DropResourceSelector: lambda s: (
        "DROP RESOURCE SELECTOR " + ("IF EXISTS " if s.if_exists else "") + quote_ident(s.name)
    ),
    ast.CreatePrincipal: lambda s: (
        f"CREATE {s.kind.sql} {quote_ident(s.name)}{_password(s.password)}"
    ),
    ast.DropPrincipal: lambda s: f"DROP {s.kind.sql} {quote_ident(s.name)}",
    ast.AddUser: lambda s: f"ADD USER {quote_ident(s.user)} TO {_names(s.groups)}",
    ast.RemoveUser: lambda s: f"REMOVE USER {quote_ident(s.user)} FROM {_names(s.groups)}",
    ast.GrantAssume: lambda s: (
        f"GRANT ASSUME SERVICE ACCOUNT {quote_ident(s.account)} TO {quote_ident(s.user)}"
    ),
    ast.RevokeAssume: lambda s: (
        f"REVOKE ASSUME SERVICE ACCOUNT {quote_ident(s.account)} FROM {quote_ident(s.user)}"
    ),
    ast.AssumeServiceAccount: lambda s: f"ASSUME SERVICE ACCOUNT {quote_ident(s.account)}",
    ast.ExitServiceAccount: lambda s: "EXIT SERVICE ACCOUNT",
    ast.SetMapping: _mapping,
    ast.SetMemoryLimit: lambda s: (
        f"ALTER {s.kind.sql} {quote_ident(s.name)} SET MEMORY LIMIT "
        + ("UNLIMITED" if s.limit is None else str(s.limit))
    ),
    ast.GrantAdmin: lambda s: f"GRANT RESOURCE GROUP ADMIN TO {quote_ident(s.principal)}",
    ast.RevokeAdmin: lambda s: f"REVOKE RESOURCE GROUP ADMIN FROM {quote_ident(s.principal)}",
    ast.GrantUse: lambda s: _use("GRANT", "TO", s.group, s.principal),
    ast.RevokeUse: lambda s: _use("REVOKE", "FROM", s.group, s.principal),
    ast.SetResourceGroup: lambda s: f"SET RESOURCE GROUP {quote_ident(s.group)}",
    ast.ResetResourceGroup: lambda s: "RESET RESOURCE GROUP",
    ast.ResetAll: lambda s: "RESET ALL",
    ast.DiscardAll: lambda s: "DISCARD ALL",
    ast.Show: lambda s: (
        "SHOW USERS"
        if s.what is ast.PrincipalKind.USER
        else "SHOW GROUPS"
        if s.what is ast.PrincipalKind.GROUP
        else "SHOW SERVICE ACCOUNTS"
    ),
    ast.Select: _select,
    ast.Union: lambda u: _union(u),
    ast.CreateTableAs: lambda s: f"CREATE TABLE {quote_ident(s.name)} AS ({_select(s.query)})",
    ast.InsertSelect: lambda s: f"INSERT INTO {quote_ident(s.name)} {_select(s.query)}",
    ast.DropTable: lambda s: (
        "DROP TABLE " + ("IF EXISTS " if s.if_exists else "") + quote_ident(s.name)
    ),
}


def format_sql(statement: ast.Statement) -> str:
    """One statement as SQL text (without the trailing ``;``)."""
    return _FORMATTERS[type(statement)](statement)
