"""Fleet mode under faults (SPEC §6, §11): three engine processes on one
PostgreSQL catalog and coordination database, each as a PostgreSQL role of its
own, while a seeded schedule kills, stops and partitions them and renames,
alters, resets, drops and re-creates their group; no instant may have more
bodies of a group running fleet-wide than the limit in force (fairly judged
across transitions, see tests/fleet_faults.py), every process must keep
completing queries, and nothing may be left behind.

The short runs are in the default suite (about 25 s per mode); the soak, with
more seeds, longer schedules and faults overlapping, is marked slow:

    pytest tests/test_fleet_faults.py -m slow

``RESGROUPS_FAULTS_PG_RESTART=1`` adds restarts of the PostgreSQL cluster to
the soak (``pg_ctlcluster``; only where the test may restart the server).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from fleet_faults import KINDS, Body, FaultConfig, Timeline, check, run_faults

SHORT_SEEDS = {"lease": 11, "quota": 12}


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_the_fleet_limit_holds_under_faults(pg_catalog: str, tmp_path: Path, mode: str) -> None:
    config = FaultConfig(mode=mode, seed=SHORT_SEEDS[mode], faults=len(KINDS))
    report = run_faults(pg_catalog, config, tmp_path)
    print(report.format())  # the figures, with -s or on failure
    report.assert_ok()
    assert {f.kind for f in report.faults} == set(KINDS)  # one of each
    assert sum(b.error is None for b in report.bodies) > 100


@pytest.mark.slow
@pytest.mark.parametrize("seed", [101, 202, 303])
@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_the_fleet_limit_holds_under_a_long_fault_soak(
    pg_catalog: str, tmp_path: Path, mode: str, seed: int
) -> None:
    config = FaultConfig(
        mode=mode,
        seed=seed,
        duration=90.0,
        gap=(0.1, 1.5),
        overlap=0.35,
        long_share=0.05,
        pg_restart=os.environ.get("RESGROUPS_FAULTS_PG_RESTART") == "1",
    )
    report = run_faults(pg_catalog, config, tmp_path)
    print(report.format())
    report.assert_ok()
    assert {f.kind for f in report.faults} >= set(KINDS)


# ---- the judge itself, on made-up bodies (no PostgreSQL) ---------------------------------


def _timeline(*steps: tuple[float, dict[int, tuple[str, int | None]]]) -> Timeline:
    """Each step: the DDL ran [t, t + 0.01] and left these groups (id -> name, limit)."""
    timeline = Timeline()
    for version, (t, groups) in enumerate(steps, start=1):
        snapshot = SimpleNamespace(
            version=version,
            groups=[
                SimpleNamespace(id=i, name=n, max_active_queries=m) for i, (n, m) in groups.items()
            ],
        )
        timeline.observe(snapshot, t, t + 0.01, f"ddl at {t}")
    return timeline


def _body(
    start: float, end: float, gid: int = 1, submit: float | None = None, v0: int = 99
) -> Body:
    return Body(0, "i", 1, start if submit is None else submit, start, end, None, "g", gid, v0, v0)


def _judge(bodies: list[Body], timeline: Timeline, propagation: float = 1.0) -> list[int]:
    violations, _, _ = check(bodies, timeline, [], 0.05, propagation, 1.5)
    return [len(v.open_bodies) for v in violations]


def test_the_judge_counts_bodies_open_at_each_start_against_the_limit() -> None:
    timeline = _timeline((0.0, {1: ("g", 2)}))
    assert _judge([_body(1, 3), _body(1.5, 2), _body(2.5, 4)], timeline) == []
    assert _judge([_body(1, 3), _body(1.5, 2.6), _body(2.5, 4)], timeline) == [3]
    # a RENAME is the same group: its count goes on
    renamed = _timeline((0.0, {1: ("g", 2)}), (2.0, {1: ("h", 2)}))
    assert _judge([_body(1, 3), _body(1.5, 3), _body(2.5, 4)], renamed) == [3]
    # a DROP + CREATE is a new group with its own count
    again = _timeline((0.0, {1: ("g", 2)}), (2.0, {}), (2.1, {2: ("g", 2)}))
    assert _judge([_body(1, 3), _body(1.5, 3), _body(2.5, 4, gid=2)], again) == []


def test_the_judge_lets_older_bodies_run_above_a_lowered_or_appearing_limit() -> None:
    lowered = _timeline((0.0, {1: ("g", 4)}), (2.0, {1: ("g", 1)}))
    old = [_body(1, 5), _body(1.1, 5), _body(1.2, 5)]
    assert _judge(old, lowered) == []  # admitted under 4, running above 1: fine
    assert _judge([*old, _body(3, 3.5)], lowered) == [4]  # nothing new while 3 >= 1 run
    assert _judge([*old, _body(6, 7)], lowered) == []  # once below it
    appeared = _timeline((0.0, {1: ("g", None)}), (2.0, {1: ("g", 2)}))
    many = [_body(1, 5 + i / 10) for i in range(6)]  # unlimited: not checked
    assert _judge(many, appeared) == []
    assert _judge([*many, _body(3, 3.2)], appeared) == [7]


def test_the_judge_tolerates_a_node_behind_a_ddl_only_within_the_propagation_window() -> None:
    lowered = _timeline((0.0, {1: ("g", 4)}), (2.0, {1: ("g", 1)}))  # version 2
    old = [_body(1, 5), _body(1.1, 5)]
    behind = _body(2.5, 2.6, v0=1)  # its node had version 1: the old limit
    assert _judge([*old, behind], lowered) == []
    assert _judge([*old, behind], lowered, propagation=0) == [3]  # the strict reading
    applied = _body(2.5, 2.6, v0=2)  # its node had the DDL: no excuse
    assert _judge([*old, applied], lowered) == [3]
    late = _body(3.5, 3.6, v0=1)  # behind for longer than the window
    assert _judge([*old, late], lowered) == [3]
    # submitted before the DDL and admitted within the slack after it: the old limit
    straddling = _body(2.03, 2.1, submit=1.9)
    assert _judge([*old, straddling], lowered, propagation=0) == []
