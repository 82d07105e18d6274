"""The catalog: an immutable snapshot plus the append-only log that builds it.

Writers call :meth:`Catalog.write` with a function that looks at the current
snapshot and returns the one change record a statement makes (or None when
it changes nothing). The function runs under the catalog's write lock, so
validation and append are atomic with respect to other writers; the record
is applied to a copy, durably appended, and only then published.

Subscribers (:meth:`Catalog.subscribe`) see every published snapshot in
version order, under the write lock, before the writer returns: the live
state built from the catalog (the group runtimes) can never be left behind
by two writers racing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from resgroups.catalog.model import DEFAULT_GROUP_ID, GroupDef, Principal, Snapshot
from resgroups.catalog.records import LOG_FORMAT, Record, apply, replay
from resgroups.catalog.store import CatalogLog, DirectoryLog, MemoryLog
from resgroups.errors import CatalogError
from resgroups.interrupts import Hold

__all__ = [
    "DEFAULT_GROUP_ID",
    "Catalog",
    "CatalogLog",
    "DirectoryLog",
    "GroupDef",
    "MemoryLog",
    "Principal",
    "Record",
    "Snapshot",
    "open_log",
]

Change = tuple[str, Mapping[str, Any]]


def open_log(spec: str | os.PathLike[str] | None, *, lock: bool = True) -> CatalogLog:
    """The backend for an ``Engine(catalog=...)`` value: None, or a directory path."""
    if spec is None:
        return MemoryLog()
    return DirectoryLog(spec, lock=lock)


class Catalog:
    """The current snapshot of a catalog log, and the only way to change it."""

    def __init__(self, log: CatalogLog, *, writer: bool = True) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[Snapshot], None]] = []
        try:
            self._snapshot = replay(log.read_all())
        except CatalogError as exc:
            raise CatalogError(f"cannot open {log.name}: {exc}", sqlstate=exc.sqlstate) from None
        if writer and not self._snapshot.has_catalog:
            self._append(Record(1, "genesis", {"format": LOG_FORMAT}))

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def version(self) -> int:
        return self._snapshot.version

    def subscribe(self, fn: Callable[[Snapshot], None]) -> None:
        """Call ``fn(snapshot)`` now and after every change, under the write lock."""
        with self._lock:
            self._subscribers.append(fn)
            fn(self._snapshot)

    def _append(self, record: Record) -> Snapshot:
        # appended, published and applied to the live runtimes together: an
        # interrupt waits (resgroups.interrupts) rather than split them
        with Hold():
            new = apply(self._snapshot, record)
            self._log.append(record)
            self._snapshot = new
            for fn in self._subscribers:
                fn(new)
            return new

    def write(self, build: Callable[[Snapshot], Change | None]) -> Snapshot:
        """Append the record ``build(snapshot)`` returns, atomically; the new snapshot."""
        with self._lock:
            change = build(self._snapshot)
            if change is None:
                return self._snapshot
            op, args = change
            return self._append(Record(self._snapshot.version + 1, op, dict(args)))

    def close(self) -> None:
        self._log.close()
