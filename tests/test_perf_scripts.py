"""The benchmarks in perf/ still run against the code they measure.

No timing is asserted (the benchmarks measure, on a quiet machine): each
script runs its shortest form and must print every row it promises, with
figures that add up where they are defined to. A benchmark that broke would
otherwise be found only when someone sat down to measure.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PERF = Path(__file__).resolve().parent.parent / "perf"


def _run(script: str, *args: str, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, str(PERF / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("args", "rows"),
    [
        ((), ("other thread", "main thread")),
        (("--engaged",), ("other thread, engaged",)),
        (("--contended",), ("8 threads, limit 2",)),
    ],
)
def test_count_query_path_counts_every_path(args: tuple[str, ...], rows: tuple[str, ...]) -> None:
    out = _run("count_query_path.py", *args)
    for row in rows:
        m = re.search(rf"^{re.escape(row)}: (\d+) bytecodes, (\d+) Python calls", out, re.M)
        assert m is not None, out
        bytecodes, calls = int(m[1]), int(m[2])
        # a managed query runs Python: a count of nothing would mean the tracer missed it
        assert bytecodes > 100, out
        assert calls > 5, out


def test_bench_isolation_prints_every_mode_and_where_the_tail_goes() -> None:
    out = _run("bench_isolation.py", "--fast", "--only", "isolation")
    modes = ("none", "nice", "resgroups", "lanes")
    for mode in modes:
        assert re.search(rf"^{mode} +\d+\.\d+ +\d+\.\d+", out, re.M), out
    assert "target (lanes):" in out
    # the paired comparison: one p99 ratio per round and mode, one difference per round
    assert re.search(
        r"^   p99 x by round: none [\d.]+; nice [\d.]+; resgroups [\d.]+; lanes [\d.]+$", out, re.M
    ), out
    assert re.search(r"lanes <= nice in [01] of 1 rounds, median [+-][\d.]+$", out, re.M), out
    assert re.search(
        r"^   lanes - nice, p99 under the report by round \(ms\): [+-][\d.]+; "
        r"lanes <= nice in [01] of 1 rounds, median [+-][\d.]+$",
        out,
        re.M,
    ), out
    assert re.search(
        r"^  target \(lanes\), rounds' medians: p99 x [\d.]+ <= 1\.5 (NOT )?met, "
        r"<= nice's p99 x (NOT )?met, p99 under the report <= nice's (NOT )?met$",
        out,
        re.M,
    ), out
    # the tail's breakdown: wall = waiting for a CPU + on a CPU + blocked, per row
    rows = re.findall(
        r"^ +(\w+) +(alone|load) +(-?[\d.]+) +(-?[\d.]+) +(-?[\d.]+) +(-?[\d.]+) +(-?[\d.]+)$",
        out,
        re.M,
    )
    assert {(mode, phase) for mode, phase, *_ in rows} == {
        (mode, phase) for mode in modes for phase in ("alone", "load")
    }, out
    for mode, _phase, wall, run_wait, on_cpu, blocked, entering in rows:
        assert float(wall) > 0, out
        assert float(run_wait) >= 0, out
        assert float(on_cpu) > 0, out
        # (each figure is printed rounded to 0.01 ms)
        assert float(wall) == pytest.approx(
            float(run_wait) + float(on_cpu) + float(blocked), abs=0.025
        ), out
        if mode in ("none", "nice"):  # no resgroups: nothing to enter
            assert float(entering) == 0, out


def test_convoy_model_prints_the_model_and_the_managed_rows() -> None:
    out = _run("convoy_model.py", "--fast")
    rows = re.findall(
        r"^model, work (\d+) +(\d+) +([\d.]+) +([\d.]+) +(-?[\d.]+) +([\d.]+)$", out, re.M
    )
    assert [int(n) for n, *_ in rows] == [0, 10, 25, 50], out
    counts = [int(bytecodes) for _, bytecodes, *_ in rows]
    assert counts == sorted(set(counts)), out  # more work, more bytecodes
    for name in ("managed, DEFAULT alone", "managed, own group"):
        assert re.search(rf"^{name} +- +- +[\d.]+ +-?[\d.]+ +[\d.]+$", out, re.M), out
    assert "2x the bare hand-off leaves" in out
