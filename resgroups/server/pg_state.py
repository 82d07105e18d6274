"""What every phase of a wire connection shares: its state, its limits, its errors.

The phases of a connection live in their own modules (``pg_startup``,
``pg_framing``, ``pg_simple``, ``pg_portals``, ``pg_extended``) as mixins of
:class:`ConnectionBase`; ``pgwire.Connection`` puts them together, and its
module opens with the memo of the state machine. This module holds what they
all read: the transaction status, the per-connection limits (each a size a
client names, capped as PostgreSQL caps it), prepared statements and
portals, and the accountant that charges prepared statements to the
session's memory budget.
"""

from __future__ import annotations

import asyncio
import enum
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from resgroups.errors import Error, MemoryLimitExceeded, ProgramLimitExceeded
from resgroups.result import Cursor, Result
from resgroups.sched.memory import QueryMemory
from resgroups.server import commands, types
from resgroups.session import Session
from resgroups.sql import ast
from resgroups.sql.parser import MAX_SCRIPT_CHARS

if TYPE_CHECKING:
    from resgroups.engine import Engine
    from resgroups.server.pgwire import Backend

# ---- limits: every size a client names ------------------------------------------------

STARTUP_TIMEOUT: Final = 60.0  # seconds a client has to log in (PostgreSQL's default)
WRITE_TIMEOUT: Final = 60.0  # seconds a reply may wait for a client that does not read
INPUT_LIMIT: Final = 4 * 1024 * 1024  # bytes of messages read ahead of the engine
OUTPUT_CHUNK: Final = 256 * 1024  # bytes a thread hands to the loop at a time
OUTPUT_LIMIT: Final = 16 * 1024 * 1024  # bytes handed to the loop unwritten, no query running
OUTPUT_POLL: Final = 0.05  # seconds between checks of a waiting query's deadline and cancel
PLAN_CACHE: Final = 128  # statement texts a connection keeps parsed (each: bound, with $n)
PLAN_CACHE_TEXT: Final = 16 * 1024  # characters of a text the plan cache keeps
STREAM_ROWS: Final = 10_000  # rows of a streamed result made at a time
MAX_STATEMENT: Final = MAX_SCRIPT_CHARS  # characters of one Query or Parse text
MAX_PARAMETER_BYTES: Final = 4 * MAX_STATEMENT  # a Bind's values (UTF-8: up to 4 bytes a char)
MAX_PREPARED: Final = 1000  # named prepared statements per connection
MAX_PORTALS: Final = 1000  # open portals and cursors per connection
MAX_SAVEPOINTS: Final = 1000  # savepoints of one transaction block
PREPARED_OVERHEAD: Final = 512  # bytes charged per prepared statement beyond its text


class TxStatus(enum.Enum):
    """The transaction status ReadyForQuery reports."""

    IDLE = b"I"  # no transaction block
    BLOCK = b"T"  # inside BEGIN ... COMMIT
    FAILED = b"E"  # a block after an error: everything but COMMIT/ROLLBACK fails


class InFailedTransaction(Error):
    sqlstate = "25P02"


class NoSuchSavepoint(Error):
    sqlstate = "3B001"


class NoActiveTransaction(Error):
    """DECLARE without HOLD outside a transaction block (25P01)."""

    sqlstate = "25P01"


class DuplicateObject(Error):
    sqlstate = "42P05"


class MessageError(Error):
    """A well-framed message that asks for something impossible (a Bind with the
    wrong number of format codes): 08P01, but the connection goes on."""

    sqlstate = "08P01"


class OutputStalled(Error):
    """The client stopped reading for longer than the write timeout: the
    connection ends (there is nobody to tell)."""

    sqlstate = "08006"


def too_many(what: str, limit: int) -> ProgramLimitExceeded:
    return ProgramLimitExceeded(f"too many {what} on this connection (limit {limit:,})")


# ---- statements and portals ----------------------------------------------------------

Plan = ast.Statement | commands.WireCommand | None  # None: an empty query


@dataclass(frozen=True)
class ResultTyping:
    """What types a prepared statement's result columns whatever values are bound:
    the statement as parsed with its placeholders (None: it does not parse so),
    whose literals are the ones written in its text, and each parameter's type
    as a result type (``SELECT $1`` is a column of $1's type, as PostgreSQL)."""

    template: ast.Statement | None
    parameters: tuple[str, ...]


@dataclass
class Prepared:
    """A statement of the extended protocol (Parse)."""

    text: str
    oids: list[int]
    plan: Plan = None  # parsed at Parse when it has no placeholders
    planned: bool = False
    # each parameter's type: as the client gave it, else inferred from its context
    # (sql/param_types.py) at the first Describe or Bind that needs it
    parameter_oids: list[int] | None = None
    charged: int = 0  # bytes charged to the session's memory budget
    # binds values into the statement parsed with its placeholders (sql/params.py),
    # made at the first Bind; False: values are bound into its text
    binder: Callable[[list[object]], object] | bool | None = None
    last_bound: tuple[tuple[tuple[type, object], ...], Plan] | None = None  # values, tree
    typing: ResultTyping | None = None  # made at the first Bind or Describe that needs it


@dataclass
class Portal:
    """A bound statement (Bind) or a DECLAREd cursor."""

    plan: Plan
    formats: list[int] = field(default_factory=list)  # result format codes as bound
    cursor: Cursor | None = None
    hold: bool = False  # survives the end of its transaction (WITH HOLD)
    executed: bool = False
    binary: bool = False  # DECLARE BINARY: rows in binary format
    # bound from a prepared statement with placeholders: its columns' types are
    # read off the statement, never off the values bound (pg_simple.wire_kinds)
    typing: ResultTyping | None = None

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()


def formats_for(codes: list[int], count: int, what: str = "result") -> list[int]:
    """Bind's format codes for ``count`` values: none (all text), one for all, or one each."""
    if not codes:
        return [types.TEXT_FORMAT] * count
    if len(codes) == 1:
        return codes * count
    if len(codes) != count:
        raise MessageError(f"bind message has {len(codes)} {what} formats for {count}")
    return codes


class StatementMemory:
    """Prepared statements' bytes, charged to the session's group and the process
    as a query's would be (SPEC §8), under the principal's query memory ceiling;
    given back as statements close and all at once when the connection ends.
    The group is the one the session's queries ran in when the first statement
    was charged. Unmanaged sessions (resource groups disabled) are not charged:
    the count cap still holds."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._memory: QueryMemory | None = None
        self._resolved = False

    def _ledger(self) -> QueryMemory | None:
        if not self._resolved:
            self._resolved = True
            placement = self._session.placement()
            if placement is not None:
                self._memory = QueryMemory(
                    self._session.engine.memory_ledger,
                    placement.group.id,
                    placement.budget,
                    placement.ceiling,
                    f"prepared statements of group={placement.group.name}, "
                    f"user={self._session.user}",
                    lambda error: None,
                )
        return self._memory

    def charge(self, nbytes: int) -> int:
        """Charge ``nbytes``; MemoryLimitExceeded (53200) when a limit refuses them."""
        memory = self._ledger()
        if memory is None:
            return 0
        try:
            memory.publish(nbytes, nbytes)
        except MemoryLimitExceeded as exc:
            raise MemoryLimitExceeded(
                exc.message.replace("query memory limit", "prepared statement memory limit")
            ) from None
        return nbytes

    def release(self, nbytes: int) -> None:
        if self._memory is not None and nbytes:
            self._memory.publish(-nbytes, 0)

    @property
    def used(self) -> int:
        return self._memory.published if self._memory is not None else 0

    def close(self) -> None:
        if self._memory is not None and self._memory.published:
            self._memory.publish(-self._memory.published, 0)


class ConnectionBase:
    """The state of one wire connection, as every phase reads it. The methods
    below are the ones a phase calls in another; each is defined by its phase."""

    backend: Backend
    engine: Engine
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    executor: Executor  # where this connection's requests run (the admin's own pool)
    pid: int
    secret: int
    peer: str  # the client's address, for the login throttle
    session: Session | None
    settings: dict[str, str]
    # the reported settings before a set_config() of the running statement changed
    # them (None: unchanged): ParameterStatus follows the statement if it succeeds
    settings_before: dict[commands.Setting, str] | None = None
    # the settings as they were before that set_config(): restored if it fails
    settings_saved: dict[str, str] | None = None
    tx: TxStatus
    savepoints: list[str]  # of the transaction block, oldest first
    statements: dict[str, Prepared]
    portals: dict[str, Portal]
    statement_memory: StatementMemory | None
    skipping: bool  # after an extended-protocol error: discard until Sync
    busy: bool
    gone: bool  # the client is gone, or the connection is being ended
    interrupted: bool  # a cancel arrived while no query ran (a long parse)
    streaming: Any  # the query whose rows are being sent (its deadline bounds the wait)
    _plans: OrderedDict[str, ast.Statement | commands.WireCommand]
    _templates: OrderedDict[str, tuple[ast.Statement, dict[int, str]]]  # parsed with $n

    # framing
    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def error(self, exc: Error, *, extended: bool = False) -> None:
        raise NotImplementedError

    def push(self) -> None:
        raise NotImplementedError

    def check_interrupt(self) -> None:
        raise NotImplementedError

    # startup
    def setting(self, name: str) -> str:
        raise NotImplementedError

    def reported(self) -> dict[commands.Setting, str]:
        raise NotImplementedError

    def sync_attributes(self) -> None:
        raise NotImplementedError

    # simple query and connection statements
    def plan(self, text: str, offset: int = 0, mapping: Callable[[int], int] | None = None) -> Plan:
        raise NotImplementedError

    def parse_text(self, text: str, offset: int, mapping: Callable[[int], int] | None) -> Plan:
        raise NotImplementedError

    def run(self, plan: Plan, portal: Portal, max_rows: int | None, *, describe: bool) -> None:
        raise NotImplementedError

    def command(self, plan: commands.WireCommand) -> Result:
        raise NotImplementedError

    def report_changes(self, before: dict[commands.Setting, str]) -> None:
        raise NotImplementedError

    # portals and cursors
    def close_portals(self, everything: bool) -> None:
        raise NotImplementedError

    def add_portal(self, name: str, portal: Portal) -> None:
        raise NotImplementedError

    def drop_statements(self) -> None:
        raise NotImplementedError

    def drop_statement(self, name: str) -> bool:
        raise NotImplementedError

    # the extended protocol (PREPARE and EXECUTE share its prepared statements)
    def prepare(self, name: str, text: str, oids: list[int]) -> None:
        raise NotImplementedError

    def execute_plan(self, command: commands.Execute) -> tuple[Plan, ResultTyping | None]:
        raise NotImplementedError

    def row_description(self, columns: Any, kinds: Any, formats: list[int]) -> bytes:
        raise NotImplementedError

    def fetch(self, plan: commands.Fetch, codes: list[int], describe: bool) -> None:
        raise NotImplementedError

    def declare(self, plan: commands.Declare) -> Result:
        raise NotImplementedError

    def stream(self, stmt: ast.Select, portal: Portal, describe: bool) -> None:
        raise NotImplementedError

    def page(self, portal: Portal, max_rows: int | None, describe: bool) -> None:
        raise NotImplementedError

    def send_rows(self, rows: list[tuple[Any, ...]], kinds: Any, formats: list[int]) -> None:
        raise NotImplementedError
