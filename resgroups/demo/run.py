"""One timed run of a scenario on a fresh engine (:func:`run_once`): its
client threads, how each runs a query, and the CPU each workload used as the
run goes."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable

import resgroups
from resgroups.demo.results import PROCESS, Live, RunResult, WorkloadStats
from resgroups.demo.scenarios import Calibration, Scenario, Workload


def _setup_users(admin: resgroups.Session, scenario: Scenario) -> None:
    users = sorted({u for w in scenario.workloads for u in w.users})
    admin.execute_script("; ".join(f"CREATE USER {u}" for u in users))


def _runner(
    scenario: Scenario, calibration: Calibration
) -> Callable[[resgroups.Session, str], float]:
    """How a client runs one query: ``run(session, sql)`` -> its wait in ms."""
    if scenario.engine == "builtin":

        def builtin(session: resgroups.Session, sql: str) -> float:
            return float(session.execute(sql).timings.get("wait_ms", 0.0))

        return builtin
    database = calibration.database

    def on_engine(session: resgroups.Session, sql: str) -> float:
        timings: dict[str, float] = {}
        cpu = time.thread_time_ns()
        try:
            database.run(session, sql, timings)
        finally:  # its thread's CPU, and its engine's threads' charged to it
            native = int(timings.get("native_cpu_ms", 0.0) * 1e6)
            session.add_work_cpu(time.thread_time_ns() - cpu + native)
        return timings.get("wait_ms", 0.0)

    return on_engine


class ThreadClock:
    """The CPU the calling thread has used since this was made, readable from any
    thread (its last reading once the thread has ended)."""

    def __init__(self) -> None:
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        self._start = time.clock_gettime_ns(self._clock)
        self._last = 0

    def read(self) -> int:
        with contextlib.suppress(OSError):  # the thread has ended: its clock is gone
            self._last = time.clock_gettime_ns(self._clock) - self._start
        return self._last


def _limits(engine: resgroups.Engine, scenario: Scenario) -> dict[str, float]:
    """Each workload's CPU limit, % of the CPUs, as its group has it now (none in DEFAULT)."""
    by_group = {g["name"]: g["cpu_limit_pct"] for g in engine.resource_groups()}
    limits = {}
    for w in scenario.workloads:
        limit = by_group.get(w.group)
        if limit is not None:
            limits[w.name] = float(limit)
    return limits


def run_once(
    scenario: Scenario,
    calibration: Calibration,
    seconds: float,
    *,
    with_groups: bool,
    progress: Callable[[float], None],
    serve: Callable[[resgroups.Engine], Live] | None = None,
    oversubscribe: float = 1.0,
) -> RunResult:
    """One timed run on a fresh engine; the statistics of every workload. With
    ``serve``, the engine is served from the start and stays up after the run
    (its queries cancelled), in the result's ``live``."""
    engine = resgroups.Engine(access_control=True, oversubscribe=oversubscribe)
    live: Live | None = None
    try:
        admin = engine.connect()
        _setup_users(admin, scenario)
        if with_groups:
            admin.execute_script("; ".join(scenario.ddl))
        limits = _limits(engine, scenario)
        if serve is not None:
            live = serve(engine)
            print(f"\nwatch it live: {live.url}", file=sys.stderr, flush=True)
        stats = {w.name: WorkloadStats() for w in scenario.workloads}
        run_query = _runner(scenario, calibration)
        sessions: dict[str, list[resgroups.Session]] = {w.name: [] for w in scenario.workloads}
        lock = threading.Lock()
        started = time.monotonic()
        stop = started + seconds

        # DuckDB charges a query's CPU to the session when the query ends, so its
        # curve sawed between workloads; the client threads' own CPU clocks (DuckDB
        # runs on the calling thread) say what each workload uses as it goes
        threads_cpu = scenario.engine == "duckdb" and hasattr(time, "pthread_getcpuclockid")
        clocks: dict[str, list[ThreadClock]] = {w.name: [] for w in scenario.workloads}

        def client(workload: Workload, user: str) -> None:
            session = engine.connect(user)
            with lock:
                sessions[workload.name].append(session)
                if threads_cpu:
                    clocks[workload.name].append(ThreadClock())
            record = stats[workload.name]
            sql = calibration.sql(workload)
            while time.monotonic() < stop:
                t0 = time.monotonic()
                try:
                    wait_ms = run_query(session, sql)
                except resgroups.AdmissionRejected:
                    with lock:
                        record.rejections += 1
                    time.sleep(0.05)
                    continue
                except resgroups.Error:
                    with lock:
                        if time.monotonic() >= stop:  # cancelled as the run ended
                            record.cancelled += 1
                        else:
                            record.errors += 1
                    continue
                if time.monotonic() <= stop:  # count what completed inside the run
                    with lock:
                        record.latencies_ms.append((time.monotonic() - t0) * 1000)
                        record.waits_ms.append(wait_ms)
                if workload.think_s:
                    time.sleep(workload.think_s)

        process_started = time.process_time_ns()

        def cpu_now() -> dict[str, int]:
            with lock:
                if threads_cpu:
                    cpu = {n: sum(c.read() for c in cs) for n, cs in clocks.items()}
                else:
                    cpu = {n: sum(s.work_cpu_ns for s in ss) for n, ss in sessions.items()}
            cpu[PROCESS] = time.process_time_ns() - process_started
            return cpu

        threads = [
            threading.Thread(target=client, args=(w, u), daemon=True)
            for w in scenario.workloads
            for u in w.users
        ]
        for t in threads:
            t.start()
        timeline: list[tuple[float, dict[str, int]]] = []
        at_stop: dict[str, int] = {}
        while True:
            now = time.monotonic()
            elapsed = min(now - started, seconds)
            timeline.append((elapsed, cpu_now()))
            progress(elapsed)
            if now >= stop:
                at_stop = cpu_now()
                break
            time.sleep(min(0.25, max(0.0, stop - now)))
        process_cpu_ns = at_stop.pop(PROCESS)
        shown = {str(r["name"]): r["cpu_lane"] for r in engine.resource_groups()}
        lanes = {name: int(lane) for name, lane in shown.items() if isinstance(lane, int)} or None
        for name, cpu in at_stop.items():
            stats[name].cpu_ns = cpu
        # long scans still running are cancelled; their latency is not counted
        for t in threads:
            t.join(0.01)
        if live is None:
            engine.close(grace=0.5)
        else:  # the engine stays up: cancel the clients' queries until they are done
            give_up = time.monotonic() + 30
            while any(t.is_alive() for t in threads) and time.monotonic() < give_up:
                with lock:
                    everyone = [s for ss in sessions.values() for s in ss]
                for session in everyone:
                    session.cancel()
                for t in threads:
                    t.join(0.1)
        for t in threads:
            t.join(10)
        label = "with groups" if with_groups else "without groups"
        return RunResult(
            label, seconds, stats, timeline, live, engine.cpus, limits, process_cpu_ns, lanes
        )
    except BaseException:  # nothing stays up after a failed run, served or not
        if live is not None:
            live.close()
        engine.close(grace=0.5)
        raise
