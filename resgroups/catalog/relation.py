"""A persistent set of id pairs, indexed from both sides.

The catalog keeps its many-to-many facts (which users are in which ACL
group, who may assume which service account) and its reverse indexes (who is
mapped to a group, who holds USE on it) as :class:`Relation` values. A
relation is immutable: :meth:`add` and :meth:`remove` return a new one that
shares all but O(log n) of its structure with the old (``immutables.Map``, a
hash array mapped trie), so a catalog change costs what it changes, not what
the catalog holds, and every snapshot stays valid for whoever still reads it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Final

from immutables import Map

Pair = tuple[int, int]
_Index = Map[int, Map[int, bool]]
_NONE: Final[Map[int, bool]] = Map()
_NOTHING: Final[_Index] = Map()


def _link(index: _Index, a: int, b: int) -> _Index:
    return index.set(a, index.get(a, _NONE).set(b, True))


def _unlink(index: _Index, a: int, b: int) -> _Index:
    inner = index.get(a, _NONE).delete(b)
    return index.set(a, inner) if inner else index.delete(a)


class Relation:
    """Pairs ``(left, right)``; ``(a, b) in r``, :meth:`right_of` and :meth:`left_of`
    are O(1)-ish lookups; :meth:`add` / :meth:`remove` cost O(log n) per pair."""

    __slots__ = ("_left", "_right", "_size")

    def __init__(self, left: _Index = _NOTHING, right: _Index = _NOTHING, size: int = 0) -> None:
        self._left = left
        self._right = right
        self._size = size

    @classmethod
    def of(cls, pairs: Iterable[Pair]) -> Relation:
        return EMPTY.add(pairs)

    def __contains__(self, pair: object) -> bool:
        if not isinstance(pair, tuple) or len(pair) != 2:
            return False
        return pair[1] in self._left.get(pair[0], _NONE)

    def __iter__(self) -> Iterator[Pair]:
        for a, bs in self._left.items():
            for b in bs:
                yield a, b

    def __len__(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Relation) and self._left == other._left

    def __hash__(self) -> int:
        return hash(self._left)

    def __repr__(self) -> str:
        return f"Relation({sorted(self)!r})"

    def right_of(self, a: int) -> Collection[int]:
        """Every ``b`` with ``(a, b)`` in the relation."""
        return self._left.get(a, _NONE)

    def left_of(self, b: int) -> Collection[int]:
        """Every ``a`` with ``(a, b)`` in the relation."""
        return self._right.get(b, _NONE)

    def add(self, pairs: Iterable[Pair]) -> Relation:
        left, right, size = self._left, self._right, self._size
        for a, b in pairs:
            if b not in left.get(a, _NONE):
                left, right, size = _link(left, a, b), _link(right, b, a), size + 1
        return Relation(left, right, size)

    def remove(self, pairs: Iterable[Pair]) -> Relation:
        left, right, size = self._left, self._right, self._size
        for a, b in pairs:
            if b in left.get(a, _NONE):
                left, right, size = _unlink(left, a, b), _unlink(right, b, a), size - 1
        return Relation(left, right, size)

    def without(self, x: int) -> Relation:
        """The relation with every pair that has ``x`` on either side removed."""
        pairs = [(x, b) for b in self.right_of(x)] + [(a, x) for a in self.left_of(x)]
        return self.remove(pairs)


EMPTY: Final = Relation()
