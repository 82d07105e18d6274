"""Counted admissions: a query that neither waits nor is sliced holds a counted
slot and a counted worker, and no ticket or runner (docs/queries.md "Cost").

With only DEFAULT (no CPU limit, no fair policy) CPU scheduling is not
engaged, so an uncontended query is admitted by count; one that must queue
gets a ticket and a runner, made when it comes to that.
"""

from __future__ import annotations

import gc
import threading

from waiting import wait_until

import resgroups
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
            engine.connect().execute("CREATE RESOURCE GROUP other WITH (cpu_weight = 200)")
            with session.query() as scheduled:  # engaged now: a runner, to be sliced
                assert not scheduled.held.counted
                assert scheduled.held.runner is not None
                assert scheduled.held.runner.scheduled
                assert engine.pool("default").free == 0
                _check(engine)
            _check(engine)
        assert engine.pool("default").free == 2
        _check(engine)
