"""SQLite under resource groups: one statement, one managed query, sliced inside SQLite.

>>> import sqlite3
>>> from resgroups.integrations.sqlite import execute
>>> con = sqlite3.connect("warehouse.db", check_same_thread=False)
>>> rows = execute(session, con, "SELECT region, sum(amount) FROM sales GROUP BY 1")

SQLite runs a statement on the calling thread, so its CPU is the query
thread's own and is metered as the built-in executor's is. Its progress
handler calls ``q.checkpoint()`` every ``steps`` virtual-machine
instructions inside native execution: a SQLite query is sliced, weighted,
limited (parked between instructions until its group's budget allows) and
cancelled like the built-in executor's. ``q.on_cancel`` also calls
``Connection.interrupt()``, for a statement waiting on a lock. One statement
runs at a time on a connection (the progress handler is the connection's):
give each thread its own connection. A statement parked by the scheduler
inside its progress handler keeps what it holds in SQLite: a reader's
shared lock (harmless to other readers of a file; a writer waits for it),
and, in a shared-cache database (``cache=shared``, ``:memory:`` shared
between connections), the cache's mutex, which stalls every connection of
that cache: never use a shared cache with resource groups.

Standard library only: no extra to install.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from resgroups.errors import Error, InvalidParameter
from resgroups.integrations.kinds import statement_kind

if TYPE_CHECKING:
    from resgroups.session import Session

STEPS: Final = 10_000  # VM instructions between checkpoints: tens of microseconds
BATCH_ROWS: Final = 10_000
_WORD: Final = 8  # bytes counted for a number or a NULL in scanned/memory figures


def _nbytes(rows: list[Any]) -> int:
    """About what the rows hold: text and blobs by length, other values a word."""
    return sum(len(v) if isinstance(v, (str, bytes)) else _WORD for row in rows for v in row)


def execute(
    session: Session,
    con: sqlite3.Connection,
    sql: str,
    parameters: Sequence[Any] = (),
    *,
    kind: str | None = None,
    steps: int = STEPS,
    timings: dict[str, float] | None = None,
) -> list[tuple[Any, ...]]:
    """Run one SQLite statement as a managed query of ``session``; its rows.

    A cancel, the query timeout or a rule's KILL stops SQLite within ``steps``
    instructions and raises resgroups' error (QueryCancelled, QueryTimeout,
    RunawayQuery...); the slot, the worker and every byte are back when this
    returns or raises. ``timings``, when given, receives ``wait_ms``.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise InvalidParameter(f"execute(): the statement is a non-empty string, not {sql!r}")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise InvalidParameter(f"execute(): steps is an integer >= 1, not {steps!r}")
    with session.query(kind=kind or statement_kind(sql), statement=sql) as q:
        if timings is not None:
            timings["wait_ms"] = q.waited_s * 1000
        failed: list[Error] = []

        def progress() -> int:
            try:
                q.checkpoint()
            except Error as exc:  # an exception here would be printed, not raised
                failed.append(exc)
                return 1  # SQLite aborts the statement: "interrupted"
            return 0

        con.set_progress_handler(progress, steps)
        q.on_cancel(con.interrupt)
        try:
            cursor = con.execute(sql, parameters)
            rows: list[tuple[Any, ...]] = []
            while batch := cursor.fetchmany(BATCH_ROWS):
                q.checkpoint()
                nbytes = _nbytes(batch)
                q.scanned(len(batch), nbytes)
                q.memory.allocate(nbytes)  # held until it joins the result
                rows.extend(batch)
                q.memory.release(nbytes)
            return rows
        except sqlite3.OperationalError as exc:
            if failed:
                raise failed[0] from None
            if "interrupted" in str(exc):
                q.checkpoint()  # raises QueryCancelled or QueryTimeout
            raise
        finally:
            con.set_progress_handler(None, 0)
