"""Where the catalog log lives: in memory, or a directory on disk.

The directory backend (SPEC §10) holds two files:

``catalog.log``
    An 8-byte header ``RGCATLG\\x01`` followed by records, each framed as
    ``length (u32 big-endian) | crc32 of payload (u32) | payload``; the payload
    is the record's JSON. Each append is one ``write`` followed by ``fsync``,
    so a record is durable before the statement returns.

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
from resgroups.errors import CatalogError, CatalogLocked

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

    def read_new(self) -> list[Record]:
        """The whole records appended since the last read (a follower's poll)."""
        ...

    def promote(self) -> list[Record]:
        """Become the writer (take its lock); the records not read yet."""
        ...

    def newest_version(self) -> int:
        """The newest version in the log, without reading it off (a lag check)."""
        ...

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        """Block until new records may have arrived, ``timeout`` passed or ``stop``."""
        ...

    def append(self, record: Record) -> None: ...

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

    def read_new(self) -> list[Record]:
        return []  # nobody else writes it

    def promote(self) -> list[Record]:
        return []

    def newest_version(self) -> int:
        return len(self._records)

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)

    def append(self, record: Record) -> None:
        self._records.append(record)

    def close(self) -> None:
        pass


def _frame(record: Record) -> bytes:
    payload = record.encode()
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def _record_at(data: bytes, pos: int, version: int | None) -> tuple[Record, int] | None:
    """The intact record framed at ``pos`` and the offset after it, or None when
    the frame is cut short or fails its checksum (a torn write).

    With ``version`` given, a frame that is whole and passes its checksum but
    that this version cannot read, or that carries another version, raises
    CatalogError: it was written whole, so it is no crash artefact, and
    cutting it (and everything after it) off would lose data.
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
    except ValueError as exc:  # JSON or UTF-8 errors among them
        if version is None:
            return None
        raise CatalogError(
            f"catalog.log record {version} at byte {pos} is whole (its checksum holds) "
            f"but is not a record this version of resgroups can read: {exc}",
            sqlstate="XX001",
        ) from None
    if version is not None and record.version != version:
        raise CatalogError(
            f"catalog.log record at byte {pos} is whole but carries version "
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
        self._mutex = threading.Lock()
        if lock:
            self._take_lock()
        self._fd = self._open(writer=lock)
        self._end = 0
        self._version = 0  # of the last record read

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

    def read_new(self) -> list[Record]:
        """A follower's poll: the whole records after the last one read. A record
        being appended (not whole yet) is left for the next poll; nothing is
        ever cut, since the writer owns the file."""
        return self._scan_new(consume=True)

    def newest_version(self) -> int:
        """The version of the last whole record in the file (read nothing off)."""
        records = self._scan_new(consume=False)
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
            while (found := _record_at(data, pos, self._version + len(records) + 1)) is not None:
                record, pos = found
                records.append(record)
            if consume:
                self._end += pos
                self._version += len(records)
            return records

    def promote(self) -> list[Record]:
        """Take the writer lock (CatalogLocked while the writer still holds it),
        reopen the log for writing, and return the records not read yet (the
        torn tail a dead writer left is cut, as a writer does on open)."""
        if self._lock_fd is not None:
            return []
        self._take_lock()
        with self._mutex:
            os.close(self._fd)
            self._fd = self._open(writer=True)
        seen = self._version
        return self.read_all()[seen:]

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        stop.wait(timeout)  # polled: a stat of the file when nothing changed

    def append(self, record: Record) -> None:
        frame = _frame(record)
        with self._mutex:
            try:
                written = os.pwrite(self._fd, frame, self._end)
                if written != len(frame):
                    raise OSError(errno.EIO, f"short write ({written} of {len(frame)} bytes)")
                os.fsync(self._fd)
            except OSError as exc:
                # leave the file as it was: the statement fails, nothing half-applies
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._end)
                raise CatalogError(
                    f"cannot write catalog record {record.version} to {self.path}: {exc}",
                    sqlstate=IO_ERROR,
                ) from exc
            self._end += len(frame)
            self._version = record.version

    def close(self) -> None:
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._release_lock()
