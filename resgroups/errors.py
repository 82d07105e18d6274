"""The error tree: every error resgroups raises derives from :class:`Error`.

Each class carries a PostgreSQL SQLSTATE in ``.sqlstate`` so that the wire
front ends can forward it unchanged. The quoted messages are QuestDB's own;
every message also names the group and the values involved.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import ClassVar

__all__ = [
    "AdmissionRejected",
    "AmbiguousColumn",
    "AuthenticationFailed",
    "CardinalityViolation",
    "CatalogError",
    "CatalogLagError",
    "CatalogLocked",
    "CatalogWriteError",
    "CoordinationUnavailable",
    "DatatypeMismatch",
    "DivisionByZero",
    "EngineClosed",
    "Error",
    "FeatureNotSupported",
    "GroupingError",
    "InternalError",
    "InvalidParameter",
    "InvalidRegularExpression",
    "InvalidTextRepresentation",
    "MemoryLimitExceeded",
    "NumericOverflow",
    "PermissionDenied",
    "QueryCancelled",
    "QueryTimeout",
    "QueueTimeout",
    "ReadOnlyReplica",
    "SqlSyntaxError",
    "UndefinedColumn",
    "UndefinedFunction",
    "UndefinedTable",
    "UndefinedType",
    "did_you_mean",
]


class Error(Exception):
    """Base class of every resgroups error; ``sqlstate`` is a PostgreSQL SQLSTATE."""

    sqlstate: str = "XX000"

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if sqlstate is not None:
            self.sqlstate = sqlstate

    @property
    def brief(self) -> str:
        """The message for a client that draws its own caret from a position (a
        PostgreSQL driver, JSON): without the caret drawing."""
        return self.message


class SqlSyntaxError(Error):
    """The text is not a statement resgroups knows; ``line``/``column`` are 1-based."""

    sqlstate = "42601"

    def __init__(
        self,
        message: str,
        *,
        line: int,
        column: int,
        expected: Sequence[str] = (),
        context: str = "",
        position: int = 0,
    ) -> None:
        text = f"{message} at line {line}, column {column}"
        if expected:
            text += "; expected one of: " + ", ".join(expected)
        if context:
            text += "\n" + context
        super().__init__(text)
        self.reason = message  # without the position, the expected tokens and the context
        self.line = line
        self.column = column
        self.expected = list(expected)
        self.context = context
        self.position = position  # 0-based character offset into the statement text

    @property
    def brief(self) -> str:
        if not self.context:
            return self.message
        return self.message[: -len(self.context)].rstrip("\n")


class InvalidParameter(Error):
    """A parameter value outside its range, or an unknown parameter."""

    sqlstate = "22023"


class CatalogError(Error):
    """Unknown (42704), duplicate (42710) or forbidden (42809) catalog objects."""

    UNDEFINED: ClassVar[str] = "42704"
    DUPLICATE: ClassVar[str] = "42710"
    FORBIDDEN: ClassVar[str] = "42809"
    sqlstate = "42704"


class CatalogWriteError(CatalogError):
    """A DDL whose record could not be written durably (the log unreachable, a
    failed or unanswered COMMIT, ENOSPC). ``applied`` says what the engine knows:
    False, the change is in no log and applied nowhere (SQLSTATE 58030); True, the
    record is in the log exactly once (a COMMIT whose answer was lost, a last
    fsync that failed) and this engine has applied it, unless reading the log
    back failed too, which the message says (08007); None, it may or may not
    have been committed and the log could not tell yet (08007). Every engine
    follows the log, so all of them converge either way."""

    sqlstate = "58030"

    def __init__(self, message: str, *, applied: bool | None) -> None:
        super().__init__(message, sqlstate="58030" if applied is False else "08007")
        self.applied = applied


class UndefinedFunction(Error):
    """A function or table function that resgroups does not have."""

    sqlstate = "42883"


class UndefinedTable(Error):
    sqlstate = "42P01"


class UndefinedColumn(Error):
    sqlstate = "42703"


class AmbiguousColumn(Error):
    """A column name that more than one relation of a FROM clause has (42702)."""

    sqlstate = "42702"


class InvalidRegularExpression(Error):
    sqlstate = "2201B"


class CardinalityViolation(Error):
    """A scalar subquery that returned more than one row (21000)."""

    sqlstate = "21000"


class DatatypeMismatch(Error):
    """An operator or function applied to values of the wrong type."""

    sqlstate = "42804"


class InvalidTextRepresentation(Error):
    """Text that is not a value of the type it is read as (a cast, a parameter)."""

    sqlstate = "22P02"


class UndefinedType(Error):
    """A type name resgroups does not know (``x::geometry``)."""

    sqlstate = "42704"


class GroupingError(Error):
    """Aggregates mixed with plain columns (there is no GROUP BY)."""

    sqlstate = "42803"


class DivisionByZero(Error):
    sqlstate = "22012"


class PermissionDenied(Error):
    sqlstate = "42501"


class AuthenticationFailed(Error):
    """A login that failed, whatever the reason (28P01): an unknown principal and a
    wrong password are indistinguishable (SPEC §2)."""

    sqlstate = "28P01"


class FeatureNotSupported(Error):
    sqlstate = "0A000"


class ReadOnlyReplica(Error):
    sqlstate = "25006"


class CatalogLocked(Error):
    sqlstate = "55006"


class CatalogLagError(Error):
    sqlstate = "55000"


class AdmissionRejected(Error):
    sqlstate = "53400"


class QueueTimeout(Error):
    sqlstate = "57014"


class QueryTimeout(Error):
    sqlstate = "57014"


class QueryCancelled(Error):
    sqlstate = "57014"


class RunawayQuery(Error):
    """Killed, or refused while its statement was watched, by a runaway-query
    rule (SPEC §16); the message names the rule, the condition and the value."""

    sqlstate = "57014"


class MemoryLimitExceeded(Error):
    sqlstate = "53200"


class CoordinationUnavailable(Error):
    sqlstate = "08006"


class NumericOverflow(Error):
    sqlstate = "22003"


class ProgramLimitExceeded(Error):
    """A statement beyond a stated limit of the SQL front end (its length, its
    nesting depth, a literal's size): refused in bounded time (54000)."""

    sqlstate = "54000"


class EngineClosed(Error):
    """The engine was closed; it takes no new sessions or statements."""

    sqlstate = "57P01"


class InternalError(Error):
    """A broken internal invariant: a bug in resgroups, never the user's input."""

    sqlstate = "XX000"


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return ``' Did you mean "x"?'`` for the closest candidate, or ``''``."""
    pool = list(candidates)
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return f' Did you mean "{lowered[close[0]]}"?' if close else ""
