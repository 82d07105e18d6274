"""Counted admissions: a query that neither waits nor is sliced holds a counted
slot and a counted worker, and no ticket or runner (docs/queries.md "Cost").

An uncontended query is admitted by count; while CPU scheduling is engaged
(two groups exist) it is also metered and charged as it leaves, and
promoted to a ticket and a runner if it reaches the end of a slice. One that
must queue, or whose group has a CPU limit or the fair policy, gets a ticket
and a runner, made when it comes to that.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

from waiting import wait_until

import resgroups
from resgroups.clock import ManualClock
from resgroups.query import Query
from resgroups.sched.admission import TicketState


def _check(engine: resgroups.Engine) -> None:
    engine.dispatcher.check_invariants()
    for runtime in engine.runtimes.all():
        with runtime.gate.lock:
            runtime.gate.gate._check_invariants()


def _default(engine: resgroups.Engine) -> dict[str, object]:
    return next(r for r in engine.resource_groups() if r["name"] == "DEFAULT")


def test_an_uncontended_query_holds_a_counted_slot_and_worker_only() -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        with session.query() as q:
            assert q.held.counted
            assert q.held.ticket is None
            assert q.held.runner is None
            assert engine.pool("default").free == 1
            assert _default(engine)["active_queries"] == 1
            progress = q.progress()
            assert progress is not None
            assert (progress.state, progress.workers_held) == ("running", 1)
            _check(engine)
        assert not q.held.counted
        assert engine.pool("default").free == 2
        assert (_default(engine)["active_queries"], _default(engine)["admitted_total"]) == (0, 1)
        _check(engine)


def test_a_query_that_must_wait_gets_a_ticket_and_the_counted_slot_goes_to_it() -> None:
    with resgroups.Engine(workers=2) as engine:
        engine.connect().execute("ALTER RESOURCE GROUP DEFAULT SET (max_active_queries = 1)")
        holder = engine.connect()
        waiter = engine.connect()
        entered, leave = threading.Event(), threading.Event()
        outcome: list[bool] = []

        def wait_then_run() -> None:
            with waiter.query() as q:
                outcome.append(q.held.counted)
                entered.set()
                leave.wait(10)

        with holder.query() as first:
            assert first.held.counted
            thread = threading.Thread(target=wait_then_run)
            thread.start()

            def queued() -> bool:
                tickets = [q.held.ticket for q in engine.live_queries() if q is not first]
                return any(t is not None and t.state is TicketState.QUEUED for t in tickets)

            wait_until(queued)
            _check(engine)
        assert entered.wait(10)  # the slot went to the ticket, with a worker
        assert outcome == [False]
        assert engine.pool("default").free == 1
        _check(engine)
        leave.set()
        thread.join(10)
        assert engine.pool("default").free == 2
        assert _default(engine)["active_queries"] == 0
        _check(engine)


def test_a_lost_counted_query_is_reclaimed() -> None:
    with resgroups.Engine(workers=2, reconcile_interval=3600) as engine:
        session = engine.connect()

        def lose_the_handle() -> None:  # a thread that dies without __exit__
            q = session.query()
            q.__enter__()
            assert q.held.counted

        thread = threading.Thread(target=lose_the_handle)
        thread.start()
        thread.join(30)
        gc.collect()
        assert engine.pool("default").free == 1
        assert engine.reconcile() == 1
        assert engine.pool("default").free == 2
        assert _default(engine)["active_queries"] == 0
        _check(engine)


def test_scheduling_that_engages_under_a_counted_query_leaves_it_unsliced() -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        with session.query() as counted:
            assert counted.held.counted
            assert counted.held.metered_at is None
            engine.connect().execute("CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")
            with session.query() as engaged:  # engaged now: counted too, and metered
                assert engaged.held.counted
                assert engaged.held.metered_at is not None
                assert engaged.held.runner is None
                assert engine.pool("default").free == 0
                _check(engine)
            assert counted.held.metered_at is None  # taken unmetered: never sliced
            _check(engine)
        assert engine.pool("default").free == 2
        _check(engine)


class _Meter:
    """A thread CPU clock the test moves by hand (ns)."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _another_parked(engine: resgroups.Engine, q: Query) -> bool:
    """A query other than ``q`` waits for a worker."""
    runners = [x.held.runner for x in engine.live_queries() if x is not q]
    return any(r is not None and r.state.value == "waiting" for r in runners)


def _query_in_other(engine: resgroups.Engine) -> tuple[threading.Thread, threading.Event]:
    """A thread (not started) that runs one query in group ``other``; the event is
    set once that query is admitted."""
    other = engine.connect()
    other.execute("SET RESOURCE GROUP other")
    entered = threading.Event()

    def run_other() -> None:
        with other.query():
            entered.set()

    return threading.Thread(target=run_other), entered


def _engaged(workers: int = 2) -> tuple[resgroups.Engine, ManualClock, _Meter]:
    clock, meter = ManualClock(), _Meter()
    engine = resgroups.Engine(workers=workers, clock=clock, cpu_meter=meter, slice_ms=50)
    engine.connect().execute("CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")
    return engine, clock, meter


def test_an_engaged_query_ending_within_its_slice_is_counted_and_charged_as_it_leaves() -> None:
    engine, clock, meter = _engaged()
    with engine:
        with engine.connect().query() as q:
            assert q.held.counted
            assert q.held.metered_at is not None
            assert q.held.ticket is None
            assert q.held.runner is None
            meter.ns += 7_000_000
            clock.advance(0.01)  # within the slice: nothing happens at a checkpoint
            q.checkpoint()
            assert q.held.counted
            assert q.held.runner is None
            _check(engine)
        assert q.cpu_ns == 7_000_000
        assert _default(engine)["cpu_nanos_total"] == 7_000_000
        assert engine.pool("default").free == 2
        _check(engine)


def test_an_engaged_counted_query_is_promoted_at_its_first_slice_end() -> None:
    engine, clock, meter = _engaged()
    with engine:
        with engine.connect().query() as q:
            meter.ns += 60_000_000
            clock.advance(0.06)  # past its slice end
            q.checkpoint()
            assert not q.held.counted
            assert q.held.metered_at is None
            runner, ticket = q.held.runner, q.held.ticket
            assert runner is not None
            assert runner.scheduled
            assert ticket is not None
            assert ticket.state is TicketState.ACTIVE
            assert _default(engine)["active_queries"] == 1
            assert engine.pool("default").free == 1
            _check(engine)
            meter.ns += 5_000_000
        assert q.cpu_ns == 65_000_000  # the slice, then the rest as it leaves
        assert _default(engine)["cpu_nanos_total"] == 65_000_000
        assert (_default(engine)["active_queries"], _default(engine)["admitted_total"]) == (0, 1)
        assert engine.pool("default").free == 2
        _check(engine)


def test_a_promoted_query_yields_to_a_lagging_group_waiting_for_its_worker() -> None:
    engine, clock, meter = _engaged(workers=1)
    with engine:
        thread, entered = _query_in_other(engine)
        admitted, go, done = threading.Event(), threading.Event(), threading.Event()
        seen: dict[str, object] = {}

        def mine() -> None:  # entered and checkpointed on its own thread (its CPU clock)
            with engine.connect().query() as q:
                seen["query"] = q
                admitted.set()
                go.wait(10)
                q.checkpoint()
                runner = q.held.runner
                seen["sliced"] = runner is not None and runner.scheduled
                done.set()

        own = threading.Thread(target=mine)
        own.start()
        assert admitted.wait(10)
        q = seen["query"]
        assert isinstance(q, Query)
        assert q.held.counted
        thread.start()
        wait_until(lambda: _another_parked(engine, q))
        meter.ns += 60_000_000
        clock.advance(0.06)
        # promoted, charged, and yields its worker to the group that has run nothing
        go.set()
        assert entered.wait(10)
        thread.join(10)
        own.join(10)
        assert done.is_set()
        assert seen["sliced"]
        _check(engine)
        assert engine.pool("default").free == 1


def test_a_limited_or_fair_group_takes_a_runner_while_engaged() -> None:
    engine, _, _ = _engaged()
    with engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP capped WITH (cpu_limit = '50%');"
            "CREATE RESOURCE GROUP shared WITH (scheduling_policy = 'fair')"
        )
        for group in ("capped", "shared"):
            session = engine.connect()
            session.execute(f"SET RESOURCE GROUP {group}")
            with session.query() as q:
                assert not q.held.counted
                assert q.held.runner is not None
                assert q.held.runner.scheduled
                _check(engine)
        _check(engine)


def test_work_arriving_in_a_metered_querys_first_slice_is_fresh_at_its_end() -> None:
    """Its grant is when it took the worker, not its promotion: another group's
    query that arrived meanwhile takes the worker at that first slice end."""
    engine, clock, meter = _engaged(workers=1)
    with engine:
        engine.connect().execute("ALTER RESOURCE GROUP other SET (cpu_weight = 100)")
        thread, entered = _query_in_other(engine)
        admitted, go = threading.Event(), threading.Event()
        seen: list[Query] = []

        def mine() -> None:  # entered and checkpointed on its own thread (its CPU clock)
            with engine.connect().query() as q:
                seen.append(q)
                admitted.set()
                go.wait(10)
                q.checkpoint()

        own = threading.Thread(target=mine)
        own.start()
        assert admitted.wait(10)
        q = seen[0]
        assert q.held.metered_at is not None
        clock.advance(0.002)  # it arrives 2 ms into q's slice
        thread.start()
        wait_until(lambda: _another_parked(engine, q))
        meter.ns += 51_000_000
        clock.advance(0.05)  # q's first slice ends
        go.set()
        assert entered.wait(10)  # it yielded there, not slices later
        own.join(10)
        thread.join(10)
        _check(engine)


def test_a_rule_on_cpu_time_does_not_take_a_metered_querys_cpu_from_its_group() -> None:
    engine, clock, meter = _engaged()
    with engine:
        engine.connect().execute(
            "CREATE RESOURCE RULE watch ON RESOURCE GROUP DEFAULT WHEN cpu_time > '1h' THEN LOG"
        )
        with engine.connect().query() as q:
            meter.ns += 3_000_000
            clock.advance(0.01)
            q.suspend()
            clock.advance(5)  # a cursor between pages
            q.resume()
            assert q.held.metered_at is not None
            meter.ns += 40_000_000
            clock.advance(0.001)
            q.checkpoint()  # its rules are due (they were before it was suspended)
            meter.ns += 2_000_000
        assert q.cpu_ns == 45_000_000
        assert _default(engine)["cpu_nanos_total"] == 45_000_000
        _check(engine)


def test_an_unsliced_metered_query_leaves_a_limit_capped_debt() -> None:
    """A limit added while a metered query runs one long native call: what it
    used is charged, its debt capped as a CTAS's (10 s of the limit's refill)."""
    engine, _, meter = _engaged()
    with engine:
        admin = engine.connect()
        with engine.connect().query() as q:
            assert q.held.metered_at is not None
            admin.execute("ALTER RESOURCE GROUP DEFAULT SET (cpu_limit = '10%')")
            meter.ns += 60_000_000_000  # a minute of CPU, no checkpoint
        g = next(g for g in engine.dispatcher.core.groups.values() if g.name == "DEFAULT")
        assert g.budget_ns >= -g.rate * 10 - 1
        assert _default(engine)["cpu_nanos_total"] == 60_000_000_000
        _check(engine)


class _ThreadMeter:
    """A CPU clock per thread, as the real one is, moved by hand (ns)."""

    def __init__(self) -> None:
        self.ns: dict[int, int] = {}

    def add(self, ns: int) -> None:
        ident = threading.get_ident()
        self.ns[ident] = self.ns.get(ident, 0) + ns

    def __call__(self) -> int:
        return self.ns.get(threading.get_ident(), 0)


def _on_another_thread(run: Callable[[], object]) -> list[BaseException]:
    errors: list[BaseException] = []

    def call() -> None:
        try:
            run()
        except BaseException as exc:  # reported to the test
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return errors


def test_a_query_left_or_checkpointed_on_another_thread_is_charged_no_other_threads_cpu() -> None:
    """A thread's CPU clock says nothing of another thread's: a query entered on
    one thread and checkpointed or left on another is charged nothing for that
    stretch (it had raised InternalError for a negative charge and kept its
    worker), and gives back everything, metered or sliced alike."""
    clock, meter = ManualClock(), _ThreadMeter()
    engine = resgroups.Engine(workers=2, clock=clock, cpu_meter=meter, slice_ms=50)
    with engine:
        engine.connect().execute("CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")
        session = engine.connect()
        # metered (counted), left on another thread
        q = session.query()
        q.__enter__()
        assert q.held.metered_at is not None
        meter.add(7_000_000)  # its own thread's CPU: not yet charged
        assert _on_another_thread(lambda: q.__exit__(None, None, None)) == []
        assert q.cpu_ns == 0
        assert engine.pool("default").free == 2
        _check(engine)
        # promoted at a slice end on its own thread, then checkpointed and left on another
        q = session.query()
        q.__enter__()
        meter.add(60_000_000)
        clock.advance(0.06)
        q.checkpoint()  # its own thread: charged, and sliced from here
        assert q.held.runner is not None
        assert q.cpu_ns == 60_000_000
        meter.add(5_000_000)
        clock.advance(0.06)
        assert _on_another_thread(q.checkpoint) == []  # that thread's clock is its mark now
        assert q.cpu_ns == 60_000_000
        assert _on_another_thread(lambda: q.__exit__(None, None, None)) == []
        assert q.cpu_ns == 60_000_000
        assert _default(engine)["cpu_nanos_total"] == 60_000_000
        assert engine.pool("default").free == 2
        assert not engine.live_queries()
        _check(engine)


def test_a_query_left_on_a_thread_that_reuses_its_enterers_ident_is_charged_nothing() -> None:
    """``get_ident()`` of a thread that ended is given to the next one to start (a
    thread-per-request server): a query entered on one and left on the next is
    told apart by a token of the thread's own, so the new thread's clock is not
    read against the old one's mark (a negative charge had kept the worker)."""
    with resgroups.Engine(workers=2) as engine:  # the real thread CPU clocks
        engine.connect().execute("CREATE RESOURCE GROUP other")  # scheduling engaged
        q = engine.connect().query()
        idents: list[int] = []

        def enter() -> None:
            spent = time.thread_time() + 0.05
            while time.thread_time() < spent:  # this thread's earlier work
                pass
            q.__enter__()
            idents.append(threading.get_ident())

        first = threading.Thread(target=enter)
        first.start()
        first.join(30)
        assert q.held.metered_at is not None

        def leave() -> None:
            idents.append(threading.get_ident())
            q.__exit__(None, None, None)

        assert _on_another_thread(leave) == []
        assert q.cpu_ns == 0  # neither thread's clock says what the other used
        assert not engine.cpu_scheduler_degraded
        assert engine.pool("default").free == 2
        assert _default(engine)["cpu_nanos_total"] == 0
        assert len(idents) == 2  # (the same ident in most runs: the case this covers)
        _check(engine)
