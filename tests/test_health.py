"""Health and the reconcile loop: stalled workers, and zombies (queries whose
handle was lost without ``__exit__``) reclaimed with a log line and a counter."""

from __future__ import annotations

import gc
import logging
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

import resgroups


def metric(engine: resgroups.Engine, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(engine.metrics_text()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name} {labels}")


def test_a_worker_without_a_checkpoint_is_reported_stalled_until_it_checkpoints() -> None:
    with resgroups.Engine(workers=2, stall_threshold=0.3) as engine:
        watcher = engine.connect()
        inside, go_on, checked = threading.Event(), threading.Event(), threading.Event()

        def body() -> None:
            with engine.connect(user="slow").query() as q:
                inside.set()
                go_on.wait(30)  # native work that never checkpoints
                q.checkpoint()
                checked.set()
                go_on.clear()
                go_on.wait(30)

        def stalled() -> list[bool]:
            rows = watcher.execute("SELECT stalled FROM resource_group_queries()").rows
            return [bool(r[0]) for r in rows]

        thread = threading.Thread(target=body)
        thread.start()
        try:
            assert inside.wait(30)
            wait_until(lambda: stalled() == [True], timeout=30)
            assert metric(engine, "resgroups_pool_stalled_workers", pool="default") == 1.0
            go_on.set()
            assert checked.wait(30)
            assert stalled() == [False]  # it reached a checkpoint: healthy again
            assert metric(engine, "resgroups_pool_stalled_workers", pool="default") == 0.0
        finally:
            go_on.set()
            thread.join(30)


def test_a_lost_query_is_reclaimed_by_the_next_reconcile(caplog: pytest.LogCaptureFixture) -> None:
    with resgroups.Engine(workers=2, reconcile_interval=3600) as engine:
        session = engine.connect(user="lost")
        session.execute(
            "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, max_queued_queries = 0);"
            "SET RESOURCE GROUP one"
        )

        def lose_the_handle() -> None:  # a thread that dies without __exit__
            q = session.query()
            q.__enter__()
            q.memory.allocate(1 << 20)
            q.memory.flush()

        thread = threading.Thread(target=lose_the_handle)
        thread.start()
        thread.join(30)
        gc.collect()
        one = next(r for r in engine.resource_groups() if r["name"] == "one")
        assert (one["active_queries"], one["memory_used_bytes"]) == (1, 1 << 20)
        with pytest.raises(resgroups.AdmissionRejected):  # the zombie holds the one slot
            session.execute("SELECT count(*) FROM long_sequence(3)")
        with caplog.at_level(logging.WARNING, logger="resgroups"):
            assert engine.reconcile() == 1
        assert "a zombie" in caplog.text
        one = next(r for r in engine.resource_groups() if r["name"] == "one")
        assert (one["active_queries"], one["memory_used_bytes"]) == (0, 0)
        assert metric(engine, "resgroups_resource_groups_zombies_reclaimed_total") == 1.0
        assert session.execute("SELECT count(*) FROM long_sequence(3)").rows == [(3,)]
        assert engine.reconcile() == 0  # nothing else drifted


def test_the_reconcile_loop_runs_on_its_own() -> None:
    with resgroups.Engine(workers=1, reconcile_interval=0.1) as engine:
        session = engine.connect(user="lost")
        q = session.query()
        q.__enter__()
        del q
        gc.collect()
        wait_until(lambda: engine.zombies_reclaimed == 1, timeout=30)
        assert engine.connect().execute("SELECT count(*) FROM long_sequence(2)").rows == [(2,)]
