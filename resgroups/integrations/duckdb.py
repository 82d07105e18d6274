"""DuckDB under resource groups: one statement, one managed query.

>>> import duckdb
>>> from resgroups.integrations.duckdb import execute
>>> con = duckdb.connect("warehouse.db")
>>> rows = execute(session, con, "SELECT region, sum(amount) FROM sales GROUP BY 1")

Each call takes a cursor of ``con`` for the query, so concurrent calls on one
connection do not share state. DuckDB's ``threads`` and ``memory_limit`` are
settings of the database, shared by every query on it: they are never
changed here (size them once, for the database). The CPU of DuckDB's own
threads is read and charged to the queries running in DuckDB
(``resgroups.integrations.native_cpu``). The statement runs inside native
calls, so the query's cancellation and its timeout reach it through
``q.on_cancel``, which interrupts the cursor; results come back as Arrow
batches, each one a checkpoint, its rows and bytes reported with
``q.scanned``, its size charged to ``q.memory`` while it is held and given
back as its rows are consumed.

Install with ``pip install 'resgroups[duckdb]'`` (DuckDB and pyarrow).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import duckdb

from resgroups.errors import InvalidParameter
from resgroups.integrations.kinds import statement_kind
from resgroups.integrations.native_cpu import EngineThreads, unnamed

__all__ = ["BATCH_ROWS", "THREADS", "execute", "statement_kind"]

if TYPE_CHECKING:
    from resgroups.session import Session

BATCH_ROWS: Final = 100_000

# DuckDB's worker threads carry no name of their own: the unnamed native threads
THREADS: Final = EngineThreads("duckdb", unnamed)


class _Interrupt:
    """``q.on_cancel``'s callback for a cursor: it interrupts DuckDB now and again
    every 0.1 s until the statement has returned. An interrupt that arrives
    before DuckDB has begun the statement is forgotten when it begins (a cancel
    between the query's entry and the native call), so once is not enough."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection) -> None:
        self._cursor = cursor
        self._lock = threading.Lock()
        self._done = False
        self._stop = threading.Event()

    def __call__(self) -> None:
        with self._lock:
            if self._done:
                return
            self._cursor.interrupt()
        threading.Thread(target=self._again, name="resgroups-duckdb-interrupt", daemon=True).start()

    def _again(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                if self._done:
                    return
                self._cursor.interrupt()

    def done(self) -> None:
        """The statement returned: no interrupt from here on (the cursor may close)."""
        with self._lock:
            self._done = True
        self._stop.set()


def execute(
    session: Session,
    con: duckdb.DuckDBPyConnection,
    sql: str,
    parameters: Sequence[Any] | None = None,
    *,
    kind: str | None = None,
    timings: dict[str, float] | None = None,
) -> list[tuple[Any, ...]]:
    """Run one DuckDB statement as a managed query of ``session``; its rows.

    A cancel or the query timeout interrupts DuckDB at once and raises
    QueryCancelled or QueryTimeout; the slot, the worker and every byte are
    back when this returns or raises. ``kind`` overrides the kind read from
    the statement; ``timings``, when given, receives ``wait_ms`` (the wait
    for a slot and a worker) and ``native_cpu_ms`` (DuckDB's own threads'
    CPU charged to the query).
    """
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidParameter(f"execute(): the statement is a non-empty string, not {sql!r}")
    with session.query(kind=kind or statement_kind(sql), statement=sql) as q:
        if timings is not None:
            timings["wait_ms"] = q.waited_s * 1000
        cursor = con.cursor()
        try:
            with THREADS.inside(q) as native:
                interrupt = _Interrupt(cursor)
                q.on_cancel(interrupt)
                rows: list[tuple[Any, ...]] = []
                try:
                    with native.active():
                        relation = cursor.sql(sql, params=parameters)
                        reader = () if relation is None else relation.to_arrow_reader(BATCH_ROWS)
                    for batch in native.each(reader):
                        q.checkpoint()
                        q.scanned(batch.num_rows, batch.nbytes)  # for rules on rows and bytes
                        q.memory.allocate(batch.nbytes)  # held while its rows are converted
                        try:
                            columns = [column.to_pylist() for column in batch.columns]
                        finally:
                            q.memory.release(batch.nbytes)
                        rows.extend(zip(*columns, strict=True))
                except duckdb.InterruptException:
                    q.checkpoint()  # raises QueryCancelled or QueryTimeout
                    raise
                finally:
                    interrupt.done()
            if timings is not None:
                timings["native_cpu_ms"] = native.charged_ns / 1e6
            return rows
        finally:
            cursor.close()
