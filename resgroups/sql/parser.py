"""Text to statements: Lark's LALR parser with an embedded Transformer.

The grammar lives in ``grammar.lark`` beside this file. The transformer runs
during the parse (no tree is built) and returns the frozen dataclasses of
:mod:`resgroups.sql.ast`; parameter values are checked and typed as they are
reduced, so a bad value fails the parse with :class:`InvalidParameter`.
Its methods are in :mod:`.to_ast_admin` (the administration statements) and
:mod:`.to_ast_query` (queries and expressions), over :mod:`.to_ast_common`
(positioned errors, placeholders, identifiers); ``_ToAst`` here composes them.

``parse_script`` costs about 50-100 µs for a typical DDL statement
(``perf/bench_parse.py``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any, Final

from lark import Lark, Token, Transformer, v_args
from lark import __version__ as lark_version
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken
from lark.lexer import BasicLexer, PatternStr

from resgroups.errors import ProgramLimitExceeded, SqlSyntaxError
from resgroups.sql import ast
from resgroups.sql.params import UndefinedParameter
from resgroups.sql.to_ast_admin import _INTEGER_OPTIONS as _INTEGER_OPTIONS
from resgroups.sql.to_ast_admin import RESOURCE_OBJECTS as RESOURCE_OBJECTS
from resgroups.sql.to_ast_admin import AdminToAst
from resgroups.sql.to_ast_admin import _no_repeats as _no_repeats
from resgroups.sql.to_ast_admin import _resource_object as _resource_object
from resgroups.sql.to_ast_common import MAX_LITERAL_CHARS, NamesToAst, placeholders_allowed
from resgroups.sql.to_ast_common import _check_literal as _check_literal
from resgroups.sql.to_ast_common import _literal_placeholder as _literal_placeholder
from resgroups.sql.to_ast_common import _Placeholders as _Placeholders
from resgroups.sql.to_ast_common import _placeholders as _placeholders
from resgroups.sql.to_ast_common import _PositionedError as _PositionedError
from resgroups.sql.to_ast_common import _PositionedLimit as _PositionedLimit
from resgroups.sql.to_ast_common import _PositionedParameter as _PositionedParameter
from resgroups.sql.to_ast_common import _unquote as _unquote
from resgroups.sql.to_ast_query import _ESCAPED as _ESCAPED
from resgroups.sql.to_ast_query import _ESCAPES as _ESCAPES
from resgroups.sql.to_ast_query import MAX_SELECT_ITEMS as MAX_SELECT_ITEMS
from resgroups.sql.to_ast_query import QueryToAst
from resgroups.sql.to_ast_query import _binary as _binary

__all__ = [
    "MAX_DEPTH",
    "MAX_LITERAL_CHARS",
    "MAX_SCRIPT_CHARS",
    "interruptible",
    "keywords",
    "parse_one",
    "parse_script",
    "placeholders_allowed",
]

# The front end's limits (docs/sql.md): every statement is answered in bounded
# time and memory, and everything after the parse (typing, evaluation,
# formatting) may recurse over a tree no deeper than MAX_DEPTH.
MAX_SCRIPT_CHARS: Final = 1_000_000  # the text given to one execute()
# MAX_LITERAL_CHARS (a numeric literal, as written) is to_ast_common's: the
# transformer checks it
MAX_DEPTH: Final = 200  # nesting of expressions (parentheses, operators, calls)
INTERRUPT_EVERY: Final = 1024  # tokens lexed between two interrupt checks


class _Interrupt(threading.local):
    check: Callable[[], None] | None = None
    tokens: int = 0


_interrupt: Final = _Interrupt()


@contextmanager
def interruptible(check: Callable[[], None]) -> Iterator[None]:
    """Parses on this thread call ``check`` every INTERRUPT_EVERY tokens; what it
    raises (a cancel, the client gone) ends the parse. A long statement is
    then as interruptible as a query (the wire protocol's cancel and
    disconnect)."""
    before = _interrupt.check
    _interrupt.check, _interrupt.tokens = check, 0
    try:
        yield
    finally:
        _interrupt.check = before


def _tick(tok: Token) -> Token:
    check = _interrupt.check
    if check is not None:
        _interrupt.tokens += 1
        if _interrupt.tokens % INTERRUPT_EVERY == 0:
            check()
    return tok


@v_args(inline=True)
class _ToAst(NamesToAst, AdminToAst, QueryToAst, Transformer[Token, Any]):
    """Parse trees to :mod:`resgroups.sql.ast` during the parse: Lark finds a
    rule's callback by its name among the methods of these parts (each part
    inlines its children with ``v_args`` itself: the decorator skips what a
    class inherits)."""

    # ---- the script
    def script(self, *statements: ast.Statement | None) -> list[ast.Statement]:
        return [s for s in statements if s is not None]


def warm() -> None:
    """Build the parser now (about a second of LALR tables), not in the first
    statement's time: what a server does before it says it is ready."""
    _parser()


# A directory where the built LALR tables may be kept between processes (opt-in;
# the test suite sets it for the servers and nodes it starts). Unset, every
# process builds its own tables, as before. The file is a pickle: name only a
# directory no one else may write to.
PARSER_CACHE_ENV: Final = "RESGROUPS_PARSER_CACHE"


def _build(grammar: str, cache_file: str | None = None) -> Lark:
    options: dict[str, Any] = {} if cache_file is None else {"cache": cache_file}
    return Lark(
        grammar,
        parser="lalr",
        lexer="basic",
        transformer=_ToAst(),
        start="script",
        maybe_placeholders=True,
        **options,
    )


def _build_cached(grammar: str, directory: str) -> Lark:
    """The parser, its tables loaded from ``directory`` when a process (of the same
    grammar, Lark and Python) has kept them there, else built and kept there.
    Lark names what it keeps by a digest of all three (checked again on loading);
    a lock beside the file lets one process at a time read or write it, so
    processes starting together never read half of one."""
    digest = hashlib.sha256(
        "\0".join((grammar, lark_version, repr(sys.version_info[:2]))).encode()
    ).hexdigest()[:24]
    path = os.path.join(directory, f"resgroups-parser-{digest}.lark")
    try:
        lock = open(path + ".lock", "a")  # noqa: SIM115 (the with below closes it)
    except OSError:
        return _build(grammar)  # no such directory, read-only: built as if unset
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(grammar, path)


@cache
def _parser() -> Lark:
    grammar = resources.files("resgroups.sql").joinpath("grammar.lark").read_text("utf-8")
    directory = os.environ.get(PARSER_CACHE_ENV)
    lark = _build_cached(grammar, directory) if directory else _build(grammar)
    # every terminal ticks the interrupt counter (a call per token, ~1 % of a parse)
    lark.lexer_conf.callbacks = dict.fromkeys((t.name for t in lark.terminals), _tick)
    lark.parser.lexer = BasicLexer(lark.lexer_conf)
    # Lark.lex() builds a new lexer on every call (~8 ms) unless one is kept here;
    # the shell lexes every line it reads to find where statements end.
    lark.lexer = lark._build_lexer()
    return lark


_TOKEN_NAMES: Final = {
    "NAME": "identifier",
    "QUOTED_NAME": "quoted identifier",
    "STRING": "string",
    "NUMBER": "number",
    "$END": "end of input",
}


@cache
def _display_names() -> dict[str, str]:
    names = dict(_TOKEN_NAMES)
    for term in _parser().terminals:
        if term.name in names:
            continue
        if isinstance(term.pattern, PatternStr):
            value = term.pattern.value
            names[term.name] = value.upper() if value.isalpha() else f"'{value}'"
        else:
            names[term.name] = term.name.lower()
    return names


def _expected(names: set[str] | frozenset[str]) -> list[str]:
    display = _display_names()
    return sorted({display.get(n, n) for n in names})


_CONTEXT_CHARS: Final = 60  # shown on each side of the caret: a long line is cut


def _caret(text: str, pos: int) -> tuple[int, int, str]:
    """1-based line and column of ``pos``, and that line (cut to a window around
    ``pos`` when long, so an error never echoes a huge statement) with a caret."""
    pos = max(0, min(pos, len(text)))
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    source_line = text[start : end if end >= 0 else len(text)]
    column = pos - start + 1
    left = max(0, column - 1 - _CONTEXT_CHARS)
    right = min(len(source_line), column - 1 + _CONTEXT_CHARS)
    prefix = "..." if left else ""
    shown = prefix + source_line[left:right] + ("..." if right < len(source_line) else "")
    return line, column, f"{shown}\n{' ' * (len(prefix) + column - 1 - left)}^"


def _syntax_error(text: str, message: str, pos: int, expected: list[str]) -> SqlSyntaxError:
    line, column, context = _caret(text, pos)
    return SqlSyntaxError(
        message, line=line, column=column, expected=expected, context=context, position=pos
    )


# a password literal, possibly unterminated: its text must never reach an error
_PASSWORD_LITERAL: Final = re.compile(r"\bpassword(\s+)'((?:[^']|'')*)", re.IGNORECASE)


def redact_passwords(text: str) -> str:
    """``text`` with every password literal's characters masked (same length and
    lines, so positions, lines and carets stay true)."""

    def mask(match: re.Match[str]) -> str:
        secret = match.group(2)
        return match.group(0)[: match.start(2) - match.start(0)] + re.sub(r"[^\n]", "*", secret)

    return _PASSWORD_LITERAL.sub(mask, text)


def _describe(token: Token, text: str) -> str:
    name = _display_names().get(token.type, token.type)
    if token.type == "$END":
        return "end of input"
    if token.type in ("NAME", "QUOTED_NAME", "STRING", "NUMBER"):
        shown = (
            text[token.start_pos : token.end_pos]
            if token.start_pos is not None and token.end_pos is not None
            else str(token)
        )
        return f"{name} {shown}"
    return f"keyword {name}" if name.isalpha() else f"{name}"


def _translate(text: str, exc: UnexpectedInput) -> SqlSyntaxError:
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        if token.type == "$END":
            return _syntax_error(
                text, "unexpected end of input", len(text.rstrip()), _expected(exc.expected)
            )
        message = f"unexpected {_describe(token, text)}"
        if "NAME" in exc.expected and str(token).isidentifier():
            message += f' (keywords are reserved: write "{token}" to use it as a name)'
        pos = token.start_pos if token.start_pos is not None else len(text)
        return _syntax_error(text, message, pos, _expected(exc.expected))
    if isinstance(exc, UnexpectedCharacters):
        at = exc.pos_in_stream or 0
        char = text[at] if at < len(text) else ""
        message = {
            "'": "unterminated string literal",
            '"': "unterminated quoted identifier",
        }.get(char, f"unexpected character {char!r}")
        return _syntax_error(text, message, at, _expected(exc.allowed or set()))
    pos = getattr(exc, "pos_in_stream", None) or len(text)
    return _syntax_error(text, "syntax error", pos, [])


def parse_script(text: str) -> list[ast.Statement]:
    """Every statement of ``text`` (separated by ``;``), in order.

    Raises :class:`SqlSyntaxError` (with line, column, expected tokens and a
    caret) or :class:`InvalidParameter` for a bad parameter value.
    """
    if len(text) > MAX_SCRIPT_CHARS:
        raise ProgramLimitExceeded(
            f"statement text of {len(text):,} characters exceeds the limit of {MAX_SCRIPT_CHARS:,}"
        )
    try:
        result: list[ast.Statement] = _parser().parse(text)  # type: ignore[assignment]
    except UnexpectedInput as exc:  # errors are drawn on the text with passwords masked
        raise _translate(redact_passwords(text), exc) from None
    except _PositionedError as exc:
        pos = exc.token.start_pos if exc.token.start_pos is not None else 0
        error = _syntax_error(redact_passwords(text), exc.message, pos, [])
        if isinstance(exc, _PositionedLimit):
            raise ProgramLimitExceeded(str(error)) from None
        if isinstance(exc, _PositionedParameter):
            raise UndefinedParameter(str(error)) from None
        raise error from None
    if len(text) > MAX_DEPTH // 2:  # shorter text cannot nest that deep
        for stmt in result:
            _check_depth(stmt)
    return result


def _check_depth(stmt: ast.Statement) -> None:
    """ProgramLimitExceeded if ``stmt`` nests deeper than MAX_DEPTH (an explicit
    stack: the check itself never recurses)."""
    stack: list[tuple[object, int]] = [(stmt, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProgramLimitExceeded(
                f"expression nesting depth exceeds the limit of {MAX_DEPTH} "
                "(parentheses, operators and calls nested inside each other)"
            )
        if isinstance(node, tuple | list):
            stack.extend((child, depth) for child in node)
        elif dataclasses.is_dataclass(node) and not isinstance(node, type):
            stack.extend((getattr(node, f.name), depth + 1) for f in dataclasses.fields(node))


def parse_one(text: str) -> ast.Statement:
    """Exactly one statement, or SqlSyntaxError."""
    statements = parse_script(text)
    if len(statements) != 1:
        raise _syntax_error(
            redact_passwords(text),
            f"expected exactly one statement, found {len(statements)}",
            0,
            [],
        )
    return statements[0]


def keywords() -> list[str]:
    """Every reserved keyword, upper-case (for completion and documentation)."""
    return sorted(
        name for name in set(_display_names().values()) if name.isalpha() and name.isupper()
    )
