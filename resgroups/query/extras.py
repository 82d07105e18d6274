"""What a query keeps only once it uses a feature: one record, made on first use.

Most queries use none of: runaway-query rules, ``q.memory``, ``q.map``,
``on_cancel`` callbacks, a fleet fence, a cursor's suspension, a statement's
fingerprint or estimate. A query that does keeps what those need in one
:class:`Extras`, which ``Query._uses()`` makes the first time; a query that
does not has none (``Query._extra is None``), so making, entering and leaving
it assigns and checks nothing of theirs: its ``__exit__`` reads one field to
know there is nothing to end. Each field is named here, with its default, and
nowhere else: a ``Query`` names what every query holds, this record what a
query may come to hold (a "query holds only what it uses", issue 29).

Who makes it: the thread that builds the query (a statement's estimate), or
the query's own thread (entry, a rule's watch, ``q.memory``, ``on_cancel``,
suspending, a fleet fence); a task or the deadline watcher finds it made
(they act on rules or callbacks, which only exist once it is). What any
thread of a query may write even when it uses nothing else, a failure and
what ``q.scanned()`` reports, stays on the query itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resgroups.catalog.selectors import Estimate
    from resgroups.fleet.modes import Fenced
    from resgroups.query.parallel import MapBatch
    from resgroups.sched.memory import MemoryCounter
    from resgroups.sched.rules import QueryRules


class Extras:
    """The state of the features one query uses (see the module's docstring)."""

    __slots__ = (
        "batch",
        "estimate",
        "fence",
        "fingerprint",
        "leaked_bytes",
        "memory",
        "moved_from",
        "on_cancel",
        "rule",
        "rules",
        "suspended_at",
        "suspended_s",
        "watched",
    )

    def __init__(self, estimate: Estimate | None = None, fingerprint: str | None = None) -> None:
        # what it is, as rules and selectors see it (SPEC §15, §16)
        self.estimate = estimate  # what the executor expects it to read (selectors)
        self.fingerprint = fingerprint  # the statement's, for watches (made on first use)
        self.rules: QueryRules | None = None  # its group's rules (None: there are none)
        self.rule: str | None = None  # the last rule that acted on it
        self.moved_from: str | None = None  # the group a rule moved it from
        # what its body asked for
        self.memory: MemoryCounter | None = None  # q.memory, made on first use
        self.batch: MapBatch[Any, Any] | None = None  # the map running now, if any
        self.watched = False  # on_cancel was called: the deadline watcher knows it
        self.on_cancel: tuple[Callable[[], object], ...] = ()  # not yet called
        # fleet mode, and cursors
        self.fence: Fenced | None = None  # what it runs on (the instance's fence)
        self.suspended_at = 0.0  # the engine clock when it was last suspended
        self.suspended_s = 0.0  # time spent suspended (elapsed leaves it out)
        self.leaked_bytes = 0  # tracked bytes it had not released when it ended
