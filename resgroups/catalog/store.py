"""Where the catalog log lives: in memory, or a directory on disk.

The directory backend (SPEC §10) holds two files:

``catalog.log``
    An 8-byte header ``RGCATLG\\x01`` followed by records, each framed as
    ``length (u32 big-endian) | crc32 of payload (u32) | payload``; the payload
    is the record's JSON. Each append writes the frame with its header zeroed
    and ``fsync``s, then writes the header and ``fsync``s again, so a record is
    durable before the statement returns and no follower reads a record that
    a failed write then cuts back (:meth:`DirectoryLog.append`).

``catalog.lock``
    Held with ``flock(LOCK_EX | LOCK_NB)`` for the writer's lifetime. flock
    locks belong to an open file description, so a second writer is refused
    whether it is another process or another engine in this one.

Recovery on open: a record cut short by a crash, or whose checksum fails,
is a torn tail when no intact record follows it; the file is truncated back
to the last whole record. A damaged record with an intact record after it is
not a crash artefact, and opening fails rather than silently dropping the
records behind it. Nor is a whole record with a valid checksum that this
version cannot read (an unknown operation, a version out of sequence, a
value SQL could not have written): opening refuses it, with its position.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Final, Protocol

from resgroups.catalog.records import Record
from resgroups.errors import CatalogError, CatalogLocked, CatalogWriteError
from resgroups.interrupts import Hold

log = logging.getLogger("resgroups.catalog")

MAGIC: Final = b"RGCATLG\x01"
FRAME: Final = struct.Struct(">II")
MAX_RECORD: Final = 64 * 1024 * 1024
IO_ERROR: Final = "58030"
BAD_PATH: Final = "22023"
FILE_MODE: Final = 0o600  # catalog.log holds password hashes


class CatalogLog(Protocol):
    """An append-only sequence of records."""

    @property
    def name(self) -> str:
        """Where the log lives, for messages (a connection string's password masked)."""
        ...

    @property
    def shared(self) -> bool:
        """Several engines may append: every engine follows the log."""
        ...

    @property
    def announced(self) -> int:
        """The newest version the log has announced (a notification), or 0."""
        ...

    def writing(self) -> contextlib.AbstractContextManager[None]:
        """Around one append: what makes it exclusive among writers."""
        ...

    def read_all(self) -> list[Record]: ...

    def read_after(self, version: int) -> list[Record]:
        """The whole records after ``version`` (a follower's poll, a writer's catch-up).
        The caller says where it is: the snapshot's version is the one truth of what
        an engine has applied, and a log keeps no cursor that could run ahead of it."""
        ...

    def promote(self, version: int) -> list[Record]:
        """Become the writer (take its lock); the records after ``version``."""
        ...

    def newest_version(self) -> int:
        """The newest version in the log, without reading it off (a lag check)."""
        ...

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        """Block until new records may have arrived, ``timeout`` passed or ``stop``."""
        ...

    def append(self, record: Record) -> None:
        """Write ``record`` durably (inside :meth:`writing`). A failure raises
        CatalogWriteError saying whether the record may be in the log."""
        ...

    def close(self) -> None: ...


class MemoryLog:
    """The default backend: the log lives and dies with the engine."""

    name = "in-memory catalog"
    shared = False
    announced = 0

    def __init__(self) -> None:
        self._records: list[Record] = []

    def writing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def read_all(self) -> list[Record]:
        return list(self._records)

    def read_after(self, version: int) -> list[Record]:
        return self._records[version:]  # nobody else writes it: empty but for a bug

    def promote(self, version: int) -> list[Record]:
        return self._records[version:]

    def newest_version(self) -> int:
        return len(self._records)

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)

    def append(self, record: Record) -> None:
        with Hold():
            self._records.append(record)

    def close(self) -> None:
        pass


def _frame(record: Record) -> bytes:
    payload = record.encode()
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _record_at(
    data: bytes, pos: int, version: int | None, *, base: int = 0
) -> tuple[Record, int] | None:
    """The intact record framed at ``pos`` and the offset after it, or None when
    the frame is cut short or fails its checksum (a torn write).

    With ``version`` given, a frame that is whole and passes its checksum but
    that this version cannot read, or that carries another version, raises
    CatalogError: it was written whole, so it is no crash artefact, and
    cutting it (and everything after it) off would lose data. ``base`` is where
    ``data`` starts in the file (for the position in messages).
    """
    if len(data) - pos < FRAME.size:
        return None
    length, crc = FRAME.unpack_from(data, pos)
    end = pos + FRAME.size + length
    if length == 0 or length > MAX_RECORD or end > len(data):
        return None
    payload = data[pos + FRAME.size : end]
    if zlib.crc32(payload) != crc:
        return None
    try:
        record = Record.decode(payload)
    except ValueError as exc:  # JSON or UTF-8 errors, a document too deep or too large
        if version is None:
            return None
        raise CatalogError(
            f"catalog.log record {version} at byte {base + pos} is whole (its checksum holds) "
            f"but is not a record this version of resgroups can read: {exc}",
            sqlstate="XX001",
        ) from None
    if version is not None and record.version != version:
        raise CatalogError(
            f"catalog.log record at byte {base + pos} is whole but carries version "
            f"{record.version} where version {version} belongs",
            sqlstate="XX001",
        )
    return record, end


def scan(data: bytes) -> tuple[list[Record], int]:
    """The whole records of a log image and the offset where they end.

    Raises CatalogError when a damaged record has an intact one after it.
    """
    if not data.startswith(MAGIC):
        if MAGIC.startswith(data):  # created, then cut inside the header
            return [], 0
        raise CatalogError("not a resgroups catalog log (bad header)", sqlstate="XX001")
    records: list[Record] = []
    pos = len(MAGIC)
    while pos < len(data):
        found = _record_at(data, pos, len(records) + 1)
        if found is None:
            for later in range(pos + 1, len(data) - FRAME.size):
                if _record_at(data, later, None) is not None:
                    raise CatalogError(
                        f"catalog.log is damaged at byte {pos} (record {len(records) + 1}) "
                        f"but holds intact records after it, at byte {later}; refusing to "
                        "open it rather than drop them",
                        sqlstate="XX001",
                    )
            break
        record, pos = found
        records.append(record)
    return records, pos


class DirectoryLog:
    """``catalog.log`` and ``catalog.lock`` in a directory (created if missing)."""

    shared = False  # one writer, holding catalog.lock
    announced = 0

    def writing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the flock already makes this the only writer

    def __init__(self, directory: str | os.PathLike[str], *, lock: bool = True) -> None:
        text = os.fspath(directory) if isinstance(directory, str | os.PathLike) else directory
        if not isinstance(text, str):
            raise CatalogError(
                f"catalog={directory!r}: expected a directory path (str or os.PathLike), "
                "or None for a catalog in memory",
                sqlstate=BAD_PATH,
            )
        if not text.strip():
            raise CatalogError(
                f"catalog directory path {text!r} is empty: give a directory, "
                "or catalog=None for a catalog in memory",
                sqlstate=BAD_PATH,
            )
        if "\0" in text:
            raise CatalogError(
                f"catalog directory path {text!r} contains a NUL byte", sqlstate=BAD_PATH
            )
        self.directory = Path(text)
        try:
            # the catalog holds password hashes: its files are the owner's alone
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CatalogError(
                f"cannot create catalog directory {self.directory}: {exc}", sqlstate=IO_ERROR
            ) from exc
        self.path = self.directory / "catalog.log"
        self.name = str(self.path)
        self._lock_fd: int | None = None
        self._mutex = threading.RLock()
        if lock:
            self._take_lock()
        try:
            self._fd = self._open(writer=lock)
        except BaseException:  # a log that cannot be read keeps no writer's lock
            self._release_lock()
            raise
        # where the file's record ``_version`` ends: a cache of a read, keyed by the
        # version asked for, never a cursor of its own (read_after says where)
        self._end = 0
        self._version = 0
        self._dirty = False  # a failed append could not cut its frame back

    def _open(self, *, writer: bool) -> int:
        # a follower only reads: it never repairs, truncates or appends
        flags = os.O_RDWR | os.O_CREAT if writer else os.O_RDONLY | os.O_CREAT
        try:
            return os.open(self.path, flags, FILE_MODE)
        except OSError as exc:
            self._release_lock()
            raise CatalogError(f"cannot open {self.path}: {exc}", sqlstate=IO_ERROR) from exc

    def _take_lock(self) -> None:
        lock_path = self.directory / "catalog.lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:
            raise CatalogError(f"cannot open {lock_path}: {exc}", sqlstate=IO_ERROR) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CatalogLocked(
                    f"catalog {self.directory} is locked by another writer "
                    f"(flock on {lock_path}); open it with role='replica' to follow it"
                ) from None
            raise
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read_image(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read()

    def read_all(self) -> list[Record]:
        """Every whole record; as the writer, also cut a torn tail and fix the header."""
        try:
            return self._read_all()
        except OSError as exc:  # unreadable, or a read-only file system refusing a repair
            raise CatalogError(
                f"cannot read or repair {self.path}: {exc}", sqlstate=IO_ERROR
            ) from exc

    def _read_all(self) -> list[Record]:
        with self._mutex:
            data = self._read_image()
            records, end = scan(data)
            if self._lock_fd is not None:
                if end < len(data):
                    log.warning(
                        "catalog %s: cut a torn tail of %d bytes after record %d",
                        self.path,
                        len(data) - end,
                        len(records),
                    )
                if end == 0:
                    os.ftruncate(self._fd, 0)
                    os.pwrite(self._fd, MAGIC, 0)
                    end = len(MAGIC)
                elif end < len(data):
                    os.ftruncate(self._fd, end)
                os.fsync(self._fd)
            self._end = end
            self._version = len(records)
            return records

    def read_after(self, version: int) -> list[Record]:
        """A follower's poll: the whole records after ``version``. A record being
        appended (not whole yet) is left for the next poll; nothing is ever cut,
        since the writer owns the file. Read on from where the last read ended
        when that was ``version`` (the common case), else from the start."""
        with self._mutex:
            if self._dirty:  # past the end: a failed append's frame, no record of the log
                return []
            if version != self._version:
                self._end = self._version = 0
            return [r for r in self._scan_new(consume=True) if r.version > version]

    def newest_version(self) -> int:
        """The version of the last whole record in the file (read nothing off)."""
        records = [] if self._dirty else self._scan_new(consume=False)
        return records[-1].version if records else self._version

    def _scan_new(self, *, consume: bool) -> list[Record]:
        with self._mutex:
            try:
                size = os.fstat(self._fd).st_size
                if size <= max(self._end, len(MAGIC)):
                    return []
                data = os.pread(self._fd, size - self._end, self._end)
            except OSError as exc:
                raise CatalogError(f"cannot read {self.path}: {exc}", sqlstate=IO_ERROR) from exc
            pos = 0
            if self._end == 0:
                if not data.startswith(MAGIC):
                    if MAGIC.startswith(data):
                        return []  # the writer is creating the header
                    raise CatalogError(
                        f"{self.path} is not a resgroups catalog log (bad header)",
                        sqlstate="XX001",
                    )
                pos = len(MAGIC)
            records: list[Record] = []
            while True:
                try:
                    found = _record_at(data, pos, self._version + len(records) + 1, base=self._end)
                except CatalogError:
                    if records:  # the good records first; the next read meets this one
                        break
                    raise
                if found is None:
                    break
                record, pos = found
                records.append(record)
            if consume:
                self._end += pos
                self._version += len(records)
            return records

    def promote(self, version: int) -> list[Record]:
        """Take the writer lock (CatalogLocked while the writer still holds it),
        reopen the log for writing, and return the records after ``version`` (the
        torn tail a dead writer left is cut, as a writer does on open)."""
        if self._lock_fd is not None:
            return self.read_after(version)
        self._take_lock()
        with self._mutex:
            os.close(self._fd)
            self._fd = self._open(writer=True)
        return self.read_all()[version:]

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)  # polled: a stat of the file when nothing changed

    def append(self, record: Record) -> None:
        """Write the frame at the end of the last whole record in two steps, so
        that no reader takes it for a record before it is durable:

        1. the frame with its header zeroed (a length of 0 is no record: a
           follower polling the file waits, a reopen cuts it as a torn tail),
           then ``fsync``;
        2. the header, then ``fsync`` again.

        An OSError in step 1 or at the header's write (ENOSPC, EIO, a short
        write) cuts the frame back: the file is as it was, no engine has seen
        the record, and the statement fails having changed nothing (if even the
        cut fails, the next append cuts first). Once the header is written the
        record is in the log for every reader of the file, so a failure of the
        last ``fsync`` keeps it: the statement reports it applied, and that the
        disk could not confirm it durable."""
        frame = _frame(record)
        # an interrupt waits: the file and where this log says it ends must agree
        with Hold(), self._mutex:
            if record.version != self._version + 1:  # the caller read past this file
                raise CatalogWriteError(
                    f"cannot write catalog record {record.version} to {self.path}: the "
                    f"file ends at record {self._version}",
                    applied=False,
                )
            try:
                if self._dirty:  # what a failed append left behind goes first
                    self._cut_back()
                self._write_at(bytes(FRAME.size) + frame[FRAME.size :])
                os.fsync(self._fd)
                self._write_at(frame[: FRAME.size])
            except OSError as exc:
                # leave the file as it was: the statement fails, nothing half-applies
                try:
                    self._cut_back()
                except OSError:
                    self._dirty = True  # a frame with no header: no record to anyone
                raise CatalogWriteError(
                    f"cannot write catalog record {record.version} to {self.path}: {exc}; "
                    f"nothing was written (the file ends at record {self._version})",
                    applied=False,
                ) from exc
            self._end += len(frame)
            self._version = record.version
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise CatalogWriteError(
                    f"catalog record {record.version} is written to {self.path} and every "
                    f"engine on it reads it, but the last fsync failed ({exc}): the change "
                    "is applied, though the disk could not confirm it would survive a "
                    "crash of the machine",
                    applied=True,
                ) from exc

    def _write_at(self, data: bytes) -> None:
        written = os.pwrite(self._fd, data, self._end)
        if written != len(data):
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")

    def _cut_back(self) -> None:
        """Cut the file back to the end of its last whole record (and make it so)."""
        os.ftruncate(self._fd, self._end)
        os.fsync(self._fd)
        self._dirty = False

    def close(self) -> None:
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._release_lock()
