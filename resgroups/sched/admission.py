"""The admission gate of one resource group (SPEC §6): an exact limit with a queue.

Goals
    ``max_active_queries`` is exact: no query ever takes a slot while the
    group holds ``max_active_queries`` of them. At the limit a query waits in
    a bounded queue; beyond ``max_queued_queries`` it is rejected at once.
    A queued query ends its wait at the first of two deadlines: its queue
    deadline (enqueue time + ``queue_timeout``) or its query deadline
    (submission + the instance query timeout). fifo groups admit in arrival
    order; fair groups admit the waiting user holding the fewest slots now,
    ties to the user who has waited longest since their last admission.

Non-goals
    Threads. :class:`Gate` is a pure state machine: every method takes
    ``now`` and returns the tickets whose state it changed; it never sleeps,
    never reads a clock and never wakes anyone. :class:`GateRuntime` wraps it
    with a lock and per-ticket events for real threads (``gate_runtime.py``).
    The stateful property test drives :class:`Gate` directly on a manual
    clock.

Its parts
    :class:`Ticket`, its states and :class:`GateConfig` are records of
    their own (``admission_records.py``), the invariant checks are
    ``admission_invariants.py``, a gate's move in the tree
    ``admission_reparent.py``, the blocking wrapper ``gate_runtime.py``;
    every name is importable from here. What a query's path runs (counted
    slots, submit, release, the hand-off, the tree's counts) is here.

Counted slots
    A query that is admitted at once and never waits needs no ticket: it
    takes a *counted* slot (:meth:`Gate.count_in`, under the lock the gate
    shares) and gives it back by count (:meth:`Gate.count_out`), its user
    named so that the fair order sees it. A query that must queue gets a
    :class:`Ticket`, with the states below; a counted slot and a ticket's
    slot are the same slot to every rule.

State and invariants (``_check_invariants``: ``admission_invariants.py``)
    T  = the set of active tickets, C = ``counted`` (slots held without a
         ticket), A = |T| + C the slots held, Q = the queue (a list in
         arrival order), L = max_active_queries (None: unlimited),
         M = max_queued_queries (None: unlimited), G = ``_grandfathered``.
    I1 every ticket is in at most one of T and Q, and its ``state`` says which;
    I2 A <= max(L, G): G is A at the moment an ALTER lowered L, and only
       falls (to A) as queries leave, so a lowered limit admits nobody
       until A < L;
    I3 nobody waits while a slot is free: Q is empty unless A >= L;
    I4 |Q| <= max(M, H): H is |Q| at the moment an ALTER lowered M and only
       falls as the queue drains; tickets queued before keep their place,
       and a new arrival is refused while |Q| >= M;
    I5 admitted_total = admissions counted; rejections and timeouts likewise;
    I6 held(u) (the slots user u holds) sums to A, and is at least u's
       active tickets.

Fair order
    For a fair group the next ticket is the oldest ticket of the user u
    minimising (held(u), last_admitted(u), oldest enqueue of u), where
    held(u) counts u's active tickets and last_admitted(u) is the time of u's
    last admission in this group (-inf if never), so with L = 1 users take
    turns. Complexity: O(|Q|) per fair admission; the fifo path is O(log |Q|)
    (the deadline heap).

The queue
    Q is kept twice: in arrival order (a per-gate counter taken at enqueue; a
    deque) and by first deadline min(queue deadline, query deadline) (a
    heap). A ticket leaves Q by changing state; both views drop what has
    left from their fronts as they are read, and each is rebuilt when it
    holds more than 2|Q| + slack entries. So withdrawing a cancelled ticket
    is O(1) amortized, admitting in arrival order O(1), and ``expire`` pops
    only the tickets that are due instead of scanning the whole queue every
    time a waiter wakes. A ticket's keys never change while it is queued.
    A third view, per user, is kept only where it is read: by a fair gate
    (each user's first ticket) and a nested one (per-user caps); a flat fifo
    gate admits its queue's head and keeps none, and a gate that becomes
    fair or nested builds it from the queue.

The contended hand-off
    A slot given back at a flat fifo gate with a ticket queued goes straight
    to the head (``_hand_to_head``): the gate was full (I3), so exactly one
    ticket is admitted, and what the head takes the queue gives up, so the
    demand peak cannot move. How the queued ticket's thread waits (no
    timer: its own first deadline, or the cancellation poll) is
    ``gate_runtime.py``'s.

Nested groups (SPEC §14)
    A gate may have a ``parent`` gate (its group's parent group's) and
    ``children``. B = ``below``, the slots held by descendants' queries, so a
    gate's load is A + B; a query holds a slot at its gate and B counts it at
    every ancestor. ``max_per_user`` (P) caps what one user holds in the
    subtree (``held_by``). A ticket is *admissible* when every gate from its
    own to the root has load below its limit and its user is under every cap
    on that path. A gate in a tree or with a per-user cap is ``nested``;
    the flat path above is unchanged for the others.
    I7 nobody waits who is admissible (I3 of a tree): a ticket arriving
       admissible is admitted at once even when tickets wait (they are not:
       its user passes a cap theirs is at);
    I8 B = the children's A + B, and ``waiting_below`` and the per-user
       counts of B likewise;
    I9 A + B <= max(L, G) at every level (G also when a reparent brings a
       subtree above the new ancestors' limits: it keeps what it holds).
    When a slot comes back anywhere, the root of the tree admits: each gate
    with room offers its own best admissible ticket and its children's
    (recursively), and picks by its policy: fifo by arrival (one counter for
    every gate), fair by (held in its subtree, last admitted here, oldest
    wait). O(gates with waiters below x queue scan) per admission, paid only
    by trees; the fast path adds one flag test to a flat gate.

ALTER
    ``configure`` applies new settings online: held slots are kept, queued
    tickets keep their deadlines (computed at enqueue time), and raising L
    admits waiters at once.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from resgroups.errors import AdmissionRejected, Error, InternalError, QueryTimeout, QueueTimeout
from resgroups.sched import admission_reparent
from resgroups.sched.admission_invariants import check_invariants
from resgroups.sched.admission_records import (
    _ARRIVALS,
    _FRONTS,
    TICKET_ACTIVE,
    TICKET_EXPIRED,
    TICKET_NEW,
    TICKET_QUEUED,
    TICKET_REJECTED,
    TICKET_RELEASED,
    TICKET_WITHDRAWN,
    GateConfig,
    Ticket,
    TicketState,
    _by_arrival,
    _first_deadline,
)
from resgroups.sched.gate_runtime import GateRuntime, wake

# the records live in admission_records.py, the blocking wrapper in
# gate_runtime.py; importable from here as they always were
__all__ = [
    "TICKET_ACTIVE",
    "TICKET_EXPIRED",
    "TICKET_NEW",
    "TICKET_QUEUED",
    "TICKET_REJECTED",
    "TICKET_RELEASED",
    "TICKET_WITHDRAWN",
    "Gate",
    "GateConfig",
    "GateRuntime",
    "Ticket",
    "TicketState",
    "wake",
]


class Gate:
    """The admission state machine of one group. Not thread-safe: see GateRuntime.

    The queue is kept twice: in arrival order (a deque) and by first deadline
    (a heap of ``(deadline, arrival, ticket)``). A ticket leaves the queue by
    changing state; both views drop what has left lazily, from their fronts,
    and are rebuilt when more than half of what they hold has left, so every
    operation stays O(1) amortized (O(log n) for the heap) without searching
    the middle of a list.
    """

    def __init__(self, config: GateConfig) -> None:
        self.config = config
        self._active: set[Ticket] = set()  # T: the tickets holding a slot
        self.counted = 0  # C: the slots held without a ticket (count_in)
        self._queue: deque[Ticket] = deque()  # arrival order, with tickets that left
        # the same per user, in arrival order (with tickets that left, dropped from
        # the fronts): the fair order and the per-user caps look at each user's
        # first ticket, O(users) rather than O(queue). Kept only while they are
        # used (``_per_user``: a fair or nested gate); a flat fifo gate admits
        # its head and keeps it empty
        self._by_user: dict[str, deque[Ticket]] = {}
        self._deadlines: list[tuple[float, int, Ticket]] = []  # a heap, likewise
        self._positions: dict[Ticket, int] | None = None  # position(), until a change
        self.slack = 32  # the views are rebuilt beyond 2 x queued + slack (tests lower it)
        self._held: dict[str, int] = {}  # user -> active tickets
        self._last_admitted: dict[str, float] = {}  # user -> time of last admission
        self.waiting = 0  # the tickets queued, read on the fast path without a call
        self.demand_peak = 0  # the most active + queued at once since the quota keeper looked
        self._grandfathered = 0
        self._queue_grandfathered = 0  # |Q| when max_queued was last lowered
        # the tree (SPEC §14): see "Nested groups" above
        self.parent: Gate | None = None
        self.children: list[Gate] = []
        self.below = 0  # B: the slots the queries of descendants hold
        self.waiting_below = 0  # the tickets queued at descendants
        self._held_below: dict[str, int] = {}  # user -> slots held at descendants
        self.nested = config.max_per_user is not None  # admission looks past this gate
        self._per_user = self._uses_per_user()  # _by_user is kept
        self.admitted_total = 0
        self.admission_rejections = 0
        self.admission_timeouts = 0

    # ---- reading -----------------------------------------------------------------

    @property
    def active(self) -> int:
        """The slots held: by tickets and counted."""
        return len(self._active) + self.counted

    @property
    def queued(self) -> int:
        return self.waiting

    def queued_tickets(self) -> list[Ticket]:
        """The queued tickets in arrival order."""
        return [t for t in self._queue if t.state is TICKET_QUEUED]

    def position(self, ticket: Ticket) -> int:
        """1-based place of a queued ticket in arrival order: O(1) once the places
        are counted, which takes one pass after each change of the queue."""
        positions = self._positions
        if positions is None:
            positions = self._positions = {
                t: place for place, t in enumerate(self.queued_tickets(), start=1)
            }
        return positions[ticket]

    def _head(self) -> Ticket | None:
        """The first queued ticket in arrival order (None: nobody waits). O(1) amortized."""
        queue = self._queue
        while queue and queue[0].state is not TICKET_QUEUED:
            queue.popleft()
        return queue[0] if queue else None

    def _first_to_expire(self) -> Ticket | None:
        """The queued ticket with the earliest deadline. O(log n) amortized."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][2].state is not TICKET_QUEUED:
            heapq.heappop(deadlines)
        return deadlines[0][2] if deadlines else None

    def oldest_wait(self, now: float) -> float:
        """Seconds the longest-waiting ticket has waited (0 when none waits)."""
        head = self._head()
        return max(0.0, now - head.enqueued_at) if head is not None else 0.0

    def oldest_wait_below(self, now: float) -> float:
        """:meth:`oldest_wait` over this gate's subtree (its own for a flat gate)."""
        oldest = self.oldest_wait(now)
        stack = [c for c in self.children if c.waiting or c.waiting_below]
        while stack:
            gate = stack.pop()
            oldest = max(oldest, gate.oldest_wait(now))
            stack.extend(c for c in gate.children if c.waiting or c.waiting_below)
        return oldest

    def next_deadline(self) -> float:
        """The earliest deadline of a queued ticket (inf when none waits)."""
        first = self._first_to_expire()
        return _first_deadline(first) if first is not None else math.inf

    def _enqueue(self, ticket: Ticket, *, front: bool = False) -> None:
        mine = None
        if self._per_user:
            mine = self._by_user.get(ticket.user)
            if mine is None:
                mine = self._by_user[ticket.user] = deque()
        if front:  # before every other arrival, after the earlier tickets put at the head
            ticket.arrival = arrival = next(_FRONTS)
            for queue in (self._queue, mine):
                if queue is None:
                    continue
                place = 0
                while place < len(queue) and queue[place].arrival < 0:
                    place += 1  # O(tickets put at the head and still in the view)
                queue.insert(place, ticket)
        else:
            ticket.arrival = arrival = next(_ARRIVALS)
            self._queue.append(ticket)
            if mine is not None:
                mine.append(ticket)
        deadline = ticket.query_deadline
        if ticket.queue_deadline < deadline:
            deadline = ticket.queue_deadline
        heapq.heappush(self._deadlines, (deadline, arrival, ticket))
        self.waiting += 1
        self._positions = None
        ticket.gate = self
        gate = self.parent
        while gate is not None:
            gate.waiting_below += 1
            gate = gate.parent

    def _dequeue(self, ticket: Ticket, state: TicketState) -> None:
        """``ticket`` leaves the queue for ``state``; the views drop it later."""
        ticket.state = state
        self.waiting -= 1
        self._positions = None
        gate = self.parent
        while gate is not None:
            gate.waiting_below -= 1
            gate = gate.parent
        queue = self._queue
        if queue[0] is ticket:  # leaving in arrival order: the common case
            queue.popleft()
        if self._per_user:
            self._user_head(ticket.user)  # drops what has left from the user's front
        self._trim()

    def _trim(self) -> None:
        """Rebuild a view of the queue that holds more than 2|Q| + slack entries
        (O(view), amortized O(1) a dequeue)."""
        most = 2 * self.waiting + self.slack  # each view holds at most this many
        if len(self._queue) > most:
            self._queue = deque(t for t in self._queue if t.state is TICKET_QUEUED)
            self._index_users()
        if len(self._deadlines) > most:
            self._deadlines = [e for e in self._deadlines if e[2].state is TICKET_QUEUED]
            heapq.heapify(self._deadlines)

    def _index_users(self) -> None:
        """The per-user view, from the queue (empty unless ``_per_user``)."""
        self._by_user = by_user = dict[str, deque[Ticket]]()
        if self._per_user:
            for t in self._queue:
                if t.state is TICKET_QUEUED:
                    by_user.setdefault(t.user, deque()).append(t)

    def _limit(self) -> float:
        limit = self.config.max_active
        return math.inf if limit is None else max(limit, self._grandfathered)

    def has_room_now(self, user: str) -> bool:
        """Would a new ticket of ``user`` be admitted at once: nobody queued, a slot
        free (in a tree: at every level, and ``user`` under every per-user cap)."""
        if self.waiting:
            return False
        if self.nested:
            return self._admissible(user)
        limit = self.config.max_active
        return limit is None or len(self._active) + self.counted < limit

    def _has_room(self) -> bool:
        limit = self.config.max_active
        return limit is None or len(self._active) + self.counted < limit

    def count_in(self, user: str, now: float) -> bool:
        """A slot for a query of ``user`` that holds no ticket, if it would be
        admitted at once (True: nobody queued, a slot free); otherwise nothing
        changes (False). O(1)."""
        if self.waiting:
            return False
        active = len(self._active) + self.counted
        if self.nested:
            if not self._admissible(user):
                return False
            self._took(user, now)
            active += self.below
        else:
            limit = self.config.max_active
            if limit is not None and active >= limit:
                return False
        self.counted += 1
        if active >= self.demand_peak:
            self.demand_peak = active + 1
        held = self._held
        held[user] = held.get(user, 0) + 1
        self._last_admitted[user] = now
        self.admitted_total += 1
        return True

    def count_out(self, user: str, now: float) -> list[Ticket]:
        """A counted slot of ``user`` comes back; the tickets admitted in its place."""
        held = self._held
        n = held.get(user, 0)
        if not n or not self.counted:
            raise InternalError(f"a counted slot of {user} given back, but none is held")
        self.counted -= 1
        if n == 1:
            del held[user]
        else:
            held[user] = n - 1
        if self.nested:
            return self._gave(user, now)
        if self._grandfathered and self._grandfathered > len(self._active) + self.counted:
            self._grandfathered = len(self._active) + self.counted
        return self._admit_waiting(now) if self.waiting else []

    def promote(self, ticket: Ticket) -> None:
        """A counted slot becomes ``ticket``'s (its user's): the query holding it is
        to be sliced from here (``Dispatcher.promote``). Nothing else moves: a
        counted slot and a ticket's count alike everywhere. O(1)."""
        if not self.counted or not self._held.get(ticket.user):
            raise InternalError(f"a counted slot of {ticket.user} promoted, but none is held")
        if ticket.state is not TICKET_NEW:
            raise InternalError(f"{ticket!r} promoted twice")
        self.counted -= 1
        ticket.state = TICKET_ACTIVE
        self._active.add(ticket)

    def take_slot(self, ticket: Ticket, now: float) -> None:
        """:meth:`submit` for the case it admits at once, when the caller has just
        seen :meth:`has_room_now` under the lock this gate shares (the fast path,
        ``Dispatcher.admit_at_once``): nobody is queued, so the demand is the
        slots held. Written out rather than through ``_admit``: it is every
        query's path."""
        ticket.state = TICKET_ACTIVE
        active = self._active
        active.add(ticket)
        if len(active) + self.counted > self.demand_peak:
            self.demand_peak = len(active) + self.counted
        user = ticket.user
        held = self._held
        held[user] = held.get(user, 0) + 1
        self._last_admitted[user] = now
        self.admitted_total += 1
        if self.nested:
            self._took(user, now)

    # ---- transitions ---------------------------------------------------------------

    def submit(self, ticket: Ticket, now: float, *, front: bool = False) -> bool:
        """Admit (True) or queue (False) a new ticket; AdmissionRejected when full.

        O(1). A ticket that must wait is queued even if its query deadline has
        already passed: its own waiter expires it (QueryTimeout) at its first look.
        ``front``: queued at the head, as a query a rule moved here is (SPEC §16); a
        fifo gate admits it first.
        """
        if ticket.state is not TICKET_NEW:
            raise InternalError(f"{ticket!r} submitted twice")
        # in a tree nobody queued here could be admitted now (I3), so a ticket that
        # could is not jumping anyone: the one behind a user at a cap goes past them
        if self._admissible(ticket.user) if self.nested else self.has_room_now(ticket.user):
            self._admit(ticket, now)
            return True
        max_queued = self.config.max_queued
        if max_queued is not None and self.waiting >= max_queued:
            ticket.state = TICKET_REJECTED
            self.admission_rejections += 1
            raise AdmissionRejected(
                f"Resource Group admission queue is full [group={self.config.name}, "
                f"max_active_queries={self.config.max_active}, "
                f"max_queued_queries={max_queued}, queued={self.waiting}]"
            )
        ticket.state = TICKET_QUEUED
        ticket.enqueued_at = now
        ticket.queue_deadline = now + self.config.queue_timeout_ms / 1000
        self._enqueue(ticket, front=front)
        demand = len(self._active) + self.counted + self.waiting  # _note_demand, written out
        if demand > self.demand_peak:
            self.demand_peak = demand
        return False

    def release(self, ticket: Ticket, now: float) -> list[Ticket]:
        """A slot comes back; the tickets admitted in its place."""
        if ticket.state is not TICKET_ACTIVE:
            raise InternalError(f"{ticket!r} released without a slot")
        self._active.remove(ticket)
        held = self._held
        user = ticket.user
        if held[user] == 1:
            del held[user]
        else:
            held[user] -= 1
        ticket.state = TICKET_RELEASED
        if self.nested:
            return self._gave(user, now)
        load = len(self._active) + self.counted
        if self._grandfathered > load:
            self._grandfathered = load
        if not self.waiting:
            return []
        if self._per_user:
            return self._admit_waiting(now)
        return self._hand_to_head(load, now)

    def _hand_to_head(self, load: int, now: float) -> list[Ticket]:
        """:meth:`_admit_waiting` of a flat fifo gate with ``load`` slots held and a
        ticket queued (every contended query's path): the slot just given back
        goes to the head of the queue, unless a lowered limit keeps it, with no
        second look for room (I3: the gate was full until this slot came back,
        so no second ticket can follow). O(1) amortized."""
        limit = self.config.max_active
        if limit is not None and load >= limit:
            return []
        queue = self._queue
        while queue[0].state is not TICKET_QUEUED:  # what left, dropped (I1: one waits)
            queue.popleft()
        ticket = queue[0]
        self._dequeue(ticket, TICKET_ACTIVE)
        self._admit(ticket, now)
        if self._queue_grandfathered > self.waiting:
            self._queue_grandfathered = self.waiting
        return [ticket]

    def withdraw(self, ticket: Ticket, error: Error) -> bool:
        """Take a queued ticket out (cancelled, or the engine closing). False if not queued."""
        if ticket.state is not TICKET_QUEUED:
            return False
        self._dequeue(ticket, TICKET_WITHDRAWN)
        self._queue_grandfathered = min(self._queue_grandfathered, self.waiting)
        ticket.error = error
        return True

    def expire(self, now: float) -> list[Ticket]:
        """End the waits whose first deadline has come; each gets its error."""
        expired = []
        while (first := self._first_to_expire()) is not None and _first_deadline(first) <= now:
            self._dequeue(first, TICKET_EXPIRED)
            expired.append(first)
        for ticket in expired:
            waited_ms = round((now - ticket.enqueued_at) * 1000)
            if ticket.query_deadline < ticket.queue_deadline:
                ticket.error = QueryTimeout(
                    "query timeout while queued for Resource Group admission "
                    f"[group={self.config.name}, waited={waited_ms}ms]"
                )
            else:
                ticket.error = QueueTimeout(
                    f"Resource Group admission queue timeout [group={self.config.name}, "
                    f"queue_timeout={self.config.queue_timeout_ms}ms, waited={waited_ms}ms]"
                )
            self.admission_timeouts += 1
        self._queue_grandfathered = min(self._queue_grandfathered, self.waiting)
        return expired

    def configure(self, config: GateConfig, now: float) -> list[Ticket]:
        """ALTER online: keep slots and deadlines; admit what the new limit allows."""
        old = self.config
        self.config = config
        self._renest()
        if config.max_active is not None and (
            old.max_active is None or config.max_active < old.max_active
        ):
            self._grandfathered = max(self._grandfathered, self.load)
        if config.max_queued is not None and (
            old.max_queued is None or config.max_queued < old.max_queued
        ):
            self._queue_grandfathered = max(self._queue_grandfathered, self.waiting)
        return self._admit_waiting(now)

    # ---- internals ---------------------------------------------------------------

    def _note_demand(self) -> None:
        """Keep the high-water mark of active + queued (fleet quota mode reads it)."""
        demand = self.active + self.waiting
        if demand > self.demand_peak:
            self.demand_peak = demand

    def _admit(self, ticket: Ticket, now: float) -> None:
        ticket.state = TICKET_ACTIVE
        self._active.add(ticket)
        self._note_demand()
        user = ticket.user
        self._held[user] = self._held.get(user, 0) + 1
        self._last_admitted[user] = now
        self.admitted_total += 1
        if self.nested:
            self._took(user, now)

    def _admit_waiting(self, now: float) -> list[Ticket]:
        if self.nested:
            return self._admit_tree(now)
        admitted = []
        fair = self.config.policy == "fair"
        while self.waiting and self._has_room():
            ticket = self._next_fair() if fair else self._head()
            assert ticket is not None
            self._dequeue(ticket, TICKET_ACTIVE)
            self._admit(ticket, now)
            admitted.append(ticket)
        self._queue_grandfathered = min(self._queue_grandfathered, self.waiting)
        return admitted

    def _next_fair(self) -> Ticket:
        best = self._fairest(capped_too=True)
        assert best is not None
        return best

    def _fair_key(self, ticket: Ticket) -> tuple[int, float, float]:
        """The fair order at this gate: the user holding fewest of its slots (its
        subtree's), then the one admitted here longest ago, then the oldest wait."""
        user = ticket.user
        return (
            self._held.get(user, 0) + self._held_below.get(user, 0),
            self._last_admitted.get(user, -math.inf),
            ticket.enqueued_at,
        )

    def _user_head(self, user: str) -> Ticket | None:
        """The user's first queued ticket (its oldest), dropping from the front of
        its view what has left; the view goes once empty. O(1) amortized."""
        mine = self._by_user.get(user)
        while mine and mine[0].state is not TICKET_QUEUED:
            mine.popleft()
        if not mine:
            self._by_user.pop(user, None)
            return None
        return mine[0]

    def _heads(self) -> list[Ticket]:
        """Each waiting user's first queued ticket: O(users). Without the per-user
        view (a flat fifo gate: no caps, arrival order) the queue's head stands
        for them all."""
        if not self._per_user:
            head = self._head()
            return [] if head is None else [head]
        return [t for t in map(self._user_head, list(self._by_user)) if t is not None]

    def _fairest(self, *, capped_too: bool) -> Ticket | None:
        """The queued ticket the fair order takes next (None: none; unless
        ``capped_too``, a user at a per-user cap on the path is passed over):
        the least ``_fair_key``, equal keys in arrival order. O(users)."""
        best: Ticket | None = None
        best_key: tuple[int, float, float, int] | None = None
        for ticket in self._heads():  # a user's first ticket is its oldest
            if not capped_too and self._capped(ticket.user) is not None:
                continue
            key = (*self._fair_key(ticket), ticket.arrival)
            if best_key is None or key < best_key:
                best, best_key = ticket, key
        return best

    # ---- the tree (SPEC §14) -------------------------------------------------------

    @property
    def load(self) -> int:
        """The slots held in this gate's subtree: its own and its descendants'."""
        return len(self._active) + self.counted + self.below

    def held_by(self, user: str) -> int:
        """The slots ``user`` holds in this gate's subtree."""
        return self._held.get(user, 0) + self._held_below.get(user, 0)

    def _uses_per_user(self) -> bool:
        """Whether admission reads the per-user view: a fair gate (each user's first
        ticket) or a nested one (per-user caps)."""
        return self.nested or self.config.policy == "fair"

    def _renest(self) -> None:
        self.nested = (
            self.parent is not None or bool(self.children) or self.config.max_per_user is not None
        )
        per_user = self._uses_per_user()
        if per_user != self._per_user:
            self._per_user = per_user
            self._index_users()

    def _full(self) -> bool:
        limit = self.config.max_active
        return limit is not None and len(self._active) + self.counted + self.below >= limit

    def _capped(self, user: str) -> Gate | None:
        """The nearest gate on the path to the root where ``user`` is at its cap."""
        gate: Gate | None = self
        while gate is not None:
            cap = gate.config.max_per_user
            if cap is not None and gate.held_by(user) >= cap:
                return gate
            gate = gate.parent
        return None

    def _admissible(self, user: str) -> bool:
        """Room at every level from here to the root, and ``user`` under every cap."""
        gate: Gate | None = self
        while gate is not None:
            if gate._full():
                return False
            cap = gate.config.max_per_user
            if cap is not None and gate.held_by(user) >= cap:
                return False
            gate = gate.parent
        return True

    def blocked_by(self, ticket: Ticket) -> str:
        """Why a queued ticket waits: its own group is full (``group_queue``), the
        nearest full ancestor (``parent:<name>``), or its user is at a per-user
        cap on the path (``user_limit``)."""
        if self._full():
            return "group_queue"
        gate = self.parent
        while gate is not None:
            if gate._full():
                return f"parent:{gate.config.name}"
            gate = gate.parent
        if self._capped(ticket.user) is not None:
            return "user_limit"
        return "group_queue"

    def _root(self) -> Gate:
        gate = self
        while gate.parent is not None:
            gate = gate.parent
        return gate

    def _took(self, user: str, now: float) -> None:
        """A slot of this gate was taken by ``user``: every ancestor counts it."""
        gate = self.parent
        while gate is not None:
            gate.below += 1
            held = gate._held_below
            held[user] = held.get(user, 0) + 1
            gate._last_admitted[user] = now
            if gate.load > gate.demand_peak:
                gate.demand_peak = gate.load
            gate = gate.parent

    def _gave(self, user: str, now: float) -> list[Ticket]:
        """A slot of this gate came back from ``user``: every ancestor gives it
        back; the tickets of the whole tree admitted in its place."""
        gate: Gate | None = self
        while gate is not None:
            if gate is not self:
                gate.below -= 1
                held = gate._held_below
                if held[user] == 1:
                    del held[user]
                else:
                    held[user] -= 1
            if gate._grandfathered > gate.load:
                gate._grandfathered = gate.load
            gate = gate.parent
        return self._admit_tree(now)

    def _admit_tree(self, now: float) -> list[Ticket]:
        """Admit, from the root of this gate's tree down, every ticket that now
        can be, each level choosing among its children's candidates by its own
        policy (fifo: arrival order across the subtree; fair: ``_fair_key``)."""
        root = self._root()
        admitted = []
        while (root.waiting or root.waiting_below) and (ticket := root._pick()) is not None:
            gate = ticket.gate
            assert gate is not None
            gate._dequeue(ticket, TICKET_ACTIVE)
            gate._admit(ticket, now)
            gate._queue_grandfathered = min(gate._queue_grandfathered, gate.waiting)
            admitted.append(ticket)
        return admitted

    def _pick(self) -> Ticket | None:
        """The ticket this gate admits next from its subtree (None: none can be).
        The caller has seen room at every ancestor."""
        if self._full():
            return None
        fair = self.config.policy == "fair"
        best: Ticket | None = None
        if self.waiting:
            if fair:
                best = self._fairest(capped_too=False)
            else:  # arrival order, past the users at a cap: O(users)
                heads = [t for t in self._heads() if self._capped(t.user) is None]
                best = min(heads, key=_by_arrival) if heads else None
        for child in self.children:
            if not (child.waiting or child.waiting_below):
                continue
            candidate = child._pick()
            if candidate is None:
                continue
            if best is None or (
                self._fair_key(candidate) < self._fair_key(best)
                if fair
                else candidate.arrival < best.arrival
            ):
                best = candidate
        return best

    def set_parent(self, parent: Gate | None, now: float) -> list[Ticket]:
        """Reparent online (ALTER ... SET/RESET (parent)): what this subtree holds
        and queues leaves the old ancestors and joins the new ones, which keep it
        even above their limits (grandfathered, as for a lowered limit); the
        tickets either tree now admits (``admission_reparent.py``)."""
        return admission_reparent.set_parent(self, parent, now)

    def _check_invariants(self) -> None:
        """I1-I9, checked (``admission_invariants.py``); InternalError if one is broken."""
        check_invariants(self)
