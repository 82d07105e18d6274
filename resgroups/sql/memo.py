"""Facts of a statement's tree, kept for the statements seen lately.

Statements are immutable (frozen dataclasses) and the wire's plan cache hands
the same object back for a repeated text, so a fact of one (its text, its
shape, whether it needs the row evaluator) is computed once per statement
object.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class PerStatement(Generic[T]):
    """A fact of a statement's tree (``walk(stmt)``), kept for the statements seen
    lately. Statements are immutable and the wire's plan cache hands the same
    object back for a repeated text, so a repeated statement is walked once:
    each walk is O(nodes), a hit O(1). Keyed by identity (a frozen tree's own
    hash walks it), through a weak reference whose death drops the entry, so
    nothing is kept alive and an id is never read for another object; at most
    ``size`` entries (all dropped when full: O(1) amortised). Thread-safe: each
    step is one dict operation under the GIL, and a lost race walks again."""

    def __init__(
        self,
        walk: Callable[[Any], T],
        size: int = 1024,
        *,
        same_when_bound: Callable[[T], bool] | None = None,
    ) -> None:
        self._walk = walk
        self._size = size
        self._seen: dict[int, tuple[weakref.ref[Any], T]] = {}
        # a tree bound from a template (remember_bound) has the template's fact
        # when this holds of it (no value can change it): no walk per execution
        self._same_when_bound = same_when_bound

    def __call__(self, stmt: Any) -> T:
        hit = self._seen.get(id(stmt))  # _kept's lookup, inline: the common case
        if hit is not None and hit[0]() is stmt:
            return hit[1]
        template = bound_from(stmt) if self._same_when_bound is not None else None
        if template is not None:
            value = self(template)
            if self._same_when_bound is not None and not self._same_when_bound(value):
                value = self._walk(stmt)
        else:
            value = self._walk(stmt)
        _keep(self._seen, self._size, stmt, value)
        return value


def _kept(seen: dict[int, tuple[weakref.ref[Any], Any]], stmt: Any) -> tuple[Any] | None:
    hit = seen.get(id(stmt))
    if hit is not None and hit[0]() is stmt:
        return (hit[1],)
    return None


def _keep(seen: dict[int, tuple[weakref.ref[Any], Any]], size: int, stmt: Any, value: Any) -> None:
    """Keep ``value`` for ``stmt`` by identity, through a weak reference whose
    death drops the entry; all dropped when ``size`` are kept."""
    key = id(stmt)
    if len(seen) >= size:
        seen.clear()

    def forget(ref: weakref.ref[Any], key: int = key) -> None:
        entry = seen.get(key)
        if entry is not None and entry[0] is ref:
            seen.pop(key, None)

    with contextlib.suppress(TypeError):  # not a node (a tuple of them): not kept
        seen[key] = (weakref.ref(stmt, forget), value)


# trees bound from a statement parsed with its placeholders: tree -> template
_BOUND_FROM: dict[int, tuple[weakref.ref[Any], Any]] = {}
BOUND_KEPT = 1024


def remember_bound(tree: Any, template: Any) -> None:
    """``tree`` is ``template`` with values bound to its placeholders (the wire's
    Bind): a fact no value can change is read off the template, walked once."""
    _keep(_BOUND_FROM, BOUND_KEPT, tree, template)


def bound_from(tree: Any) -> Any | None:
    """The template ``tree`` was bound from (None: not a bound tree, or forgotten)."""
    hit = _kept(_BOUND_FROM, tree)
    return None if hit is None else hit[0]
