"""What a statement returns."""

from __future__ import annotations

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

    @classmethod
    def command(cls, status: str) -> Result:
        return cls(status=status)

    @classmethod
    def table(
        cls, columns: list[str], rows: list[tuple[Any, ...]], types: list[str] | None = None
    ) -> Result:
        return cls(list(columns), rows, f"SELECT {len(rows)}", types or infer_types(rows, len(columns)))


def infer_types(rows: list[tuple[Any, ...]], width: int) -> list[str]:
    """Each column's type from its first non-NULL value ("text" when all are NULL)."""
    names = {bool: "bool", int: "int", float: "float", str: "text"}
    types = []
    for i in range(width):
        value = next((r[i] for r in rows if r[i] is not None), None)
        types.append(names.get(type(value), "text"))
    return types
