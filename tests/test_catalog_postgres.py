"""The catalog in PostgreSQL (SPEC §10): several primaries, followers by
LISTEN/NOTIFY with polling behind, migrations under an advisory lock, lost
connections, kills. Each test has a database of its own (the pg_catalog
fixture); remote engines are real processes (tests/nodes.py)."""

from __future__ import annotations

import logging

import psycopg
import pytest
from catalog_digest import digest
from nodes import Node, follow_delays
from waiting import wait_until

import resgroups
from resgroups.catalog.postgres import PostgresLog, redact
from resgroups.catalog.records import replay
from resgroups.pgschema import migrate


def _versions(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM resgroups_catalog_log ORDER BY 1")]


def test_ddl_on_a_primary_reaches_a_replica_in_another_process_within_a_second(
    pg_catalog: str,
) -> None:
    delays = follow_delays(pg_catalog)
    assert delays
    assert max(delays) < 1.0, delays


def test_two_primaries_appending_500_records_each_leave_no_gap_and_no_duplicate(
    pg_catalog: str,
) -> None:
    with (
        Node("primary", pg_catalog, "--groups", "500", "--prefix", "a") as first,
        Node("primary", pg_catalog, "--groups", "500", "--prefix", "b") as second,
    ):
        first.wait_for(lambda m: m.get("done", False), timeout=300)
        second.wait_for(lambda m: m.get("done", False), timeout=300)
    versions = _versions(pg_catalog)
    assert versions == list(range(1, 1002))  # the genesis record and 1,000 groups, no gap
    with (
        resgroups.Engine(catalog=pg_catalog, role="replica") as here,
        Node("replica", pg_catalog, "--until", "1001") as there,
    ):
        done = there.wait_for(lambda m: m.get("done", False), timeout=120)
        wait_until(lambda: here.catalog_version == 1001, timeout=30)
        assert done["digest"] == digest(here.snapshot)
        names = {g.name for g in here.snapshot.groups}
        assert {f"a{i}" for i in range(500)} | {f"b{i}" for i in range(500)} <= names


def test_a_follower_whose_connections_are_terminated_catches_up_without_a_restart(
    pg_catalog: str,
) -> None:
    with (
        resgroups.Engine(catalog=pg_catalog) as primary,
        resgroups.Engine(catalog=pg_catalog, role="replica") as replica,
    ):
        session = primary.connect()
        session.execute("CREATE RESOURCE GROUP before")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        with psycopg.connect(pg_catalog, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'resgroups replica%'"
            ).fetchone()
        assert killed is not None
        assert killed[0] >= 1
        for i in range(5):
            session.execute(f"CREATE RESOURCE GROUP after{i}")
        wait_until(lambda: replica.catalog_version == primary.catalog_version, timeout=30)
        assert digest(replica.snapshot) == digest(primary.snapshot)


def test_a_primary_killed_mid_write_leaves_no_follower_ahead_of_the_log(pg_catalog: str) -> None:
    with resgroups.Engine(catalog=pg_catalog, role="replica") as replica:
        for round_ in range(3):
            with Node("primary", pg_catalog, "--forever") as writer:
                target = 20 * (round_ + 1)
                writer.wait_for(lambda m, target=target: m.get("version", 0) > target)
                writer.kill()
            wait_until(lambda: replica.catalog_version == len(_versions(pg_catalog)), timeout=30)
            applied = replica.snapshot
            log = PostgresLog(pg_catalog, lock=False)
            records = log.read_all()
            log.close()
            assert applied.version == len(records)
            assert digest(replay(records)) == digest(applied)


def test_a_promoted_replica_writes_and_the_others_follow(pg_catalog: str) -> None:
    with resgroups.Engine(catalog=pg_catalog) as primary:
        primary.connect().execute("CREATE RESOURCE GROUP from_primary")
    with (
        resgroups.Engine(catalog=pg_catalog, role="replica") as promoted,
        resgroups.Engine(catalog=pg_catalog, role="replica") as other,
    ):
        wait_until(lambda: promoted.catalog_version == 2)
        promoted._follower.stop()
        with resgroups.Engine(catalog=pg_catalog) as late:
            late.connect().execute("CREATE RESOURCE GROUP while_behind")
        with pytest.raises(resgroups.CatalogLagError):
            promoted.promote()
        promoted._follower.start()
        wait_until(lambda: promoted.catalog_version == 3)
        promoted.promote()
        promoted.connect().execute("CREATE RESOURCE GROUP from_promoted")
        wait_until(lambda: other.catalog_version == promoted.catalog_version)
        assert digest(other.snapshot) == digest(promoted.snapshot)


def test_a_replica_on_an_empty_database_runs_unmanaged_until_the_genesis_record(
    pg_catalog: str,
) -> None:
    with resgroups.Engine(catalog=pg_catalog, role="replica") as replica:
        session = replica.connect()
        assert session.execute("SELECT current_resource_group()").rows == [(None,)]
        assert replica.catalog_lag_unmanaged_queries == 1
        with resgroups.Engine(catalog=pg_catalog):
            wait_until(lambda: replica.catalog_version >= 1)
        assert session.execute("SELECT current_resource_group()").rows == [("DEFAULT",)]


def test_migrations_are_applied_once_in_order(pg_catalog: str) -> None:
    with psycopg.connect(pg_catalog, autocommit=True) as conn:
        first = migrate(conn)
        again = migrate(conn)
        names = [n for (n,) in conn.execute("SELECT name FROM resgroups_schema_migrations")]
    assert first == [
        "0001_catalog_log.sql",
        "0002_fleet_leases.sql",
        "0003_fleet_instances.sql",
        "0004_fleet_quotas.sql",
        "0005_fleet_identity.sql",
        "0006_fleet_tree.sql",
    ]
    assert again == []
    assert names == first


def test_connection_strings_never_show_their_password(
    pg_catalog: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = pg_catalog.replace("postgresql://postgres@", "postgresql://postgres:hunter2@")
    assert redact(secret).count("hunter2") == 0
    assert redact("host=h password=hunter2 dbname=x") == "host=h password=*** dbname=x"
    assert "hunter2" not in redact("postgresql://h/x?password=hunter2&sslmode=off")
    caplog.set_level(logging.INFO, logger="resgroups")
    with (
        resgroups.Engine(catalog=secret) as primary,
        resgroups.Engine(catalog=secret, role="replica") as replica,
    ):
        with pytest.raises(resgroups.ReadOnlyReplica) as refused:
            replica.connect().execute("CREATE RESOURCE GROUP x")
        assert "hunter2" not in str(refused.value)
        assert "***" in str(refused.value)
        with psycopg.connect(pg_catalog, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'resgroups%'"
            )
        # the primary reopens its connection for the DDL; the replica's follower
        # logs the lost connection (masked), reconnects and catches up
        primary.connect().execute("CREATE RESOURCE GROUP after")
        wait_until(lambda: replica.catalog_version == primary.catalog_version, timeout=30)
    assert "lost the notification connection" in caplog.text
    assert "postgres:***@" in caplog.text
    assert "hunter2" not in caplog.text


def test_a_replica_process_killed_while_applying_restarts_with_the_primarys_snapshot(
    pg_catalog: str,
) -> None:
    with Node("primary", pg_catalog, "--groups", "300") as writer:
        final = writer.wait_for(lambda m: m.get("done", False), timeout=120)
    for stop_at in (37, 150, 290):
        with Node("replica", pg_catalog, "--until", str(final["version"])) as rep:
            rep.wait_for(lambda m, stop_at=stop_at: m.get("version", 0) >= stop_at)
            rep.kill()
    with Node("replica", pg_catalog, "--until", str(final["version"])) as rep:
        done = rep.wait_for(lambda m: m.get("done", False))
    assert done["digest"] == final["digest"]


def test_a_replica_process_started_before_any_primary_runs_unmanaged_then_managed(
    pg_catalog: str,
) -> None:
    with Node("replica", pg_catalog, "--until", "2") as rep:
        started = rep.wait_for(lambda m: "started" in m)
        assert started["group"] is None
        assert started["unmanaged"] == 1
        with resgroups.Engine(catalog=pg_catalog) as primary:
            primary.connect().execute("CREATE RESOURCE GROUP first")
            done = rep.wait_for(lambda m: m.get("done", False))
    assert done["group"] == "DEFAULT"
