"""Cutting SQL text into statements at top-level semicolons, as it arrives.

The shell reads a script line by line and runs each statement as soon as its
``;`` arrives; a driver may hand over a script in pieces. :class:`Splitter`
scans every character once, however the text is fed, by keeping its lexical
state (outside, in a 'string', in a "quoted name", in a -- comment or a
/* comment */) between chunks, so the cost of a statement of L lines is O(L),
not the O(L²) of re-reading the whole statement at every line.

The lexical rules are the grammar's (``grammar.lark``): strings and quoted
names double their quote to escape it; a ``--`` comment runs to the end of
the line; a block comment ends at the first ``*/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Final

_OUTSIDE_STOPS: Final = re.compile(r"""['";]|--|/\*""")


class _State(Enum):
    OUTSIDE = 0
    STRING = 1  # '...'
    NAME = 2  # "..."
    LINE_COMMENT = 3
    BLOCK_COMMENT = 4


_QUOTE: Final = {_State.STRING: "'", _State.NAME: '"'}


@dataclass(frozen=True)
class Piece:
    """One statement: its text (up to and including its ``;``, with the blanks and
    comments before it), its offset in everything fed, and the line it starts on."""

    offset: int
    line: int
    text: str


class Splitter:
    """Feed text in any chunks; get back each statement once its ``;`` has come.

    Pieces holding nothing but blanks and comments are dropped. An unterminated
    string, name or comment keeps its statement open until :meth:`finish`,
    which returns what is left for the parser to report.
    """

    def __init__(self, *, line: int = 1) -> None:
        self.reset(line=line)

    def reset(self, *, line: int = 1, offset: int = 0) -> None:
        """Forget what is pending; the next text starts at ``line`` and ``offset``."""
        self._parts: list[str] = []  # the statement in progress, scanned
        self._tail = ""  # fed but not scanned yet: a character the next one decides
        self._offset = offset  # where the statement in progress starts in all text fed
        self._line = line  # the line it starts on
        self._state = _State.OUTSIDE
        self._code = False  # it holds code, not only blanks and comments

    @property
    def idle(self) -> bool:
        """Nothing pending but blanks and comments: a new statement would start here."""
        return (
            self._state in (_State.OUTSIDE, _State.LINE_COMMENT)
            and not self._code
            and not self._tail.strip()
        )

    def feed(self, chunk: str) -> list[Piece]:
        """Add ``chunk``; the statements it completes, in order. Scans ``chunk``
        (and at most one character held back from before) once."""
        text = self._tail + chunk
        pieces: list[Piece] = []
        start, i, end = 0, 0, len(text)
        state, code = self._state, self._code
        while i < end:
            if state is _State.OUTSIDE:
                stop = _OUTSIDE_STOPS.search(text, i)
                if stop is None:
                    hold = 1 if text.endswith(("-", "/")) else 0  # '--' or '/*' may follow
                    code = code or bool(text[i : end - hold].strip())
                    i = end - hold
                    break
                code = code or bool(text[i : stop.start()].strip())
                i = stop.end()
                token = stop.group()
                if token == ";":
                    whole = "".join(self._parts) + text[start:i]
                    if code:
                        pieces.append(Piece(self._offset, self._line, whole))
                    self._parts, self._offset = [], self._offset + len(whole)
                    self._line += whole.count("\n")
                    start, code = i, False
                elif token == "'":
                    state, code = _State.STRING, True
                elif token == '"':
                    state, code = _State.NAME, True
                elif token == "--":
                    state = _State.LINE_COMMENT
                else:
                    state = _State.BLOCK_COMMENT
            elif state is _State.LINE_COMMENT:
                newline = text.find("\n", i)
                if newline < 0:
                    i = end
                    break
                state, i = _State.OUTSIDE, newline + 1
            elif state is _State.BLOCK_COMMENT:
                close = text.find("*/", i)
                if close < 0:
                    i = max(i, end - 1)  # a '*' at the end may be half of '*/'
                    break
                state, i = _State.OUTSIDE, close + 2
            else:  # in a string or a quoted name
                quote = _QUOTE[state]
                at = text.find(quote, i)
                if at < 0:
                    i = end
                    break
                if at + 1 == end:  # closing, or the first of a doubled quote
                    i = at
                    break
                if text[at + 1] == quote:
                    i = at + 2
                else:
                    state, i = _State.OUTSIDE, at + 1
        if i > start:
            self._parts.append(text[start:i])
        self._tail = text[i:]
        self._state, self._code = state, code
        return pieces

    def finish(self) -> Piece | None:
        """End of input: what is left, if it holds code (even without its ``;``)."""
        rest = Piece(self._offset, self._line, "".join(self._parts) + self._tail)
        has_code = (
            self._code
            or bool(self._tail.strip())
            or self._state in (_State.STRING, _State.NAME, _State.BLOCK_COMMENT)
        )
        self.reset(line=self._line + rest.text.count("\n"), offset=self._offset + len(rest.text))
        return rest if has_code else None


def split_statements(text: str) -> Iterator[tuple[int, str]]:
    """Split a whole script at top-level ``;`` into (offset, statement text) pairs.

    Quotes and comments are respected; blank pieces are skipped. A piece that
    does not end (an unterminated string) runs to the end of the text, where
    parsing it reports the error.
    """
    splitter = Splitter()
    for piece in splitter.feed(text):
        yield piece.offset, piece.text
    rest = splitter.finish()
    if rest is not None:
        yield rest.offset, rest.text


def is_complete(text: str) -> bool:
    """Does ``text`` hold at least one statement and end with a finished one (its
    ``;`` outside any string, name or comment, nothing but blanks after it)?"""
    splitter = Splitter()
    return bool(splitter.feed(text)) and splitter.idle
