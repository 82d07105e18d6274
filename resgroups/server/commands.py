"""Statements a wire connection answers itself, and its settings.

A PostgreSQL connection carries state that is not the engine's: transaction
blocks (drivers that do not autocommit send ``BEGIN``/``COMMIT``), run-time
settings drivers read and set on connect (``client_encoding``,
``application_name``, ``DateStyle``, ...), cursors (``DECLARE``/``FETCH``/
``MOVE``/``CLOSE``, what psycopg's server-side cursors send) and prepared
statements (``DEALLOCATE``). :func:`recognize` picks these out by their
leading words; every other statement goes to the engine's parser. DDL
applies at once whatever the transaction block: ``BEGIN`` and ``COMMIT``
only track what the driver expects to see.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from resgroups.catalog.selectors import MAX_APPLICATION, MAX_TAG, MAX_TAGS
from resgroups.errors import (
    Error,
    FeatureNotSupported,
    NumericOverflow,
    SqlSyntaxError,
    did_you_mean,
)
from resgroups.version import SERVER_VERSION, SERVER_VERSION_NUM

# Linear: every alternative consumes what it starts, to its end or to the end of
# the text (an unterminated comment, name or string is one token that runs to
# the end), so no position is ever scanned twice. A failed lazy match of an
# unterminated ``/*`` at each of n positions was quadratic (48 KB: 21 s).
_TOKEN: Final = re.compile(
    r"""\s+|--[^\n]*|(?P<comment>/\*[^*]*(?:\*+[^*/][^*]*)*(?:\*+/|\*+\Z|\Z))"""
    r"""|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)|(?P<quoted>"(?:[^"]|"")*"?)"""
    r"""|(?P<string>'(?:[^']|'')*'?)|(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"""
    r"""|(?P<punct>[^\s])"""
)
MAX_FETCH_DIGITS: Final = 19  # a FETCH count is a bigint


class UndefinedObject(Error):
    """An unknown setting, cursor or prepared statement (42704 / 34000 / 26000)."""

    sqlstate = "42704"


class CantChangeRuntimeParam(Error):
    sqlstate = "55P02"


@dataclass(frozen=True)
class Token:
    kind: str  # word, quoted, string, number, punct
    text: str  # words lower-cased; quoted names and strings unquoted
    at: int


def _closed(text: str, kind: str) -> bool:
    if kind == "comment":
        return len(text) >= 4 and text.endswith("*/")
    quote = text[0]
    body = text[1:]
    return body.endswith(quote) and (len(body) - len(body.rstrip(quote))) % 2 == 1


def tokens(sql: str) -> list[Token] | None:
    """The tokens of ``sql``; None when it holds something this lexer does not know
    (such a statement is not one of these, and goes to the engine's parser)."""
    out: list[Token] = []
    at = 0
    while at < len(sql):
        m = _TOKEN.match(sql, at)
        if m is None:
            return None
        kind = m.lastgroup
        if kind in ("quoted", "string", "comment") and not _closed(m.group(), kind):
            return None  # unterminated: not a statement of these; the parser says why
        if kind == "comment":
            pass
        elif kind == "word":
            out.append(Token(kind, m.group().lower(), at))
        elif kind in ("quoted", "string"):
            quote = m.group()[0]
            out.append(Token(kind, m.group()[1:-1].replace(quote * 2, quote), at))
        elif kind is not None:
            out.append(Token(kind, m.group(), at))
        at = m.end()
    while out and out[-1].text == ";":
        out.pop()
    return out


# ---- settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    name: str  # as SHOW ALL spells it
    default: str
    check: Callable[[str], str] | None = None  # normalises a new value or raises; None: fixed
    report: bool = False  # sent as ParameterStatus when it changes (GUC_REPORT)
    description: str = ""


def _choice(*allowed: str, canonical: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value.lower().replace("-", "") not in {a.lower().replace("-", "") for a in allowed}:
            raise FeatureNotSupported(
                f"value {value!r} is not supported here (allowed: {', '.join(allowed)})"
            )
        return canonical

    return check


def _encoding(value: str) -> str:
    """An encoding name in any spelling PostgreSQL accepts: it keeps only letters and
    digits, case-insensitively (asyncpg sends ``'utf-8'``, quotes included)."""
    cleaned = "".join(c for c in value.lower() if c.isascii() and c.isalnum())
    if cleaned not in ("utf8", "unicode"):
        raise FeatureNotSupported(
            f"client_encoding {value[:64]!r} is not supported: the server speaks UTF8 "
            "(allowed: UTF8 in any spelling, e.g. utf-8, UNICODE)"
        )
    return "UTF8"


def _datestyle(value: str) -> str:
    words = {w.strip().lower() for w in value.split(",")}
    if not words <= {"iso", "mdy", "dmy", "ymd", "us", "european", "noneuropean", "postgres"} or (
        words - {"mdy", "dmy", "ymd", "us", "european", "noneuropean"} != {"iso"}
    ):
        raise FeatureNotSupported(
            f"DateStyle {value!r} is not supported: timestamps are sent in ISO format "
            "(allowed: ISO with any field order)"
        )
    order = "DMY" if words & {"dmy", "european"} else "YMD" if "ymd" in words else "MDY"
    return f"ISO, {order}"


MAX_TIMEZONE: Final = 255  # characters of a zone name (IANA names are under 40)


def _timezone(value: str) -> str:
    if len(value) > MAX_TIMEZONE:
        raise InvalidSetting(
            f'invalid value for parameter "TimeZone": a name of {len(value):,} characters '
            f"(time zone names are at most {MAX_TIMEZONE})"
        )
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSetting(f'invalid value for parameter "TimeZone": {value!r}') from None
    return value


def _int_range(low: int, high: int, name: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        try:
            number = int(value)
        except ValueError:
            raise InvalidSetting(f"parameter {name!r} requires an integer value") from None
        if not low <= number <= high:
            raise InvalidSetting(
                f"{number} is outside the valid range for parameter {name!r} ({low} .. {high})"
            )
        return str(number)

    return check


def _any(value: str) -> str:
    return value


def _application(value: str) -> str:
    """application_name, kept to PostgreSQL's 63 bytes as PostgreSQL truncates it
    (selectors route on it, SPEC §15)."""
    return value.encode("utf-8")[:MAX_APPLICATION].decode("utf-8", "ignore")


def client_tags(value: str) -> tuple[str, ...]:
    """``client_tags``: tags separated by commas, blanks around them ignored."""
    return tuple(t.strip() for t in value.split(",") if t.strip())


def _tags(value: str) -> str:
    tags = client_tags(value)
    if len(tags) > MAX_TAGS or any(len(t) > MAX_TAG for t in tags):
        raise InvalidSetting(
            f'invalid value for parameter "client_tags": at most {MAX_TAGS} tags of '
            f"at most {MAX_TAG} characters, separated by commas"
        )
    return ",".join(dict.fromkeys(tags))


ISOLATION_LEVELS: Final = ("read uncommitted", "read committed", "repeatable read", "serializable")


def _isolation(value: str) -> str:
    level = " ".join(value.lower().replace("_", " ").split())
    if level not in ISOLATION_LEVELS:
        raise InvalidSetting(
            f"invalid value for transaction isolation: {value[:64]!r} "
            f"(allowed: {', '.join(ISOLATION_LEVELS)})"
        )
    return level


class InvalidSetting(Error):
    sqlstate = "22023"


SETTINGS: Final[dict[str, Setting]] = {
    s.name.lower(): s
    for s in (
        Setting("server_version", SERVER_VERSION, None, True, "the PostgreSQL version spoken"),
        Setting("server_encoding", "UTF8", None, True, "the server's character set"),
        Setting(
            "client_encoding",
            "UTF8",
            _encoding,
            True,
            "the client's character set (UTF8 only)",
        ),
        Setting("DateStyle", "ISO, MDY", _datestyle, True, "display format of dates"),
        Setting("TimeZone", "UTC", _timezone, True, "time zone of timestamptz text"),
        Setting("integer_datetimes", "on", None, True, "timestamps are 64-bit integers"),
        Setting(
            "standard_conforming_strings",
            "on",
            _choice("on", canonical="on"),
            True,
            "backslashes in '...' are literal",
        ),
        Setting("IntervalStyle", "postgres", _choice("postgres", canonical="postgres"), True),
        Setting(
            "application_name",
            "",
            _application,
            True,
            "the client's name for itself; resource selectors route on it",
        ),
        Setting(
            "client_tags",
            "",
            _tags,
            False,
            "tags of the client's queries, separated by commas; resource selectors route on them",
        ),
        Setting("extra_float_digits", "1", _int_range(-15, 3, "extra_float_digits")),
        Setting(
            "search_path", '"$user", public', _any, False, "accepted; resgroups has no schemas"
        ),
        Setting(
            "transaction_isolation",
            "read committed",
            _isolation,
            False,
            "accepted and shown; each statement applies at once (no isolation levels)",
        ),
        Setting(
            "default_transaction_isolation",
            "read committed",
            _isolation,
            False,
            "accepted and shown; each statement applies at once (no isolation levels)",
        ),
        Setting("transaction_read_only", "off", None, False, "transactions can write"),
        Setting("default_transaction_read_only", "off", None, False, "transactions can write"),
        Setting("server_version_num", SERVER_VERSION_NUM, None, False, "the version as a number"),
        Setting("lc_collate", "C.UTF-8", None, False, "text sorts by code point"),
        Setting("lc_ctype", "C.UTF-8", None, False, "character classification"),
        Setting("max_identifier_length", "63", None, False, "as PostgreSQL"),
        Setting("is_superuser", "off", None, True, "is the session the admin"),
        Setting("session_authorization", "", None, True, "the login name"),
    )
}


def find_setting(name: str) -> Setting:
    setting = SETTINGS.get(name.lower())
    if setting is None:
        raise UndefinedObject(
            f'unrecognized configuration parameter "{name}"'
            + did_you_mean(name.lower(), list(SETTINGS))
        )
    return setting


def startup_options(options: str) -> list[tuple[str, str]]:
    """The settings of a startup packet's ``options`` (``-c name=value``, ``-cname=value``,
    ``--name=value``; a backslash escapes a blank, as in PostgreSQL); anything else
    in it is refused, naming it."""
    words, word, escaped = [], [], False
    for ch in options:
        if escaped:
            word.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch.isspace():
            if word:
                words.append("".join(word))
                word = []
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    pairs = []
    items = iter(words)
    for item in items:
        if item == "-c":
            item = next(items, "")
        elif item.startswith("-c") or item.startswith("--"):
            item = item[2:]
        else:
            raise InvalidSetting(
                f"invalid startup option {item[:64]!r}: only -c name=value and --name=value "
                "are accepted"
            )
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise InvalidSetting(f"invalid startup option {item[:64]!r}: expected name=value")
        pairs.append((name.replace("-", "_"), value))
    return pairs


def apply_setting(values: dict[str, str], name: str, value: str | None) -> None:
    """SET name = value (None: RESET / SET ... TO DEFAULT) into ``values``."""
    setting = find_setting(name)
    if setting.check is None:
        raise CantChangeRuntimeParam(f'parameter "{setting.name}" cannot be changed')
    key = setting.name.lower()
    if value is None:
        values.pop(key, None)
    else:
        values[key] = setting.check(value)


# ---- the statements ----------------------------------------------------------------------


@dataclass(frozen=True)
class Transaction:
    action: str  # "begin", "commit", "rollback"


@dataclass(frozen=True)
class Savepoint:
    """``SAVEPOINT name``, ``RELEASE [SAVEPOINT] name``, ``ROLLBACK TO [SAVEPOINT] name``
    (what psycopg's nested ``transaction()`` sends): tracked like BEGIN."""

    action: str  # "savepoint", "release", "rollback"
    name: str


@dataclass(frozen=True)
class SetParameter:
    name: str
    value: str | None  # None: DEFAULT / RESET


@dataclass(frozen=True)
class ShowParameter:
    name: str  # "all" for SHOW ALL


@dataclass(frozen=True)
class Declare:
    name: str
    query: str  # the text after FOR
    offset: int  # where it starts in the statement
    hold: bool
    binary: bool


@dataclass(frozen=True)
class Fetch:
    name: str
    count: int | None  # None: ALL
    move: bool  # MOVE: skip the rows instead of sending them


@dataclass(frozen=True)
class CloseCursor:
    name: str | None  # None: CLOSE ALL


@dataclass(frozen=True)
class Deallocate:
    name: str | None  # None: DEALLOCATE ALL


@dataclass(frozen=True)
class Prepare:
    """``PREPARE name [(type, ...)] AS statement``: a prepared statement of the
    same kind, namespace and limits as the extended protocol's (Parse)."""

    name: str
    types: tuple[str, ...]  # the parameter types as written ("int", "varchar(20)")
    query: str  # the text after AS
    offset: int  # where it starts in the statement


@dataclass(frozen=True)
class Execute:
    """``EXECUTE name [(value, ...)]``: each value a constant, as its text (None: NULL)."""

    name: str
    values: tuple[str | None, ...]


@dataclass(frozen=True)
class Unlisten:
    """``UNLISTEN channel | *``: nothing is ever listened to, so nothing to stop."""


@dataclass(frozen=True)
class CursorExists:
    """``SELECT 1 FROM pg_catalog.pg_cursors WHERE name = '...'``: what psycopg asks
    before closing a cursor whose DECLARE it did not see succeed."""

    name: str


WireCommand = (
    Transaction
    | SetParameter
    | ShowParameter
    | Declare
    | Fetch
    | CloseCursor
    | Deallocate
    | CursorExists
    | Prepare
    | Execute
    | Unlisten
    | Savepoint
)
WIRE_COMMANDS: Final = (
    Transaction, SetParameter, ShowParameter, Declare, Fetch, CloseCursor, Deallocate, CursorExists,
    Prepare, Execute, Unlisten, Savepoint,
)  # fmt: skip
_CURSOR_EXISTS: Final = re.compile(
    r"\s*select\s+1\s+from\s+pg_catalog\.pg_cursors\s+where\s+name\s*=\s*'((?:[^']|'')*)'\s*;?\s*",
    re.IGNORECASE,
)

_TRANSACTION_WORDS: Final = {
    "begin": "begin",
    "start": "begin",
    "commit": "commit",
    "end": "commit",
    "rollback": "rollback",
    "abort": "rollback",
}
_ENGINE_SHOWS: Final = {"users", "groups", "service"}
_TX_MODE_WORDS: Final = {
    "isolation", "level", "serializable", "repeatable", "read", "committed", "uncommitted",
    "write", "only", "deferrable", "not", ",",
}  # fmt: skip


_FIRST_WORDS: Final = {
    *_TRANSACTION_WORDS, "set", "show", "reset", "declare", "fetch", "move", "close", "deallocate",
    "prepare", "execute", "unlisten", "listen", "savepoint", "release",
}  # fmt: skip


def with_connection_statements(exc: SqlSyntaxError) -> SqlSyntaxError:
    """``exc`` (the engine's parser's) with the statements this server runs itself
    (BEGIN, COMMIT, DECLARE, FETCH, ...) among the expected keywords when it is at
    a statement's first word, where the engine's parser knows only its own."""
    if not {"SELECT", "CREATE", "GRANT"} <= set(exc.expected):
        return exc
    expected = sorted({*exc.expected, *(word.upper() for word in _FIRST_WORDS)})
    return SqlSyntaxError(
        exc.reason,
        line=exc.line,
        column=exc.column,
        expected=expected,
        context=exc.context,
        position=exc.position,
    )


# SHOW of a setting PostgreSQL spells in several words
_SHOW_PHRASES: Final = {
    ("time", "zone"): "timezone",
    ("transaction", "isolation", "level"): "transaction_isolation",
    ("session", "authorization"): "session_authorization",
}
# single-character \s: ``(?:\s+)*`` would backtrack exponentially over blanks
_LEAD: Final = re.compile(r"(?:\s|--[^\n]*\n|/\*(?:[^*]|\*(?!/))*\*/)*([A-Za-z_]+)")


def _syntax(sql: str, at: int, message: str) -> SqlSyntaxError:
    line = sql.count("\n", 0, at) + 1
    column = at - (sql.rfind("\n", 0, at) + 1) + 1
    return SqlSyntaxError(message, line=line, column=column, position=at)


def recognize(sql: str) -> WireCommand | None:
    """The connection statement ``sql`` is, or None when it is the engine's."""
    exists = _CURSOR_EXISTS.fullmatch(sql)
    if exists is not None:
        return CursorExists(exists.group(1).replace("''", "'"))
    lead = _LEAD.match(sql)
    if lead is None or lead.group(1).lower() not in _FIRST_WORDS:
        return None  # the engine's: not lexed twice (a long SELECT costs nothing here)
    toks = tokens(sql)
    if not toks or toks[0].kind != "word":
        return None
    first = toks[0].text
    words = [t.text for t in toks]
    if first in ("savepoint", "release") or words[:2] == ["rollback", "to"]:
        return _savepoint(sql, toks)
    if first in _TRANSACTION_WORDS:
        return _transaction(sql, toks)
    if first == "set" and len(words) > 1 and words[1] not in ("resource",):
        return _set(sql, toks)
    if first == "show" and len(toks) == 2 and words[1] not in _ENGINE_SHOWS:
        return ShowParameter(toks[1].text)
    if first == "show" and tuple(words[1:]) in _SHOW_PHRASES:
        return ShowParameter(_SHOW_PHRASES[tuple(words[1:])])
    if first == "prepare":
        return _prepare(sql, toks)
    if first == "execute":
        return _execute(sql, toks)
    if first == "unlisten":
        if len(toks) != 2 or (toks[1].kind not in ("word", "quoted") and toks[1].text != "*"):
            raise _syntax(sql, toks[-1].at, "UNLISTEN takes one channel name or *")
        return Unlisten()
    if first == "listen":
        raise FeatureNotSupported(
            "LISTEN is not supported: resgroups sends no notifications (UNLISTEN is accepted)"
        )
    if first == "reset" and len(toks) == 2 and words[1] not in ("all", "resource"):
        return SetParameter(toks[1].text, None)
    if first == "declare":
        return _declare(sql, toks)
    if first in ("fetch", "move"):
        return _fetch(sql, toks)
    if first == "close":
        if len(toks) != 2:
            raise _syntax(sql, toks[-1].at, "CLOSE takes one cursor name or ALL")
        return CloseCursor(
            None if toks[1].kind == "word" and toks[1].text == "all" else toks[1].text
        )
    if first == "deallocate":
        rest = toks[2:] if len(toks) > 1 and toks[1].text == "prepare" else toks[1:]
        if len(rest) != 1:
            raise _syntax(sql, toks[-1].at, "DEALLOCATE takes one statement name or ALL")
        return Deallocate(
            None if rest[0].kind == "word" and rest[0].text == "all" else rest[0].text
        )
    return None


def _transaction(sql: str, toks: list[Token]) -> Transaction:
    action = _TRANSACTION_WORDS[toks[0].text]
    rest = toks[1:]
    if toks[0].text == "start":
        if not rest or rest[0].text != "transaction":
            raise _syntax(sql, toks[0].at, "expected START TRANSACTION")
        rest = rest[1:]
    elif rest and rest[0].text in ("work", "transaction"):
        rest = rest[1:]
    if action == "begin":
        bad = [t for t in rest if t.text not in _TX_MODE_WORDS]
    else:  # AND NO CHAIN is the only chaining accepted
        bad = [] if [t.text for t in rest] in ([], ["and", "no", "chain"]) else rest
    if bad:
        raise _syntax(sql, bad[0].at, f"unexpected {bad[0].text!r} in {toks[0].text.upper()}")
    return Transaction(action)


def _set(sql: str, toks: list[Token]) -> SetParameter:
    rest = toks[1:]
    words = [t.text for t in rest]
    for lead, name in (
        (["transaction"], "transaction_isolation"),
        (["session", "characteristics", "as", "transaction"], "default_transaction_isolation"),
    ):
        n = len(lead)
        if words[:n] == lead and words[n : n + 2] == ["isolation", "level"] and words[n + 2 :]:
            return SetParameter(name, " ".join(words[n + 2 :]))
    if rest and rest[0].text in ("session", "local") and len(rest) > 1:
        if rest[0].text == "local":
            raise FeatureNotSupported("SET LOCAL is not supported: use SET (session scope)")
        rest = rest[1:]
    if len(rest) >= 2 and rest[0].text == "time" and rest[1].text == "zone":
        name, values = "timezone", rest[2:]
    elif len(rest) >= 2 and rest[1].text in ("=", "to"):
        name, values = rest[0].text, rest[2:]
    else:
        at = rest[1].at if len(rest) > 1 else toks[-1].at
        raise _syntax(sql, at, "expected SET name = value or SET name TO value")
    if not values:
        raise _syntax(sql, toks[-1].at, f"SET {name}: a value is missing")
    if len(values) == 1 and values[0].kind == "word" and values[0].text == "default":
        return SetParameter(name, None)
    parts = [v.text for v in values if v.text != ","]
    return SetParameter(name, ", ".join(parts))


def _savepoint(sql: str, toks: list[Token]) -> Savepoint:
    rest = toks[2:] if toks[0].text == "rollback" else toks[1:]
    if toks[0].text != "savepoint" and rest and rest[0].text == "savepoint":
        rest = rest[1:]
    if len(rest) != 1 or rest[0].kind not in ("word", "quoted"):
        at = rest[-1].at if rest else toks[-1].at
        raise _syntax(sql, at, f"{toks[0].text.upper()} takes one savepoint name")
    return Savepoint(toks[0].text, rest[0].text)


def _prepare(sql: str, toks: list[Token]) -> Prepare:
    if len(toks) < 2 or toks[1].kind not in ("word", "quoted"):
        raise _syntax(sql, toks[-1].at, "PREPARE needs a statement name")
    i, depth = 2, 0
    types: list[str] = []
    written: list[str] = []
    if i < len(toks) and toks[i].text == "(":
        i += 1
        while i < len(toks) and (depth or toks[i].text != ")"):
            text = toks[i].text
            depth += (text == "(") - (text == ")")
            if text == "," and not depth:
                types.append(" ".join(written).replace(" (", "(").replace("( ", "("))
                written = []
            else:
                written.append(text)
            i += 1
        if i == len(toks) or not written:
            at = toks[min(i, len(toks) - 1)].at
            raise _syntax(sql, at, "PREPARE name (type, ...): a type is missing")
        types.append(" ".join(written).replace(" (", "(").replace("( ", "("))
        i += 1
    if i >= len(toks) - 1 or toks[i].text != "as":
        at = toks[min(i, len(toks) - 1)].at
        raise _syntax(sql, at, "expected PREPARE name [(type, ...)] AS statement")
    offset = toks[i + 1].at
    return Prepare(toks[1].text, tuple(types), sql[offset:], offset)


def _execute(sql: str, toks: list[Token]) -> Execute:
    if len(toks) < 2 or toks[1].kind not in ("word", "quoted"):
        raise _syntax(sql, toks[-1].at, "EXECUTE needs a prepared statement's name")
    rest = toks[2:]
    if not rest:
        return Execute(toks[1].text, ())
    if rest[0].text != "(" or rest[-1].text != ")":
        raise _syntax(sql, rest[0].at, "expected EXECUTE name [(value, ...)]")
    values: list[str | None] = []
    items = rest[1:-1]
    for n, tok in enumerate(items):
        if n % 2 == 1:
            if tok.text != ",":
                raise _syntax(sql, tok.at, "EXECUTE's values are constants separated by commas")
            continue
        if tok.kind in ("number", "string"):
            values.append(tok.text)
        elif tok.kind == "word" and tok.text in ("true", "false", "null"):
            values.append(None if tok.text == "null" else tok.text)
        else:
            raise FeatureNotSupported(
                f"EXECUTE's values must be constants (numbers, strings, TRUE, FALSE, NULL), "
                f"not {tok.text[:40]!r}"
            )
    if items and len(items) % 2 == 0:
        raise _syntax(sql, items[-1].at, "EXECUTE: a value is missing after ','")
    return Execute(toks[1].text, tuple(values))


def _declare(sql: str, toks: list[Token]) -> Declare:
    if len(toks) < 2:
        raise _syntax(sql, toks[0].at, "DECLARE needs a cursor name")
    name = toks[1].text
    binary = hold = False
    i = 2
    while i < len(toks) and toks[i].text != "for":
        word = toks[i].text
        if word == "binary":
            binary = True
        elif word in ("with", "without") and i + 1 < len(toks) and toks[i + 1].text == "hold":
            hold = word == "with"
            i += 1
        elif word not in ("insensitive", "asensitive", "no", "scroll", "cursor"):
            raise _syntax(sql, toks[i].at, f"unexpected {word!r} in DECLARE")
        if word == "scroll" and not (i > 2 and toks[i - 1].text == "no"):
            raise FeatureNotSupported("scrollable cursors are not supported (NO SCROLL only)")
        i += 1
    if i >= len(toks) - 1:
        raise _syntax(sql, toks[-1].at, "DECLARE ... CURSOR FOR needs a query after FOR")
    offset = toks[i + 1].at
    return Declare(name, sql[offset:], offset, hold, binary)


def _count(sql: str, tok: Token) -> int:
    """A FETCH/MOVE row count: a whole number (``1.5`` and ``1e3`` are not), a bigint."""
    digits = tok.text.lstrip("+")
    if not digits.lstrip("-").isdigit():
        raise _syntax(sql, tok.at, f"FETCH count must be a whole number, not {tok.text[:20]}")
    if len(digits.lstrip("-").lstrip("0")) > MAX_FETCH_DIGITS or abs(int(digits)) >= 2**63:
        raise NumericOverflow(f"FETCH count {tok.text[:24]} is out of range for type bigint")
    return int(digits)


def _fetch(sql: str, toks: list[Token]) -> Fetch:
    move = toks[0].text == "move"
    rest = toks[1:]
    count: int | None = 1
    if rest and rest[0].kind == "word" and rest[0].text in ("next", "forward"):
        forward = rest[0].text == "forward"
        rest = rest[1:]
        if forward and rest and rest[0].kind == "number":
            count, rest = _count(sql, rest[0]), rest[1:]
        elif forward and rest and rest[0].text == "all":
            count, rest = None, rest[1:]
    elif rest and rest[0].kind == "number":
        count, rest = _count(sql, rest[0]), rest[1:]
    elif rest and rest[0].text == "all":
        count, rest = None, rest[1:]
    if rest and rest[0].text in ("from", "in"):
        rest = rest[1:]
    if len(rest) != 1 or rest[0].kind not in ("word", "quoted"):
        at = rest[0].at if rest else toks[-1].at
        raise _syntax(
            sql,
            at,
            f"{toks[0].text.upper()} supports [NEXT | FORWARD [n | ALL] | n | ALL] "
            "[FROM | IN] cursor (forward only)",
        )
    if count is not None and count < 0:
        raise FeatureNotSupported(
            "cursors here are forward only: a negative count is not supported"
        )
    return Fetch(rest[0].text, count, move)
