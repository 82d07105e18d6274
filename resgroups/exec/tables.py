"""In-memory columnar tables of the reference executor (no persistence)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from resgroups.catalog.names import Ident
from resgroups.errors import CatalogError, DatatypeMismatch, UndefinedTable, did_you_mean

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Table:
    names: tuple[str, ...]
    arrays: list[Array]

    @property
    def rows(self) -> int:
        return len(self.arrays[0]) if self.arrays else 0


def _key(name: Ident) -> str:
    return name.text if name.quoted else name.text.casefold()


class TableStore:
    """Tables by name: unquoted names fold case, quoted names are exact."""

    def __init__(self) -> None:
        self._tables: dict[str, Table] = {}
        self._lock = threading.Lock()

    def get(self, name: Ident) -> Table:
        with self._lock:
            table = self._tables.get(_key(name))
        if table is None:
            raise UndefinedTable(
                f"table {name.text} does not exist." + did_you_mean(name.text, self._tables)
            )
        return table

    def items(self) -> list[tuple[str, Table]]:
        """Every table (its stored name, its current value), sorted by name."""
        with self._lock:
            return sorted(self._tables.items())

    def check_new(self, name: Ident) -> None:
        with self._lock:
            if _key(name) in self._tables:
                raise CatalogError(f"table {name.text} already exists", sqlstate="42P07")

    def create(self, name: Ident, table: Table) -> None:
        with self._lock:
            if _key(name) in self._tables:
                raise CatalogError(f"table {name.text} already exists", sqlstate="42P07")
            self._tables[_key(name)] = table

    def append(self, name: Ident, arrays: list[Array]) -> int:
        """Add rows (a new Table value, so running scans keep their view)."""
        with self._lock:
            table = self._tables.get(_key(name))
            if table is None:
                raise UndefinedTable(f"table {name.text} does not exist")
            merged = []
            for column, old, new in zip(table.names, table.arrays, arrays, strict=True):
                if old.dtype.kind != new.dtype.kind and not (
                    old.dtype.kind == "f" and new.dtype.kind in "iu"
                ):
                    raise DatatypeMismatch(
                        f"column {column} of {name.text} is {old.dtype}, not {new.dtype}"
                    )
                merged.append(np.concatenate([old, new.astype(old.dtype)]))
            self._tables[_key(name)] = Table(table.names, merged)
            return len(arrays[0]) if arrays else 0

    def drop(self, name: Ident, *, if_exists: bool = False) -> None:
        with self._lock:
            if self._tables.pop(_key(name), None) is None and not if_exists:
                raise UndefinedTable(f"table {name.text} does not exist")
