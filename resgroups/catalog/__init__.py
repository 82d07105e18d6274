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

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from resgroups.catalog.model import DEFAULT_GROUP_ID, GroupDef, Principal, Snapshot
from resgroups.catalog.records import CORRUPT, LOG_FORMAT, Record, apply, replay
from resgroups.catalog.store import CatalogLog, DirectoryLog, MemoryLog
from resgroups.errors import CatalogError, CatalogWriteError
from resgroups.interrupts import Hold

__all__ = [
    "DEFAULT_GROUP_ID",
    "Catalog",
    "CatalogLag",
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

# how long a write that committed but failed keeps trying to read its record
# back, so that the statement returns with the change applied here
READ_BACK_S = 5.0


class CatalogLag(NamedTuple):
    """How far a follower is behind the newest catalog version it has seen."""

    records: int
    seconds: float


def open_log(spec: str | os.PathLike[str] | None, *, lock: bool = True) -> CatalogLog:
    """The backend for an ``Engine(catalog=...)`` value: None (in memory), a
    ``postgresql://`` connection string, or a directory path."""
    if spec is None:
        return MemoryLog()
    if isinstance(spec, str) and spec.startswith(("postgresql://", "postgres://")):
        try:
            from resgroups.catalog.postgres import PostgresLog
        except ImportError as exc:
            raise CatalogError(
                f"a PostgreSQL catalog needs psycopg: pip install 'resgroups[postgres]' ({exc})",
                sqlstate="58030",
            ) from None
        return PostgresLog(spec, lock=lock)
    return DirectoryLog(spec, lock=lock)


class Catalog:
    """The current snapshot of a catalog log, and the only way to change it."""

    def __init__(self, log: CatalogLog, *, writer: bool = True) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[Snapshot], None]] = []
        self.writer = writer
        try:
            # the current snapshot: replaced whole under the write lock, never changed
            # in place; read it as an attribute (every managed query reads it)
            self.snapshot: Snapshot = replay(log.read_all())
        except CatalogError as exc:
            raise CatalogError(f"cannot open {log.name}: {exc}", sqlstate=exc.sqlstate) from None
        # a follower's view of the log: the newest version it has seen, and since
        # when it has seen a version it has not applied (for the lag)
        self.seen_version = self.snapshot.version
        self._behind_since: float | None = None
        if writer and not self.snapshot.has_catalog:
            self._write_genesis()

    @property
    def log_name(self) -> str:
        return self._log.name

    # ---- following ------------------------------------------------------------------

    def catch_up(self) -> int:
        """Read the records other writers appended and apply them, in version
        order, publishing each to the subscribers; how many. A record this
        version cannot apply stops the catch-up with CatalogError (the records
        before it stay applied)."""
        with self._lock:
            try:
                return len(self._catch_up_locked())
            except CatalogError as exc:
                if exc.sqlstate == CORRUPT:  # a record is there that cannot be applied:
                    self.note_seen(self.snapshot.version + 1)  # the lag shows it
                raise

    def note_seen(self, version: int) -> None:
        """A version exists in the log (read, or announced by a notification)."""
        if version > self.seen_version:
            self.seen_version = version
        if version > self.snapshot.version and self._behind_since is None:
            self._behind_since = time.monotonic()

    @property
    def lag(self) -> CatalogLag:
        """How far behind the newest version seen this catalog is."""
        records = max(0, self.seen_version - self.snapshot.version)
        since = self._behind_since
        seconds = time.monotonic() - since if records and since is not None else 0.0
        return CatalogLag(records, seconds)

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        self._log.wait_for_news(timeout, stop)
        self.note_seen(self._log.announced)  # a notification names a version

    def look_ahead(self) -> CatalogLag:
        """Ask the log for its newest version (applying nothing); the lag then."""
        self.note_seen(self._log.newest_version())
        return self.lag

    def promote(self) -> int:
        """Become a writer: take the log's writer lock, apply what is left, and
        write the genesis record onto a log that never had one; the records applied."""
        with self._lock:
            records = self._apply_read(self._log.promote(self.snapshot.version))
            self.writer = True
        if not self.snapshot.has_catalog:
            self._write_genesis()
        return len(records)

    def _publish(self, new: Snapshot) -> None:
        with Hold():  # published and applied to the live runtimes together
            self.snapshot = new
            for fn in self._subscribers:
                fn(new)

    @property
    def version(self) -> int:
        return self.snapshot.version

    def subscribe(self, fn: Callable[[Snapshot], None]) -> None:
        """Call ``fn(snapshot)`` now and after every change, under the write lock."""
        with self._lock:
            self._subscribers.append(fn)
            fn(self.snapshot)

    def _catch_up_locked(self) -> list[Record]:
        # where to read from is the snapshot's version: what this engine has applied
        return self._apply_read(self._log.read_after(self.snapshot.version))

    def _apply_read(self, records: list[Record]) -> list[Record]:
        """Lock held: apply records read from the log, in order, each published."""
        if records:
            self.note_seen(records[-1].version)
        for record in records:
            self._publish(apply(self.snapshot, record))
        if self.seen_version <= self.snapshot.version:
            self._behind_since = None
        return records

    def write(self, build: Callable[[Snapshot], Change | None]) -> Snapshot:
        """Append the record ``build(snapshot)`` returns, atomically; the new snapshot.

        Inside the log's write transaction (PostgreSQL: an advisory lock), the
        records other writers appended are applied first, so ``build`` sees the
        newest snapshot and the record gets the next version. The record is
        applied to a copy, appended, committed, and only then published. An
        interrupt waits (resgroups.interrupts) rather than split an append of a
        directory log or a publication; one that lands in a PostgreSQL
        transaction ends it (rolled back, or committed and read back by the
        follower), so a DDL waiting on the server stays interruptible.

        A log of this engine alone (in memory, a directory) has no follower to
        apply a record an interrupt kept from its publication: there the append
        and the publication are one step, and an interrupt that arrives during
        either runs once both are done (the statement raises it, its change
        made, in the log and in the live engine alike).

        A write that fails (CatalogWriteError) publishes nothing of its own: the
        log is read back from the snapshot's version and what it holds is
        applied, the record of this write included, once, if it was committed."""
        # the hold outermost: the lock is given back inside it, so that no handler
        # runs between the hold's end and the lock's release (it would keep the lock)
        with contextlib.nullcontext() if self._log.shared else Hold(), self._lock:
            record: Record | None = None
            try:
                with self._log.writing():
                    self._catch_up_locked()
                    change = build(self.snapshot)
                    if change is None:
                        return self.snapshot
                    op, args = change
                    record = Record(self.snapshot.version + 1, op, dict(args))
                    new = apply(self.snapshot, record)
                    self._log.append(record)
            except CatalogWriteError as exc:
                raise self._read_back(exc, record) from exc
            self.seen_version = max(self.seen_version, new.version)
            self._publish(new)
            return new

    def _read_back(self, exc: CatalogWriteError, record: Record | None) -> CatalogWriteError:
        """Lock held, after a failed write: apply what the log holds, and settle
        from it a write whose commit could not be told (``applied`` None)."""
        deadline = time.monotonic() + READ_BACK_S
        while True:
            try:
                read = self._catch_up_locked()
                break
            except CatalogError as again:  # the log is out of reach: the follower retries
                committed = exc.applied is True and record is not None
                if committed and time.monotonic() < deadline:  # try to apply it here first
                    time.sleep(0.1)
                    continue
                if not committed:
                    return exc
                return CatalogWriteError(
                    f"{exc.message}; but reading the log back failed ({again.message}), so "
                    "this engine applies it when its follower reads the log",
                    applied=True,
                )
        if exc.applied is not None or record is None:
            return exc
        found = next((r for r in read if r.version == record.version), None)
        if found is None:
            return exc  # not in the log yet: the follower applies it if it commits
        if found.encode() == record.encode():
            return CatalogWriteError(
                f"{exc.message}; reading the log back found it committed as version "
                f"{record.version}: the change is applied",
                applied=True,
            )
        return CatalogWriteError(
            f"{exc.message}; reading the log back found another record at version "
            f"{record.version}: this change was not applied",
            applied=False,
        )

    def _write_genesis(self) -> None:
        """The record that means "this log has a catalog" (written once: a second
        writer starting at the same time finds it when it catches up)."""
        genesis = {"format": LOG_FORMAT, "catalog": uuid.uuid4().hex}  # the log's identity
        self.write(lambda snap: None if snap.has_catalog else ("genesis", genesis))

    def close(self) -> None:
        self._log.close()
