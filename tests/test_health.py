"""Health and the reconcile loop: stalled workers, and zombies (queries whose
handle was lost without ``__exit__``) reclaimed with a log line and a counter."""

from __future__ import annotations

import gc
import logging
import signal
import threading
from pathlib import Path

import psycopg
import pytest
from nodes import Node
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

import resgroups
from resgroups.sql.parser import parse_one


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


def test_a_paging_cursor_dropped_unclosed_is_reclaimed_without_the_collector() -> None:
    """A cursor whose handle is lost between pages (the caller dropped it, or a
    signal landed as it was returned) is freed at once: nothing of it sits in a
    reference cycle that only the collector would break, so the next reconcile
    gives back its rows' bytes and its count among the suspended cursors."""
    with resgroups.Engine(workers=2, reconcile_interval=3600) as engine:
        session = engine.connect(user="reader")
        session.execute("CREATE RESOURCE GROUP one; SET RESOURCE GROUP one")

        def one() -> dict[str, object]:
            return next(r for r in engine.resource_groups() if r["name"] == "one")

        gc.collect()
        gc.disable()
        try:
            for select in (
                "SELECT x FROM long_sequence(1000000)",  # streamed: a batch charged
                "SELECT x FROM long_sequence(100000) ORDER BY x DESC",  # every row first
            ):
                cursor = session.open_cursor(parse_one(select))
                assert len(cursor.fetch(10)) == 10
                query_id = cursor.query.id
                assert engine.live_query(query_id) is not None
                del cursor
                assert engine.live_query(query_id) is None  # freed: no cycle held it
                assert engine.reconcile() == 1
                assert one()["memory_used_bytes"] == 0
                assert sum(r.suspended for r in engine.runtimes.all()) == 0
                assert engine.reconcile() == 0
        finally:
            gc.enable()
        session.execute("DROP RESOURCE GROUP one")  # idle: nothing holds it any more


def test_the_reconcile_loop_runs_on_its_own() -> None:
    with resgroups.Engine(workers=1, reconcile_interval=0.1) as engine:
        session = engine.connect(user="lost")
        q = session.query()
        q.__enter__()
        del q
        gc.collect()
        wait_until(lambda: engine.zombies_reclaimed == 1, timeout=30)
        assert engine.connect().execute("SELECT count(*) FROM long_sequence(2)").rows == [(2,)]


FLEET_NODE = Path(__file__).parent / "programs" / "fleet_node.py"


def test_a_stopped_instance_is_unhealthy_loses_its_lease_and_fails_its_query(
    pg_catalog: str,
) -> None:
    """SIGSTOP one fleet member: the other lists it unhealthy and, after the expiry,
    its lease is reclaimed and the slot serves the other; after SIGCONT its next
    heartbeat notices, its query fails with CoordinationUnavailable, and it serves
    again."""
    with Node(pg_catalog, "--worker", program=FLEET_NODE) as node:
        stopped_id = node.wait_for(lambda line: "holding" in line)["holding"]
        with resgroups.Engine(
            coordination=pg_catalog,
            workers=1,
            lease_heartbeat=0.5,
            lease_expiry=2.0,
            sweep_interval=0.5,
        ) as engine:
            admin = engine.connect()
            admin.execute(  # each engine has its own catalog; leases go by group name
                "CREATE RESOURCE GROUP one WITH (max_active_queries = 1, queue_timeout = '60s')"
            )

            def instances() -> dict[str, tuple[int, bool]]:
                rows = admin.execute(
                    "SELECT instance_id, leases_held, healthy FROM resource_group_instances()"
                ).rows
                return {str(r[0]): (int(r[1]), bool(r[2])) for r in rows}

            wait_until(lambda: instances().get(stopped_id) == (1, True), timeout=30)
            wait_until(lambda: instances().get(engine.instance_id, (0, False))[1], timeout=30)
            node.proc.send_signal(signal.SIGSTOP)
            try:
                # unhealthy once its heartbeat lapses, and its lease reclaimed by the sweep
                wait_until(lambda: instances().get(stopped_id) == (0, False), timeout=30)
                admin.execute("SET RESOURCE GROUP one")
                with admin.query():  # the one fleet-wide slot is this engine's now
                    node.proc.send_signal(signal.SIGCONT)
                    failed = node.wait_for(lambda line: "failed" in line)
                    assert failed == {"failed": "CoordinationUnavailable", "sqlstate": "08006"}
            finally:
                node.proc.send_signal(signal.SIGCONT)
            node.wait_for(lambda line: "served" in line)  # it serves again
            wait_until(lambda: instances().get(stopped_id, (0, True))[1], timeout=30)


def test_the_reconcile_deletes_lease_rows_no_live_query_holds(pg_catalog: str) -> None:
    with resgroups.Engine(coordination=pg_catalog, workers=1, reconcile_interval=3600) as engine:
        with psycopg.connect(pg_catalog, autocommit=True) as db:
            db.execute(
                "INSERT INTO resgroups_fleet_leases (query_id, group_key, instance_id)"
                " VALUES ('orphan', 'g', %s)",
                [engine.instance_id],
            )
            assert engine.reconcile() == 1
            rows = db.execute("SELECT count(*) FROM resgroups_fleet_leases").fetchone()
            assert rows == (0,)
        assert engine.zombies_reclaimed == 1
        with pytest.raises(resgroups.FeatureNotSupported):
            resgroups.Engine().connect().execute("SELECT * FROM resource_group_instances()")
