"""``resgroups shell``: an interactive SQL shell, ``-c`` and piped scripts.

Statements end with ``;``; a line starting with a backslash is a shell
command (``\\timing``, ``\\q``, ``\\?``). On a terminal prompt_toolkit gives
history, multi-line editing (Enter runs the text once it ends with ``;``) and
keyword completion; without one, statements are read from stdin as a script,
and an error does not stop the script (the exit status is 1 if any failed).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from resgroups.catalog.rules import METRICS
from resgroups.errors import Error, SqlSyntaxError
from resgroups.result import Result
from resgroups.sql.parser import keywords
from resgroups.sql.split import Splitter, is_complete

# what a rule is written with beside the grammar's keywords (names to the grammar, so
# that they stay usable as names elsewhere): its metrics, actions and option
RULE_WORDS: Final = (*METRICS, "KILL", "MOVE", "LOG", "watch")

if TYPE_CHECKING:
    from resgroups.session import Session

HELP = """\
Statements end with ';'. Shell commands:
  \\timing   toggle printing each statement's run time
  \\watch [SECONDS] [count=N]
            run the previous statement again every SECONDS (2) until Ctrl-C
            (or N times), e.g. after SELECT * FROM resource_group_queries();
  \\q        quit (Ctrl-D too)
  \\?        this help
Try: SELECT * FROM resource_groups(); SELECT * FROM resource_group_queries();
     EXPLAIN RESOURCE GROUP;"""


def format_result(result: Result) -> str:
    """A table for rows (tabulate, psql style), the command tag otherwise."""
    if not result.columns:
        return result.status
    from tabulate import tabulate  # imported lazily: the shell's start-up matters

    rows = [tuple("NULL" if v is None else v for v in row) for row in result.rows]
    align = ["right" if t in ("int", "float") else "left" for t in result.types]
    table = tabulate(
        rows,
        headers=result.columns,
        tablefmt="psql",
        disable_numparse=True,
        colalign=align or None,
    )
    count = len(result.rows)
    return f"{table}\n({count} row{'s' if count != 1 else ''})"


def format_error(error: Error, line_offset: int = 0) -> str:
    """``ERROR [sqlstate]: message``, with the caret of a syntax error."""
    if isinstance(error, SqlSyntaxError):
        head = f"ERROR [{error.sqlstate}]: syntax error at line {error.line + line_offset}"
        head += f", column {error.column}: {error.message.split(' at line ')[0]}"
        if error.expected:
            head += f"\n  expected one of: {', '.join(error.expected)}"
        return f"{head}\n{error.context}" if error.context else head
    return f"ERROR [{error.sqlstate}]: {error.message}"


@dataclass
class ShellRunner:
    """Feeds text to a session statement by statement and prints what comes back."""

    session: Session
    write: Callable[[str], Any]
    timing: bool = False
    failures: int = 0
    quit: bool = False
    _splitter: Splitter = field(default_factory=Splitter)
    _line: int = field(default=0)
    _previous: tuple[str, int] | None = None  # the last statement run, for \watch
    _interrupted: bool = False  # Ctrl-C came (a plain flag: handlers take no locks)

    def feed_line(self, line: str) -> None:
        """One line of input: a shell command, or part of one or more statements.

        Each line is scanned once (:class:`~resgroups.sql.split.Splitter`), so
        a statement of L lines costs O(L) to read, however long it is."""
        self._line += 1
        if self._splitter.idle and line.lstrip().startswith("\\"):
            self._splitter.reset(line=self._line + 1)
            self.command(line.strip())
            return
        for piece in self._splitter.feed(line if line.endswith("\n") else line + "\n"):
            self.run(piece.text, piece.line)

    def finish(self) -> None:
        """End of input: run what is left even without a closing ``;``."""
        rest = self._splitter.finish()
        if rest is not None:
            self.run(rest.text, rest.line)

    def run(self, sql: str, first_line: int = 1) -> None:
        """Run ``sql`` and print its results. Ctrl-C cancels it, as in psql: the
        statement runs on its own thread while this one waits, and an interrupt
        cancels the session's running query and returns to the prompt."""
        self._previous = (sql, first_line)
        started = time.perf_counter()
        outcome: list[list[Result] | BaseException] = []
        finished = threading.Event()

        def work() -> None:
            try:
                outcome.append(self.session.execute_script(sql))
            except BaseException as exc:
                outcome.append(exc)
            finally:
                finished.set()

        with self._ctrl_c_cancels():
            threading.Thread(target=work, name="resgroups-shell-statement", daemon=True).start()
            while not finished.wait(0.05):  # a timed wait lets the handler run at once
                pass
        (done,) = outcome
        if isinstance(done, Error):
            self.failures += 1
            self.write(format_error(done, line_offset=first_line - 1) + "\n")
            return
        if isinstance(done, BaseException):
            raise done
        for result in done:
            self.write(format_result(result) + "\n")
        if self.timing:
            self.write(f"Time: {(time.perf_counter() - started) * 1000:.3f} ms\n")

    @contextlib.contextmanager
    def _ctrl_c_cancels(self) -> Iterator[None]:
        """While a statement runs, SIGINT (Ctrl-C) cancels it instead of raising
        KeyboardInterrupt: a handler that only records the request cannot land
        half-way through the shell's own code. Off the main thread, where no
        handler can be set, the default behaviour stays."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def cancel(signum: int, frame: object) -> None:
            self._interrupted = True
            self.session.cancel()
            self.write("Cancel request sent\n")

        previous = signal.signal(signal.SIGINT, cancel)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def watch(self, args: list[str]) -> None:
        """``\\watch``: the previous statement again every few seconds, until Ctrl-C."""
        try:
            seconds, count = _watch_arguments(args)
        except ValueError as exc:
            self.failures += 1
            self.write(f"ERROR: \\watch: {exc}; usage: \\watch [SECONDS] [count=N]\n")
            return
        if self._previous is None:
            self.failures += 1
            self.write("ERROR: \\watch: there is no previous statement to run again\n")
            return
        sql, line = self._previous
        self._interrupted = False
        with self._ctrl_c_cancels():  # between runs too: Ctrl-C ends the watch
            _watch_loop(self, sql, line, seconds, count)
        self._interrupted = False

    def command(self, text: str) -> None:
        name = text.split()[0]
        if name in ("\\q", "\\quit"):
            self.quit = True
        elif name == "\\timing":
            self.timing = not self.timing
            self.write(f"Timing is {'on' if self.timing else 'off'}.\n")
        elif name == "\\watch":
            self.watch(text.split()[1:])
        elif name in ("\\?", "\\help", "\\h"):
            self.write(HELP + "\n")
        else:
            self.failures += 1
            self.write(f"ERROR: unknown shell command {name}; \\? lists them\n")


def _watch_loop(
    runner: ShellRunner, sql: str, line: int, seconds: float, count: int | None
) -> None:
    """Run ``sql`` every ``seconds`` until Ctrl-C or ``count`` runs; a run that fails stops it."""
    runs = 0
    while not runner._interrupted:
        runner.write(f"{time.strftime('%a %b %d %H:%M:%S %Y')} (every {seconds:g}s)\n\n")
        failures = runner.failures
        runner.run(sql, line)
        runs += 1
        if runner.failures != failures or (count is not None and runs >= count):
            return
        wake = time.monotonic() + seconds
        while not runner._interrupted and time.monotonic() < wake:
            time.sleep(min(0.05, max(0.0, wake - time.monotonic())))


def _watch_arguments(args: list[str]) -> tuple[float, int | None]:
    """``\\watch [SECONDS] [count=N]`` (psql's spellings: i=, interval=, c=)."""
    seconds, count = 2.0, None
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key in ("c", "count"):
            count = int(value)
            if count < 1:
                raise ValueError(f"count must be at least 1, got {count}")
        elif not sep or key in ("i", "interval"):
            seconds = float(value if sep else arg)
            if not 0 < seconds < 86_400:
                raise ValueError(f"the interval must be above 0 s and below a day, got {seconds}")
        else:
            raise ValueError(f"unknown argument {arg!r}")
    return seconds, count


def run_text(runner: ShellRunner, text: str) -> None:
    # lines end at \n only: str.splitlines() would also cut at U+2028, U+0085 and
    # the like, which belong to a quoted string as typed
    for line in text.replace("\r\n", "\n").split("\n"):
        if runner.quit:
            return
        runner.feed_line(line)
    runner.finish()


def statement_complete(text: str) -> bool:
    stripped = text.strip()
    if not stripped or stripped.startswith("\\"):
        return True
    return is_complete(text)


def interactive(runner: ShellRunner, *, input: Any = None, output: Any = None) -> None:
    """The prompt_toolkit loop (``input``/``output`` let tests drive it)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.history import FileHistory, History, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    from resgroups.sched.stats import COLUMN_NAMES
    from resgroups.statements.table_functions import TABLE_FUNCTIONS

    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event: Any) -> None:
        buffer = event.current_buffer
        if statement_complete(buffer.text):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    history: History
    try:
        path = Path.home() / ".resgroups_history"
        path.touch(exist_ok=True)
        history = FileHistory(str(path))
    except OSError:
        history = InMemoryHistory()
    words = [
        *keywords(),
        *COLUMN_NAMES,
        *(f"{name}()" for name in TABLE_FUNCTIONS),
        "current_resource_group()",
        *RULE_WORDS,
    ]
    prompt: PromptSession[str] = PromptSession(
        multiline=True,
        key_bindings=bindings,
        history=history,
        completer=WordCompleter(words, ignore_case=True, sentence=False),
        input=input,
        output=output,
    )
    runner.write("resgroups shell: statements end with ';', \\? for help, \\q to quit\n")
    while not runner.quit:
        try:
            text = prompt.prompt(
                "resgroups=> ", prompt_continuation=lambda width, line, soft: "resgroups-> "
            )
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        run_text(runner, text)


def main(session: Session, *, command: str | None = None) -> int:
    """Run ``-c`` text, a piped script or the interactive shell; the exit status."""
    runner = ShellRunner(session, sys.stdout.write)
    if command is not None:
        run_text(runner, command)
    elif not sys.stdin.isatty():
        run_text(runner, sys.stdin.read())
    else:
        interactive(runner)
    return 1 if runner.failures else 0
