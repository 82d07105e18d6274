"""What both halves of the parser's transformer share (:mod:`.to_ast_admin`,
:mod:`.to_ast_query`): errors positioned at a token (``parse_script`` draws them
on the text), the numeric literal's limit, the placeholders' state while a
prepared statement is typed, quoting, and identifiers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from lark import Token, Transformer, v_args

from resgroups.sql import ast
from resgroups.sql.params import placeholder_number

# one of the front end's limits (the others are in resgroups.sql.parser)
MAX_LITERAL_CHARS: Final = 100  # a numeric literal, as written


def _check_literal(tok: Token) -> None:
    if len(tok) > MAX_LITERAL_CHARS:
        raise _PositionedLimit(
            f"numeric literal of {len(tok)} characters exceeds the limit of {MAX_LITERAL_CHARS}",
            tok,
        )


class _PositionedError(Exception):
    """Raised inside the transformer; ``parse_script`` adds line, column and caret."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


class _PositionedLimit(_PositionedError):
    """A limit of MAX_* exceeded: ProgramLimitExceeded, with its position."""


class _PositionedParameter(_PositionedError):
    """``$n`` where no value is bound: UndefinedParameter (42P02), with its position."""


class _Placeholders(threading.local):
    allowed: bool = False
    # the types of placeholders where the grammar takes only a literal (LIMIT $1,
    # an integer option's value), known from the position alone
    literal_types: dict[int, str] | None = None


_placeholders: Final = _Placeholders()


@contextmanager
def placeholders_allowed() -> Iterator[dict[int, str]]:
    """Parses on this thread keep ``$n`` as :class:`~resgroups.sql.ast.Param`
    (to infer the types of a prepared statement's parameters) instead of
    refusing it: a statement runs only with its values bound. Yields the types
    of the placeholders found where only a literal stands (``LIMIT $1``: int),
    filled as the block parses; such a placeholder parses as a stand-in value."""
    before = _placeholders.allowed, _placeholders.literal_types
    found: dict[int, str] = {}
    _placeholders.allowed, _placeholders.literal_types = True, found
    try:
        yield found
    finally:
        _placeholders.allowed, _placeholders.literal_types = before


def _literal_placeholder(tok: Token, type_name: str | None) -> None:
    """``$n`` where the grammar takes a literal: recorded with its type, or 42P02."""
    if not _placeholders.allowed:
        raise _PositionedParameter(f"there is no parameter {tok}", tok)
    found = _placeholders.literal_types
    if found is not None and type_name is not None:
        found.setdefault(placeholder_number(tok[1:]), type_name)


def _unquote(text: str, quote: str) -> str:
    return text[1:-1].replace(quote * 2, quote)


@v_args(inline=True)
class NamesToAst(Transformer[Token, Any]):
    """Identifiers, plain and quoted: names in every kind of statement."""

    def ident(self, tok: Token) -> ast.Ident:
        return ast.Ident(str(tok))

    def quoted_ident(self, tok: Token) -> ast.Ident:
        text = _unquote(tok, '"')
        if not text:
            raise _PositionedError("empty quoted identifier", tok)
        return ast.Ident(text, quoted=True)
