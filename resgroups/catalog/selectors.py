"""Selectors (SPEC §15): route a query by what it is, not only by who sent it.

A selector is ``WHEN condition [AND ...] THEN RESOURCE GROUP g [WITH (priority
= n)]``; a query's attributes (:class:`Attributes`) either meet every
condition or not. Conditions are stored as ``(attribute, operator, value)``:

=================  ===========  ==================================================
attribute          operators    matches
=================  ===========  ==================================================
application        = LIKE       the session's application name (exact; LIKE as SQL)
tag                =            one of the session's client tags
kind               =            select, ctas, insert_select or export
user               = LIKE       the login principal (= ignores case, as unquoted
                                names do; LIKE is exact)
statement          LIKE         the statement text, when the executor gives it
estimated_rows     < >          the executor's row estimate, when it gives one
estimated_memory   < >          the executor's memory estimate, in bytes
=================  ===========  ==================================================

A condition on an attribute the query does not have (no statement, no
estimate, no application) does not hold.

Routing must not scan every selector: :class:`SelectorIndex` files each
selector under its most selective equality (application, then user, then
tag, then kind); only selectors with none are checked for every query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final, NamedTuple

from resgroups.catalog.params import INT64_MAX
from resgroups.catalog.rules import format_size

KINDS: Final = ("select", "ctas", "insert_select", "export")
MAX_APPLICATION: Final = 63  # PostgreSQL keeps application_name to NAMEDATALEN - 1 bytes
MAX_TAG: Final = 63
MAX_TAGS: Final = 32


@dataclass(frozen=True)
class Estimate:
    """What a query's executor expects it to read: ``rows`` and ``memory``
    (bytes); None where it does not know. Selectors route on it (SPEC §15)."""

    rows: int | None = None
    memory: int | None = None

    def __post_init__(self) -> None:
        for name in ("rows", "memory"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX
            ):
                raise ValueError(f"Estimate.{name} = {value!r}: expected an integer >= 0 or None")


class Attributes(NamedTuple):
    """What a query is, for selectors: the session's and the query's own."""

    user: str
    kind: str = "select"
    application: str | None = None
    tags: frozenset[str] = frozenset()
    statement: str | None = None
    estimated_rows: int | None = None
    estimated_memory: int | None = None


# attribute -> the operators it takes and whether its value is a number
ATTRIBUTES: Final[Mapping[str, tuple[tuple[str, ...], bool]]] = {
    "application": (("=", "like"), False),
    "tag": (("=",), False),
    "kind": (("=",), False),
    "user": (("=", "like"), False),
    "statement": (("like",), False),
    "estimated_rows": (("<", ">"), True),
    "estimated_memory": (("<", ">"), True),
}

Condition = tuple[str, str, str | int]


def condition_problem(condition: object) -> str | None:
    """Why ``condition`` is not one SQL could have written, or None."""
    if not isinstance(condition, (list, tuple)) or len(condition) != 3:
        return f"condition {condition!r}: expected [attribute, operator, value]"
    attribute, op, value = condition
    if attribute not in ATTRIBUTES:
        return f"condition on unknown attribute {attribute!r}"
    ops, numeric = ATTRIBUTES[attribute]
    if op not in ops:
        return f"operator {op!r} on {attribute}: expected one of {', '.join(ops)}"
    if numeric:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
            return f"{attribute} {op} {value!r}: expected an integer 0..2^63-1"
    elif not isinstance(value, str):
        return f"{attribute} {op} {value!r}: expected text"
    elif attribute == "kind" and value not in KINDS:
        return f"kind = {value!r}: expected one of {', '.join(KINDS)}"
    return None


def conditions_problem(conditions: object) -> str | None:
    if not isinstance(conditions, (list, tuple)) or not conditions:
        return f"conditions = {conditions!r}: expected a non-empty list"
    for condition in conditions:
        problem = condition_problem(condition)
        if problem is not None:
            return problem
    return None


@lru_cache(maxsize=4096)
def like_pattern(pattern: str) -> re.Pattern[str]:
    """SQL LIKE as a regular expression: ``%`` any run, ``_`` one character,
    backslash escapes the next character; the whole text must match."""
    out = []
    chars = iter(pattern)
    for ch in chars:
        if ch == "\\":
            out.append(re.escape(next(chars, "\\")))
        elif ch == "%":
            out.append(".*")
        elif ch == "_":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def holds(condition: Condition, attrs: Attributes) -> bool:
    """Does ``attrs`` meet ``condition``?"""
    attribute, op, value = condition
    if attribute == "tag":
        return value in attrs.tags
    if attribute == "user":
        if op == "=":
            return attrs.user.casefold() == str(value).casefold()
        return like_pattern(str(value)).fullmatch(attrs.user) is not None
    actual = getattr(attrs, attribute)
    if actual is None:
        return False
    if op == "=":
        return bool(actual == value)
    if op == "like":
        return like_pattern(str(value)).fullmatch(actual) is not None
    if op == "<":
        return bool(actual < value)
    return bool(actual > value)


def failing(conditions: Sequence[Condition], attrs: Attributes) -> Condition | None:
    """The first condition ``attrs`` does not meet (None: they all hold)."""
    return next((c for c in conditions if not holds(c, attrs)), None)


def quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def format_condition(condition: Condition) -> str:
    attribute, op, value = condition
    if attribute == "estimated_memory" and isinstance(value, int):
        shown = format_size(value)
    else:
        shown = str(value) if isinstance(value, int) else quote(value)
    return f"{attribute} {op.upper() if op == 'like' else op} {shown}"


def format_conditions(conditions: Iterable[Condition]) -> str:
    """Normalized text: ``application = 'superset' AND estimated_rows < 100000``."""
    return " AND ".join(format_condition(c) for c in conditions)


_INDEXED: Final = ("application", "user", "tag", "kind")  # most selective first


@dataclass(frozen=True)
class SelectorIndex:
    """Selectors filed by their most selective equality, so that routing a query
    looks at the selectors that could match it, not at all of them."""

    by_value: Mapping[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    unindexed: tuple[int, ...] = ()

    @classmethod
    def build(cls, selectors: Iterable[tuple[int, Sequence[Condition]]]) -> SelectorIndex:
        by_value: dict[tuple[str, str], list[int]] = {}
        unindexed: list[int] = []
        for selector_id, conditions in selectors:
            key = _index_key(conditions)
            if key is None:
                unindexed.append(selector_id)
            else:
                by_value.setdefault(key, []).append(selector_id)
        return cls({k: tuple(v) for k, v in by_value.items()}, tuple(unindexed))

    def candidates(self, attrs: Attributes) -> tuple[int, ...]:
        """The ids of the selectors that could match ``attrs``: O(tags + unindexed)."""
        get = self.by_value.get
        found = self.unindexed
        if attrs.application is not None:
            found += get(("application", attrs.application), ())
        found += get(("user", attrs.user.casefold()), ())
        found += get(("kind", attrs.kind), ())
        for tag in attrs.tags:
            found += get(("tag", tag), ())
        return found


def _index_key(conditions: Sequence[Condition]) -> tuple[str, str] | None:
    equalities = {a: v for a, op, v in conditions if op == "="}
    for attribute in _INDEXED:
        if attribute in equalities:
            value = str(equalities[attribute])
            return attribute, value.casefold() if attribute == "user" else value
    return None
