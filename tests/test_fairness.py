"""Fairness as data: entitled against used CPU over the window, on real CPU-bound
work, and the token bucket of a fractional CPU limit on a hand-driven clock."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from test_cpu_real import Load, run
from waiting import wait_until

import resgroups
from resgroups.clock import ManualClock

WINDOW = 4.0  # seconds; the default is 10


def rows(engine: resgroups.Engine) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in engine.resource_groups()}


def test_two_to_one_weights_split_within_five_points_then_the_busy_group_takes_all() -> None:
    with resgroups.Engine(workers=2, cpu_share_window=WINDOW) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP heavy WITH (cpu_weight = 200);"
            "CREATE RESOURCE GROUP light WITH (cpu_weight = 100);"
        )
        load = Load()
        both = threading.Thread(
            target=run, args=(engine, [("heavy", "u")] * 3 + [("light", "u")] * 3, 6.0, load)
        )
        both.start()
        time.sleep(WINDOW + 1.0)  # the measurement: the window fills with contention
        during = rows(engine)
        both.join(60)
        # Used is a share of all the CPUs, so CPU the machine gave to other processes
        # shows as error in every group; the split between the two is what must be 2:1.
        used = {name: during[name]["cpu_used_pct"] for name in ("heavy", "light")}
        missing = max(0.0, 100.0 - sum(used.values()))
        assert 100 * used["heavy"] / sum(used.values()) == pytest.approx(200 / 3, abs=5.0), during
        for name, entitled in (("heavy", 200 / 3), ("light", 100 / 3)):
            row = during[name]
            assert row["cpu_entitled_pct"] == pytest.approx(entitled, abs=2.0), row
            assert abs(row["cpu_share_error_pct"]) <= 5.0 + missing, row
            assert row["cpu_share_error_pct"] == pytest.approx(
                row["cpu_used_pct"] - row["cpu_entitled_pct"], abs=0.002
            )
        # light goes idle, heavy keeps going: within one window heavy is entitled to all
        alone = threading.Thread(target=run, args=(engine, [("heavy", "u")] * 3, 6.0, Load()))
        alone.start()
        time.sleep(WINDOW + 0.5)
        later = rows(engine)
        alone.join(60)
        assert later["heavy"]["cpu_entitled_pct"] >= 95.0, later["heavy"]
        assert later["light"]["cpu_entitled_pct"] <= 5.0, later["light"]


def test_a_limit_caps_the_entitlement_and_the_rest_goes_by_weight() -> None:
    with resgroups.Engine(workers=2, cpu_share_window=WINDOW) as engine:
        quarter = 25.0
        engine.connect().execute_script(
            f"CREATE RESOURCE GROUP capped WITH (cpu_weight = 300, cpu_limit = '{quarter}%');"
            "CREATE RESOURCE GROUP free WITH (cpu_weight = 100);"
        )
        both = threading.Thread(
            target=run,
            args=(engine, [("capped", "u")] * 2 + [("free", "u")] * 2, WINDOW + 3.0, Load()),
        )
        both.start()
        wait_until(lambda: rows(engine)["free"]["cpu_entitled_pct"] > 0, timeout=30)
        # the threads start one after another, so the window's first moments may hold
        # capped alone (entitled 25, free 0): read once the window is all contention
        time.sleep(WINDOW + 0.5)
        now = rows(engine)
        both.join(60)
        # weight alone would give capped 75 %: its limit holds it to 25, free gets the rest
        assert now["capped"]["cpu_entitled_pct"] == pytest.approx(quarter, abs=1.0)
        assert now["free"]["cpu_entitled_pct"] == pytest.approx(100 - quarter, abs=1.0)


def test_token_bucket_columns_follow_burst_and_refill_on_a_manual_clock() -> None:
    clock = ManualClock()
    meter = [0]
    with resgroups.Engine(workers=1, clock=clock, cpu_meter=lambda: meter[0]) as engine:
        half_core = 50 / engine.cpus
        session = engine.connect()
        session.execute(f"CREATE RESOURCE GROUP half WITH (cpu_limit = '{half_core}%')")
        start = rows(engine)["half"]
        # a fresh group starts with its burst: 100 ms of its rate (0.5 core -> 50 ms)
        assert start["cpu_refill_cores"] == pytest.approx(0.5)
        assert start["cpu_burst_millis"] == pytest.approx(50.0)
        assert start["cpu_budget_millis"] == pytest.approx(50.0)
        assert rows(engine)["DEFAULT"]["cpu_budget_millis"] is None  # no fractional limit
        session.execute("SET RESOURCE GROUP half")
        with session.query() as q:
            meter[0] += 30_000_000  # 30 ms of CPU in this slice
            clock.advance(0.011)  # past the 10 ms slice: the next checkpoint charges it
            q.checkpoint()
            # refilled while full (capped at the burst), then charged 30 ms
            assert rows(engine)["half"]["cpu_budget_millis"] == pytest.approx(20.0)
            clock.advance(0.020)  # 20 ms at half a core refills 10 ms
            assert rows(engine)["half"]["cpu_budget_millis"] == pytest.approx(30.0)
            clock.advance(5.0)  # idle time is not banked beyond the burst
            assert rows(engine)["half"]["cpu_budget_millis"] == pytest.approx(50.0)


def test_a_task_above_one_core_leaves_the_group_in_debt() -> None:
    """Above one core parallel tasks do not wait for budget: the bucket goes negative
    and the query repays (SPEC §7), and cpu_budget_millis shows the debt."""
    from resgroups.sched.cpu import CpuScheduler, Runner

    core = CpuScheduler({"default": 4}, slice_ms=10, cpus=4)
    core.engaged = True
    g = core.group(1, "wide")
    core.configure(1, "wide", 100, 1.5, "fifo", 0.0)  # 1.5 cores: fractional, above one
    query = Runner(g, "default", "u", 1)
    task = Runner(g, "default", "u", 1, is_task=True)
    core.submit(query, 0.0)
    core.submit(task, 0.0)
    assert core.budget(1, 0.0) == pytest.approx(150e6)  # the burst: 100 ms of 1.5 cores
    core.release(task, 400_000_000, 0.01)  # the task used 400 ms of CPU
    assert core.budget(1, 0.01) == pytest.approx(150e6 - 400e6)  # in debt (negative)
    assert core.budget(1, 0.11) == pytest.approx(150e6 - 400e6 + 0.1 * 1.5e9)  # refilling


def test_fairness_and_the_token_bucket_in_metrics() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with resgroups.Engine(workers=2) as engine:
        half_core = 50 / engine.cpus
        engine.connect().execute(f"CREATE RESOURCE GROUP half WITH (cpu_limit = '{half_core}%')")
        families = {f.name: f for f in text_string_to_metric_families(engine.metrics_text())}
        for name in ("cpu_entitled_pct", "cpu_used_pct", "cpu_share_error_pct"):
            samples = families[f"resgroups_resource_group_{name}"].samples
            assert {s.labels["resource_group"] for s in samples} == {"DEFAULT", "half"}
        budget = families["resgroups_resource_group_cpu_budget_millis"].samples
        assert [(s.labels["resource_group"], s.value) for s in budget] == [("half", 50.0)]
        burst = families["resgroups_resource_group_cpu_burst_millis"].samples
        assert [s.value for s in burst] == [50.0]
