"""Bound parameters: ``$1``, ``$2`` ... replaced by values, in the parsed statement
or in its text.

The extended protocol of a PostgreSQL client sends a statement with ``$n``
placeholders and, separately, its values. A statement whose placeholders all
stand where expressions do is parsed once with them (``ast.Param``) and each
execution's values are bound into that tree (:func:`binder`: the node each
value's literal would parse to). Otherwise (a placeholder where the grammar
takes only a literal: ``LIMIT $1``, ``WITH (max_active_queries = $1)``), a
bound statement is its text with each ``$n`` outside strings, quoted names
and comments replaced by the literal of its value (:func:`bind`: a text
value becomes a quoted string with its quotes doubled), parsed again.
Either way no value is ever spliced in as SQL code.

:func:`bind` also returns a map from offsets in the bound text back to the
original, so that a syntax error points at what the client wrote.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Final

from resgroups.errors import Error, InvalidParameter, ProgramLimitExceeded
from resgroups.sql import ast

# a placeholder, or something a placeholder cannot be inside (the lexical
# rules of grammar.lark: strings and names double their quote to escape it)
_SCAN: Final = re.compile(
    r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|--[^\n]*|/\*(?:.|\n)*?(?:\*/|\Z)|\$([0-9]+)"""
)

_MAX_LITERAL_CHARS: Final = 100  # parser.MAX_LITERAL_CHARS: a numeric literal, as written
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
        case datetime():  # a timestamptz (a timestamp's is read in the session's zone)
            aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
            return "CAST('" + aware.isoformat() + "' AS timestamptz)"
        case date():
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


# ---- binding into a parsed statement ----------------------------------------------------

Binder = Callable[[Sequence[object]], object]


def value_node(value: object) -> ast.Expr:
    """A parameter value as the node its literal parses to (what :func:`bind` then
    a parse would make): the same checks, the same types, no text."""
    match value:
        case None | bool() | str():
            return ast.Literal(value)
        case int():
            return ast.Literal(value)  # int_literal() checks its range where it is typed
        case float():
            literal(value)  # refuses what has no literal (inf, NaN)
            return ast.Literal(value)
        case Decimal():
            text = literal(value).strip()
            if len(text.lstrip("-")) > _MAX_LITERAL_CHARS:
                raise ProgramLimitExceeded(
                    f"numeric literal of {len(text.lstrip('-'))} characters exceeds the limit "
                    f"of {_MAX_LITERAL_CHARS}"
                )
            body = text.lstrip("-")
            number: int | float = int(body) if body.isdigit() else float(body)
            if not math.isfinite(number):
                raise InvalidParameter(f"parameter value {value}: out of range for a double")
            return ast.Literal(-number if text.startswith("-") else number)
        case datetime():
            return ast.Literal(value if value.tzinfo is not None else value.replace(tzinfo=UTC))
        case date():
            return ast.Literal(value.isoformat())
    literal(value)  # raises, naming the type
    raise AssertionError(value)


def binder(node: object) -> Binder | None:
    """A function that builds ``node`` (a statement parsed with its placeholders)
    with each ``$n`` replaced by the node of its value; None when ``node`` holds
    no placeholder. Built once per statement; each call rebuilds only the paths
    down to its placeholders (the rest is shared, as nodes are immutable), so
    binding costs no parse."""
    if isinstance(node, ast.Param):
        n = node.number

        def bind_one(values: Sequence[object]) -> object:
            if n > len(values):
                raise UndefinedParameter(
                    f"there is no parameter ${n} (the statement was bound with {len(values)} "
                    f"value{'' if len(values) == 1 else 's'})"
                )
            return value_node(values[n - 1])

        return bind_one
    if isinstance(node, tuple):
        parts = [binder(item) for item in node]
        if not any(parts):
            return None
        items = list(zip(parts, node, strict=True))
        return lambda values: tuple(p(values) if p else item for p, item in items)
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        live = [
            (f.name, b)
            for f in dataclasses.fields(node)
            if (b := binder(getattr(node, f.name))) is not None
        ]
        if not live:
            return None
        return lambda values: dataclasses.replace(node, **{k: b(values) for k, b in live})
    return None


def has_placeholder(node: object) -> bool:
    """Whether ``node`` holds a ``$n`` (linear in its size)."""
    return ast.any_node(node, lambda n: isinstance(n, ast.Param))
