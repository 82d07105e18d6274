"""Interrupts and early cancels (issue: hostile input, class 2): a
KeyboardInterrupt arriving at any instant of ``__enter__``/``__exit__``/``map``
never leaks a slot, a worker or a byte; map's workers are back before
``__exit__`` returns.

Signals at random instants run in a subprocess (tests/programs/), so an
interrupt can never land in pytest itself; each is bounded by a timeout. The
storm of issue 28 sends them from this process to a child running queries
while two CPU hogs spin. The every-instruction tests run here, with no real
signal: a trace function calls the handler in force before each instruction,
and the handler raises an exception of the test's own, never KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import CodeType, FrameType

import numpy as np
import pytest

import resgroups
from resgroups import interrupts
from resgroups.catalog import Catalog
from resgroups.clock import ManualClock
from resgroups.cpus import available_cpus
from resgroups.interrupts import Hold

PROGRAMS = Path(__file__).parent / "programs"


def _run(program: str, *args: str, timeout: float = 300) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, str(PROGRAMS / program), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _whole(report: dict[str, object]) -> None:
    assert report["pool_free"] == report["pool_size"], report
    for key in ("active", "queued", "memory", "open_queries"):
        if key in report:
            assert report[key] == 0, report


def test_sigint_at_each_worst_moment_gives_everything_back() -> None:
    """Made to happen: __exit__ blocked on the dispatcher's lock, __enter__ on the
    gate's or the dispatcher's, map waiting for a task on a pool thread, a
    query waiting in the queue. Each gets its KeyboardInterrupt, and the pool,
    the gate and the budgets are whole at once."""
    reports = _run("interrupt_cases.py", timeout=120)
    cases = {str(r["case"]): r for r in reports if "interrupted" in r}
    assert set(cases) == {
        "exit_waits_for_the_dispatcher",
        "enter_waits_for_the_gate",
        "enter_waits_for_a_worker",
        "map_waits_for_a_task",
        "queued_query",
    }
    for report in cases.values():
        assert report["interrupted"] is True, report
        _whole(report)
    # a queued query still answers Ctrl-C promptly: its wait notices within a poll
    (waited,) = [r["waited_s"] for r in reports if "waited_s" in r]
    assert isinstance(waited, float)
    assert waited < 5.0


@pytest.mark.parametrize("seed", [1, 2])
def test_thousands_of_interrupts_at_random_instants_leave_the_engine_whole(seed: int) -> None:
    (report,) = _run("interrupt_storm.py", "--interrupts", "3000", "--seed", str(seed))
    assert report["sent"] >= 3000  # and for at least 3 s
    caught = report["caught"]
    assert isinstance(caught, dict)
    # they landed, in every kind of step (signals that arrive before the main thread
    # runs again coalesce into one, so fewer are caught than sent on a loaded machine)
    assert sum(caught.values()) >= 300, caught
    assert {"enter-exit", "map", "memory", "queued", "sql"} <= set(caught), caught
    assert report["completed"] > 0
    _whole(report)
    groups = report["groups"]
    assert isinstance(groups, dict)
    assert all(counts == [0, 0, 0] for counts in groups.values()), groups
    assert report["process_memory"] == 0
    assert report["session_running"] == 0
    assert report["served_after"] == 4


@contextlib.contextmanager
def _cpu_hogs(count: int = 2) -> Iterator[None]:
    """``count`` processes spinning on the CPU, ended (by their own pids) on the way out."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)


def _sigint_storm(seed: int, sigints: int = 300, term: bool = False) -> dict[str, object]:
    """tests/programs/sigint_storm.py under two CPU hogs, sent ``sigints`` SIGINTs
    (SIGTERMs: ``term``) at random 2-20 ms gaps (issue 28's reproducer); its report
    once stdin closes."""
    rng = random.Random(seed)
    signum = signal.SIGTERM if term else signal.SIGINT
    program = [sys.executable, str(PROGRAMS / "sigint_storm.py"), "--max-seconds", "60"]
    with _cpu_hogs():
        child = subprocess.Popen(
            [*program, "--signal", "term" if term else "int"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            assert child.stdin is not None
            ready = child.stdout.readline()  # the engine serves (or the child died: "")
            assert json.loads(ready or "{}").get("ready"), ready
            for _ in range(sigints):
                time.sleep(rng.uniform(0.002, 0.020))  # pacing the signals, not a wait
                os.kill(child.pid, signum)
            out, err = child.communicate(timeout=60)  # closes stdin: the child stops
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    assert child.returncode == 0, err[-3000:]
    (line,) = [line for line in out.splitlines() if line.startswith("{")]
    report = json.loads(line)
    assert isinstance(report, dict)
    return report


def _nothing_stranded(report: dict[str, object]) -> None:
    assert report["queries"] == [], report  # resource_group_queries() is empty
    assert report["pool_free"] == report["workers"], report
    groups = report["groups"]
    assert isinstance(groups, dict)
    assert all(counts == [0, 0, 0] for counts in groups.values()), groups
    assert report["process_memory"] == 0, report
    assert report["open_queries"] == 0, report
    assert report["served_after"] is True, report
    errors = report["errors"]
    assert isinstance(errors, dict)
    assert "QueryTimeout" not in errors, report  # what a stranded query makes of the rest


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_sigints_from_outside_under_cpu_hogs_strand_no_query(seed: int) -> None:
    """Issue 28: a handler that raises KeyboardInterrupt itself, memory and map in
    each query, SIGINTs every 2-20 ms from another process, two CPU hogs."""
    report = _sigint_storm(seed)
    _nothing_stranded(report)
    interrupted, completed = report["interrupted"], report["completed"]
    assert isinstance(interrupted, int)
    assert isinstance(completed, int)
    assert interrupted >= 50, report  # they landed
    assert completed > 0, report


def test_sigterms_raising_system_exit_strand_no_query() -> None:
    report = _sigint_storm(21, term=True)
    _nothing_stranded(report)
    interrupted = report["interrupted"]
    assert isinstance(interrupted, int)
    assert interrupted >= 50, report


@pytest.mark.slow
def test_the_sigint_storm_20_runs_strands_no_query() -> None:
    """The issue's check: 20 runs with random seeds under two CPU hogs, zero stranded."""
    seeds = [random.randrange(1 << 30) for _ in range(20)]
    stranded: dict[int, dict[str, object]] = {}
    interrupted = []
    for seed in seeds:
        report = _sigint_storm(seed)
        interrupted.append(report["interrupted"])
        try:
            _nothing_stranded(report)
        except AssertionError:
            stranded[seed] = report
    print(f"storm: {len(seeds)} runs, {len(stranded)} stranding, interrupts caught {interrupted}")
    assert not stranded, stranded


def test_map_workers_are_back_before_exit_returns() -> None:
    data = np.arange(20_000, dtype=np.float64)
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        for i in range(300):
            with session.query() as q:
                q.map(lambda task, k: float((data * k).sum()), range(4))
            assert engine.pool("default").free == 2, f"iteration {i}"


def test_a_hold_runs_its_block_to_the_end_then_the_handler() -> None:
    seen: list[int] = []
    steps: list[str] = []

    def held() -> None:
        with Hold(seen.append):
            signal.raise_signal(signal.SIGINT)
            steps.append("the block went on")
            with Hold():
                steps.append("an inner hold ends without delivering")
            steps.append("still held")

    with pytest.raises(KeyboardInterrupt):
        held()
    assert steps == ["the block went on", "an inner hold ends without delivering", "still held"]
    assert seen == [signal.SIGINT]


def test_a_hold_delivers_at_a_point_its_holder_chooses() -> None:
    with Hold() as hold:
        signal.raise_signal(signal.SIGINT)
        assert hold.interrupted
        with pytest.raises(KeyboardInterrupt):
            hold.deliver()
        assert not hold.interrupted


def test_a_hold_off_the_main_thread_changes_nothing() -> None:
    states: list[bool] = []

    def run() -> None:
        with Hold() as hold:
            states.append(hold.active)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert states == [False]


def test_handlers_are_the_programs_own_outside_holds() -> None:
    before = signal.getsignal(signal.SIGINT)
    with Hold():
        assert signal.getsignal(signal.SIGINT) is not before  # wrapped while held
    assert signal.getsignal(signal.SIGINT) is before
    with resgroups.Engine() as engine, engine.connect().query():
        pass
    assert signal.getsignal(signal.SIGINT) is before  # asyncio.run looks for this one


def test_a_handler_installed_in_a_query_or_between_queries_is_wrapped_by_the_next_hold() -> None:
    """While a query is in flight the handlers stay wrapped, and a hold checks in
    one read whether the program installed one meanwhile: a hold in the body
    (as ``__exit__``'s) wraps a handler the body installed, and the next query
    wraps one installed between queries; each goes back as the last query ends."""
    before = signal.getsignal(signal.SIGUSR1)
    seen: list[object] = []

    def first(signum: int, frame: object) -> None:
        pass

    def second(signum: int, frame: object) -> None:
        pass

    def wrapped_usr1() -> None:
        handler = signal.getsignal(signal.SIGUSR1)
        seen.append(handler.inner if isinstance(handler, interrupts._Deferring) else None)

    try:
        with resgroups.Engine() as engine:
            session = engine.connect()
            with session.query():
                signal.signal(signal.SIGUSR1, first)  # not wrapped until a hold begins
                with Hold():
                    wrapped_usr1()
            assert signal.getsignal(signal.SIGUSR1) is first  # the program's again
            signal.signal(signal.SIGUSR1, second)
            with session.query():
                wrapped_usr1()  # wrapped as the query began
            assert signal.getsignal(signal.SIGUSR1) is second
        assert seen == [first, second]
    finally:
        signal.signal(signal.SIGUSR1, before)


def test_a_main_thread_query_lost_without_exit_does_not_keep_the_handlers_wrapped() -> None:
    """A query entered on the main thread keeps the handlers wrapped until its
    __exit__; one whose handle is lost instead (the reconcile loop gives back
    what it held) stops counting as in flight once it is collected."""
    before = signal.getsignal(signal.SIGINT)
    with resgroups.Engine(reconcile_interval=3600) as engine:
        lost = engine.connect().query()
        lost.__enter__()
        assert signal.getsignal(signal.SIGINT) is not before  # wrapped while in flight
        del lost
        gc.collect()
        assert engine.reconcile() == 1
        with engine.connect().query():  # the next hold on the main thread settles it
            pass
        assert signal.getsignal(signal.SIGINT) is before
        assert interrupts.STATE.queries == 0


# ---- a handler at every instruction: signals simulated under sys.settrace ----------


class Injected(BaseException):
    """What the test's handler raises: a signal handler's exception, as
    KeyboardInterrupt is, but one pytest never takes for the user's Ctrl-C."""


def _raise_injected(signum: int, frame: object) -> None:
    raise Injected


RESGROUPS = str(Path(resgroups.__file__).parent)


def _in_resgroups(frame: FrameType | None) -> bool:
    """The frame runs resgroups' code, or code resgroups called."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(RESGROUPS):
            return True
        frame = frame.f_back
    return False


def _with_a_signal_at(
    nth: int, run: Callable[[], object], only: CodeType | None = None
) -> tuple[int, bool]:
    """``run()`` on this thread with the SIGINT handler in force called, as CPython
    calls it, before the ``nth`` instruction that resgroups (or what it calls)
    executes on this thread: ``(such instructions run, whether it was called)``.
    A superset of the points where CPython runs handlers in that code (it checks
    only at a function's start, a call and a backward jump), so protected code
    must also leave nothing pending where no real signal could arrive. The
    caller's own frames are left out: their instructions between the body's
    end and the call of ``__exit__`` are no such point, and the ``with``
    statement does not cover them. ``only``: the instructions of frames of that
    code alone are counted (a function whose every instruction is to have its
    turn in a few runs)."""
    seen = 0
    called = False

    def local(frame: FrameType, event: str, arg: object) -> object:
        nonlocal seen, called
        if called:
            return None
        if event == "opcode" and (only is not None or _in_resgroups(frame)):
            seen += 1
            if seen == nth:
                called = True
                sys.settrace(None)
                handler = signal.getsignal(signal.SIGINT)
                assert callable(handler)
                handler(signal.SIGINT, frame)  # raises here, or is deferred
        return local

    def start(frame: FrameType, event: str, arg: object) -> object:
        if only is not None and frame.f_code is not only:
            return None
        frame.f_trace_opcodes = True
        return local

    sys.settrace(start)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen, called


def _every_instruction(
    engine: resgroups.Engine, run: Callable[[], None], limit: int = 20_000
) -> dict[str, int]:
    """A handler that raises, called before each instruction of ``run()`` in turn:
    each time the exception leaves ``run()`` (it is never lost), nothing is left
    pending, the program's handler is back, and the engine holds nothing."""
    outcomes = {"raised": 0}
    nth = 1
    while nth < limit:
        raised = False
        try:
            seen, called = _with_a_signal_at(nth, run)
        except Injected:
            raised, called = True, True
            seen = nth
        assert raised == called, f"instruction {nth}: the handler's exception was lost"
        assert not interrupts.PENDING, f"instruction {nth}: a signal left pending"
        assert signal.getsignal(signal.SIGINT) is _raise_injected, f"instruction {nth}"
        assert engine.pool("default").free == 2, f"instruction {nth}"
        assert not engine.live_queries(), f"instruction {nth}"
        for row in engine.resource_groups():
            held = (row["active_queries"], row["queued_queries"], row["memory_used_bytes"])
            assert held == (0, 0, 0), f"instruction {nth}: {row}"
        assert engine.memory_ledger.process.used == 0, f"instruction {nth}"
        if not called:  # past the end: every instruction had its turn
            # (``raised`` may exceed the last run's length by a few: a run's path is
            # not the same on a loaded machine, where a query may wait a moment more)
            outcomes["instructions"] = seen
            return outcomes
        outcomes["raised"] += raised
        nth += 1
    raise AssertionError(f"more than {limit} instructions")


@pytest.fixture
def raising_sigint() -> Iterator[None]:
    before = signal.signal(signal.SIGINT, _raise_injected)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("raising_sigint")
def test_a_handler_raising_before_any_instruction_of_a_query_strands_nothing() -> None:
    """Enter, a body with memory and a checkpoint, exit: the handler called before
    each instruction of them all (the first of ``__exit__`` included)."""
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP g WITH (memory_limit = '16M')")
        session = engine.connect()
        session.execute("SET RESOURCE GROUP g")

        def run() -> None:
            with session.query() as q:
                q.memory.allocate(1 << 16)
                q.checkpoint()
                q.memory.release(1 << 16)

        outcomes = _every_instruction(engine, run)
        assert outcomes["instructions"] > 1000, outcomes
        assert outcomes["raised"] >= outcomes["instructions"], outcomes


@pytest.mark.usefixtures("raising_sigint")
def test_a_handler_raising_before_any_instruction_of_a_nested_query_strands_nothing() -> None:
    """The inner query of two on the main thread: protection does not end when
    the inner query's hold does, and the outer query's ``__exit__`` stays covered."""
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()

        def run() -> None:
            with session.query() as outer:
                with session.query() as inner:
                    inner.memory.allocate(1 << 12)
                outer.checkpoint()

        outcomes = _every_instruction(engine, run)
        assert outcomes["raised"] >= outcomes["instructions"], outcomes


@pytest.mark.usefixtures("raising_sigint")
def test_a_handler_raising_at_any_instruction_of_a_reconcile_strands_nothing() -> None:
    """``reconcile()`` on demand on the main thread, the handler called before each
    of its instructions in turn: the zombie is either reclaimed whole (the
    exception after it) or left whole for the next reconcile, never taken off
    the books with its slot and bytes still held."""
    with resgroups.Engine(workers=2, reconcile_interval=3600) as engine:
        engine.connect().execute(
            "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, memory_limit = '16M')"
        )
        session = engine.connect()
        session.execute("SET RESOURCE GROUP one")

        def lose_a_query() -> None:  # a thread that dies without __exit__
            q = session.query()
            q.__enter__()
            q.memory.allocate(1 << 16)
            q.memory.flush()

        nth, raised = 1, 0
        while nth < 20_000:
            thread = threading.Thread(target=lose_a_query)
            thread.start()
            thread.join(30)  # its frames gone, the query is unreachable: a zombie
            one = next(r for r in engine.resource_groups() if r["name"] == "one")
            assert (one["active_queries"], one["memory_used_bytes"]) == (1, 1 << 16)
            raised_here = False
            try:
                _seen, called = _with_a_signal_at(nth, engine.reconcile)
            except Injected:
                called = raised_here = True
                raised += 1
            assert raised_here == called, f"instruction {nth}: the handler's exception was lost"
            assert not interrupts.PENDING, f"instruction {nth}: a signal left pending"
            engine.reconcile()  # what the signal left for the next one, if anything
            one = next(r for r in engine.resource_groups() if r["name"] == "one")
            held = (one["active_queries"], one["memory_used_bytes"])
            assert held == (0, 0), f"instruction {nth}: {one}"
            assert engine.pool("default").free == 2, f"instruction {nth}"
            assert engine.zombies_reclaimed == nth, f"instruction {nth}: counted once each"
            if not called:  # past the end: every instruction had its turn
                assert raised == nth - 1 > 50, (raised, nth)
                return
            nth += 1
        raise AssertionError("more than 20000 instructions")


class BodyFailed(Exception):
    pass


@pytest.mark.usefixtures("raising_sigint")
def test_a_handler_raising_before_any_instruction_of_a_failed_query_strands_nothing() -> None:
    """``__exit__`` on its exception path (the body raised), and ``map`` with its
    tasks on the calling thread (a group limited to one core), so that every
    instruction is the same from one run to the next."""
    one_core = min(100.0, 100.0 / available_cpus())
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute(
            f"CREATE RESOURCE GROUP g WITH (cpu_limit = '{one_core:.2f}%', memory_limit = '16M')"
        )
        session = engine.connect()
        session.execute("SET RESOURCE GROUP g")

        def task(t: resgroups.query.Task, k: int) -> int:
            t.memory.allocate(1 << 12)
            t.checkpoint()
            t.memory.release(1 << 12)
            return k

        def run() -> None:
            with contextlib.suppress(BodyFailed), session.query() as q:
                q.memory.allocate(1 << 16)
                assert q.map(task, range(2)) == [0, 1]
                raise BodyFailed

        outcomes = _every_instruction(engine, run)
        assert outcomes["raised"] >= outcomes["instructions"], outcomes


def test_a_query_off_the_main_thread_wraps_nothing_and_counts_nothing() -> None:
    """Only the main thread runs signal handlers: a query elsewhere leaves the
    program's handlers as they are and is not counted as in flight."""
    before = signal.getsignal(signal.SIGINT)
    seen: list[object] = []
    entered, leave = threading.Event(), threading.Event()
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()

        def run() -> None:
            with session.query() as q:
                q.memory.allocate(1 << 12)
                entered.set()
                leave.wait(10)

        thread = threading.Thread(target=run)
        thread.start()
        assert entered.wait(10)
        seen.extend([signal.getsignal(signal.SIGINT), interrupts.STATE.queries])
        leave.set()
        thread.join(10)
        assert not thread.is_alive()
    assert seen == [before, 0]


def _finishes(run: Callable[[], object], timeout: float = 30.0) -> bool:
    """``run()`` on another thread ends within ``timeout`` (it waits on no lock a
    signal left held)."""
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


@pytest.mark.usefixtures("raising_sigint")
@pytest.mark.parametrize("kind", ["memory", "directory"])
def test_a_handler_raising_at_any_instruction_of_a_catalog_write_keeps_no_lock(
    kind: str, tmp_path: Path
) -> None:
    """Each instruction of ``Catalog.write`` in turn, for a DDL that changes the
    catalog and one that changes nothing (``IF EXISTS``): the exception leaves
    the statement, the change is made or not, live and durable alike, and the
    catalog's lock is back (a hold around it: a handler that would run as it is
    given back waited for that)."""
    catalog = str(tmp_path / "catalog") if kind == "directory" else None
    engine = resgroups.Engine(workers=2, catalog=catalog)
    admin = engine.connect()
    admin.execute("CREATE RESOURCE GROUP g")
    code = Catalog.write.__code__
    for statement in (
        "ALTER RESOURCE GROUP g SET (max_active_queries = {nth})",
        "DROP RESOURCE GROUP IF EXISTS missing_{nth}",
    ):
        nth, raised = 1, 0
        while nth < 1_000:
            text = statement.format(nth=nth)
            try:
                _seen, called = _with_a_signal_at(nth, partial(admin.execute, text), only=code)
            except Injected:
                called = raised_here = True
                raised += 1
            else:
                raised_here = False
            assert raised_here == called, f"{text}: the handler's exception was lost"
            assert not interrupts.PENDING, f"{text}: a signal left pending"
            assert _finishes(lambda: admin.execute("ALTER RESOURCE GROUP g SET (cpu_weight = 50)"))
            if not called:
                assert raised == nth - 1 > 20, (statement, raised, nth)
                break
            nth += 1
        else:
            raise AssertionError(f"{statement}: more than 1000 instructions")
    live = {r["name"]: r["max_active_queries"] for r in engine.resource_groups()}
    engine.close()
    if catalog is not None:  # what the directory holds is what the engine ran
        with resgroups.Engine(workers=2, catalog=catalog) as reopened:
            assert {r["name"]: r["max_active_queries"] for r in reopened.resource_groups()} == live


@pytest.mark.usefixtures("raising_sigint")
@pytest.mark.parametrize("action", ["LOG", "MOVE TO RESOURCE GROUP g2"])
def test_a_handler_raising_at_any_instruction_of_a_rules_check_strands_nothing(
    action: str,
) -> None:
    """Each instruction of a checkpoint that finds a rule due, in turn (the rule
    logs, or moves the query to another group): the exception leaves the query
    (or waits for the end of what the rule does), and its exit, which asks the
    rules again for the LOG rules crossed at its end, gives everything back
    rather than waiting on a lock the handler kept."""
    clock = ManualClock()
    with resgroups.Engine(workers=2, clock=clock, slice_ms=50) as engine:
        admin = engine.connect()
        admin.execute(
            "CREATE RESOURCE GROUP g; CREATE RESOURCE GROUP g2;"
            f"CREATE RESOURCE RULE r ON RESOURCE GROUP g WHEN rows > 10 THEN {action}"
        )
        session = engine.connect()
        session.execute("SET RESOURCE GROUP g")
        nth, raised = 1, 0

        def run(nth: int, outcome: list[bool], exited: list[bool]) -> None:
            q = session.query(statement="SELECT x FROM t")
            q.__enter__()
            try:
                q.memory.allocate(1 << 14)
                q.scanned(1000, 8000)
                clock.advance(0.06)  # past its slice: the checkpoint asks the rules
                outcome.append(_with_a_signal_at(nth, q.checkpoint)[1])
                q.memory.release(1 << 14)
            finally:
                # its exit on another thread, so that a lock left held fails the test
                # rather than hang it
                exited.append(_finishes(lambda: q.__exit__(None, None, None)))

        while nth < 20_000:
            outcome: list[bool] = []
            exited: list[bool] = []
            try:
                run(nth, outcome, exited)
                # deferred as a hold in the body ended (the query still in flight): the
                # next hold's end on this thread runs it (a slice end, or the exit,
                # had it run here)
                with Hold():
                    pass
            except Injected:
                raised += 1
                called = True
            else:
                called = outcome[0]
            assert exited == [True], f"instruction {nth}: the query's exit waits on a lock"
            assert not interrupts.PENDING, f"instruction {nth}: a signal left pending"
            assert engine.pool("default").free == 2, f"instruction {nth}"
            assert not engine.live_queries(), f"instruction {nth}"
            for row in engine.resource_groups():
                held = (row["active_queries"], row["queued_queries"], row["memory_used_bytes"])
                assert held == (0, 0, 0), f"instruction {nth}: {row}"
            if not called:
                assert raised == nth - 1 > 50, (raised, nth)
                return
            nth += 1
        raise AssertionError("more than 20000 instructions")
