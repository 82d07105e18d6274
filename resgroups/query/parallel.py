"""A query's parallel work: ``q.map`` runs tasks on pool workers.

Each task beyond the first is offered to the query's pool with a runner of
its own (``Dispatcher.submit_tasks``); a pool thread granted a worker runs
one pending item and gives the worker back before telling the query. While
it waits, the query's own thread runs pending items itself, so a query never
deadlocks on workers its group or its callers hold, and ``map`` returns only
once every task runner has given its worker back.

Who runs the tasks: a group limited to one core or less runs them on the
query's own thread, and so does a CTAS in any limited group; the tasks of a
CTAS in an unlimited group, and of unmanaged queries, run outside every
group and are charged to none.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from resgroups.errors import QueryCancelled
from resgroups.interrupts import Hold
from resgroups.sched.cpu import RUNNER_DONE, Runner
from resgroups.sched.memory import MemoryCounter

if TYPE_CHECKING:
    from resgroups.query.lifecycle import Query

T = TypeVar("T")
R = TypeVar("R")


class Task:
    """What a ``map`` task function receives: checkpoints and memory of its query.

    A task running on a pool thread holds its own worker (its own runner);
    its checkpoints stop it when the query is cancelled or timed out, or a
    sibling failed, and charge its CPU to the group at each slice end.
    """

    __slots__ = ("_batch", "_runner", "_slice_end", "cpu_mark", "memory", "query")

    def __init__(self, query: Query, batch: MapBatch[Any, Any], runner: Runner | None) -> None:
        self.query = query
        self._batch = batch
        self._runner = runner  # None: running on the query's own thread
        # each task has its own accumulator, published when the task ends
        self.memory = MemoryCounter(query.held.published)  # map() created it for its tasks
        self.cpu_mark = query._engine.cpu_meter() if runner is not None and runner.scheduled else 0
        # the end of this task's CPU slice, on the engine clock (inf: unscheduled)
        self._slice_end = query._now() + query._engine.slice_s if self.cpu_mark else math.inf

    def checkpoint(self) -> None:
        """The query's checkpoint, plus: stop early once a sibling task failed."""
        query = self.query
        if self._runner is None:
            query.checkpoint()
        else:
            now = query._checked_at = query._now()  # a task's progress is its query's
            if now >= query._stop_at:
                query._checkpoint_slow()
            if now >= query._fence_at:  # fleet mode: the instance's fence, for tasks too
                query._check_fence()
            if now >= query._rules_at:  # runaway-query rules, for tasks too
                query.check_rules(now, own_thread=False)
            if now >= self._slice_end:
                self._charge_slice(now)
        if self._batch.failed:
            raise QueryCancelled("a sibling task of this query failed")

    def _charge_slice(self, now: float) -> None:
        runner = self._runner
        assert runner is not None
        query = self.query
        mark = query._engine.cpu_meter()
        query.cpu_ns += mark - self.cpu_mark
        query._engine.dispatcher.slice_end(
            runner, mark - self.cpu_mark, query._wait_error, query._timeout_at
        )
        self.cpu_mark = mark
        self._slice_end = now + query._engine.slice_s

    def cpu_to_charge(self) -> int:
        """The CPU used since the last charge (0 when unscheduled)."""
        if not self.cpu_mark:
            return 0
        used = self.query._engine.cpu_meter() - self.cpu_mark
        self.query.cpu_ns += used
        return used


class MapBatch(Generic[T, R]):
    """The tasks of one ``map`` call: pending indexes, results, the first error."""

    def __init__(self, query: Query, fn: Callable[[Task, T], R], items: list[T]) -> None:
        self.query = query
        self.fn = fn
        self.items = items
        self.results: list[Any] = [None] * len(items)
        self._pending = deque(range(len(items)))
        self._unfinished = len(items)
        self._cond = threading.Condition()
        self.runners: list[Runner] = []  # the task runners offered to the pools
        self.error: BaseException | None = None
        self.failed = False

    def run_one(self, runner: Runner | None = None) -> bool:
        """Run one pending item (on the caller's thread when ``runner`` is None)."""
        dispatcher = self.query._engine.dispatcher
        with self._cond:
            if not self._pending:
                return False
            index = self._pending.popleft()
            skip = self.failed  # what a failure made pointless is not run
        if skip:
            try:
                if runner is not None:
                    dispatcher.release(runner, 0)
            finally:
                with self._cond:
                    self._finish_locked()
            return True
        task = Task(self.query, self, runner)
        try:
            try:
                self.results[index] = self.fn(task, self.items[index])
            finally:
                task.memory.flush()
        except BaseException as exc:
            with self._cond:
                if self.error is None:
                    self.error = exc
                self.failed = True
        finally:
            try:
                if runner is not None:
                    runner.pending_cpu_ns = task.cpu_to_charge()
            except BaseException as exc:  # the meter failed: the task still ends
                with self._cond:
                    self.error = self.error or exc
                    self.failed = True
            finally:
                try:
                    if runner is not None:  # the worker is back before map() returns
                        dispatcher.release(runner, runner.pending_cpu_ns)
                finally:
                    with self._cond:
                        self._finish_locked()
        return True

    def run_task(self, runner: Runner) -> None:
        """A pool thread, holding ``runner``'s worker: run one pending item, and
        give the worker back before telling the query (so that when ``map``
        returns, every worker its tasks used is back in the pool)."""
        runner.pending_cpu_ns = 0
        try:
            self.run_one(runner)  # gives the worker back itself when it ran an item
        finally:
            try:
                self.query._engine.dispatcher.release(runner, runner.pending_cpu_ns)
            finally:
                with self._cond:
                    self._cond.notify_all()

    def _finish_locked(self) -> None:
        self._unfinished -= 1
        if not self._unfinished:
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every item has ended and every task runner gave its worker back
        (or the pools closed under it)."""
        dispatcher = self.query._engine.dispatcher
        with self._cond:
            while self._unfinished or any(r.state is not RUNNER_DONE for r in self.runners):
                if dispatcher.closed:
                    return
                self._cond.wait(0.25)


def task_runners(query: Query, count: int) -> list[Runner]:
    """Runners for ``count`` parallel tasks of ``query`` (none: every task on the
    query's own thread; see the module's docstring for who runs them)."""
    if count <= 0:
        return []
    core = query._engine.dispatcher.core
    runtime = query.runtime
    group = core.outside
    if runtime is not None:
        cpu = runtime.cpu
        # a limit of its own group or of one above it (SPEC §14)
        if cpu.single_threaded or (query.kind == "ctas" and cpu.path_limited):
            return []
        if query.kind != "ctas":
            group = cpu
    return [
        Runner(group, query.pool_name, query.user, query.id, query.kind, is_task=True)
        for _ in range(count)
    ]


def run_map(query: Query, fn: Callable[[Task, T], R], items: Iterable[T]) -> list[R]:
    """``[fn(task, item) for item in items]`` for a running ``query`` (``q.map``)."""
    batch: MapBatch[T, R] = MapBatch(query, fn, list(items))
    if not batch.items:
        return []
    dispatcher = query._engine.dispatcher
    # on the main thread, signals wait until every task has ended and its worker is
    # back; SIGINT cancels the query meanwhile, so tasks stop at a checkpoint
    with Hold(query._interrupted):
        runners = batch.runners = task_runners(query, len(batch.items) - 1)
        extra = query._uses()  # its running map is kept there
        extra.batch = batch
        try:
            if runners:
                dispatcher.submit_tasks(runners, batch)
            while batch.run_one():
                pass
            dispatcher.withdraw_tasks(runners)
            batch.wait()
        finally:
            extra.batch = None
    if batch.error is not None:
        raise batch.error
    return list(batch.results)
