"""The fast path against the slow path (docs/queries.md "Cost").

Two engines get the same random workload: one takes a query's slot and
worker in one step when nobody waits (``Dispatcher.admit_at_once``), the other
always takes the slow path (the gate's ``enter``, then a worker). Each query
runs on its own thread, so queued and parked queries really wait. After
every step both engines have settled (every query running, done, or
waiting in a queue or for a worker) and must agree on every query's state
and every counter of ``resource_groups()``; the gates' and the scheduler's
invariants hold in both.

Time stands still (a manual clock) and the CPU meter reads zero, so the
order in which waiting queries get a slot or a worker depends only on the
rules, never on timing.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from waiting import wait_until

import resgroups
from resgroups.clock import ManualClock
from resgroups.errors import Error
from resgroups.query import Query
from resgroups.sched.admission import TicketState
from resgroups.sched.cpu import RunnerState

GROUPS = ("a", "b", "default")
USERS = ("ann", "bob")
COUNTERS = (
    "active_queries",
    "queued_queries",
    "admitted_total",
    "admission_rejections",
    "admission_timeouts",
    "memory_used_bytes",
)
SETUP = """
CREATE RESOURCE GROUP a WITH (max_active_queries = 2, max_queued_queries = 2);
CREATE RESOURCE GROUP b WITH (max_active_queries = 1, max_queued_queries = 1,
                              scheduling_policy = 'fair');
"""


class QueryThread:
    """One managed query on its own thread, told what to do through a queue."""

    def __init__(self, session: resgroups.Session, group: str) -> None:
        self.group = group
        self.query: Query = session.query()
        self.outcome = ""  # "entered", or the class of the error that ended it
        self.entered = threading.Event()
        self.done = threading.Event()
        self._commands: queue.Queue[tuple[str, int]] = queue.Queue()
        self._acks: queue.Queue[None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with self.query as q:
                self.outcome = "entered"
                self.entered.set()
                while True:
                    command, nbytes = self._commands.get(timeout=60)
                    if command == "exit":
                        break
                    if command == "allocate":
                        q.memory.allocate(nbytes)
                    elif command == "release":
                        q.memory.release(nbytes)
                    self._acks.put(None)
        except Error as exc:
            self.outcome = type(exc).__name__
        finally:
            self.done.set()

    def tell(self, command: str, nbytes: int = 0) -> None:
        self._commands.put((command, nbytes))
        if command != "exit":
            self._acks.get(timeout=10)

    def finish(self) -> None:
        self.tell("exit")
        assert self.done.wait(10), "the query did not end"
        self._thread.join(10)

    def stable_state(self) -> str | None:
        """Where the query stands, once it stopped moving (None: still moving)."""
        if self.done.is_set():
            return f"done: {self.outcome}"
        if self.entered.is_set():
            return "running"
        q = self.query
        ticket, runner = q._ticket, q._runner
        if ticket is not None and ticket.state is TicketState.QUEUED:
            return "queued"
        if (
            ticket is not None
            and ticket.state is TicketState.ACTIVE
            and runner is not None
            and runner.state is RunnerState.WAITING
        ):
            return "parked"
        return None


class Side:
    """One engine and the queries running in it."""

    def __init__(self, fast: bool) -> None:
        self.engine = resgroups.Engine(workers=3, clock=ManualClock(), cpu_meter=lambda: 0)
        self.engine.dispatcher.fast_path = fast
        self.engine.connect().execute(SETUP)
        self.sessions: dict[tuple[str, str], resgroups.Session] = {}
        self.queries: list[QueryThread] = []

    def session(self, group: str, user: str) -> resgroups.Session:
        key = (group, user)
        if key not in self.sessions:
            session = self.sessions[key] = self.engine.connect(user)
            session.execute(f"SET RESOURCE GROUP {group}")
        return self.sessions[key]

    def settle(self) -> list[str]:
        states: list[str | None] = []

        def stable() -> bool:
            states[:] = [q.stable_state() for q in self.queries]
            return None not in states

        wait_until(stable)
        return [s for s in states if s is not None]

    def by_group(self) -> list[tuple[str, str]]:
        """Each query's (group, state), sorted: which of two queries admitted in one
        step takes the one free worker is a race on the slow path (each woken
        thread asks for its worker itself), so queries compare group by group."""
        states = self.settle()
        return sorted(zip((q.group for q in self.queries), states, strict=True))

    def counters(self) -> dict[str, tuple[Any, ...]]:
        return {
            row["name"]: tuple(row[c] for c in COUNTERS) for row in self.engine.resource_groups()
        }

    def check_invariants(self) -> None:
        self.engine.dispatcher.check_invariants()
        for runtime in self.engine.runtimes.all():
            with runtime.gate.lock:
                runtime.gate.gate._check_invariants()

    def close(self) -> None:
        for q in self.queries:  # a waiting query may still be admitted meanwhile
            if not q.entered.is_set():
                q.query.cancel()
        for q in self.queries:
            wait_until(lambda q=q: q.done.is_set() or q.entered.is_set())
            if not q.done.is_set():
                q.finish()
        self.engine.close()


class FastAgainstSlow(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.fast = Side(fast=True)
        self.slow = Side(fast=False)

    def teardown(self) -> None:
        for side in (getattr(self, "fast", None), getattr(self, "slow", None)):
            if side is not None:
                side.close()

    def _both(self) -> tuple[Side, Side]:
        return self.fast, self.slow

    def _with_state(self, wanted: str) -> list[int]:
        """The queries in state ``wanted`` on both sides."""
        return [
            i
            for i, (f, s) in enumerate(zip(self.fast.queries, self.slow.queries, strict=True))
            if f.stable_state() == wanted and s.stable_state() == wanted
        ]

    @precondition(lambda self: len(self.fast.queries) < 8)
    @rule(group=st.sampled_from(GROUPS), user=st.sampled_from(USERS))
    def open_query(self, group: str, user: str) -> None:
        for side in self._both():
            side.queries.append(QueryThread(side.session(group, user), group))
            side.settle()

    @rule(data=st.data())
    def finish_one(self, data: st.DataObject) -> None:
        running = self._with_state("running")
        if not running:
            return
        i = data.draw(st.sampled_from(running))
        for side in self._both():
            side.queries[i].finish()
            side.settle()

    @rule(data=st.data())
    def cancel_a_waiting_one(self, data: st.DataObject) -> None:
        waiting = self._with_state("queued") + self._with_state("parked")
        if not waiting:
            return
        i = data.draw(st.sampled_from(waiting))
        for side in self._both():
            side.queries[i].query.cancel()
            assert side.queries[i].done.wait(10)
            side.settle()

    @rule(data=st.data(), nbytes=st.integers(1, 200_000))
    def track_memory(self, data: st.DataObject, nbytes: int) -> None:
        running = self._with_state("running")
        if not running:
            return
        i = data.draw(st.sampled_from(running))
        for side in self._both():
            side.queries[i].tell("allocate", nbytes)
            if nbytes % 2:
                side.queries[i].tell("release", nbytes)

    @rule(group=st.sampled_from(("a", "b")), limit=st.integers(1, 3))
    def alter_limit(self, group: str, limit: int) -> None:
        for side in self._both():
            side.engine.connect().execute(
                f"ALTER RESOURCE GROUP {group} SET (max_active_queries = {limit})"
            )
            side.settle()

    @invariant()
    def both_agree(self) -> None:
        assert self.fast.by_group() == self.slow.by_group()
        assert self.fast.counters() == self.slow.counters()
        for side in self._both():
            side.check_invariants()
        fast_free = self.fast.engine.pool("default").free
        assert fast_free == self.slow.engine.pool("default").free


FastAgainstSlow.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
test_the_fast_path_agrees_with_the_slow_path = FastAgainstSlow.TestCase


def test_an_uncontended_query_takes_the_fast_path() -> None:
    """Below the limit with nobody waiting, a query is admitted and granted a
    worker in one step; the counters are those of the slow path."""
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g WITH (max_active_queries = 1)")
        session.execute("SET RESOURCE GROUP g")
        calls: list[str] = []
        gate = engine.runtimes.all()
        runtime = next(r for r in gate if r.definition.name == "g")
        original = runtime.gate.enter

        def counting_enter(*args: Any, **kwargs: Any) -> None:
            calls.append("slow")
            original(*args, **kwargs)

        runtime.gate.enter = counting_enter  # type: ignore[method-assign]
        for _ in range(3):
            with session.query():
                pass
        assert calls == []
        row = next(r for r in engine.resource_groups() if r["name"] == "g")
        assert row["admitted_total"] == 3
        assert row["active_queries"] == 0
        with session.query():  # the group is full: the second waits, on the slow path
            other = engine.connect()
            other.execute("SET RESOURCE GROUP g")
            waiter = QueryThread(other, "g")
            wait_until(lambda: waiter.stable_state() == "queued")
            assert calls == ["slow"]
        wait_until(lambda: waiter.stable_state() == "running")
        waiter.finish()
        assert engine.pool("default").free == 2


@pytest.mark.parametrize("fast", [True, False])
def test_a_query_entered_on_either_path_gives_everything_back(fast: bool) -> None:
    with resgroups.Engine(workers=2) as engine:
        engine.dispatcher.fast_path = fast
        session = engine.connect()
        with session.query() as q:
            q.memory.allocate(100_000)
            assert engine.pool("default").free == 1
        assert engine.pool("default").free == 2
        row = next(r for r in engine.resource_groups() if r["name"] == "DEFAULT")
        assert row["memory_used_bytes"] == 0
        assert row["active_queries"] == 0


def _handoff_setup(workers: int) -> tuple[Any, Any, Any, Any]:
    """A dispatcher, a gate of one slot held by a first query, and a second query
    queued behind it with its runner, as ``resgroups.query.waiting.admit_slow`` leaves them."""
    from resgroups.sched.admission import Gate, GateConfig, Ticket
    from resgroups.sched.cpu import Runner
    from resgroups.sched.pool import Dispatcher

    clock = ManualClock()
    dispatcher = Dispatcher({"default": workers}, clock.monotonic, slice_ms=10, granularity_ms=50)
    group = dispatcher.core.group(1, "g")
    gate = Gate(GateConfig("g", max_active=1))
    first, first_runner = Ticket("ann"), Runner(group, "default", "ann", 1)
    assert dispatcher.admit_at_once(gate, first, first_runner)
    second, second_runner = Ticket("bob"), Runner(group, "default", "bob", 2)
    with dispatcher.lock:
        assert not gate.submit(second, clock.monotonic())
    second.runner = second_runner
    return dispatcher, gate, (first, first_runner), (second, second_runner)


def test_a_slot_handed_on_takes_a_free_worker_with_it() -> None:
    """When a leaving query's slot goes to the next in the queue and a worker is
    free, the worker goes too: the woken query has nothing left to take. Its
    arrival order for workers counts from the hand-off, as a new runner's would."""

    dispatcher, gate, (first, first_runner), (second, runner) = _handoff_setup(workers=2)
    try:
        arrived = runner.seq
        dispatcher.leave(gate, first, first_runner, 0)
        assert second.state is TicketState.ACTIVE
        assert runner.state is RunnerState.RUNNING
        assert runner.seq > arrived
        assert second.runner is None
        assert dispatcher.core.free["default"] == 1
        gate._check_invariants()
        dispatcher.check_invariants()
    finally:
        dispatcher.close()


def test_no_worker_is_handed_on_when_none_is_free() -> None:
    """The slot still goes to the next query, but the freed worker goes to a query
    already waiting for one: the woken query asks for a worker itself, in the
    pool's order."""
    from resgroups.sched.cpu import Runner

    dispatcher, gate, (first, first_runner), (second, runner) = _handoff_setup(workers=1)
    try:
        other = Runner(first_runner.group, "default", "cy", 3)
        with dispatcher.lock:
            assert dispatcher.core.submit(other, 0.0) == []  # waits for the one worker
        dispatcher.leave(gate, first, first_runner, 0)
        assert other.state is RunnerState.RUNNING  # the freed worker: first in line
        assert second.state is TicketState.ACTIVE  # the slot
        assert runner.state is RunnerState.DONE  # no worker with it
        assert dispatcher.core.free["default"] == 0
        gate._check_invariants()
        dispatcher.check_invariants()
    finally:
        dispatcher.close()


def test_a_wakeup_is_consumed_by_one_wait() -> None:
    from resgroups.sched.wakeup import Wakeup

    wakeup = Wakeup()
    assert not wakeup.wait(0.001)  # nothing set: the wait times out
    wakeup.set()
    wakeup.set()  # twice before a wait: one wake-up
    assert wakeup.wait(0.001)
    assert not wakeup.wait(0.001)
    woken = threading.Event()

    def waiter() -> None:
        if wakeup.wait(10.0):
            woken.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    wakeup.set()
    thread.join(10.0)
    assert woken.is_set()
