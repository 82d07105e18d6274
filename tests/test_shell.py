"""resgroups shell: -c, piped scripts, the prompt_toolkit loop, --catalog and --access-control."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

import resgroups
from resgroups import cli, shell


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "resgroups.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dash_c_prints_aligned_tables(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(
        [
            "shell",
            "-c",
            "CREATE RESOURCE GROUP reporting WITH (cpu_weight = 50);"
            "SELECT name, cpu_weight, max_active_queries FROM resource_groups()",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert out.splitlines() == [
        "CREATE RESOURCE GROUP",
        "+-----------+--------------+----------------------+",
        "| name      |   cpu_weight |   max_active_queries |",
        "|-----------+--------------+----------------------|",
        "| DEFAULT   |          100 |                 NULL |",
        "| reporting |           50 |                 NULL |",
        "+-----------+--------------+----------------------+",
        "(2 rows)",
    ]


def test_piped_script_reports_errors_with_a_caret_and_goes_on() -> None:
    script = (
        "CREATE RESOURCE GROUP a;\n"
        "\\timing\n"
        "SELECT name\n"
        "  FROM resource_groups()\n"
        " WHERE name = 'a';\n"
        "ALTER RESOURCE GROUP a\n"
        "  SET cpu_weight = 5;\n"
        "CREATE RESOURCE GROUP b WITH (cpu_weight = 0);\n"
        "SELECT count(*) FROM resource_groups()\n"
    )
    result = run_cli("shell", stdin=script)
    assert result.returncode == 1
    out = result.stdout
    assert "Timing is on." in out
    assert "| a      |" in out
    assert (
        "ERROR [42601]: syntax error at line 7, column 7: unexpected identifier cpu_weight" in out
    )
    assert "  SET cpu_weight = 5;\n      ^" in out
    assert "ERROR [22023]: invalid value 0 for cpu_weight: expected an integer 1..10000" in out
    assert "|       2 |" in out  # the script went on after the errors
    assert "Time: " in out


def test_catalog_directory_survives_a_restart(tmp_path: Path) -> None:
    first = run_cli("shell", "--catalog", str(tmp_path), "-c", "CREATE RESOURCE GROUP kept")
    assert first.returncode == 0, first.stderr
    second = run_cli(
        "shell", "--catalog", str(tmp_path), "-c", "SELECT name FROM resource_groups()"
    )
    assert "| kept    |" in second.stdout


def test_access_control_and_login(tmp_path: Path) -> None:
    setup = run_cli(
        "shell",
        "--catalog",
        str(tmp_path),
        "--access-control",
        "-c",
        "CREATE USER analyst WITH PASSWORD 'pw'",
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    denied = run_cli(
        "shell",
        "--catalog",
        str(tmp_path),
        "--access-control",
        "--user",
        "analyst",
        "--password",
        "pw",
        "-c",
        "SELECT * FROM resource_groups()",
    )
    assert "Access denied for analyst [RESOURCE GROUP ADMIN]" in denied.stdout
    wrong = run_cli(
        "shell",
        "--catalog",
        str(tmp_path),
        "--access-control",
        "--user",
        "analyst",
        "--password",
        "nope",
        "-c",
        "SELECT 1",
    )
    assert wrong.returncode == 2
    assert "password authentication failed" in wrong.stderr
    off = run_cli("shell", "-c", "CREATE USER x")
    assert "ERROR [0A000]" in off.stdout


def test_a_locked_catalog_is_reported(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=str(tmp_path)):
        result = run_cli("shell", "--catalog", str(tmp_path), "-c", "SELECT 1")
    assert result.returncode == 2
    assert "locked by another writer" in result.stderr


def test_interactive_multi_line_history_and_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    written: list[str] = []
    with resgroups.Engine() as engine:
        runner = shell.ShellRunner(engine.connect(), written.append)
        with create_pipe_input() as pipe:
            pipe.send_text("CREATE RESOURCE GROUP g\r")  # not ended: Enter adds a line
            pipe.send_text("WITH (cpu_weight = 7);\r")
            pipe.send_text("\\timing\r")
            pipe.send_text("SELECT cpu_weight FROM resource_groups() WHERE name = 'g';\r")
            pipe.send_text("\\q\r")
            shell.interactive(runner, input=pipe, output=DummyOutput())
    out = "".join(written)
    assert "CREATE RESOURCE GROUP" in out
    assert "|            7 |" in out
    assert "Timing is on." in out
    history = (tmp_path / ".resgroups_history").read_text()
    assert "WITH (cpu_weight = 7);" in history


def test_statement_complete() -> None:
    assert shell.statement_complete("SELECT 1;")
    assert shell.statement_complete("\\q")
    assert not shell.statement_complete("SELECT 1")
    assert not shell.statement_complete("SELECT ';")
    assert not shell.statement_complete("SELECT 1; SELECT")


def _interrupt_when_running(session: resgroups.Session) -> threading.Thread:
    """Send the main thread a KeyboardInterrupt (as Ctrl-C does) once ``session``
    has a query in flight; bounded."""

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while not session.running_ids and time.monotonic() < deadline:
            time.sleep(0.005)
        if session.running_ids:  # never interrupt anything but the statement
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_cancels_the_running_statement_and_keeps_the_shell() -> None:
    # a broken cancel ends in QueryTimeout after 30 s instead of hanging
    with resgroups.Engine(query_timeout=30) as engine:
        session = engine.connect()
        out: list[str] = []
        runner = shell.ShellRunner(session, out.append)
        helper = _interrupt_when_running(session)
        runner.run("SELECT sum(x) FROM long_sequence(10000000000)")
        helper.join(5)
        text = "".join(out)
        assert "Cancel request sent" in text
        assert "ERROR [57014]: query cancelled" in text
        assert runner.failures == 1
        assert not runner.quit
        out.clear()
        runner.run("SELECT 1 AS one")  # the shell goes on
        assert "(1 row)" in "".join(out)
        assert not session.running_ids


def shell_process(tmp_path: Path, script: str) -> subprocess.Popen[str]:
    """``resgroups shell`` reading ``script`` from a file as its standard input."""
    (tmp_path / "script.sql").write_text(script)
    with (tmp_path / "script.sql").open() as stdin:
        return subprocess.Popen(
            [sys.executable, "-m", "resgroups.cli", "shell"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def test_ctrl_c_in_a_real_shell_process_cancels_and_continues(tmp_path: Path) -> None:
    child = shell_process(
        tmp_path, "SELECT sum(x) FROM long_sequence(10000000000);\nSELECT 42 AS answer;\n"
    )
    try:
        process = psutil.Process(child.pid)
        deadline = time.monotonic() + 30
        # the scan is running once the process has burnt CPU beyond its start-up
        while sum(process.cpu_times()[:2]) < 2.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert "query cancelled" in out, out + err
    assert "42" in out  # the next statement ran
    assert child.returncode == 1  # one statement failed


def test_text_inside_quotes_is_kept_exactly_as_typed() -> None:
    session = resgroups.Engine().connect()
    out: list[str] = []
    runner = shell.ShellRunner(session, out.append)
    typed = "a\u2028b\u2029c\x85d\x0be"  # separators str.splitlines() would cut at
    shell.run_text(runner, f"SELECT '{typed}' AS t;\nSELECT 2 AS two;")
    assert runner.failures == 0, out
    assert typed in "".join(out)
    assert "(1 row)" in out[-1]


def test_watch_runs_the_previous_statement_again() -> None:
    with resgroups.Engine() as engine:
        out: list[str] = []
        runner = shell.ShellRunner(engine.connect(), out.append)
        runner.command("\\watch 1")
        assert "no previous statement" in "".join(out)
        out.clear()
        runner.run("SELECT count(*) AS n FROM resource_group_queries()")
        out.clear()
        runner.command("\\watch 0.05 count=3")
        text = "".join(out)
        assert text.count("(every 0.05s)") == 3
        assert text.count("(1 row)") == 3
        for bad in ("\\watch x", "\\watch 0", "\\watch count=0", "\\watch nope=1"):
            out.clear()
            runner.command(bad)
            assert "ERROR: \\watch:" in "".join(out), bad
        assert runner.failures == 5


def test_ctrl_c_ends_a_watch_in_a_real_shell_process(tmp_path: Path) -> None:
    child = shell_process(
        tmp_path,
        "SELECT count(*) AS watched FROM resource_group_queries();\n"
        "\\watch 0.05\n"
        "SELECT 42 AS answer;\n",
    )
    assert child.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)  # type: ignore[arg-type]
    try:
        reader.start()
        deadline = time.monotonic() + 30
        while sum("(every" in line for line in list(lines)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        child.wait(30)
        reader.join(30)
        err = child.stderr.read() if child.stderr is not None else ""
    finally:
        if child.poll() is None:
            child.kill()
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    out = "".join(lines)
    assert out.count("(every 0.05s)") >= 2, out + err
    assert "42" in out  # the watch ended and the script went on
    assert child.returncode == 0, err
