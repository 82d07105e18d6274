"""The share window on its own: water-filling by weight under limits, and the
window's accounting over arbitrary (float-unfriendly) times."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from resgroups.sched.shares import ShareWindow, tree_fill, water_fill


@dataclass(frozen=True)
class G:
    group_id: int
    weight: int = 100
    limit_cores: float | None = None


@dataclass(frozen=True)
class N:
    """A group in a tree, as tree_fill sees it."""

    group_id: int
    weight: int = 100
    limit_cores: float | None = None
    parent: N | None = None


def test_water_fill_by_weight_with_caps_and_the_excess_redistributed() -> None:
    a, b, c = G(1, 300, limit_cores=0.5), G(2, 100), G(3, 100)
    shares = water_fill([a, b, c], cpus=2)
    assert shares[1] == pytest.approx(0.25)  # 300/500 = 60 % > its 25 % cap
    assert shares[2] == pytest.approx(0.375)  # the other 75 % split 1:1
    assert shares[3] == pytest.approx(0.375)
    assert water_fill([G(1, limit_cores=4.0)], cpus=2) == {1: 1.0}
    assert water_fill([], cpus=2) == {}


times = st.lists(
    st.tuples(
        st.sampled_from([0.1, 0.2, 0.3, 0.05, 0.7, 1e-9, 3.0, 0.2 * 3, 0.1 * 7]),
        st.sets(st.sampled_from([1, 2, 3])),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(times, st.sampled_from([1.0, 2.0, 4.0, 10.0]))
@example(  # busy just before the window: only the edge bucket's pro rata share counts
    [(0.1, {1}), (0.1, set()), (0.1, set()), (0.1, set()), (0.1, set()), (0.7, set()),
     (3.0, set())],
    4.0,
)  # fmt: skip
def test_the_window_shares_out_exactly_the_time_someone_wanted(
    steps: list[tuple[float, set[int]]], window: float
) -> None:
    groups = {1: G(1, 200), 2: G(2, 100), 3: G(3, 100, limit_cores=0.2)}
    shares = ShareWindow(cpus=2, window_s=window)
    now = 1000.1
    wanted: list[tuple[float, float, bool]] = []  # (start, end, anyone wanted)
    current: set[int] = set()
    shares.changed([], now)
    for advance, busy in steps:
        wanted.append((now, now + advance, bool(current)))
        now += advance
        current = busy
        shares.changed([groups[g] for g in busy], now)
    reading = shares.read(now + 0.0)
    for share in reading.values():
        assert 0.0 <= share.entitled_pct <= 100.0 + 1e-6
    span = min(window, now - 1000.1)
    busy_time = sum(
        max(0.0, min(end, now) - max(start, now - span)) for start, end, any_ in wanted if any_
    )
    # with group 3 capped the total can fall short of the busy time, never exceed it
    # by more than the window's edge: the oldest bucket is counted pro rata, off by
    # at most one bucket (a twentieth of the window)
    total = sum(s.entitled_pct for s in reading.values())
    if span > 0:
        assert total <= (busy_time + window / 20) / span * 100 + 1e-6


def test_tree_fill_shares_each_level_by_weight_under_the_limits_above() -> None:
    """docs/cpu.md's example on 2 CPUs: etl limited to half, its children 2:1,
    adhoc top level; an inner group's fraction is its subtree's."""
    etl = N(1, limit_cores=1.0)
    nightly, backfill, adhoc = N(2, 200, parent=etl), N(3, 100, parent=etl), N(4)
    shares = tree_fill([etl, nightly, backfill, adhoc], cpus=2)
    assert shares[1] == pytest.approx(0.5)
    assert shares[2] == pytest.approx(1 / 3)
    assert shares[3] == pytest.approx(1 / 6)
    assert shares[4] == pytest.approx(0.5)
    # backfill idle: nightly takes all of etl's half, not more
    assert tree_fill([etl, nightly, adhoc], cpus=2) == pytest.approx({1: 0.5, 2: 0.5, 4: 0.5})
    # adhoc idle: etl's limit still holds
    assert tree_fill([etl, nightly, backfill], cpus=2)[1] == pytest.approx(0.5)


def test_tree_fill_caps_a_subtree_at_what_its_capped_children_can_take() -> None:
    """An unlimited parent whose only wanting child is limited to 0.4 core takes
    0.2 of 2 CPUs; its top-level sibling gets the rest."""
    parent = N(1, weight=900)
    child = N(2, limit_cores=0.4, parent=parent)
    other = N(3)
    shares = tree_fill([parent, child, other], cpus=2)
    assert shares == pytest.approx({1: 0.2, 2: 0.2, 3: 0.8})


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 50, 100, 300]), st.sampled_from([None, 0.2, 1.0, 3.0])),
        min_size=1,
        max_size=6,
    )
)
def test_tree_fill_without_parents_is_water_fill(groups: list[tuple[int, float | None]]) -> None:
    flat = [N(i, w, limit) for i, (w, limit) in enumerate(groups)]
    assert tree_fill(flat, cpus=2) == water_fill(flat, cpus=2)
