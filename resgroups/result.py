"""What a statement returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Result:
    """Columns, rows of plain Python values, and the command tag.

    ``columns`` is empty for commands; ``status`` is the PostgreSQL-style tag
    (``"CREATE RESOURCE GROUP"``, ``"SELECT 3"``).
    """

    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    status: str = ""
    types: list[str] = field(default_factory=list)  # "int", "float", "text", "bool"
    timings: dict[str, float] = field(default_factory=dict)  # e.g. wait_ms, total_ms, cpu_ms
    notices: list[str] = field(default_factory=list)  # warnings for the client, e.g. over the wire
    group: str | None = None  # the resource group a managed query ran in (None: unmanaged)

    @classmethod
    def command(cls, status: str) -> Result:
        return cls(status=status)

    @classmethod
    def table(
        cls,
        columns: Sequence[str],
        rows: list[tuple[Any, ...]],
        types: Sequence[str | None] = (),
        group: str | None = None,
    ) -> Result:
        """A SELECT result; a type not given is inferred from the column's values."""
        declared = list(types) or [None] * len(columns)
        return cls(
            list(columns),
            rows,
            f"SELECT {len(rows)}",
            [t or _infer(rows, i) for i, t in enumerate(declared)],
            group=group,
        )


_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "text"}


def _infer(rows: list[tuple[Any, ...]], column: int) -> str:
    """A column's type from its first non-NULL value ("text" when all are NULL)."""
    value = next((r[column] for r in rows if r[column] is not None), None)
    return _TYPE_NAMES.get(type(value), "text")


class Cursor(Protocol):
    """A result read a page at a time (a portal of the wire protocol, a DECLAREd
    cursor): ``fetch(n)`` returns up to ``n`` rows (None: all that are left),
    ``done`` turns True once none are left, ``close()`` gives back whatever
    the cursor holds and may be called more than once."""

    @property
    def columns(self) -> Sequence[str]: ...

    @property
    def types(self) -> Sequence[str]: ...

    @property
    def status(self) -> str:
        """The command tag when the statement is not a query ("" for a query)."""

    @property
    def done(self) -> bool: ...

    def fetch(self, n: int | None) -> list[tuple[Any, ...]]: ...

    def close(self) -> None: ...


class RowsCursor:
    """A cursor over a result already computed (unmanaged statements, engine state)."""

    def __init__(self, result: Result) -> None:
        self.columns = result.columns
        self.types = result.types
        self.status = "" if result.columns else result.status
        self._rows = result.rows
        self._next = 0

    @property
    def done(self) -> bool:
        return self._next >= len(self._rows)

    def fetch(self, n: int | None) -> list[tuple[Any, ...]]:
        stop = len(self._rows) if n is None else min(len(self._rows), self._next + n)
        page = self._rows[self._next : stop]
        self._next = stop
        return page

    def close(self) -> None:
        self._next = len(self._rows)
