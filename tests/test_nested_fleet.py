"""A tree of groups across a fleet (SPEC §14, §11): three engine processes on
one PostgreSQL catalog and coordination database run queries in the two
children of a parent limited to 4, while one is killed (SIGKILL) and another
stopped (SIGSTOP) past its lease expiry and resumed. In both fleet modes, no
instant has more than 4 bodies running fleet-wide in the parent, nor more
than a child's limit in a child; the fleet goes on without the lost processes
and the stopped one comes back."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg
import pytest
from nodes import Node, max_overlap
from waiting import wait_until

TREE_NODE = Path(__file__).parent / "programs" / "tree_node.py"
MONO = time.CLOCK_MONOTONIC


def _leases(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM resgroups_fleet_leases").fetchone()
        assert row is not None
        return int(row[0])


def _completed(node: Node, since: float) -> int:
    return sum(1 for m in node.seen if m.get("end") is not None and m["start"] >= since)


def _progress(node: Node, since: float, count: int, timeout: float = 30) -> None:
    """Bounded: ``node`` reports ``count`` bodies that started after ``since``."""
    deadline = time.monotonic() + timeout
    while _completed(node, since) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"no progress: {node.seen[-3:]}"
        node.wait_for(lambda m: "end" in m, timeout=left)


def _intervals(nodes: list[Node], killed: dict[int, float]) -> list[tuple[str, float, float]]:
    """(group, start, end) of every body: its final line, or, for a body of a
    killed node that never said it ended, from its start to the kill."""
    out: list[tuple[str, float, float]] = []
    for i, node in enumerate(nodes):
        ended = {m["body"]: m for m in node.seen if "end" in m}
        for m in node.seen:
            if "end" in m and m["start"] is not None and m["end"] is not None:
                out.append((m["group"], m["start"], m["end"]))
            elif "body" in m and "end" not in m and m["body"] not in ended and i in killed:
                out.append((m["group"], m["start"], killed[i]))
    return out


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_a_parent_limit_holds_across_a_fleet_under_faults(
    pg_catalog: str, tmp_path: Path, mode: str
) -> None:
    nodes: list[Node] = []
    killed: dict[int, float] = {}
    try:
        for i in range(3):  # one after the other: the first creates the tree
            node = Node(pg_catalog, "--mode", mode, "--log", str(tmp_path / f"node{i}.log"),
                        program=TREE_NODE)  # fmt: skip
            nodes.append(node)
            node.wait_for(lambda m: "ready" in m, timeout=60)
        begin = time.clock_gettime(MONO)
        for node in nodes:
            _progress(node, begin, 15)
        killed[0] = time.clock_gettime(MONO)
        nodes[0].proc.send_signal(signal.SIGKILL)  # its leases stand until swept
        for node in nodes[1:]:
            _progress(node, killed[0], 15)
        stopped = time.clock_gettime(MONO)
        nodes[1].proc.send_signal(signal.SIGSTOP)  # past its expiry (1.5 s)
        # the fleet goes on while it is away, past its expiry
        _progress(nodes[2], stopped + 2.5, 5)
        resumed = time.clock_gettime(MONO)
        nodes[1].proc.send_signal(signal.SIGCONT)
        _progress(nodes[1], resumed, 10)  # it recovers from the lapse
        _progress(nodes[2], resumed, 10)
        for node in nodes[1:]:
            node.proc.send_signal(signal.SIGTERM)
        for node in nodes[1:]:
            node.wait_for(lambda m: m.get("done", False), timeout=60)
    finally:
        for node in nodes:
            node.kill()
            node.drain()
    intervals = _intervals(nodes, killed)
    assert len(intervals) > 100
    team = max_overlap([(s, e) for _, s, e in intervals])
    per_child = {g: max_overlap([(s, e) for c, s, e in intervals if c == g]) for g in "ab"}
    print(f"{mode}: {len(intervals)} bodies, peak team {team}, children {per_child}")
    assert team <= 4, f"the parent's limit of 4 was exceeded: {_crowd(intervals, 4)}"
    assert team >= 3  # the limit was pressed on: six threads a node want more
    assert all(peak <= 3 for peak in per_child.values()), per_child
    if mode == "lease":  # the killed node's leases were swept, the others released
        wait_until(lambda: _leases(pg_catalog) == 0, timeout=30)


def _crowd(intervals: list[tuple[str, float, float]], limit: int) -> list[tuple[str, float, float]]:
    """The bodies open at the first instant more than ``limit`` were (for the
    failure message; empty when none was)."""
    starts = [(s, 1, (g, s, e)) for g, s, e in intervals]
    ends = [(e, -1, (g, s, e)) for g, s, e in intervals]
    running: list[tuple[str, float, float]] = []
    for _, step, body in sorted(starts + ends):
        if step == 1:
            running.append(body)
        else:
            running.remove(body)
        if len(running) > limit:
            return running
    return []


@pytest.mark.parametrize("mode", ["lease", "quota"])
def test_a_subtree_joining_a_limited_parent_brings_its_running_queries(
    pg_catalog: str, mode: str
) -> None:
    """A query admitted where no level had a limit holds nothing in the fleet;
    when its group is reparented under a limited parent, every engine adopts it
    there before anyone admits on the parent's limit."""
    from test_fleet_exact import Bodies, _everyone_sees, _holds, _release, _shared_fleet

    with _shared_fleet(pg_catalog, mode) as (one, two):
        one.connect().execute_script(
            "CREATE RESOURCE GROUP p WITH (max_active_queries = 1, queue_timeout = '30s');"
            "CREATE RESOURCE GROUP x WITH (parent = p); CREATE RESOURCE GROUP c"
        )
        _everyone_sees([one, two], "c")
        fleet = Bodies()
        (free,) = fleet.hold(one, "c")
        wait_until(lambda: free.admitted is not None, timeout=15)
        one.connect().execute("ALTER RESOURCE GROUP c SET (parent = p)")
        _everyone_sees([one, two], "c", parent_group="p")
        (late,) = fleet.hold(two, "x")
        # c's running query counts against p across the fleet: nobody else gets p
        assert _holds(lambda: late.admitted is None, 1.5)
        _release([free])
        wait_until(lambda: late.admitted is not None, timeout=15)
        _release([late])
    assert not fleet.errors()
    assert fleet.peak == 1
