"""resgroups demo, run as a new user runs it: the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from resgroups import demo


def resgroups_command() -> str:
    command = shutil.which("resgroups", path=str(Path(sys.executable).parent))
    assert command is not None, "pip install -e . puts the resgroups script beside python"
    return command


def test_demo_prints_both_runs_and_writes_the_chart(tmp_path: Path) -> None:
    chart = tmp_path / "demo.png"
    result = subprocess.run(
        [resgroups_command(), "demo", "--duration", "6", "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    header = next(line for line in out.splitlines() if "workload" in line and "metric" in line)
    assert "without groups" in header
    assert "with groups" in header
    for workload in ("dashboards", "report", "adhoc"):
        assert f"| {workload}" in out
    for metric in (
        "p50 latency ms",
        "p95 latency ms",
        "p99 latency ms",
        "CPU share %",
        "avg queue wait ms",
        "rejections",
        "errors",
        "cancelled at end",
    ):
        assert metric in out
    assert f"chart: {chart}" in out
    assert "calibrated: the report scans" in out
    assert "x lower)" in out or "x higher)" in out
    assert chart.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "#" in result.stderr  # the progress bar


def test_demo_json_and_the_dashboards_win(tmp_path: Path) -> None:
    chart = tmp_path / "c.png"
    result = subprocess.run(
        [resgroups_command(), "demo", "--duration", "8", "--json", "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    runs = doc["runs"]
    assert set(runs) == {"without_groups", "with_groups"}
    before, after = runs["without_groups"]["dashboards"], runs["with_groups"]["dashboards"]
    assert after["queries"] > before["queries"]
    assert after["p99_ms"] is not None
    slow = before["p99_ms"] if before["p99_ms"] is not None else float("inf")
    assert after["p99_ms"] * 3 <= slow  # at least 3x lower with groups
    assert runs["with_groups"]["report"]["cpu_share_pct"] > 0  # the report still works
    assert runs["with_groups"]["report"]["queries"] >= 1  # and completes scans
    calibration = doc["calibration"]
    assert calibration["report_rows_per_s"] > 0
    assert set(calibration["rows"]) == {"dashboards", "report", "adhoc"}
    assert calibration["rows"]["dashboards"] < calibration["rows"]["adhoc"]
    assert calibration["rows"]["adhoc"] < calibration["rows"]["report"]
    assert Path(doc["chart"]) == chart
    assert chart.exists()


@pytest.mark.parametrize(
    "engine",
    [
        "duckdb",
        pytest.param("datafusion", marks=pytest.mark.slow),
        pytest.param("polars", marks=pytest.mark.slow),
        pytest.param("sqlite", marks=pytest.mark.slow),
    ],
)
def test_demo_engine_scenario_the_dashboards_win_and_reports_complete(
    tmp_path: Path, engine: str
) -> None:
    """``--scenario ENGINE``: the same story on the engine's table generated at start
    (DuckDB's in the default suite; the others, as long, with -m slow)."""
    chart = tmp_path / f"{engine}.png"
    result = subprocess.run(
        [resgroups_command(), "demo", "--scenario", engine, "--duration", "10", "--json",
         "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["scenario"] == engine
    runs = doc["runs"]
    before, after = runs["without_groups"]["dashboards"], runs["with_groups"]["dashboards"]
    assert after["p99_ms"] is not None
    slow = before["p99_ms"] if before["p99_ms"] is not None else float("inf")
    assert after["p99_ms"] * 3 <= slow, (before, after)  # at least 3x lower with groups
    for run in runs.values():  # report scans complete in both runs
        assert run["report"]["queries"] >= 1, run["report"]
        assert run["report"]["errors"] == 0
    assert chart.exists()


def test_demo_refuses_an_unknown_scenario() -> None:
    result = subprocess.run(
        [resgroups_command(), "demo", "--scenario", "nope"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "scenarios: dashboards" in result.stderr


@pytest.mark.parametrize("duration", ["0", "-3"])
def test_demo_refuses_a_bad_duration(duration: str) -> None:
    result = subprocess.run(
        [resgroups_command(), "demo", "--duration", duration], capture_output=True, text=True
    )
    assert result.returncode == 2


def _summary(p99_ms: float) -> dict[str, Any]:
    return {
        "queries": 10,
        "p50_ms": p99_ms,
        "p95_ms": p99_ms,
        "p99_ms": p99_ms,
        "cpu_share_pct": 50.0,
        "avg_queue_wait_ms": 0.0,
        "rejections": 0,
        "errors": 0,
        "cancelled_at_end": 0,
    }


@pytest.mark.parametrize(
    ("before", "after", "says"), [(100.0, 10.0, "10.0x lower"), (10.0, 40.0, "4.0x higher")]
)
def test_the_verdict_says_higher_when_the_p99_went_up(
    monkeypatch: pytest.MonkeyPatch, before: float, after: float, says: str
) -> None:
    runs = [demo.RunResult(label, 1.0, {}, []) for label in ("without groups", "with groups")]
    summaries = iter(
        [
            {"dashboards": _summary(before), "report": _summary(1.0)},
            {"dashboards": _summary(after), "report": _summary(1.0)},
        ]
    )
    monkeypatch.setattr(demo.RunResult, "summary", lambda self: next(summaries))
    text = demo.verdict(runs)
    assert says in text


def test_demo_serve_shows_the_run_live_and_stays_up_until_sigterm(tmp_path: Path) -> None:
    """``demo --serve``: the run with groups is on the live page while it runs, and
    its engine stays up after the runs (the history kept) until SIGTERM."""
    import re
    import signal
    import threading
    import urllib.request

    from waiting import wait_until

    proc = subprocess.Popen(
        [resgroups_command(), "demo", "--serve", "--duration", "6", "--json",
         "--http-port", "0", "--pg-port", "0", "--chart", str(tmp_path / "c.png")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )  # fmt: skip
    err: list[str] = []
    out: list[str] = []
    assert proc.stdout is not None
    assert proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    readers = [
        # stderr a character at a time: the progress bar ends its lines with \r
        threading.Thread(target=lambda: err.extend(iter(lambda: stderr.read(1), "")), daemon=True),
        threading.Thread(target=lambda: out.append(stdout.read()), daemon=True),
    ]
    for reader in readers:
        reader.start()

    def state(url: str) -> dict[str, Any]:
        with urllib.request.urlopen(url + "api/state", timeout=30) as reply:
            body: dict[str, Any] = json.load(reply)
            return body

    try:
        wait_until(lambda: "watch it live: " in "".join(err), timeout=120)
        match = re.search(r"watch it live: (http://\S+/)", "".join(err))
        assert match is not None
        url = match.group(1)
        # while the run goes: its groups, and queries of its users
        wait_until(lambda: len(state(url)["queries"]) > 0, timeout=30)
        live = state(url)
        assert {g["name"] for g in live["groups"]} >= {"dashboards", "reporting", "adhoc"}
        assert {q["user_name"] for q in live["queries"]} <= {
            "dash1", "dash2", "dash3", "dash4", "nightly", "analyst"
        }  # fmt: skip
        wait_until(lambda: "stays up at" in "".join(err), timeout=120)
        after = state(url)  # the runs are over, the engine and its history are not
        assert after["queries"] == []
        used = after["history"]["groups"]["reporting"]["cpu_used_pct"]
        assert any(v for v in used if v is not None)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for reader in readers:
            reader.join(10)
        stdout.close()
        stderr.close()
    document = json.loads(out[0])
    assert set(document["runs"]) == {"without_groups", "with_groups"}
