"""Defects found by trying resgroups as a new user would; each test failed before its fix."""

from __future__ import annotations

import threading

import pytest

import resgroups
from resgroups.sched.groups import GroupRuntimes


def test_racing_alters_leave_the_live_gate_at_the_latest_catalog_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A's ALTER is held inside the step that brings the live gate up to date,
    # long enough for B's ALTER to finish if nothing orders the two.
    original = GroupRuntimes.apply
    a_applying, b_done = threading.Event(), threading.Event()

    def apply_slowly_in_a(self: GroupRuntimes, snapshot: resgroups.catalog.Snapshot) -> None:
        if threading.current_thread().name == "alter-a":
            a_applying.set()
            b_done.wait(1.0)  # bounded: with the fix B waits for A instead
        original(self, snapshot)

    monkeypatch.setattr(GroupRuntimes, "apply", apply_slowly_in_a)
    with resgroups.Engine() as engine:
        engine.connect().execute("CREATE RESOURCE GROUP g")
        errors: list[BaseException] = []

        def alter(limit: int, before: threading.Event | None, after: threading.Event) -> None:
            try:
                if before is not None:
                    assert before.wait(5.0)
                engine.connect().execute(
                    f"ALTER RESOURCE GROUP g SET (max_active_queries = {limit})"
                )
            except BaseException as exc:
                errors.append(exc)
            finally:
                after.set()

        a = threading.Thread(target=alter, args=(1, None, threading.Event()), name="alter-a")
        b = threading.Thread(target=alter, args=(2, a_applying, b_done), name="alter-b")
        a.start()
        b.start()
        a.join(10)
        b.join(10)
        assert not a.is_alive() and not b.is_alive()
        assert not errors
        catalog_value = engine.snapshot.find_group(resgroups.catalog.names.Ident("g"))
        assert catalog_value is not None
        live = engine.runtimes.get(catalog_value.id)
        assert live is not None
        assert live.gate.gate.config.max_active == catalog_value.max_active_queries
        row = next(r for r in engine.resource_groups() if r["name"] == "g")
        assert row["max_active_queries"] == catalog_value.max_active_queries


class _FailingMeter:
    """A CPU clock that raises once told to."""

    def __init__(self) -> None:
        self.fail = False
        self.now = 0

    def __call__(self) -> int:
        if self.fail:
            raise RuntimeError("CPU meter fault")
        self.now += 1_000
        return self.now


def test_a_meter_fault_at_exit_still_gives_the_worker_and_the_slot_back() -> None:
    meter = _FailingMeter()
    with resgroups.Engine(workers=1, cpu_meter=meter, query_timeout=5.0) as engine:
        session = engine.connect()
        session.execute(
            "CREATE RESOURCE GROUP g WITH (max_active_queries = 1); SET RESOURCE GROUP g"
        )
        assert engine.cpu_managed_dispatch  # two groups: scheduling engaged
        with pytest.raises(RuntimeError, match="CPU meter fault"), session.query() as q:
            q.checkpoint()
            meter.fail = True  # the charge at exit fails
        meter.fail = False
        # the only worker and the only slot are free again: this query gets both
        with session.query() as again:
            assert again.group == "g"
        row = next(r for r in engine.resource_groups() if r["name"] == "g")
        assert row["active_queries"] == 0


def test_a_meter_fault_in_a_parallel_task_fails_the_query_not_the_pool() -> None:
    meter = _FailingMeter()
    with resgroups.Engine(workers=2, cpu_meter=meter, query_timeout=5.0) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g; SET RESOURCE GROUP g")
        started = threading.Barrier(2, timeout=5.0)

        def task(t: resgroups.query.Task, i: int) -> int:
            if i < 2:
                started.wait()
                meter.fail = True  # both tasks end with the meter failing
            return i

        outcome: list[BaseException] = []

        def run() -> None:
            try:
                with session.query() as q:
                    q.map(task, range(2))
            except BaseException as exc:
                outcome.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        runner.join(10)
        assert not runner.is_alive(), "map() never returned after its tasks' meter failed"
        assert len(outcome) == 1 and "CPU meter fault" in str(outcome[0])
        meter.fail = False
        with session.query() as q:  # both workers are back
            assert q.map(lambda t, i: i, range(4)) == [0, 1, 2, 3]


def _admin_engine() -> resgroups.Engine:
    return resgroups.Engine(access_control=True)


def test_unmanaged_queries_resolve_nothing_so_a_dropped_choice_cannot_fail_them() -> None:
    with _admin_engine() as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE USER ann; CREATE RESOURCE GROUP g; GRANT USE ON RESOURCE GROUP g TO ann"
        )
        ann = engine.connect("ann")
        ann.execute("SET RESOURCE GROUP g")
        admin.execute("DROP RESOURCE GROUP g")
        with ann.query(kind="other") as q:
            assert q.group is None
        with pytest.raises(resgroups.CatalogError, match="no longer exists"), ann.query():
            pass  # a managed query still fails (SPEC §5)


def test_unmanaged_queries_resolve_nothing_so_a_revoked_use_cannot_fail_them() -> None:
    with _admin_engine() as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE USER ann; CREATE RESOURCE GROUP g; GRANT USE ON RESOURCE GROUP g TO ann"
        )
        ann = engine.connect("ann")
        ann.execute("SET RESOURCE GROUP g")
        admin.execute("REVOKE USE ON RESOURCE GROUP g FROM ann")
        with ann.query(kind="other") as q:
            assert q.group is None
        with pytest.raises(resgroups.PermissionDenied, match="USE ON RESOURCE GROUP g"):
            ann.query().__enter__()


def test_errors_about_a_session_choice_name_the_group_as_it_is_now() -> None:
    with _admin_engine() as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE USER ann; CREATE RESOURCE GROUP g; GRANT USE ON RESOURCE GROUP g TO ann"
        )
        ann = engine.connect("ann")
        ann.execute("SET RESOURCE GROUP g")
        admin.execute("ALTER RESOURCE GROUP g RENAME TO h")
        assert ann.execute("SELECT current_resource_group()").rows == [("h",)]
        admin.execute("REVOKE USE ON RESOURCE GROUP h FROM ann")
        with pytest.raises(resgroups.PermissionDenied) as denied:
            ann.execute("SELECT current_resource_group()")
        assert "RESOURCE GROUP h" in denied.value.message
        assert " g " not in denied.value.message and "[USE ON RESOURCE GROUP g]" not in str(
            denied.value
        )
        admin.execute("GRANT USE ON RESOURCE GROUP h TO ann")
        admin.execute("ALTER RESOURCE GROUP h RENAME TO k")
        admin.execute("DROP RESOURCE GROUP k")
        with pytest.raises(resgroups.CatalogError) as gone:
            ann.execute("SELECT current_resource_group()")
        assert "resource group k chosen by SET RESOURCE GROUP no longer exists" in str(gone.value)
