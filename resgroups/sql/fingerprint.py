"""A statement's fingerprint (SPEC §16): its text with literals and whitespace
normalized, so that the same query with other constants is recognised.

``SELECT sum(x)  FROM long_sequence(100000000) WHERE x > 5`` and
``select SUM(x) from long_sequence(200) where x > 7`` share the fingerprint
``select sum(x) from long_sequence(?) where x > ?``:

- string literals (``'...'``, ``E'...'``), numbers and ``$n`` parameters
  become ``?``;
- comments go, runs of whitespace become one space, none is kept beside
  punctuation;
- unquoted words are lower-cased; quoted identifiers stay as written.

One pass of one regular expression over the text (linear), so a watch list
can fingerprint every statement it sees.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Final

from resgroups.sql.parser import keywords

_TOKEN: Final = re.compile(
    r"""
      (?P<space>\s+|--[^\n]*|/\*.*?(?:\*/|\Z))
    | (?P<string>[eE]'(?:[^'\\]|\\.|'')*(?:'|\Z)|'(?:[^']|'')*(?:'|\Z))
    | (?P<quoted>"(?:[^"]|"")*(?:"|\Z))
    | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|\$\d+)
    | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    | (?P<op>::|<=|>=|<>|!=|\|\||!~\*?|~\*|[-+*/%<>=~!|&^#@?])
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_NO_SPACE_BEFORE: Final = frozenset({")", ",", ".", ";", "[", "]", "::"})
_NO_SPACE_AFTER: Final = frozenset({"(", ".", "[", "::"})


@cache
def _keywords() -> frozenset[str]:
    return frozenset(k.lower() for k in keywords())


def _call(before: str) -> bool:
    """Is a ``(`` after ``before`` a call's (``count(``), not a group (``where (``)?"""
    first = before[:1]
    return first == '"' or ((first.isalpha() or first == "_") and before not in _keywords())


def fingerprint(statement: str) -> str:
    """The normalized text of ``statement`` (see the module's docstring): the
    same whatever the spacing, case and constants of the original."""
    tokens: list[str] = []
    for match in _TOKEN.finditer(statement):
        kind, text = match.lastgroup, match.group()
        if kind == "space":
            continue
        if kind in ("string", "number"):
            tokens.append("?")
        elif kind == "word":
            tokens.append(text.lower())
        else:
            tokens.append(text)
    while tokens and tokens[-1] == ";":
        tokens.pop()
    parts: list[str] = []
    for token in tokens:
        if (
            parts
            and token not in _NO_SPACE_BEFORE
            and parts[-1] not in _NO_SPACE_AFTER
            and not (token == "(" and _call(parts[-1]))
        ):
            parts.append(" ")
        parts.append(token)
    return "".join(parts)
