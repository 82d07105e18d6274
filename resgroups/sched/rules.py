"""What runaway-query rules did (SPEC §16): hits per rule and the watch list.

The rules themselves are catalog records (:class:`~resgroups.catalog.model.RuleDef`);
this module keeps the live state beside them, in memory, restarting at 0 as
every counter does (§9):

- :class:`RuleHits`: how often each rule acted, and when it last did
  (``resource_group_rules()``, ``resgroups_resource_rule_hits_total``);
- :class:`QueryRules`: the rules of one query's group, which of them have
  acted on it (each at most once per query), and which are due now;
- :class:`WatchList`: after a KILL or a MOVE of a rule with ``watch``, the
  statement's fingerprint is watched until ``until``; a query of that
  fingerprint starting meanwhile gets the action at admission
  (``resource_group_watches()``). One entry per fingerprint: the latest
  action replaces an older one. Expired entries are dropped when the list is
  read or written, so it holds at most the fingerprints acted on within the
  longest watch.

Both are keyed by rule id, so a RENAME of the rule or of its groups changes
nothing; a dropped rule's entries stop matching (``matching`` takes the
rules that exist now).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from resgroups.catalog.model import RuleDef
from resgroups.catalog.rules import KILL, LOG, METRICS, MOVE


class RuleHit(NamedTuple):
    """How often one rule acted, and when last (wall clock, seconds since the epoch)."""

    total: int
    last_at: float | None


class RuleHits:
    """Per rule id: how often it acted. Thread-safe; cheap (one lock, rare writes)."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._lock = threading.Lock()
        self._hits: dict[int, RuleHit] = {}

    def record(self, rule_id: int) -> None:
        with self._lock:
            total, _ = self._hits.get(rule_id, RuleHit(0, None))
            self._hits[rule_id] = RuleHit(total + 1, self._wall())

    def get(self, rule_id: int) -> RuleHit:
        with self._lock:
            return self._hits.get(rule_id, RuleHit(0, None))


@dataclass
class Watch:
    """One watched fingerprint of one group: the rule that acted and until when."""

    group_id: int
    fingerprint: str
    rule_id: int
    action: str
    until: float  # the engine clock
    until_wall: float
    hits: int = 0


class WatchList:
    """Statements watched after a KILL or a MOVE with ``watch`` (SPEC §16), per
    group: a watch catches the queries of its rule's group only, and a later
    action on the same statement in another group is a watch of its own."""

    def __init__(self, now: Callable[[], float], wall: Callable[[], float] = time.time) -> None:
        self._now = now
        self._wall = wall
        self._lock = threading.Lock()
        self._watches: dict[tuple[int, str], Watch] = {}

    def __bool__(self) -> bool:
        """Anything watched (read without the lock: a hint for the query path)."""
        return bool(self._watches)

    def watch(
        self, group_id: int, fingerprint: str, rule_id: int, action: str, seconds: float
    ) -> None:
        """Watch ``fingerprint`` in ``group_id`` for ``seconds`` from now (replacing
        an older watch of the same statement in that group)."""
        now = self._now()
        with self._lock:
            self._expire(now)
            self._watches[group_id, fingerprint] = Watch(
                group_id, fingerprint, rule_id, action, now + seconds, self._wall() + seconds
            )

    def matching(
        self, group_id: int, fingerprint: str, live_rules: Collection[int]
    ) -> Watch | None:
        """The watch on ``fingerprint`` in ``group_id`` whose rule still exists,
        counted as a hit; None when there is none. O(1)."""
        if not self._watches:
            return None
        with self._lock:
            watch = self._watches.get((group_id, fingerprint))
            if watch is None:
                return None
            if watch.until <= self._now() or watch.rule_id not in live_rules:
                del self._watches[group_id, fingerprint]
                return None
            watch.hits += 1
            return Watch(**vars(watch))

    def entries(self) -> list[Watch]:
        """The watches in force, earliest end first (copies)."""
        with self._lock:
            self._expire(self._now())
            return sorted((Watch(**vars(w)) for w in self._watches.values()), key=_by_until)

    def _expire(self, now: float) -> None:
        for key in [k for k, w in self._watches.items() if w.until <= now]:
            del self._watches[key]


def _by_until(watch: Watch) -> float:
    return watch.until


class QueryRules:
    """The rules that apply to one query (its group's, in creation order) and
    which of them have acted on it: a rule acts at most once per query, so the
    record of what acted goes with the query when a MOVE gives it another
    group's rules (two groups whose rules move queries to each other cannot
    bounce one back and forth).

    ``due`` takes the query's readings, one integer per metric in the metric's
    base unit (milliseconds, bytes, rows), and returns the rules whose every
    condition the readings now exceed and that have not acted yet; when one of
    them is a KILL, the MOVEs due with it are left out (the KILL wins), while
    the LOGs are kept. O(rules x conditions) per call. ``kill_after_ms``: the
    earliest elapsed time at which a KILL with no other condition is due, so
    that native work can be interrupted then (``q.on_cancel``).
    ``move_left``: the last check found a MOVE due that it could not take (a
    task's thread, or a ``map`` running), so the query's own thread must check
    again at its next checkpoint rather than a slice later.
    """

    __slots__ = (
        "_acted",
        "_lock",
        "kill_after_ms",
        "metrics",
        "move_left",
        "rules",
        "snapshot",
    )

    def __init__(
        self, rules: Sequence[RuleDef], snapshot: object = None, acted: Iterable[int] = ()
    ) -> None:
        self.rules = tuple(rules)
        self.snapshot = snapshot  # the catalog snapshot they were read from
        self.metrics = frozenset(m for r in self.rules for m, _ in r.conditions)
        self._acted: set[int] = set(acted)
        self._lock = threading.Lock()  # the query's thread and its tasks' may check at once
        self.kill_after_ms = self._kill_after()
        self.move_left = False

    @property
    def acted(self) -> frozenset[int]:
        """The ids of the rules that have acted on the query."""
        with self._lock:
            return frozenset(self._acted)

    def _kill_after(self) -> int | None:
        limits = [
            r.conditions[0][1]
            for r in self.rules
            if r.action == KILL
            and r.id not in self._acted
            and len(r.conditions) == 1
            and r.conditions[0][0] == "elapsed"
        ]
        return min(limits) if limits else None

    def due(
        self, readings: Mapping[str, int], *, can_move: bool = True, logs_only: bool = False
    ) -> list[RuleDef]:
        """The rules due now (see the class); with ``can_move`` False a MOVE is left
        for a later check (a thread that cannot move the query found it due), with
        ``logs_only`` every rule but a LOG (the query has ended)."""
        with self._lock:
            due = [
                rule
                for rule in self.rules
                if rule.id not in self._acted
                and (not logs_only or rule.action == LOG)
                and all(readings.get(metric, 0) > limit for metric, limit in rule.conditions)
            ]
            if any(rule.action == KILL for rule in due):
                due = [rule for rule in due if rule.action != MOVE]
            elif not can_move:
                moves = [rule for rule in due if rule.action == MOVE]
                if moves:
                    due = [rule for rule in due if rule.action != MOVE]
                self.move_left = bool(moves)
            else:
                self.move_left = False
            self._acted.update(rule.id for rule in due)
            return due


def describe_hit(rule: RuleDef, readings: Mapping[str, int]) -> str:
    """``cpu_time 31.2s > 30s, memory 2.1G > 2G``: each condition with the value reached."""
    shown = []
    for metric, limit in rule.conditions:
        fmt = METRICS[metric].format
        shown.append(
            f"{metric} {fmt(readings.get(metric, 0)).strip(chr(39))} > {fmt(limit).strip(chr(39))}"
        )
    return ", ".join(shown)
