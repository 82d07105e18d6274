"""The reference executor (SPEC §12): real queries for the scheduler to schedule.

This is the example to copy when embedding resgroups in an executor. Every
query follows the same shape::

    with session.query(kind=...) as q:          # resolve, admit, take a worker
        parts = q.map(run_morsel, morsels)      # morsels on pool workers
        ...combine parts exactly...

    def run_morsel(task, morsel):
        task.checkpoint()                       # cancel / timeout / yield point
        with task.memory.track(array): ...      # account every morsel's arrays

Sources are ``long_sequence(n)`` (one int64 column ``x`` = 1..n) and the
in-memory tables that CREATE TABLE ... AS and INSERT ... SELECT build. It is
an example and a test bed, not a database: no joins, no GROUP BY, no NULLs,
no persistence.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from resgroups.catalog.selectors import Estimate
from resgroups.errors import CatalogError, DatatypeMismatch, InvalidParameter
from resgroups.exec.tables import Table
from resgroups.exec.vector import (
    Array,
    Morsel,
    Partial,
    combine,
    dtype_type,
    evaluate,
    merge,
    partial,
    supported,
)
from resgroups.query import Query, QueryState, Task
from resgroups.result import Result
from resgroups.sql import ast
from resgroups.sql.expr import EvalContext, Scope, compile_expr, find_aggregates
from resgroups.sql.format import format_sql
from resgroups.sql.select import Relation, run_select, select_shape
from resgroups.sql.semantics import INT, INT64_MAX

if TYPE_CHECKING:
    from resgroups.session import Session

MORSEL_ROWS: Final = 1_000_000
MAP_BATCH: Final = 4  # morsels per worker handed to one q.map call
ROW_SLICE: Final = 4096  # a streamed morsel's rows made into Python tuples this many at a time


# ---- sources ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Rows to scan, a morsel at a time."""

    names: tuple[str, ...]
    types: tuple[str, ...]  # the SQL type of each column
    rows: int
    morsel: Callable[[int, int], list[Array]]  # (start, stop) -> one array per column
    sequence: bool = False  # long_sequence(n): x is 1..n, so bounds on x give row counts


def long_sequence(n: int) -> Source:
    # arange(start, stop) + 1, not arange(start + 1, stop + 1): x = n = 2^63 - 1
    # must not need 2^63 on the way
    return Source(
        ("x",),
        (INT,),
        n,
        lambda start, stop: [np.arange(start, stop, dtype=np.int64) + 1],
        sequence=True,
    )


def table_source(table: Table) -> Source:
    arrays = list(table.arrays)  # a consistent view: later INSERTs make new arrays
    return Source(
        table.names,
        tuple(dtype_type(a.dtype) for a in arrays),
        table.rows,
        lambda start, stop: [a[start:stop] for a in arrays],
    )


def source_of(session: Session, stmt: ast.Select) -> Source:
    match stmt.source:
        case ast.TableFunction(name="long_sequence", args=args):
            if len(args) != 1:
                raise DatatypeMismatch(f"long_sequence() takes 1 argument, got {len(args)}")
            n = compile_expr(args[0], Scope(()), EvalContext())(())
            if type(n) is not int or not 0 <= n <= INT64_MAX:
                raise InvalidParameter(
                    f"long_sequence({n!r}): expected an integer 0..{INT64_MAX} (x = 1..n is bigint)"
                )
            return long_sequence(n)
        case ast.TableName(name=name):
            return table_source(session.engine.tables.get(name))
    raise DatatypeMismatch(f"the executor cannot scan {stmt.source!r}")


def estimate(stmt: ast.Select, source: Source) -> Estimate:
    """What a scan expects to read, for selectors (SPEC §15): the source's rows,
    narrowed where the WHERE's selectivity is known here (bounds on x of
    ``long_sequence``, AND-ed: ``x > 10 AND x <= 500`` reads 490 rows), else
    the upper bound; its memory, those rows of every source column, 8 bytes a
    value (one morsel at a time is what it holds, but this is what it reads)."""
    rows = source.rows
    if source.sequence and stmt.where is not None:
        low, high = _x_bounds(stmt.where, 1, source.rows)
        rows = max(0, high - low + 1)
    return Estimate(rows=rows, memory=min(rows * 8 * len(source.names), INT64_MAX))


_BOUND_OPS: Final = {"<", "<=", ">", ">=", "="}


def _x_bounds(where: ast.Expr, low: int, high: int) -> tuple[int, int]:
    """Narrow [low, high] of x by the comparisons of x with integer literals that
    the WHERE ANDs together; anything else leaves the bounds as they are."""
    if isinstance(where, ast.Binary) and where.op == "and":
        low, high = _x_bounds(where.left, low, high)
        return _x_bounds(where.right, low, high)
    if not isinstance(where, ast.Binary) or where.op not in _BOUND_OPS:
        return low, high
    left, right, op = where.left, where.right, where.op
    if isinstance(right, ast.Column) and isinstance(left, ast.Literal):  # 10 < x
        left, right = right, left
        op = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}[op]
    if not (
        isinstance(left, ast.Column)
        and left.name.text.lower() == "x"
        and isinstance(right, ast.Literal)
        and type(right.value) is int
    ):
        return low, high
    k = right.value
    if op in ("<", "<="):
        high = min(high, k - 1 if op == "<" else k)
    elif op in (">", ">="):
        low = max(low, k + 1 if op == ">" else k)
    else:
        low, high = max(low, k), min(high, k)
    return low, high


def is_executor_source(stmt: ast.Select) -> bool:
    return isinstance(stmt.source, ast.TableName) or (
        isinstance(stmt.source, ast.TableFunction) and stmt.source.name == "long_sequence"
    )


# ---- one scan ----------------------------------------------------------------------------


class Scan:
    """One query's pass over a source: WHERE, then aggregates or a projection."""

    def __init__(
        self,
        session: Session,
        q: Query,
        stmt: ast.Select,
        source: Source,
        ctx: EvalContext | None = None,
    ) -> None:
        self.session = session
        self.q = q
        self.stmt = stmt
        self.source = source
        self.scope = Scope(source.names, source.types)
        # the statement's context (None: the query's own, made now)
        self.ctx = session.eval_context(q.group) if ctx is None else ctx
        # typed and checked before the first morsel: an empty source fails and
        # types its columns exactly as a full one does
        shape = select_shape(stmt, self.scope)
        self.items, self.names, self.types = shape.items, shape.names, shape.types
        items = self.items
        exprs = [i.expr for i in items]
        for expr in [*exprs, *([stmt.where] if stmt.where is not None else [])]:
            supported(expr)
        self.aggregates = list(
            dict.fromkeys(call for i in items for call in find_aggregates(i.expr))
        )
        self.cpu_ns = 0
        self._lock = threading.Lock()

    def batches(self) -> Iterator[list[tuple[int, int]]]:
        """Row ranges of at most MORSEL_ROWS, a batch of MAP_BATCH per worker at a
        time, made as they are needed: a scan of 2^62 rows costs nothing before
        its first morsel, and the query's checkpoints (timeout, cancel) hold
        from its first instant. An empty source is one empty morsel, so that
        its columns come out typed."""
        rows = self.source.rows
        if rows == 0:
            yield [(0, 0)]
            return
        step = MAP_BATCH * max(1, self.session.engine.workers)
        starts = range(0, rows, MORSEL_ROWS)
        for first in range(0, len(starts), step):
            self.q.checkpoint()
            yield [(s, min(s + MORSEL_ROWS, rows)) for s in starts[first : first + step]]

    def _filtered(self, task: Task, start: int, stop: int) -> Morsel:
        arrays = self.source.morsel(start, stop)
        m = Morsel(self.scope, arrays, stop - start, self.ctx)
        if self.stmt.where is not None:
            mask = evaluate(self.stmt.where, m)
            if mask.dtype != np.bool_:
                raise DatatypeMismatch("argument of WHERE must be boolean")
            task.memory.allocate(mask.nbytes)
            m = Morsel(self.scope, [a[mask] for a in arrays], int(mask.sum()), self.ctx)
            task.memory.release(mask.nbytes)
        return m

    def _run(self, task: Task, morsel: tuple[int, int], body: Callable[[Morsel], Any]) -> Any:
        task.checkpoint()  # between morsels: cancel, timeout, slice end
        started = time.thread_time_ns()
        try:
            start, stop = morsel
            width = len(self.source.names) * 8 * (stop - start)
            task.query.scanned(stop - start, width)  # for rules on rows and bytes
            with task.memory.track(_Bytes(width)):  # the morsel's source columns
                return body(self._filtered(task, start, stop))
        finally:
            used = time.thread_time_ns() - started
            with self._lock:
                self.cpu_ns += used
            self.session.add_work_cpu(used)

    # ---- aggregates
    def aggregate(self) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        def body(m: Morsel) -> list[Partial]:
            return [partial(call, m) for call in self.aggregates]

        merged: list[Partial] | None = None  # one running partial per aggregate
        for batch in self.batches():
            for parts in self.q.map(lambda task, ms: self._run(task, ms, body), batch):
                merged = (
                    parts
                    if merged is None
                    else [merge(a, b) for a, b in zip(merged, parts, strict=True)]
                )
        assert merged is not None  # batches() yields at least one morsel
        values = tuple(combine(call, [merged[i]]) for i, call in enumerate(self.aggregates))
        slots = {call: i for i, call in enumerate(self.aggregates)}
        row = tuple(
            compile_expr(i.expr, self.scope, self.ctx, aggregate_slots=slots)(values)
            for i in self.items
        )
        return self.names, [row]

    # ---- projections
    def project(self) -> list[Array]:
        """Every output column, as arrays (WHERE applied)."""
        limit = None if self.stmt.order_by or self.stmt.limit is None else self.stmt.limit
        if limit is not None:
            limit += self.stmt.offset  # the rows OFFSET skips are scanned too
        exprs = [i.expr for i in self.items]

        def body(m: Morsel) -> list[Array]:
            out = [np.array(evaluate(e, m), copy=True) for e in exprs]
            return [np.broadcast_to(a, (m.n,)).copy() if a.shape != (m.n,) else a for a in out]

        chunks: list[list[Array]] = []
        rows = 0
        for morsels in self.batches():
            batch = self.q.map(lambda task, ms: self._run(task, ms, body), morsels)
            chunks.extend(batch)
            rows += sum(len(c[0]) if c else 0 for c in batch)
            if limit is not None and rows >= limit:  # no ORDER BY: enough rows are in
                break
        return [np.concatenate([c[j] for c in chunks]) for j in range(len(exprs))]

    def answer_arrays(self) -> list[Array]:
        """:meth:`project` for a SELECT's answer: without ORDER BY, only the first
        LIMIT + OFFSET rows (the last batch scanned may hold millions past them,
        and turning those into Python rows took seconds for LIMIT 3 over the
        largest sequence)."""
        arrays = self.project()
        if self.stmt.order_by or self.stmt.limit is None:
            return arrays
        return [a[: self.stmt.limit + self.stmt.offset] for a in arrays]


class _Bytes:
    """Something with ``nbytes``, for ``memory.track``."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def _rows(arrays: list[Array]) -> list[tuple[Any, ...]]:
    return list(zip(*(a.tolist() for a in arrays), strict=True)) if arrays else []


def _timings(q: Query, started: float, scan: Scan) -> dict[str, float]:
    return {
        "wait_ms": q.waited_s * 1000,
        "total_ms": (time.monotonic() - started) * 1000,
        "cpu_ms": scan.cpu_ns / 1e6,
    }


# ---- statements ------------------------------------------------------------------------


def select(session: Session, stmt: ast.Select) -> Result:
    source = source_of(session, stmt)
    started = time.monotonic()
    with session.query(
        kind="select", statement=format_sql(stmt), estimate=estimate(stmt, source)
    ) as q:
        out, scan = _answer(session, q, stmt, source)
    result = Result.table(out.columns, out.rows, out.types)
    return replace(result, timings=_timings(q, started, scan), group=q.group)


def relation_in(session: Session, q: Query, stmt: ast.Select, ctx: EvalContext) -> Relation:
    """The rows of a SELECT the executor answers, scanned within the managed query
    ``q`` that a larger statement holds, in its evaluation context ``ctx`` (a
    branch of a UNION: every branch sees one now())."""
    return _answer(session, q, stmt, source_of(session, stmt), ctx)[0]


def _answer(
    session: Session, q: Query, stmt: ast.Select, source: Source, ctx: EvalContext | None = None
) -> tuple[Relation, Scan]:
    scan = Scan(session, q, stmt, source, ctx)
    types = scan.types
    if scan.aggregates:
        names, rows = scan.aggregate()
    else:
        arrays = scan.answer_arrays()
        names, rows = scan.names, _rows(arrays)
    order = () if scan.aggregates else stmt.order_by  # an aggregate is one row
    if order or stmt.limit is not None or stmt.offset:
        rows = run_select(
            ast.Select(None, None, None, order, stmt.limit, stmt.offset),
            Relation(names, rows, types),
            scan.ctx,
        ).rows
    return Relation(names, rows, types), scan


class ScanCursor:
    """A SELECT over a source read a page at a time: a paging cursor (SPEC §6).

    Its managed query is entered once and suspended between pages, so it holds
    no admission slot and no worker while the client reads; each ``fetch``
    passes the gate again. A refused resume raises and leaves the cursor as it
    was (the caller may retry or close it). A projection without ORDER BY
    streams: each page scans only the morsels it needs, and the rows scanned
    but not yet fetched stay charged to the query's memory. Aggregates and
    ORDER BY need every row first, so the first fetch computes them all.
    """

    status = ""

    def __init__(self, session: Session, stmt: ast.Select, *, paging: bool = True) -> None:
        """``paging=False``: the query keeps its slot and worker between fetches
        (a result streamed to a client as fast as it reads, not a cursor)."""
        self._paging = paging
        self._started = time.monotonic()
        source = source_of(session, stmt)
        self._q = q = session.query(
            kind="select", statement=format_sql(stmt), estimate=estimate(stmt, source)
        )
        q.__enter__()
        try:
            self._scan = scan = Scan(session, q, stmt, source)
            self.columns: tuple[str, ...] = scan.names
            self.types: tuple[str, ...] = scan.types
            streams = not scan.aggregates and not stmt.order_by
            # generators of the scan and the query, not of the cursor: a cursor whose
            # handle is dropped unclosed is freed at once (no cycle through its
            # rows), so the reconcile reclaims what it held without the collector
            self._rows: Iterator[tuple[Any, ...]] = (
                _stream(scan, q, stmt.limit, stmt.offset) if streams else _all(scan, q, stmt)
            )
            self._ahead: list[tuple[Any, ...]] = []  # one row read ahead: is there more?
            self._done = False
            if paging:
                q.suspend()
        except BaseException:
            q.__exit__(None, None, None)
            raise

    @property
    def done(self) -> bool:
        return self._done

    @property
    def query(self) -> Query:
        return self._q

    @property
    def group(self) -> str | None:
        """The group the query runs in (None: unmanaged)."""
        return self._q.group

    def timings(self) -> dict[str, float]:
        """``wait_ms``, ``total_ms`` (since the cursor opened) and ``cpu_ms`` so far."""
        return _timings(self._q, self._started, self._scan)

    def fetch(self, n: int | None) -> list[tuple[Any, ...]]:
        if self._done:
            return []
        if self._paging:
            self._q.resume()  # may raise: still suspended, retryable
        try:
            want = None if n is None else n + 1 - len(self._ahead)
            page = self._ahead + list(self._rows if want is None else islice(self._rows, want))
        except BaseException:
            self.close()
            raise
        if n is not None and len(page) > n:
            self._ahead = page[n:]
            if self._paging:
                self._q.suspend()
            return page[:n]
        self._ahead = []
        self.close()
        return page

    def close(self) -> None:
        if self._q.state is QueryState.DONE:
            return
        self._done = True
        try:
            close_rows = getattr(self._rows, "close", None)
            if close_rows is not None:
                close_rows()  # gives back the memory of rows scanned but not fetched
        finally:
            self._q.__exit__(None, None, None)


def _stream(scan: Scan, q: Query, limit: int | None, offset: int) -> Iterator[tuple[Any, ...]]:
    """A paging cursor's rows as its pages ask for them: a projection scanned a
    batch of morsels at a time, the rows of a batch charged to ``q`` until fetched."""
    exprs = [i.expr for i in scan.items]

    def body(m: Morsel) -> list[Array]:
        out = [np.array(evaluate(e, m), copy=True) for e in exprs]
        return [np.broadcast_to(a, (m.n,)).copy() if a.shape != (m.n,) else a for a in out]

    left = math.inf if limit is None else limit
    skip = offset  # OFFSET's rows are scanned and dropped, never fetched
    for morsels in scan.batches():
        if left <= 0:
            return
        for chunk in q.map(lambda task, ms: scan._run(task, ms, body), morsels):
            held = sum(a.nbytes for a in chunk)
            q.memory.allocate(held)  # charged until the chunk's rows are fetched
            try:
                # rows as Python tuples a slice at a time: those are not charged,
                # so at most ROW_SLICE of them exist per cursor
                size = len(chunk[0]) if chunk else 0
                for lo in range(0, size, ROW_SLICE):
                    for row in _rows([a[lo : lo + ROW_SLICE] for a in chunk]):
                        if skip:
                            skip -= 1
                            continue
                        if left <= 0:
                            return
                        left -= 1
                        yield row
            finally:
                q.memory.release(held)


def _all(scan: Scan, q: Query, stmt: ast.Select) -> Iterator[tuple[Any, ...]]:
    """A paging cursor's rows when every row is needed first (an aggregate, ORDER BY)."""
    if scan.aggregates:
        _, rows = scan.aggregate()
    else:
        rows = _rows(scan.answer_arrays())
    order = () if scan.aggregates else stmt.order_by  # an aggregate is one row
    rows = run_select(
        ast.Select(None, None, None, order, stmt.limit, stmt.offset),
        Relation(scan.names, rows, scan.types),
        scan.session.eval_context(q.group),
    ).rows
    yield from rows


def _materialize(
    session: Session, query: ast.Select, kind: str, statement: str
) -> tuple[tuple[str, ...], list[Array]]:
    """Run the source query of a CTAS or an INSERT ... SELECT into column arrays."""
    source = source_of(session, query) if query.source is not None else long_sequence(1)
    with session.query(kind=kind, statement=statement, estimate=estimate(query, source)) as q:
        scan = Scan(session, q, query, source)
        if scan.aggregates:
            names, rows = scan.aggregate()
            for name, value in zip(names, rows[0], strict=True):
                if value is None:
                    raise DatatypeMismatch(
                        f"column {name} is NULL (an aggregate over no rows); "
                        "the executor's tables hold no NULLs"
                    )
            return names, [np.array([v]) for v in rows[0]]
        return scan.names, scan.project()


def _unordered(query: ast.Select, statement: str) -> None:
    """A CTAS's or an INSERT's source query: the executor's tables keep no order and
    its writes take every row scanned, so ORDER BY, LIMIT and OFFSET are refused
    rather than ignored."""
    if query.order_by or query.limit is not None or query.offset:
        raise DatatypeMismatch(f"{statement} takes no ORDER BY, LIMIT or OFFSET here")


def create_table_as(session: Session, stmt: ast.CreateTableAs) -> Result:
    tables = session.engine.tables
    tables.check_new(stmt.name)
    _unordered(stmt.query, "CREATE TABLE ... AS")
    names, arrays = _materialize(session, stmt.query, "ctas", format_sql(stmt))
    if len({n.lower() for n in names}) != len(names):
        raise CatalogError(f"duplicate column names in {list(names)}", sqlstate="42701")
    tables.create(stmt.name, Table(names, arrays))
    return Result.command(f"SELECT {len(arrays[0]) if arrays else 0}")


def insert_select(session: Session, stmt: ast.InsertSelect) -> Result:
    tables = session.engine.tables
    table = tables.get(stmt.name)
    _unordered(stmt.query, "INSERT ... SELECT")
    _, arrays = _materialize(session, stmt.query, "insert_select", format_sql(stmt))
    if len(arrays) != len(table.names):
        raise DatatypeMismatch(
            f"INSERT has {len(arrays)} columns, table {stmt.name.text} has {len(table.names)}"
        )
    count = tables.append(stmt.name, arrays)
    return Result.command(f"INSERT 0 {count}")


def drop_table(session: Session, stmt: ast.DropTable) -> Result:
    session.engine.tables.drop(stmt.name, if_exists=stmt.if_exists)
    return Result.command("DROP TABLE")
