"""Bound parameters: ``$1``, ``$2`` ... replaced by SQL literals before parsing.

The extended protocol of a PostgreSQL client sends a statement with ``$n``
placeholders and, separately, its values. resgroups' grammar has no
placeholders; a bound statement is its text with each ``$n`` outside strings,
quoted names and comments replaced by the literal of its value, so every
statement, DDL included (``WITH (max_active_queries = $1)``), takes
parameters the same way and no value is ever spliced in as SQL code: a text
value becomes a quoted string with its quotes doubled.

:func:`bind` also returns a map from offsets in the bound text back to the
original, so that a syntax error points at what the client wrote.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Final

from resgroups.errors import Error, InvalidParameter, ProgramLimitExceeded

# a placeholder, or something a placeholder cannot be inside (the lexical
# rules of grammar.lark: strings and names double their quote to escape it)
_SCAN: Final = re.compile(
    r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|--[^\n]*|/\*(?:.|\n)*?(?:\*/|\Z)|\$([0-9]+)"""
)

MAX_PARAMETERS: Final = 65535  # what a Bind message can carry (an int16 count)


class UndefinedParameter(Error):
    """``$n`` with no n-th value."""

    sqlstate = "42P02"


def placeholder_number(digits: str) -> int:
    """The n of ``$n``; ProgramLimitExceeded (54000) past MAX_PARAMETERS, read
    from at most 6 digits, so ``$2147483648`` builds nothing of its size."""
    stripped = digits.lstrip("0") or "0"
    if len(stripped) > 5 or int(stripped) > MAX_PARAMETERS:
        shown = stripped if len(stripped) <= 12 else stripped[:12] + "..."
        raise ProgramLimitExceeded(
            f"there is no parameter ${shown}: a statement takes at most {MAX_PARAMETERS} parameters"
        )
    return int(stripped)


def placeholders(sql: str) -> int:
    """The highest ``$n`` in ``sql`` (0: none); linear in ``len(sql)``."""
    highest = 0
    for m in _SCAN.finditer(sql):
        if m.group(1):
            highest = max(highest, placeholder_number(m.group(1)))
    return highest


def literal(value: object) -> str:
    """The SQL literal of a parameter value."""
    match value:
        case None:
            return "NULL"
        case bool():
            return "TRUE" if value else "FALSE"
        case int():
            if value == -(2**63):  # its negation does not fit: "(-9223372036854775808)::int"
                return f"({value})"  # must negate the literal before the cast
            return str(value) if value >= 0 else f" {value}"  # "x-$1" must not become "x--1"
        case float():
            if not math.isfinite(value):
                raise InvalidParameter(
                    f"parameter value {value!r}: resgroups SQL has no literal for an infinite "
                    "or NaN float; send a finite number"
                )
            text = repr(value)
            return text if value >= 0 else f" {text}"
        case Decimal():
            if not value.is_finite():
                raise InvalidParameter(f"parameter value {value}: not a finite number")
            text = format(value, "f")
            return text if value >= 0 else f" {text}"
        case str():
            return "'" + value.replace("'", "''") + "'"
        case datetime() | date():
            return "'" + value.isoformat() + "'"
    raise InvalidParameter(
        f"parameter of type {type(value).__name__} is not supported "
        "(allowed: NULL, bool, integers, floats, numeric, text, timestamps)"
    )


def bind(sql: str, values: Sequence[object]) -> tuple[str, Callable[[int], int]]:
    """``sql`` with every ``$n`` replaced by the literal of ``values[n-1]``, and a
    function mapping a 0-based offset in the result to one in ``sql``."""
    pieces: list[str] = []
    spans: list[tuple[int, int, int, int]] = []  # (new start, new end, old start, old end)
    last = 0
    new_len = 0
    for match in _SCAN.finditer(sql):
        number = match.group(1)
        if number is None:
            continue
        n = placeholder_number(number)
        if not 1 <= n <= len(values):
            raise UndefinedParameter(
                f"there is no parameter ${n} (the statement was bound with {len(values)} "
                f"value{'' if len(values) == 1 else 's'})"
            )
        text = literal(values[n - 1])
        pieces.append(sql[last : match.start()])
        new_len += match.start() - last
        spans.append((new_len, new_len + len(text), match.start(), match.end()))
        pieces.append(text)
        new_len += len(text)
        last = match.end()
    pieces.append(sql[last:])
    bound = "".join(pieces)

    def original(offset: int) -> int:
        shift = 0
        for new_start, new_end, old_start, old_end in spans:
            if offset < new_start:
                break
            if offset < new_end:
                return old_start  # inside a value: point at its placeholder
            shift = old_end - new_end
        return offset + shift

    return bound, original
