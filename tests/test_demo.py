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
    # not a terminal: the progress is a line per tenth of the way, not one long line
    steps = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert len(steps) == 11, result.stderr
    assert "\r" not in result.stderr
    assert steps[-1].startswith("[100%] with groups")
    # one vocabulary for CPU: % of the CPUs, the report's limit beside it, idle shown
    assert "| (idle or others)" in out
    assert "| (outside queries)" in out
    assert "limit 50%)" in out


def _dashboards_win_within_the_run_with_groups(doc: dict[str, Any]) -> None:
    """With groups, the dashboards answer at least 3x faster than a report scan
    takes in the same run (a scan still running at the end took the whole run).
    Within one run, side by side: the run without groups came at another moment
    of a shared machine, so the two runs' latencies are not compared."""
    run = doc["runs"]["with_groups"]
    assert run["dashboards"]["queries"] > 0
    assert run["dashboards"]["p99_ms"] is not None
    report = run["report"]
    scan_ms = report["p50_ms"] if report["p50_ms"] is not None else doc["seconds_per_run"] * 1000
    assert run["dashboards"]["p99_ms"] * 3 <= scan_ms, (run["dashboards"], report)
    assert report["cpu_share_pct"] > 0  # the report still works
    assert report["errors"] == 0
    assert report["queries"] + report["cancelled_at_end"] >= 1


def _demo_json(*args: str, chart: Path, timeout: float = 120) -> dict[str, Any]:
    """``resgroups demo ARGS --json --chart CHART``, run to success: its document."""
    result = subprocess.run(
        [resgroups_command(), "demo", *args, "--json", "--chart", str(chart)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_demo_json_and_the_dashboards_win(tmp_path: Path) -> None:
    chart = tmp_path / "c.png"
    doc = _demo_json("--duration", "8", chart=chart)
    runs = doc["runs"]
    assert set(runs) == {"without_groups", "with_groups"}
    _dashboards_win_within_the_run_with_groups(doc)
    for label in runs:  # one vocabulary: every share is of the same CPUs, adding up to 100
        shares = [w["cpu_share_pct"] for w in runs[label].values()]
        total = sum(shares) + doc["cpu_outside_queries_pct"][label] + doc["cpu_idle_pct"][label]
        assert total == pytest.approx(100, abs=1)
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
    doc = _demo_json("--scenario", engine, "--duration", "10", chart=chart, timeout=180)
    assert doc["scenario"] == engine
    runs = doc["runs"]
    _dashboards_win_within_the_run_with_groups(doc)
    for run in runs.values():  # the report's scans run (complete or not) in both runs
        assert run["report"]["queries"] + run["report"]["cancelled_at_end"] >= 1, run["report"]
        assert run["report"]["errors"] == 0
    assert chart.exists()


def test_progress_is_a_bar_on_a_terminal_and_a_line_per_step_elsewhere() -> None:
    import io

    for terminal in (True, False):
        stream = io.StringIO()
        progress = demo.Progress(stream, 10.0, terminal=terminal)
        for run in ("without groups", "with groups"):
            for tick in range(21):  # four updates a second, as run_once sends them
                progress.update(run, tick / 4)
            progress.finish_run(5.0)
        progress.close()
        text = stream.getvalue()
        if terminal:
            assert text.count("\r") == 42
            assert text.count("\n") == 1
        else:
            assert "\r" not in text
            lines = text.splitlines()
            assert [line[:6] for line in lines] == [f"[{p:3d}%]" for p in range(0, 101, 10)]
    assert demo.Progress(io.StringIO(), 1.0).terminal is False  # a StringIO is no terminal


def _run(label: str, cpu: list[tuple[float, dict[str, int]]], limits: dict[str, float]) -> Any:
    workloads = {n: demo.WorkloadStats(cpu_ns=cpu[-1][1][n]) for n in cpu[-1][1]}
    return demo.RunResult(label, cpu[-1][0], workloads, cpu, None, 2.0, limits)


def test_cpu_is_a_share_of_the_cpus_available_with_idle_and_limits() -> None:
    """A workload using one of two CPUs for the whole run is at 50 %, whatever the
    others use; what nobody used is idle; a limit is the group's cpu_limit_pct."""
    second = 1_000_000_000
    timeline = [(t / 4, {"report": t * second // 4, "dashboards": t * second // 20})
                for t in range(41)]  # fmt: skip
    run = _run("with groups", timeline, {"report": 50.0})
    summary = run.summary()
    assert summary["report"]["cpu_share_pct"] == 50.0
    assert summary["dashboards"]["cpu_share_pct"] == 10.0
    assert summary["report"]["cpu_limit_pct"] == 50.0
    assert summary["dashboards"]["cpu_limit_pct"] is None
    assert run.idle_pct() == 40.0
    run.process_cpu_ns = 14 * second  # 70 % of 2 CPUs for 10 s: 10 points outside the queries
    assert run.outside_queries_pct() == 10.0
    assert run.idle_pct() == 30.0  # idle, or had by other processes
    times, shares = demo.cpu_over_time(run, 1.0)
    assert times[0] == 0.25
    assert all(abs(v - 50.0) < 1e-9 for v in shares["report"])
    assert all(abs(v - 10.0) < 1e-9 for v in shares["dashboards"])


def test_the_chart_gives_each_workload_one_colour_in_both_runs(tmp_path: Path) -> None:
    second = 1_000_000_000
    timeline = [(t / 4, {"report": t * second // 4, "dashboards": t * second // 20})
                for t in range(41)]  # fmt: skip
    runs = [_run("without groups", timeline, {}), _run("with groups", timeline, {"report": 50.0})]
    runs[1].workloads["dashboards"].latencies_ms.extend([3.0, 4.0, 40.0])  # the others: none
    colours = demo.colours(list(runs[0].workloads))
    assert colours == demo.colours(list(runs[1].workloads))
    assert len(set(colours.values())) == len(colours)
    path = demo.chart(runs, str(tmp_path / "c.png"))
    assert Path(path).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_demo_refuses_an_unknown_scenario() -> None:
    result = subprocess.run(
        [resgroups_command(), "demo", "--scenario", "nope"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "scenarios: dashboards" in result.stderr


@pytest.mark.parametrize("factor", ["0.5", "17", "x"])
def test_demo_refuses_a_bad_oversubscribe(factor: str) -> None:
    result = subprocess.run(
        [resgroups_command(), "demo", "--oversubscribe", factor, "--duration", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "oversubscribe" in result.stderr


def test_demo_oversubscribed_runs_its_groups_in_priority_lanes(tmp_path: Path) -> None:
    """``--oversubscribe 2``: more workers than CPUs while the groups exist, so the
    lanes act in the run with groups (by weight: the dashboards above the report)
    and not in the one without (a single group: nothing engaged)."""
    doc = _demo_json("--oversubscribe", "2", "--duration", "6", chart=tmp_path / "c.png")
    assert doc["oversubscribe"] == 2
    lanes = doc["priority_lanes"]
    assert lanes["without_groups"] is None
    if lanes["with_groups"] is not None:  # None where the kernel refuses per-thread nice
        assert lanes["with_groups"]["dashboards"] < lanes["with_groups"]["reporting"]
    _dashboards_win_within_the_run_with_groups(doc)


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
        charged = [v for v in after["history"]["groups"]["reporting"]["cpu_nanos_total"] if v]
        assert after["cpus"] > 0
        page_cpus = after["cpus"]
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
    # the page and the PNG (the JSON's figures) tell the same run alike: the report's
    # CPU over the run with groups, % of the same CPUs (the page's counter also holds
    # what the scans in flight used until they were cancelled: a little more)
    assert document["cpus"] == page_cpus
    page_pct = 100 * max(charged) / (document["seconds_per_run"] * page_cpus * 1e9)
    demo_pct = document["runs"]["with_groups"]["report"]["cpu_share_pct"]
    assert demo_pct - 5 <= page_pct <= demo_pct + 15, (page_pct, demo_pct)
