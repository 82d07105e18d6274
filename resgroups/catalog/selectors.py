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
from typing import Final, NamedTuple

from resgroups.catalog.params import INT64_MAX
from resgroups.catalog.rules import format_size
from resgroups.errors import InvalidParameter

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
                raise InvalidParameter(
                    f"Estimate.{name} = {value!r}: expected an integer 0..2^63-1 or None"
                )


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
    if numeric and op == "<" and value == 0:
        return f"{attribute} < 0 never holds: an estimate is 0 or more"
    if attribute in ("application", "tag") and op == "=":
        limit = MAX_APPLICATION if attribute == "application" else MAX_TAG
        if not 0 < len(str(value)) <= limit:
            return (
                f"{attribute} = {quote(str(value)[:70])} never holds: "
                f"{'an application name' if attribute == 'application' else 'a tag'} "
                f"has 1..{limit} characters"
            )
    if op == "like":
        return like_problem(str(value))
    return None


def conditions_problem(conditions: object) -> str | None:
    if not isinstance(conditions, (list, tuple)) or not conditions:
        return f"conditions = {conditions!r}: expected a non-empty list"
    for condition in conditions:
        problem = condition_problem(condition)
        if problem is not None:
            return problem
    return None


class LikeMatcher:
    """SQL LIKE without backtracking: ``%`` any run, ``_`` one character,
    backslash escapes the next; the whole text must match, case-sensitively.

    The pattern is cut at its ``%`` into segments of fixed length (``_`` is
    one character). The first segment must match at the start and the last at
    the end; each one between is taken at its leftmost place after the one
    before (the leftmost place never loses a match that a later one would
    find). So a match costs O(len(text) x len(segment)) per segment, whatever
    the pattern: a regular expression with ``.*`` for each ``%`` backtracks,
    and ``'%a%a%a%a%a%a%b'`` against 100 ``a`` took 38 s.
    """

    __slots__ = ("_first", "_last", "_middle", "_minimum", "_whole")

    def __init__(self, pattern: str) -> None:
        segments: list[list[str]] = [[]]
        chars = iter(pattern)
        for ch in chars:
            if ch == "\\":
                segments[-1].append(re.escape(next(chars, "\\")))
            elif ch == "%":
                segments.append([])
            elif ch == "_":
                segments[-1].append(".")
            else:
                segments[-1].append(re.escape(ch))
        compiled = [(re.compile("".join(seg), re.DOTALL), len(seg)) for seg in segments]
        self._whole = compiled[0][0] if len(compiled) == 1 else None
        self._first, self._last = compiled[0], compiled[-1]
        self._middle = [c for c in compiled[1:-1] if c[1]]  # %% is one %
        self._minimum = sum(n for _, n in compiled)

    def matches(self, text: str) -> bool:
        if self._whole is not None:
            return self._whole.fullmatch(text) is not None
        if len(text) < self._minimum:
            return False
        first, first_len = self._first
        if first.match(text, 0, first_len) is None:
            return False
        last, last_len = self._last
        end = len(text) - last_len
        if last.fullmatch(text, end) is None:
            return False
        position = first_len
        for segment, _ in self._middle:
            found = segment.search(text, position, end)
            if found is None:
                return False
            position = found.end()
        return True


def like_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a LIKE pattern (as PostgreSQL refuses it), or None."""
    trailing = len(pattern) - len(pattern.rstrip("\\"))
    if trailing % 2:
        return f"LIKE pattern {pattern[:64]!r} must not end with the escape character"
    return None


def holds(condition: Condition, attrs: Attributes, like: Mapping[str, LikeMatcher]) -> bool:
    """Does ``attrs`` meet ``condition``? ``like``: compiled patterns by text (a
    pattern missing there is compiled now)."""
    attribute, op, value = condition
    if attribute == "tag":
        return value in attrs.tags
    if attribute == "user":
        if op == "=":
            return attrs.user.casefold() == str(value).casefold()
        return _matcher(like, str(value)).matches(attrs.user)
    actual = getattr(attrs, attribute)
    if actual is None:
        return False
    if op == "=":
        return bool(actual == value)
    if op == "like":
        return _matcher(like, str(value)).matches(actual)
    if op == "<":
        return bool(actual < value)
    return bool(actual > value)


def _matcher(like: Mapping[str, LikeMatcher], pattern: str) -> LikeMatcher:
    matcher = like.get(pattern)
    return matcher if matcher is not None else LikeMatcher(pattern)


def failing(
    conditions: Sequence[Condition],
    attrs: Attributes,
    like: Mapping[str, LikeMatcher] | None = None,
) -> Condition | None:
    """The first condition ``attrs`` does not meet (None: they all hold)."""
    compiled = like if like is not None else {}
    return next((c for c in conditions if not holds(c, attrs, compiled)), None)


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
    looks at the selectors that could match it, not at all of them; and every
    LIKE pattern of the catalog compiled once."""

    by_value: Mapping[tuple[str, str], tuple[int, ...]] = field(default_factory=dict)
    unindexed: tuple[int, ...] = ()
    like: Mapping[str, LikeMatcher] = field(default_factory=dict)

    @classmethod
    def build(cls, selectors: Iterable[tuple[int, Sequence[Condition]]]) -> SelectorIndex:
        """Each selector goes under the equality (application, user, tag or kind)
        that the fewest selectors share, so that a value common to many (kind =
        'select', one user) does not file them all together. O(n)."""
        listed = list(selectors)
        shared: dict[tuple[str, str], int] = {}
        for _, conditions in listed:
            for key in _index_keys(conditions):
                shared[key] = shared.get(key, 0) + 1
        by_value: dict[tuple[str, str], list[int]] = {}
        unindexed: list[int] = []
        like: dict[str, LikeMatcher] = {}
        for selector_id, conditions in listed:
            keys = _index_keys(conditions)
            if keys:
                best = min(keys, key=lambda k: (shared[k], _INDEXED.index(k[0])))
                by_value.setdefault(best, []).append(selector_id)
            else:
                unindexed.append(selector_id)
            for _, op, value in conditions:
                if op == "like" and value not in like:
                    like[str(value)] = LikeMatcher(str(value))
        return cls({k: tuple(v) for k, v in by_value.items()}, tuple(unindexed), like)

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


def _index_keys(conditions: Sequence[Condition]) -> list[tuple[str, str]]:
    """The (attribute, value) keys a selector could be filed under."""
    return [
        (attribute, str(value).casefold() if attribute == "user" else str(value))
        for attribute, op, value in conditions
        if op == "=" and attribute in _INDEXED
    ]
