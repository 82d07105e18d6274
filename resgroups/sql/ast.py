"""Statement and expression nodes: frozen dataclasses built during the parse.

Every node is a value: two parses of the same text compare equal, and
``format_sql`` (in :mod:`resgroups.sql.format`) turns any node back into text
that parses to an equal node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from resgroups.catalog.names import Ident as Ident
from resgroups.catalog.names import PrincipalKind as PrincipalKind
from resgroups.catalog.params import ParamValue as ParamValue

# --------------------------------------------------------------------------
# names


DEFAULT_GROUP = Ident("DEFAULT")
"""What the keyword DEFAULT stands for where a group name is expected."""


# --------------------------------------------------------------------------
# expressions


@dataclass(frozen=True)
class Literal:
    value: int | float | str | bool | datetime | None  # datetime: a bound timestamptz


@dataclass(frozen=True)
class Column:
    name: Ident
    table: Ident | None = None  # c.relname: the relation's name or alias


@dataclass(frozen=True)
class Unary:
    op: str  # "-" or "not"
    operand: Expr


@dataclass(frozen=True)
class Binary:
    op: str  # + - * / % = <> < <= > >= and or like, ~ !~ ~* !~*, distinct, not distinct
    left: Expr
    right: Expr


@dataclass(frozen=True)
class IsNull:
    operand: Expr
    negated: bool = False


@dataclass(frozen=True)
class InList:
    operand: Expr
    items: tuple[Expr, ...]
    negated: bool = False


@dataclass(frozen=True)
class Call:
    name: str  # lower-cased function name
    args: tuple[Expr, ...] = ()
    star: bool = False  # count(*)
    order_by: tuple[OrderItem, ...] = ()  # array_agg(x ORDER BY y)


@dataclass(frozen=True)
class Cast:
    """``operand::type`` or ``CAST(operand AS type)``; ``type`` is one of the
    semantics' types, ``written`` the type as the statement spelled it."""

    operand: Expr
    type: str
    written: str


@dataclass(frozen=True)
class Case:
    """``CASE [operand] WHEN w THEN t ... [ELSE e] END``."""

    operand: Expr | None
    whens: tuple[tuple[Expr, Expr], ...]
    default: Expr | None = None


@dataclass(frozen=True)
class Subquery:
    """``(SELECT ...)`` (kind "scalar"), ``EXISTS (SELECT ...)`` or ``ARRAY(SELECT ...)``."""

    kind: str
    select: Select


@dataclass(frozen=True)
class Window:
    """``row_number() OVER (PARTITION BY ... ORDER BY ...)``."""

    name: str
    partition_by: tuple[Expr, ...] = ()
    order_by: tuple[OrderItem, ...] = ()


@dataclass(frozen=True)
class Param:
    """``$n``: a placeholder, parsed only to infer the types of a prepared
    statement's parameters (:mod:`resgroups.sql.param_types`); statements run
    with their values bound (:mod:`resgroups.sql.params`)."""

    number: int


Expr = (
    Literal | Column | Unary | Binary | IsNull | InList | Call | Cast | Case | Subquery | Window
    | Param
)  # fmt: skip


# --------------------------------------------------------------------------
# resource group DDL


"""A typed parameter value (see :mod:`resgroups.catalog.params`)."""


@dataclass(frozen=True)
class Variant:
    """One variant of a base group: its own name and the parameters it overrides."""

    name: Ident
    params: tuple[tuple[str, ParamValue], ...] = ()


@dataclass(frozen=True)
class CreateResourceGroup:
    name: Ident
    params: tuple[tuple[str, ParamValue], ...] = ()
    if_not_exists: bool = False
    variants: tuple[Variant, ...] = ()


@dataclass(frozen=True)
class AddVariant:
    group: Ident
    variant: Variant


@dataclass(frozen=True)
class DropVariant:
    group: Ident
    name: Ident
    if_exists: bool = False


@dataclass(frozen=True)
class AlterResourceGroupSet:
    name: Ident
    params: tuple[tuple[str, ParamValue], ...]


@dataclass(frozen=True)
class AlterResourceGroupReset:
    name: Ident
    params: tuple[str, ...]


@dataclass(frozen=True)
class RenameResourceGroup:
    name: Ident
    new_name: Ident


@dataclass(frozen=True)
class DropResourceGroup:
    name: Ident
    if_exists: bool = False


@dataclass(frozen=True)
class CreateResourceRule:
    """CREATE RESOURCE RULE (SPEC §16): thresholds in each metric's base unit
    (:mod:`resgroups.catalog.rules`); ``target`` only for a MOVE."""

    name: Ident
    group: Ident
    conditions: tuple[tuple[str, int], ...]
    action: str
    target: Ident | None = None
    watch_ms: int = 0
    if_not_exists: bool = False


@dataclass(frozen=True)
class RenameResourceRule:
    name: Ident
    new_name: Ident


@dataclass(frozen=True)
class DropResourceRule:
    name: Ident
    if_exists: bool = False


@dataclass(frozen=True)
class CreateResourceSelector:
    """CREATE RESOURCE SELECTOR (SPEC §15): conditions as (attribute, operator,
    value) (:mod:`resgroups.catalog.selectors`)."""

    name: Ident
    conditions: tuple[tuple[str, str, str | int], ...]
    group: Ident
    priority: int = 0
    if_not_exists: bool = False


@dataclass(frozen=True)
class RenameResourceSelector:
    name: Ident
    new_name: Ident


@dataclass(frozen=True)
class DropResourceSelector:
    name: Ident
    if_exists: bool = False


# --------------------------------------------------------------------------
# principals, mappings, permissions


@dataclass(frozen=True)
class CreatePrincipal:
    kind: PrincipalKind
    name: Ident
    password: str | None = None


@dataclass(frozen=True)
class DropPrincipal:
    kind: PrincipalKind
    name: Ident


@dataclass(frozen=True)
class AddUser:
    user: Ident
    groups: tuple[Ident, ...]


@dataclass(frozen=True)
class RemoveUser:
    user: Ident
    groups: tuple[Ident, ...]


@dataclass(frozen=True)
class GrantAssume:
    account: Ident
    user: Ident


@dataclass(frozen=True)
class RevokeAssume:
    account: Ident
    user: Ident


@dataclass(frozen=True)
class AssumeServiceAccount:
    account: Ident


@dataclass(frozen=True)
class ExitServiceAccount:
    pass


@dataclass(frozen=True)
class SetMapping:
    """ALTER USER|GROUP|SERVICE ACCOUNT name SET/UNSET RESOURCE GROUP."""

    kind: PrincipalKind
    name: Ident
    group: Ident | None  # None: UNSET
    priority: int | None = None  # MAPPING PRIORITY, ALTER GROUP only


@dataclass(frozen=True)
class SetMemoryLimit:
    kind: PrincipalKind
    name: Ident
    limit: int | None  # None: UNLIMITED (the principal has no limit of its own)


@dataclass(frozen=True)
class GrantAdmin:
    principal: Ident


@dataclass(frozen=True)
class RevokeAdmin:
    principal: Ident


@dataclass(frozen=True)
class GrantUse:
    group: Ident | None  # None: USE RESOURCE GROUP (every group)
    principal: Ident


@dataclass(frozen=True)
class RevokeUse:
    group: Ident | None
    principal: Ident


# --------------------------------------------------------------------------
# session control and queries


@dataclass(frozen=True)
class SetResourceGroup:
    group: Ident


@dataclass(frozen=True)
class ResetResourceGroup:
    pass


@dataclass(frozen=True)
class ResetAll:
    pass


@dataclass(frozen=True)
class DiscardAll:
    pass


@dataclass(frozen=True)
class Show:
    what: PrincipalKind


@dataclass(frozen=True)
class ExplainResourceGroup:
    """EXPLAIN RESOURCE GROUP [FOR USER name | FOR SERVICE ACCOUNT name]."""

    kind: PrincipalKind | None = None  # None: the current session
    name: Ident | None = None
    # what the query would be: application, tags, kind (SPEC §15); unset: the session's
    application: str | None = None
    tags: tuple[str, ...] | None = None
    query_kind: str | None = None


@dataclass(frozen=True)
class SelectItem:
    expr: Expr
    alias: Ident | None = None


@dataclass(frozen=True)
class OrderItem:
    expr: Expr
    descending: bool = False


@dataclass(frozen=True)
class TableFunction:
    name: str  # lower-cased
    args: tuple[Expr, ...] = ()
    alias: Ident | None = None


@dataclass(frozen=True)
class TableName:
    name: Ident
    schema: Ident | None = None  # pg_catalog.pg_class
    alias: Ident | None = None


@dataclass(frozen=True)
class Join:
    """``left [INNER|LEFT] JOIN right ON on``; a comma in FROM is kind "cross"."""

    left: Source
    right: Source
    kind: str  # "inner", "left" or "cross"
    on: Expr | None = None


@dataclass(frozen=True)
class DerivedTable:
    """``(SELECT ...) AS alias`` in FROM."""

    select: Select
    alias: Ident


Source = TableFunction | TableName | Join | DerivedTable


@dataclass(frozen=True)
class Select:
    items: tuple[SelectItem, ...] | None  # None: SELECT *
    source: Source | None = None
    where: Expr | None = None
    order_by: tuple[OrderItem, ...] = ()
    limit: int | None = None
    offset: int = 0
    group_by: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class CreateTableAs:
    """CREATE TABLE name AS (SELECT ...): the source query runs as kind "ctas"."""

    name: Ident
    query: Select


@dataclass(frozen=True)
class InsertSelect:
    """INSERT INTO name SELECT ...: the source query runs as kind "insert_select"."""

    name: Ident
    query: Select


@dataclass(frozen=True)
class DropTable:
    name: Ident
    if_exists: bool = False


@dataclass(frozen=True)
class Union:
    """``SELECT ... UNION [ALL] SELECT ...``: ``all[i]`` joins ``selects[i + 1]``
    to what comes before it; the ORDER BY, LIMIT and OFFSET are the union's."""

    selects: tuple[Select, ...]
    all: tuple[bool, ...]
    order_by: tuple[OrderItem, ...] = ()
    limit: int | None = None
    offset: int = 0


Statement = (
    CreateResourceGroup
    | AlterResourceGroupSet
    | AlterResourceGroupReset
    | RenameResourceGroup
    | DropResourceGroup
    | AddVariant
    | DropVariant
    | CreateResourceRule
    | RenameResourceRule
    | DropResourceRule
    | CreateResourceSelector
    | RenameResourceSelector
    | DropResourceSelector
    | CreatePrincipal
    | DropPrincipal
    | AddUser
    | RemoveUser
    | GrantAssume
    | RevokeAssume
    | AssumeServiceAccount
    | ExitServiceAccount
    | SetMapping
    | SetMemoryLimit
    | GrantAdmin
    | RevokeAdmin
    | GrantUse
    | RevokeUse
    | SetResourceGroup
    | ResetResourceGroup
    | ResetAll
    | DiscardAll
    | Show
    | ExplainResourceGroup
    | Select
    | Union
    | CreateTableAs
    | InsertSelect
    | DropTable
)


def any_node(node: object, test: Callable[[object], bool]) -> bool:
    """Whether ``test`` holds for ``node`` or for any node below it (through
    tuples and dataclass fields; linear in the tree's size)."""
    if test(node):
        return True
    if isinstance(node, tuple):
        return any(any_node(item, test) for item in node)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return any(any_node(getattr(node, f.name), test) for f in dataclasses.fields(node))
    return False
