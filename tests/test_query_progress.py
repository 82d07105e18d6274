"""``resource_group_queries()``: why is my query waiting?

For each value of ``blocked_by`` a test makes that situation happen, sees the
reason, clears the cause and sees the query move to running."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from waiting import wait_until

import resgroups

Row = dict[str, Any]


def queries(session: resgroups.Session) -> list[Row]:
    result = session.execute("SELECT * FROM resource_group_queries()")
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def row_of(session: resgroups.Session, query_id: int) -> Row | None:
    return next((r for r in queries(session) if r["query_id"] == query_id), None)


class Body:
    """A managed query on a thread of its own: ``entered`` once admitted with a
    worker, then it spins real CPU between checkpoints until ``finish`` is set."""

    def __init__(self, engine: resgroups.Engine, user: str, group: str | None = None) -> None:
        self.session = engine.connect(user=user)
        if group is not None:
            self.session.execute(f"SET RESOURCE GROUP {group}")
        self.query = self.session.query(kind="select")
        self.entered = threading.Event()
        self.finish = threading.Event()
        self.checkpoints = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        data = np.arange(200_000, dtype=np.float64)
        try:
            with self.query as q:
                self.entered.set()
                while not self.finish.is_set():
                    q.checkpoint()
                    float(np.sqrt(data).sum())  # real work, GIL released
                    self.checkpoints += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def end(self) -> None:
        self.finish.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


@contextmanager
def bodies(*running: Body) -> Iterator[None]:
    try:
        yield
    finally:
        for body in running:
            body.query.cancel()
            body.end()


def state_is(
    session: resgroups.Session, body: Body, state: str, blocked: str | None
) -> Callable[[], bool]:
    def check() -> bool:
        row = row_of(session, body.query.id)
        return row is not None and (row["state"], row["blocked_by"]) == (state, blocked)

    return check


def test_queued_behind_the_group_limit_then_running() -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP one WITH (max_active_queries = 1)")
        first = Body(engine, "first", "one")
        assert first.entered.wait(30)
        second = Body(engine, "second", "one")
        wait_until(state_is(admin, second, "queued", "group_queue"), timeout=30)
        third = Body(engine, "third", "one")  # queued after second: arrival order
        with bodies(first, second, third):
            wait_until(state_is(admin, third, "queued", "group_queue"), timeout=30)
            row = row_of(admin, second.query.id)
            assert row is not None
            assert (row["state"], row["blocked_by"], row["queue_position"]) == (
                "queued", "group_queue", 1,
            )  # fmt: skip
            assert row_of(admin, third.query.id)["queue_position"] == 2  # type: ignore[index]
            assert row["timeout_in_millis"] is not None
            assert 0 < row["timeout_in_millis"] <= 30_000  # the queue timeout is nearer
            assert row["workers_held"] == 0
            running = row_of(admin, first.query.id)
            assert running is not None
            assert (running["state"], running["blocked_by"], running["workers_held"]) == (
                "running", None, 1,
            )  # fmt: skip
            assert running["user_name"] == "first"
            assert running["resource_group"] == "one"
            assert running["started_at"] is not None
            first.end()  # the cause clears: the next in line runs
            assert second.entered.wait(30)
            wait_until(state_is(admin, second, "running", None), timeout=30)
            assert row_of(admin, third.query.id)["queue_position"] == 1  # type: ignore[index]


def test_parked_waiting_for_a_worker_then_running() -> None:
    with resgroups.Engine(workers=1) as engine:
        admin = engine.connect()
        first = Body(engine, "first")
        assert first.entered.wait(30)
        second = Body(engine, "second")
        with bodies(first, second):
            wait_until(state_is(admin, second, "parked", "worker"), timeout=30)
            first.end()
            assert second.entered.wait(30)
            wait_until(state_is(admin, second, "running", None), timeout=30)


def test_parked_at_the_cpu_limit_then_running() -> None:
    with resgroups.Engine(workers=2) as engine:
        admin = engine.connect()
        one_core = 100 / engine.cpus
        admin.execute(f"CREATE RESOURCE GROUP capped WITH (cpu_limit = '{one_core:.2f}%')")
        first = Body(engine, "first", "capped")
        assert first.entered.wait(30)
        second = Body(engine, "second", "capped")
        with bodies(first, second):
            wait_until(state_is(admin, second, "parked", "cpu_limit"), timeout=30)
            admin.execute("ALTER RESOURCE GROUP capped RESET (cpu_limit)")  # the cause clears
            assert second.entered.wait(30)
            wait_until(state_is(admin, second, "running", None), timeout=30)


def test_parked_for_cpu_budget_then_running() -> None:
    with resgroups.Engine(workers=2, slice_ms=5) as engine:
        admin = engine.connect()
        tenth = 10 / engine.cpus  # 0.1 core: the budget runs out and refills slowly
        admin.execute(f"CREATE RESOURCE GROUP slow WITH (cpu_limit = '{tenth:.2f}%')")
        body = Body(engine, "spender", "slow")
        with bodies(body):
            assert body.entered.wait(30)
            wait_until(state_is(admin, body, "parked", "cpu_budget"), timeout=60)
            admin.execute("ALTER RESOURCE GROUP slow RESET (cpu_limit)")
            before = body.checkpoints
            wait_until(lambda: body.checkpoints > before + 20, timeout=30)  # it runs freely
            wait_until(state_is(admin, body, "running", None), timeout=30)


def test_suspended_cursor_and_who_sees_which_rows() -> None:
    with resgroups.Engine(workers=2, access_control=True) as engine:
        admin = engine.connect()
        admin.execute("CREATE USER ann; CREATE USER bob")
        ann, bob = engine.connect(user="ann"), engine.connect(user="bob")
        with ann.query() as cursor:
            cursor.suspend()
            rows = queries(ann)
            assert [(r["query_id"], r["state"], r["blocked_by"]) for r in rows] == [
                (cursor.id, "suspended", None)
            ]
            assert queries(bob) == []  # not an admin: only their own
            assert [r["user_name"] for r in queries(admin)] == ["ann"]
            cursor.resume()
            assert [r["state"] for r in queries(ann)] == ["running"]
        assert queries(admin) == []


def test_queued_for_a_fleet_lease_then_running(pg_catalog: str) -> None:
    opts = {"catalog": pg_catalog, "coordination": pg_catalog, "workers": 2}
    with resgroups.Engine(**opts) as one, resgroups.Engine(**opts) as two:  # type: ignore[arg-type]
        one.connect().execute("CREATE RESOURCE GROUP fleet WITH (max_active_queries = 1)")
        wait_until(lambda: "fleet" in two.snapshot.group_names(), timeout=30)
        holder = Body(one, "holder", "fleet")
        assert holder.entered.wait(30)
        waiter = Body(two, "waiter", "fleet")
        watcher = two.connect()
        with bodies(holder, waiter):
            wait_until(state_is(watcher, waiter, "queued", "fleet_lease"), timeout=30)
            holder.end()
            assert waiter.entered.wait(60)
            wait_until(state_is(watcher, waiter, "running", None), timeout=30)
