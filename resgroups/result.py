"""What a statement returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


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

    @classmethod
    def command(cls, status: str) -> Result:
        return cls(status=status)

    @classmethod
    def table(
        cls,
        columns: Sequence[str],
        rows: list[tuple[Any, ...]],
        types: Sequence[str | None] = (),
    ) -> Result:
        """A SELECT result; a type not given is inferred from the column's values."""
        declared = list(types) or [None] * len(columns)
        return cls(
            list(columns),
            rows,
            f"SELECT {len(rows)}",
            [t or _infer(rows, i) for i, t in enumerate(declared)],
        )


_TYPE_NAMES = {bool: "bool", int: "int", float: "float", str: "text"}


def _infer(rows: list[tuple[Any, ...]], column: int) -> str:
    """A column's type from its first non-NULL value ("text" when all are NULL)."""
    value = next((r[column] for r in rows if r[column] is not None), None)
    return _TYPE_NAMES.get(type(value), "text")
