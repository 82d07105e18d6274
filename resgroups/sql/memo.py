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

    def __init__(self, walk: Callable[[Any], T], size: int = 1024) -> None:
        self._walk = walk
        self._size = size
        self._seen: dict[int, tuple[weakref.ref[Any], T]] = {}

    def __call__(self, stmt: Any) -> T:
        key = id(stmt)
        hit = self._seen.get(key)
        if hit is not None and hit[0]() is stmt:
            return hit[1]
        value = self._walk(stmt)
        if len(self._seen) >= self._size:
            self._seen.clear()
        seen = self._seen

        def forget(ref: weakref.ref[Any], key: int = key) -> None:
            entry = seen.get(key)
            if entry is not None and entry[0] is ref:
                seen.pop(key, None)

        with contextlib.suppress(TypeError):  # not a node (a tuple of them): not kept
            self._seen[key] = (weakref.ref(stmt, forget), value)
        return value
