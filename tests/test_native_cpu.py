"""The attribution of an engine's own threads' CPU to the queries inside it
(resgroups.integrations.native_cpu), driven by a hand clock and hand-set thread
clocks; and Query.charge_cpu, which hands the shares to the scheduler."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from engine_checks import group_row
from waiting import wait_until

import resgroups
from resgroups.integrations.native_cpu import EngineThreads, thread_cpu_ns


class FakeQuery:
    """What EngineThreads needs of a query: a key, and charge_cpu."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.charged: list[int] = []

    def charge_cpu(self, nanos: int) -> None:
        self.charged.append(nanos)


class Hand:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu: dict[int, int] = {}

    def clock(self) -> float:
        return self.now

    def clocks(self) -> dict[int, int]:
        return dict(self.cpu)


def threads(hand: Hand) -> EngineThreads:
    return EngineThreads("test", lambda name: True, clock=hand.clock, clocks=hand.clocks)


def test_a_lone_query_is_charged_what_the_threads_used_while_it_was_inside() -> None:
    hand = Hand()
    hand.cpu = {1: 5_000, 2: 7_000}  # used before: the baseline, charged to nobody
    engine = threads(hand)
    q = FakeQuery("q")
    with engine.inside(q) as native:  # type: ignore[arg-type]
        with native.active():
            hand.now, hand.cpu = 1.0, {1: 505_000, 2: 307_000}
        native.charge()
        assert q.charged == [800_000]
        with native.active():
            hand.now, hand.cpu = 2.0, {1: 605_000, 2: 307_000, 3: 50_000}  # 3 is new
        engine._check_invariants()
    assert q.charged == [800_000, 150_000]
    assert native.charged_ns == 950_000
    engine._check_invariants()


def test_two_queries_share_by_their_active_time_and_idle_cpu_is_unattributed() -> None:
    hand = Hand()
    hand.cpu = {1: 0}
    engine = threads(hand)
    a, b = FakeQuery("a"), FakeQuery("b")
    with engine.inside(a) as na, engine.inside(b) as nb:  # type: ignore[arg-type]
        hand.now = 1.0
        engine._activity(a, True)  # a active from 1.0
        hand.now = 2.0
        engine._activity(b, True)  # b active from 2.0
        hand.now = 4.0
        hand.cpu = {1: 4_000_000}  # used over (0, 4]
        engine._activity(a, False)
        engine._activity(b, False)
        na.charge()
        nb.charge()
        # a was active 3 s of the interval, b 2 s: 3:2
        assert (a.charged, b.charged) == ([2_400_000], [1_600_000])
        hand.now, hand.cpu = 5.0, {1: 5_000_000}  # nobody active: nobody charged
        na.charge()
        engine._check_invariants()
    assert engine.unattributed_ns == pytest.approx(1_000_000)
    assert engine.taken_ns == 4_000_000
    engine._check_invariants()


def test_a_thread_that_ended_is_forgotten_and_a_query_cannot_enter_twice() -> None:
    hand = Hand()
    hand.cpu = {1: 100, 2: 100}
    engine = threads(hand)
    q = FakeQuery("q")
    with engine.inside(q) as native:  # type: ignore[arg-type]
        with native.active():
            hand.now, hand.cpu = 1.0, {1: 1_100}  # 2 ended
        native.charge()
        assert q.charged == [1_000]
        with (
            pytest.raises(resgroups.InternalError, match="inside test already"),
            engine.inside(q),  # type: ignore[arg-type]
        ):
            pass
    assert engine.inside_now() == 0


def test_the_thread_clock_is_the_threads_own() -> None:
    started = time.thread_time_ns()
    mine = thread_cpu_ns(threading.get_native_id())
    assert abs(mine - started) < 50_000_000
    finished: list[int] = []
    worker = threading.Thread(target=lambda: finished.append(threading.get_native_id()))
    worker.start()
    worker.join(10)
    wait_until(lambda: not os.path.exists(f"/proc/self/task/{finished[0]}"), timeout=10)
    with pytest.raises(OSError, match="Invalid argument"):  # refused, not made up
        thread_cpu_ns(finished[0])


# ---- Query.charge_cpu -------------------------------------------------------------


def test_charge_cpu_reaches_the_group_while_the_query_is_metered() -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP g")
        admin.execute("CREATE RESOURCE GROUP other")  # two groups: scheduling engaged
        admin.execute("SET RESOURCE GROUP g")
        with admin.query() as q:
            q.charge_cpu(500_000_000)
        assert group_row(engine, "g")["cpu_nanos_total"] >= 500_000_000
        assert q.cpu_ns >= 500_000_000


def test_charge_cpu_is_not_metered_while_scheduling_is_disengaged() -> None:
    with resgroups.Engine(workers=2) as engine:
        with engine.connect().query() as q:
            q.charge_cpu(500_000_000)
        assert group_row(engine, "DEFAULT")["cpu_nanos_total"] == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "10"])
def test_charge_cpu_refuses_what_is_not_nanoseconds(bad: Any) -> None:
    with (
        resgroups.Engine(workers=1) as engine,
        engine.connect().query() as q,
        pytest.raises(resgroups.InvalidParameter, match="integer >= 0"),
    ):
        q.charge_cpu(bad)
