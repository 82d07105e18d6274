"""The catalog log in PostgreSQL (SPEC §10): ``Engine(catalog="postgresql://...")``.

One row per record in ``resgroups_catalog_log`` (version, record as JSONB).
Several primaries may append: :meth:`PostgresLog.writing` opens a
transaction and takes a transaction-scoped advisory lock, the catalog reads
and applies every record after its own version, builds its record against
that snapshot, inserts it with the next version and ``pg_notify``s the
version; the commit releases the lock and delivers the notification. So
versions run 1, 2, 3, ... with no gap and no duplicate however many engines
write at once (the primary key would refuse a duplicate anyway).

Every engine on the log follows it: a dedicated autocommit connection
``LISTEN``s, a notification is a hint (the follower reads everything after
its last version, so a burst coalesces into one read), a poll every half
second is the fallback, and a lost connection is reopened with a backoff by
the follower's retries. The schema comes from the versioned migration files
of :mod:`resgroups.pgschema`, applied in order under an advisory lock so two
processes starting at once never race. Connection strings appear in logs
and messages with their password masked.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Final

import psycopg
from psycopg.types.json import Jsonb

from resgroups.catalog.records import Record, load_json
from resgroups.errors import CatalogError, CatalogWriteError
from resgroups.pgschema import migrate, redact

log = logging.getLogger("resgroups.catalog")

CHANNEL: Final = "resgroups_catalog"
IO_ERROR: Final = "58030"
# advisory lock keys (two int4): "rg" and what they serialize
_APPEND_LOCK: Final = (0x7267, 2)
_POLL_S: Final = 0.5
# how long a write whose COMMIT went unanswered asks PostgreSQL how it ended, while
# the server still has the transaction in progress (it has not read the COMMIT, or
# not yet noticed the client gone)
_RESOLVE_S: Final = 5.0
# a write's transaction that has no answer in this time (a server or a proxy that
# stopped answering without closing the connection) is cut from this side, and the
# server ends one idle in its transaction, or waiting for the append lock, after
# _SERVER_S: no writer can hold the append lock, or wait for it, without bound
_SERVER_S: Final = 20
_WRITE_S: Final = _SERVER_S + 10.0
_CONNECT_OPTIONS: Final[dict[str, Any]] = {
    "connect_timeout": 10,
    # a peer gone without a word (a partition): found by TCP within about 30 s
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
    "options": f"-c idle_in_transaction_session_timeout={_SERVER_S}s -c lock_timeout={_SERVER_S}s",
}


class PostgresLog:
    """The catalog log as a PostgreSQL table (see the module docstring)."""

    shared = True  # several engines append: every one of them follows the log

    def __init__(self, dsn: str, *, lock: bool = True) -> None:
        self.dsn = dsn
        self.name = redact(dsn)
        # what pg_stat_activity shows for this engine's connections
        self.application_name = f"resgroups {'primary' if lock else 'replica'} {os.getpid()}"
        self._mutex = threading.RLock()  # the main connection: writers and the follower
        self._conn: psycopg.Connection[Any] | None = None
        self._listener: psycopg.Connection[Any] | None = None
        # the write in progress once its record is inserted: (transaction id, version)
        self._pending: tuple[int, int] | None = None
        self.write_timeout = _WRITE_S  # a write's transaction, its lock wait included
        self.announced = 0  # the newest version a notification named
        with self._io("open"):
            applied = migrate(self._connection())
        if applied:
            log.info("catalog %s: applied migrations %s", self.name, ", ".join(applied))

    # ---- connections ----------------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn, autocommit=True, application_name=self.application_name, **_CONNECT_OPTIONS
        )

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _live_connection(self) -> psycopg.Connection[Any]:
        """The connection, checked with a round trip and reopened once if the
        server dropped it meanwhile (a restart, pg_terminate_backend): a DDL
        statement does not fail for a connection lost while it was idle."""
        conn = self._connection()
        try:
            conn.execute("SELECT 1")
        except psycopg.OperationalError:
            conn.close()
            self._conn = None
            conn = self._connection()
        return conn

    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        """PostgreSQL errors become CatalogError naming the (masked) catalog; a
        broken connection is dropped, so the next call opens a new one."""
        try:
            with self._mutex:
                yield
        except psycopg.Error as exc:
            with self._mutex:
                self._drop_if_broken()
            raise CatalogError(
                f"catalog {self.name}: cannot {what}: {redact(str(exc)).strip()}",
                sqlstate=IO_ERROR,
            ) from exc

    # ---- reading ----------------------------------------------------------------------

    def _rows_after(self, version: int, *, partial: bool = True) -> list[Record]:
        """The records after ``version``. One that cannot be read ends the list
        with the records before it (``partial``: they are applied, and the next
        read meets it first and raises), or raises at once."""
        # the record as text, decoded here: a document too deep or too large for the
        # decoder is a record this version cannot read, not a driver error
        rows = self._connection().execute(
            "SELECT version, record::text FROM resgroups_catalog_log WHERE version > %s "
            "ORDER BY version",
            [version],
        )
        records: list[Record] = []
        for got, body in rows:
            try:
                if got != version + len(records) + 1:
                    raise CatalogError(
                        f"catalog {self.name}: version {got} follows {version + len(records)}",
                        sqlstate="XX001",
                    )
                records.append(_record(got, body))
            except CatalogError:
                if partial and records:
                    break
                raise
        return records

    def read_all(self) -> list[Record]:
        with self._io("read the log"):
            return self._rows_after(0, partial=False)

    def read_after(self, version: int) -> list[Record]:
        with self._io("read the log"):
            return self._rows_after(version)

    def newest_version(self) -> int:
        with self._io("read the log"):
            row = (
                self._connection()
                .execute("SELECT coalesce(max(version), 0) FROM resgroups_catalog_log")
                .fetchone()
            )
            return int(row[0]) if row else 0

    # ---- writing ----------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """One append: a transaction holding the append lock (released at commit).

        A PostgreSQL failure anywhere in it raises CatalogWriteError: before the
        COMMIT was sent, nothing can have been written (applied=False); at the
        COMMIT, the server is asked how the transaction ended (``txid_status``,
        on a new connection when the old one broke), so a COMMIT that failed is
        told from one whose answer was lost."""
        with self._mutex:
            self._pending = None
            watchdog = _Watchdog(self.write_timeout)
            try:
                conn = self._live_connection()
                with watchdog.over(conn), conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _APPEND_LOCK)
                    yield
            except psycopg.Error as exc:
                self._drop_if_broken()
                why = redact(str(exc)).strip()
                raise self._write_failed(watchdog.explain(why)) from exc
            except CatalogError as exc:
                if not isinstance(exc.__cause__, psycopg.Error):
                    raise  # the statement's own refusal: nothing was written
                # a read inside the transaction failed (already a CatalogError)
                raise CatalogWriteError(
                    watchdog.explain(exc.message) + "; nothing was written", applied=False
                ) from exc
            finally:
                self._pending = None

    def _write_failed(self, why: str) -> CatalogWriteError:
        pending = self._pending
        if pending is None:  # the COMMIT was never sent
            return CatalogWriteError(
                f"catalog {self.name}: cannot append to the log: {why}; nothing was written",
                applied=False,
            )
        xid, version = pending
        committed, doubt = self._resolve(xid)
        if committed is False:
            return CatalogWriteError(
                f"catalog {self.name}: the commit of catalog record {version} failed: {why}; "
                "PostgreSQL rolled it back, so the change is applied nowhere",
                applied=False,
            )
        if committed is True:
            return CatalogWriteError(
                f"catalog {self.name}: the commit of catalog record {version} lost its "
                f"answer ({why}), but PostgreSQL reports the transaction committed: the "
                f"change is applied, as version {version}",
                applied=True,
            )
        return CatalogWriteError(
            f"catalog {self.name}: the commit of catalog record {version} lost its answer "
            f"({why}) and whether it committed cannot be told yet ({doubt}); if it did, "
            "every engine applies it as it follows the log",
            applied=None,
        )

    def _resolve(self, xid: int) -> tuple[bool | None, str]:
        """Whether transaction ``xid`` committed (None: cannot tell yet), and why not known."""
        deadline = time.monotonic() + _RESOLVE_S
        doubt = "the server still has it in progress"
        while True:
            try:
                conn = self._live_connection()
                with _Watchdog(_RESOLVE_S).over(conn):
                    row = conn.execute("SELECT txid_status(%s)", [xid]).fetchone()
            except psycopg.Error as exc:
                self._drop_if_broken()
                doubt = f"cannot ask the server: {redact(str(exc)).strip()}"
            else:
                status = row[0] if row else None
                if status == "committed":
                    return True, ""
                if status == "aborted":
                    return False, ""
                if status is None:  # so old that its status is gone: only the log can tell
                    return None, f"the server no longer knows transaction {xid}"
            if time.monotonic() >= deadline:
                return None, doubt
            time.sleep(0.05)

    def _drop_if_broken(self) -> None:
        if self._conn is not None and self._conn.broken:
            self._conn.close()
            self._conn = None

    def append(self, record: Record) -> None:
        """Inside :meth:`writing`: insert the record and announce its version."""
        conn = self._connection()
        conn.execute(
            "INSERT INTO resgroups_catalog_log (version, record) VALUES (%s, %s)",
            [record.version, Jsonb({"op": record.op, **record.args})],
        )
        row = conn.execute(
            "SELECT txid_current(), pg_notify(%s, %s)", [CHANNEL, str(record.version)]
        ).fetchone()
        assert row is not None
        self._pending = (int(row[0]), record.version)

    def promote(self, version: int) -> list[Record]:
        # no lock to take: PostgreSQL serializes the writers
        self.application_name = self.application_name.replace("replica", "primary", 1)
        return self.read_after(version)

    # ---- following --------------------------------------------------------------------

    def wait_for_news(self, timeout: float, stop: threading.Event) -> None:
        """Until a notification arrives, ``timeout`` (at most half a second: the
        poll fallback) passes, or ``stop``. A lost listening connection raises
        CatalogError; the follower retries, and the next call reconnects."""
        try:
            if self._listener is None or self._listener.closed:
                self._listener = self._connect()
                self._listener.execute(f"LISTEN {CHANNEL}")
            for note in self._listener.notifies(timeout=min(timeout, _POLL_S), stop_after=1):
                with contextlib.suppress(ValueError):
                    self.announced = max(self.announced, int(note.payload))
        except psycopg.Error as exc:
            if self._listener is not None:
                self._listener.close()
                self._listener = None
            raise CatalogError(
                f"catalog {self.name}: lost the notification connection: "
                f"{redact(str(exc)).strip()}",
                sqlstate=IO_ERROR,
            ) from exc

    def close(self) -> None:
        with self._mutex:
            for conn in (self._conn, self._listener):
                if conn is not None:
                    conn.close()
            self._conn = self._listener = None


class _Watchdog:
    """Cuts a connection's socket when a round trip takes longer than ``seconds``:
    the blocked call then fails (OperationalError) instead of waiting forever on
    a peer that keeps the connection open and never answers."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False

    @contextlib.contextmanager
    def over(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        timer = threading.Timer(self.seconds, self._cut, args=(conn,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def explain(self, why: str) -> str:
        if not self.fired:
            return why
        return f"no answer from the server in {self.seconds:g} s, connection cut ({why})"

    def _cut(self, conn: psycopg.Connection[Any]) -> None:
        self.fired = True
        with contextlib.suppress(Exception):  # the connection may be gone already
            sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
            try:
                sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()


def _record(version: int, body: Any) -> Record:
    if isinstance(body, str):
        try:
            body = load_json(body)
        except ValueError as exc:
            raise CatalogError(
                f"catalog record {version} is not a record this version of resgroups can "
                f"read: {exc}",
                sqlstate="XX001",
            ) from None
    if not isinstance(body, dict) or not isinstance(body.get("op"), str):
        raise CatalogError(f"catalog record {version} is not a record: {body!r}", sqlstate="XX001")
    args = dict(body)
    return Record(version, args.pop("op"), args)
