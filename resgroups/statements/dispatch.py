"""Running statements: one handler per statement kind, and who may run it.

``RULES`` maps each statement class to its handler, whether it needs access
control (SPEC §5: principal, mapping, memory-limit and grant statements
raise FeatureNotSupported without it) and the permission it needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, Final

from resgroups.access import check_group_admin, check_use, find_runtime_group
from resgroups.catalog.params import INT64_MAX
from resgroups.catalog.selectors import Estimate
from resgroups.errors import (
    DatatypeMismatch,
    Error,
    FeatureNotSupported,
    PermissionDenied,
    UndefinedTable,
)
from resgroups.exec import executor
from resgroups.exec.tables import Table
from resgroups.exec.vector import dtype_type
from resgroups.result import Cursor, Result, RowsCursor
from resgroups.sql import ast
from resgroups.sql.expr import CATALOG_FUNCTIONS, EvalContext, Scope, compile_expr
from resgroups.sql.format import format_sql
from resgroups.sql.memo import PerStatement
from resgroups.sql.param_types import parameter_types
from resgroups.sql.params import has_placeholder
from resgroups.sql.relational import SERIES, run_query
from resgroups.sql.select import Relation, Shape, run_select, select_shape
from resgroups.sql.semantics import ARITHMETIC, COMPARISON, FLOAT, union_type
from resgroups.statements import groups, principals, rules, selectors
from resgroups.statements.pg_catalog import CatalogRows, catalog_columns, unknown_relation
from resgroups.statements.table_functions import TABLE_FUNCTIONS, relation, table_function

if TYPE_CHECKING:
    from resgroups.query import Query
    from resgroups.session import Session


class Needs(Enum):
    NOTHING = "nothing"
    GROUP_ADMIN = "RESOURCE GROUP ADMIN"
    ADMIN = "the admin"


@dataclass(frozen=True)
class Rule:
    handler: Callable[[Session, Any], Result]
    needs: Needs = Needs.NOTHING
    access_control: bool = False  # True: FeatureNotSupported when it is off


# ---- session control -----------------------------------------------------------


def set_resource_group(session: Session, stmt: ast.SetResourceGroup) -> Result:
    engine = session.engine
    snap = engine.snapshot
    group = find_runtime_group(snap, stmt.group)
    check_use(snap, session.identity, group, access_control=engine.access_control)
    session.choose(group.id)
    return Result.command("SET")


def reset_resource_group(session: Session, stmt: ast.Statement) -> Result:
    session.choose(None)
    return Result.command("RESET")


def discard_all(session: Session, stmt: ast.DiscardAll) -> Result:
    session.choose(None)
    session.assume(None)
    return Result.command("DISCARD ALL")


# ---- queries -------------------------------------------------------------------


def _in_executor(session: Session, stmt: ast.Select) -> bool:
    """True: a scan of one executor table or long_sequence() with the executor's
    expressions; else the row engine answers (catalog relations, joins, subqueries)."""
    if not executor.is_executor_source(stmt):
        return False
    source = stmt.source
    if isinstance(source, ast.TableName):
        if source.schema is not None and source.schema.text.casefold() != "public":
            return False
        try:
            session.engine.tables.get(source.name)
        except UndefinedTable:
            return False
    assert isinstance(source, ast.TableName | ast.TableFunction)
    label = source.alias or source.name
    named = label if isinstance(label, str) else label.text
    # a qualifier other than the table's name or alias: the row engine's error
    if any(q.casefold() != named.casefold() for q in _qualifiers(stmt)):
        return False
    return not _needs_rows(stmt)


def _unqualified(stmt: ast.Select) -> ast.Select:
    """``stmt`` with its columns' qualifiers dropped: they name its one source,
    as :func:`_in_executor` checked, and the executor's scope is that source."""

    def walk(node: Any) -> Any:
        if isinstance(node, ast.Column):
            return replace(node, table=None)
        if isinstance(node, tuple):
            return tuple(walk(x) for x in node)
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return replace(
                node, **{f.name: walk(getattr(node, f.name)) for f in dataclasses.fields(node)}
            )
        return node

    result: ast.Select = walk(stmt)
    return result


def _qualifiers(node: object) -> set[str]:
    """The table qualifiers of every column ``node`` names (``t`` of ``t.x``)."""
    if isinstance(node, ast.Column):
        return set() if node.table is None else {node.table.text}
    if isinstance(node, tuple):
        return set().union(*(_qualifiers(x) for x in node))
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return set().union(*(_qualifiers(getattr(node, f.name)) for f in dataclasses.fields(node)))
    return set()


_ROW_ONLY: Final = (ast.Case, ast.Subquery, ast.DerivedTable, ast.Join)


def _walk_needs_rows(node: object) -> bool:
    """Whether ``node`` holds an expression only the row evaluator has."""
    return ast.any_node(node, _row_only)


def _row_only(node: object) -> bool:
    """Whether ``node`` itself is one only the row evaluator has."""
    if isinstance(node, _ROW_ONLY):
        return True
    if isinstance(node, ast.Binary) and node.op in (
        "~",
        "!~",
        "~*",
        "!~*",
        "distinct",
        "not distinct",
    ):
        return True
    if isinstance(node, ast.Call) and (
        node.name in CATALOG_FUNCTIONS or node.name == "array_agg" or node.order_by
    ):
        return True
    if isinstance(node, ast.Select) and node.group_by:
        return True
    return isinstance(node, ast.Cast) and node.written in ("regclass", "regtype")


# no value bound to a placeholder makes a statement need the row engine
_needs_rows: Final = PerStatement(_walk_needs_rows, same_when_bound=lambda needs: True)


def _resolver(
    session: Session, catalog: CatalogRows, ctx: EvalContext
) -> tuple[Callable[[ast.TableName | ast.TableFunction, tuple[Any, ...]], Relation], list[bool]]:
    """Resolve FROM names: the catalog, a table function's view, an executor table;
    and whether every relation read is the workload's (managed) rather than state."""
    managed = [True]

    def resolve(ref: ast.TableName | ast.TableFunction, values: tuple[Any, ...]) -> Relation:
        if isinstance(ref, ast.TableFunction):
            fn = table_function(ref.name)
            managed[0] = managed[0] and not fn.engine_state
            return relation(session, fn, values)
        found = catalog.relation(ref)
        if found is not None:
            managed[0] = False
            return found
        public = ref.schema is None or ref.schema.text.casefold() == "public"
        name = ref.name.text if ref.name.quoted else ref.name.text.casefold()
        if public and name in TABLE_FUNCTIONS:
            return resolve(ast.TableFunction(name), ())
        if public:
            try:
                table = session.engine.tables.get(ref.name)
            except UndefinedTable:
                pass
            else:
                columns = [a.tolist() for a in table.arrays]
                return Relation(
                    table.names,
                    list(zip(*columns, strict=True)),
                    tuple(dtype_type(a.dtype) for a in table.arrays),
                )
        raise unknown_relation(ref, catalog.names())

    return resolve, managed


def _run(session: Session, stmt: ast.Select, ctx: EvalContext) -> tuple[Relation, bool]:
    catalog = CatalogRows(session)
    resolve, managed = _resolver(session, catalog, ctx)
    out = run_query(stmt, resolve, replace(ctx, catalog=catalog))
    return out, managed[0]


def select(session: Session, stmt: ast.Select) -> Result:
    """SELECT over engine state (unmanaged), the executor's sources, or no FROM."""
    if _in_executor(session, stmt):
        return executor.select(session, _unqualified(stmt))
    if (stmt.source is None or isinstance(stmt.source, ast.TableFunction)) and not _needs_rows(
        stmt
    ):
        return _select_simple(session, stmt)
    group = None
    if _reads_tables(session, stmt):  # the workload's tables: a managed query
        with session.query(
            kind="select",
            statement=_text(stmt),
            estimate=_row_engine_estimate(session, stmt),
        ) as q:
            out, _ = _run(session, stmt, session.eval_context(q.group))
            group = q.group
    else:  # the catalog and engine state: unmanaged, like resource_groups()
        out, _ = _run(session, stmt, session.eval_context())
    return replace(Result.table(out.columns, out.rows, out.types), group=group)


def union(session: Session, stmt: ast.Union) -> Result:
    """``SELECT ... UNION [ALL] SELECT ...`` over the catalog (unmanaged) or, when
    a branch reads the workload's tables, as one managed query."""
    if _reads_tables(session, stmt):
        with session.query(
            kind="select",
            statement=_text(stmt),
            estimate=_row_engine_estimate(session, stmt),
        ) as q:
            out = _union(session, stmt, session.eval_context(q.group), q)
        return replace(Result.table(out.columns, out.rows, out.types), group=q.group)
    out = _union(session, stmt, session.eval_context(), None)
    return Result.table(out.columns, out.rows, out.types)


def _union(session: Session, stmt: ast.Union, ctx: EvalContext, q: Query | None) -> Relation:
    """The branches one after the other, in one evaluation context (one now());
    a branch over long_sequence(), which only the executor reads, is scanned by
    it within the union's query; the rest are the row engine's, as a SELECT of
    its own with what the executor lacks (text, functions) would be."""

    def branch(s: ast.Select) -> Relation:
        sequence = isinstance(s.source, ast.TableFunction) and s.source.name == "long_sequence"
        if q is not None and sequence and _in_executor(session, s):
            return executor.relation_in(session, q, _unqualified(s), ctx)
        return _run(session, s, ctx)[0]

    listed = [len(s.items) for s in stmt.selects if s.items is not None]
    if listed and min(listed) != max(listed):  # known before any branch runs
        raise _union_columns(listed[0], next(n for n in listed if n != listed[0]))
    parts = [branch(s) for s in stmt.selects]
    first = parts[0]
    rows = list(first.rows)
    for every, part in zip(stmt.all, parts[1:], strict=True):
        if len(part.columns) != len(first.columns):
            raise _union_columns(len(first.columns), len(part.columns))
        rows += part.rows
        if not every:  # UNION: distinct rows, in order of first appearance
            rows = list(dict.fromkeys(rows))
    resolved: Sequence[str | None] = first.types
    for part in parts[1:]:
        resolved = _union_types(resolved, part.types)
    types = tuple(resolved)
    # a double column some branch gave integers in: they become doubles
    doubles = [
        i
        for i, t in enumerate(types)
        if t == FLOAT and any(p.types[i : i + 1] != (FLOAT,) for p in parts)
    ]
    if doubles:
        rows = [_as_doubles(row, doubles) for row in rows]
    tail = ast.Select(None, None, None, stmt.order_by, stmt.limit, stmt.offset)
    # a name the union's columns repeat (NULL, NULL: ?column? twice) is told apart
    # while sorting, so ORDER BY takes its position; the result keeps the names
    seen: dict[str, int] = {}
    inner = []
    for name in first.columns:
        seen[name] = seen.get(name, 0) + 1
        inner.append(name if seen[name] == 1 else f"{name}\x00{seen[name]}")
    out = run_select(tail, Relation(tuple(inner), rows, types), ctx)
    return replace(out, columns=first.columns)


def _union_columns(first: int, other: int) -> DatatypeMismatch:
    return DatatypeMismatch(
        f"each UNION query must have the same number of columns ({first} and {other})",
        sqlstate="42601",
    )


def _union_types(types: Sequence[str | None], other: Sequence[str | None]) -> list[str | None]:
    if len(types) < len(other):  # a branch's own count is checked as it runs
        types = [*types, *[None] * (len(other) - len(types))]
    return [union_type(i, a, b) for i, (a, b) in enumerate(zip(types, other, strict=False))] + list(
        types[len(other) :]
    )


def _as_doubles(row: tuple[Any, ...], columns: list[int]) -> tuple[Any, ...]:
    values = list(row)
    for i in columns:
        if type(values[i]) is int:
            values[i] = float(values[i])
    return tuple(values)


def _walk_sources(node: object) -> Iterator[ast.TableName | ast.TableFunction]:
    """Every relation a statement reads from, anywhere in it (a table function's
    arguments are not looked into)."""
    if isinstance(node, ast.TableName | ast.TableFunction):
        yield node
    elif isinstance(node, tuple):
        for item in node:
            yield from _walk_sources(item)
    elif dataclasses.is_dataclass(node) and not isinstance(node, type):
        for f in dataclasses.fields(node):
            yield from _walk_sources(getattr(node, f.name))


_text: Final = PerStatement(format_sql)  # a statement's text, as queries are listed
# a template's sources are a bound tree's when none holds a placeholder (the
# binder shares every subtree without one)
_sources: Final = PerStatement(
    lambda stmt: tuple(_walk_sources(stmt)),
    same_when_bound=lambda sources: not any(has_placeholder(s) for s in sources),
)


def _executor_table(session: Session, source: ast.TableName | ast.TableFunction) -> Table | None:
    """The executor table ``source`` names (None: not one)."""
    if isinstance(source, ast.TableFunction):
        return None
    if source.schema is not None and source.schema.text.casefold() != "public":
        return None
    try:
        return session.engine.tables.get(source.name)
    except UndefinedTable:
        return None


def _reads_tables(session: Session, node: object) -> bool:
    """Whether ``node`` names an executor table (or long_sequence) anywhere."""
    return any(
        _executor_table(session, source) is not None
        if isinstance(source, ast.TableName)
        else source.name not in TABLE_FUNCTIONS and source.name not in SERIES
        for source in _sources(node)
    )


def _rows_read(session: Session, node: object) -> int:
    """An upper bound of the rows a query answered by the row engine reads, for
    selectors (SPEC §15): the product of the row counts of the executor tables
    and sequences a SELECT names (a join reads at most their product, a
    subquery no more), the sum of a union's branches, capped at 2^63-1."""
    if isinstance(node, ast.Union):  # a union reads its branches one after the other
        return min(sum(_rows_read(session, branch) for branch in node.selects), INT64_MAX)
    rows = 1
    for source in _sources(node):
        match source:
            case ast.TableFunction(name="long_sequence", args=(ast.Literal(value=int() as n),)):
                rows = min(rows * max(0, n), INT64_MAX)
            case ast.TableName():
                table = _executor_table(session, source)
                if table is not None:
                    rows = min(rows * table.rows, INT64_MAX)
    return rows


def _row_engine_estimate(session: Session, stmt: ast.Statement) -> Estimate:
    rows = _rows_read(session, stmt)
    return _ONE_ROW if rows == 1 else Estimate(rows=rows, memory=min(rows * 8, INT64_MAX))


_ONE_ROW: Final = Estimate(rows=1, memory=8)  # a SELECT of no source (SELECT 1), say


def _select_simple(session: Session, stmt: ast.Select) -> Result:
    match stmt.source:
        case None:
            source = Relation((), [()])
            managed = True
        case ast.TableFunction(name=name, args=args):
            fn = table_function(name)
            values = tuple(compile_expr(a, _NO_COLUMNS, session.eval_context())(()) for a in args)
            source = relation(session, fn, values)
            managed = not fn.engine_state
    group = None
    # no source: the shape is the statement's alone, kept per statement
    shape = _plain_shape(stmt) if stmt.source is None else None
    if not managed:
        out = run_select(stmt, source, session.eval_context(), shape)
    else:
        with session.query(
            kind="select",
            statement=_text(stmt),
            estimate=_row_engine_estimate(session, stmt),
        ) as q:
            folded = _folded(stmt) if shape is not None else None
            if folded is not None:  # its rows as computed once, a new list of them
                out = Relation(folded.columns, list(folded.rows), folded.types)
            else:
                out = run_select(stmt, source, session.eval_context(q.group), shape)
            group = q.group
    return Result.table(out.columns, out.rows, out.types, group)


_NO_COLUMNS: Final = Scope(())


def describe(session: Session, stmt: ast.Statement) -> tuple[list[str], list[str]] | None:
    """The columns and types ``stmt`` returns, without running it (None: not a SELECT)."""
    if isinstance(stmt, ast.Union):  # its first branch's names, its branches' types
        described = [describe(session, s) for s in stmt.selects]
        branches = [b for b in described if b is not None]
        first = described[0]
        if first is None or any(len(b[0]) != len(first[0]) for b in branches):
            return first  # the union fails as it runs, and says why
        types: Sequence[str | None] = first[1]
        for branch in branches[1:]:
            types = _union_types(types, branch[1])
        return first[0], [t or "text" for t in types]
    if not isinstance(stmt, ast.Select):
        return None
    if _in_executor(session, stmt):
        stmt = _unqualified(stmt)
        source = executor.source_of(session, stmt)
        shape = select_shape(stmt, Scope(source.names, source.types))
    elif _needs_rows(stmt) or not (
        stmt.source is None or isinstance(stmt.source, ast.TableFunction)
    ):
        # the catalog is small: its description is its answer's (read, not managed)
        out, _ = _run(session, stmt, session.eval_context())
        return list(out.columns), [t or "text" for t in out.types]
    else:
        shape = _plain_shape(stmt)
    return list(shape.names), list(shape.types)


def _walk_plain_shape(stmt: ast.Select) -> Shape:
    """The shape of a SELECT of no source or of a table function's (whose columns
    are fixed): its statement's alone, so kept per statement."""
    names: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    if isinstance(stmt.source, ast.TableFunction):
        fn = table_function(stmt.source.name)
        names = tuple(name for name, _ in fn.columns)
        types = tuple(kind for _, kind in fn.columns)
    return select_shape(stmt, Scope(names, types))


_plain_shape: Final = PerStatement(_walk_plain_shape)


def _walk_folded(stmt: ast.Select) -> Relation | None:
    """A SELECT of no source whose every expression is a constant (literals of
    numbers, text and booleans, their casts to those types, arithmetic,
    comparisons and logic over them): its rows, computed once, as a planner
    folds constants. None: something in it depends on the query or the session
    (a function, a column, a time, a subquery), or it raises, and it is
    evaluated at each execution."""
    if stmt.source is not None or stmt.group_by or stmt.items is None:
        return None
    exprs = [i.expr for i in stmt.items] + [o.expr for o in stmt.order_by]
    if stmt.where is not None:
        exprs.append(stmt.where)
    if not all(_constant(e) for e in exprs):
        return None
    try:
        return run_select(stmt, Relation((), [()]), EvalContext(), _plain_shape(stmt))
    except Error:
        return None


def _constant(node: ast.Expr) -> bool:
    match node:
        case ast.Literal(value=value):
            return type(value) in _FOLDED_VALUES
        case ast.Cast(operand=operand, type=kind, written=written):
            return kind in _FOLDED_TYPES and written not in _REG_TYPES and _constant(operand)
        case ast.Unary(operand=operand):
            return _constant(operand)
        case ast.Binary(op=op, left=left, right=right):
            return op in _FOLDED_OPS and _constant(left) and _constant(right)
        case ast.IsNull(operand=operand):
            return _constant(operand)
    return False


_FOLDED_VALUES: Final = frozenset({int, float, str, bool, type(None)})
_FOLDED_TYPES: Final = frozenset({"int", "float", "text", "bool"})
# object identifiers name catalog rows: read at each execution
_REG_TYPES: Final = frozenset({"oid", "regclass", "regtype", "regproc", "regnamespace", "regrole"})
_FOLDED_OPS: Final = ARITHMETIC | COMPARISON | {"and", "or"}
# a bound tree's values decide, so each bound tree is folded on its own
_folded: Final = PerStatement(_walk_folded)


def _source_columns(session: Session, source: ast.Source | None) -> Scope | None:
    """The columns a source has, where they are known without reading it
    (long_sequence, an executor table, a table function, the catalog's
    relations and joins of them); None otherwise."""
    columns: tuple[tuple[str, str], ...] | None = None
    label: ast.Ident | str | None = None
    match source:
        case ast.TableFunction(name="long_sequence", alias=alias):
            columns, label = (("x", "int"),), alias or "long_sequence"
        case ast.TableFunction(name=name, alias=alias) if name in TABLE_FUNCTIONS:
            columns, label = TABLE_FUNCTIONS[name].columns, alias or name
        case ast.TableName(name=name, schema=schema, alias=alias):
            label = alias or name
            if schema is None or schema.text.casefold() == "public":
                try:
                    table = session.engine.tables.get(name)
                    columns = tuple(
                        zip(table.names, (dtype_type(a.dtype) for a in table.arrays), strict=True)
                    )
                except UndefinedTable:
                    pass
            if columns is None:
                columns = catalog_columns(source)
        case ast.Join(left=left, right=right):
            a, b = _source_columns(session, left), _source_columns(session, right)
            if a is None or b is None:
                return None
            return Scope(a.names + b.names, a.types + b.types, a.tables + b.tables)
    if columns is None:
        return None
    table_name = label if isinstance(label, str) else label.text if label is not None else None
    return Scope(
        tuple(n for n, _ in columns),
        tuple(t for _, t in columns),
        (table_name,) * len(columns),
    )


# the argument types of the table functions that take arguments
TABLE_ARGUMENTS: Final = {"long_sequence": ("int",)}


def describe_parameters(session: Session, stmt: ast.Statement) -> dict[int, str]:
    """The type each ``$n`` of ``stmt`` (parsed with its placeholders) takes from
    its context: its source's columns, its table functions' arguments."""
    query = stmt.query if isinstance(stmt, ast.CreateTableAs | ast.InsertSelect) else stmt
    scope = _source_columns(session, query.source) if isinstance(query, ast.Select) else None
    return parameter_types(stmt, scope.column_type if scope is not None else None, TABLE_ARGUMENTS)


def open_cursor(session: Session, stmt: ast.Statement, *, paging: bool = True) -> Cursor:
    """``stmt``'s result a page at a time: a scan of the executor's sources (its
    query suspended between pages when ``paging``), else the whole result now."""
    if isinstance(stmt, ast.Select) and _in_executor(session, stmt):
        return executor.ScanCursor(session, _unqualified(stmt), paging=paging)
    return RowsCursor(execute_statement(session, stmt))


_DDL = Needs.GROUP_ADMIN
RULES: Final[dict[type, Rule]] = {
    ast.CreateResourceGroup: Rule(groups.create_resource_group, _DDL),
    ast.AlterResourceGroupSet: Rule(groups.alter_resource_group_set, _DDL),
    ast.AlterResourceGroupReset: Rule(groups.alter_resource_group_reset, _DDL),
    ast.RenameResourceGroup: Rule(groups.rename_resource_group, _DDL),
    ast.DropResourceGroup: Rule(groups.drop_resource_group, _DDL),
    ast.AddVariant: Rule(groups.add_variant, _DDL),
    ast.DropVariant: Rule(groups.drop_variant, _DDL),
    ast.CreateResourceRule: Rule(rules.create_resource_rule, _DDL),
    ast.RenameResourceRule: Rule(rules.rename_resource_rule, _DDL),
    ast.DropResourceRule: Rule(rules.drop_resource_rule, _DDL),
    ast.CreateResourceSelector: Rule(selectors.create_resource_selector, _DDL),
    ast.RenameResourceSelector: Rule(selectors.rename_resource_selector, _DDL),
    ast.DropResourceSelector: Rule(selectors.drop_resource_selector, _DDL),
    ast.CreatePrincipal: Rule(principals.create_principal, Needs.ADMIN, True),
    ast.DropPrincipal: Rule(principals.drop_principal, Needs.ADMIN, True),
    ast.AddUser: Rule(principals.add_user, Needs.ADMIN, True),
    ast.RemoveUser: Rule(principals.remove_user, Needs.ADMIN, True),
    ast.GrantAssume: Rule(principals.grant_assume, Needs.ADMIN, True),
    ast.RevokeAssume: Rule(principals.revoke_assume, Needs.ADMIN, True),
    ast.AssumeServiceAccount: Rule(principals.assume_service_account, Needs.NOTHING, True),
    ast.ExitServiceAccount: Rule(principals.exit_service_account, Needs.NOTHING, True),
    ast.SetMapping: Rule(principals.set_mapping, _DDL, True),
    ast.SetMemoryLimit: Rule(principals.set_memory_limit, Needs.ADMIN, True),
    ast.GrantAdmin: Rule(principals.grant_admin, Needs.ADMIN, True),
    ast.RevokeAdmin: Rule(principals.revoke_admin, Needs.ADMIN, True),
    ast.GrantUse: Rule(principals.grant_use, _DDL, True),
    ast.RevokeUse: Rule(principals.revoke_use, _DDL, True),
    ast.Show: Rule(principals.show, _DDL, True),
    ast.ExplainResourceGroup: Rule(principals.explain_resource_group),
    ast.SetResourceGroup: Rule(set_resource_group),
    ast.ResetResourceGroup: Rule(reset_resource_group),
    ast.ResetAll: Rule(reset_resource_group),
    ast.DiscardAll: Rule(discard_all),
    ast.Select: Rule(select),
    ast.Union: Rule(union),
    ast.CreateTableAs: Rule(executor.create_table_as),
    ast.InsertSelect: Rule(executor.insert_select),
    ast.DropTable: Rule(executor.drop_table),
}

_STATEMENT_NAMES: Final = {
    ast.CreatePrincipal: "CREATE USER|GROUP|SERVICE ACCOUNT",
    ast.DropPrincipal: "DROP USER|GROUP|SERVICE ACCOUNT",
    ast.AddUser: "ADD USER",
    ast.RemoveUser: "REMOVE USER",
    ast.GrantAssume: "GRANT ASSUME SERVICE ACCOUNT",
    ast.RevokeAssume: "REVOKE ASSUME SERVICE ACCOUNT",
    ast.AssumeServiceAccount: "ASSUME SERVICE ACCOUNT",
    ast.ExitServiceAccount: "EXIT SERVICE ACCOUNT",
    ast.SetMapping: "SET/UNSET RESOURCE GROUP on a principal",
    ast.SetMemoryLimit: "SET MEMORY LIMIT",
    ast.GrantAdmin: "GRANT RESOURCE GROUP ADMIN",
    ast.RevokeAdmin: "REVOKE RESOURCE GROUP ADMIN",
    ast.GrantUse: "GRANT USE",
    ast.RevokeUse: "REVOKE USE",
    ast.Show: "SHOW USERS|GROUPS|SERVICE ACCOUNTS",
}


def execute_statement(session: Session, stmt: ast.Statement) -> Result:
    rule = RULES[type(stmt)]
    engine = session.engine
    if rule.access_control and not engine.access_control:
        raise FeatureNotSupported(
            f"{_STATEMENT_NAMES.get(type(stmt), type(stmt).__name__)} requires access control "
            "(start the engine with access_control=True, or the shell with --access-control)"
        )
    who = session.identity
    if rule.needs is Needs.GROUP_ADMIN:
        check_group_admin(engine.snapshot, who, access_control=engine.access_control)
    elif rule.needs is Needs.ADMIN and not who.is_admin:
        raise PermissionDenied(
            f"Access denied for {who.login_name}: "
            f"{_STATEMENT_NAMES.get(type(stmt), 'this statement')} is the admin's"
        )
    return rule.handler(session, stmt)
