"""Replicas of a directory catalog (SPEC §10): following in other processes, the
lag rules, promotion, kills. Each remote engine is a real process
(tests/nodes.py); every wait is bounded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from catalog_digest import digest
from nodes import Node, follow_delays
from waiting import wait_until

import resgroups
from resgroups.catalog.records import replay
from resgroups.catalog.store import DirectoryLog


def test_ddl_on_the_primary_reaches_a_replica_in_another_process_within_a_second(
    tmp_path: Path,
) -> None:
    delays = follow_delays(str(tmp_path / "cat"))
    assert delays
    assert max(delays) < 1.0, delays  # SPEC §10: applied within a second


def test_a_replica_refuses_ddl_naming_the_primary(tmp_path: Path) -> None:
    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        primary.connect().execute("CREATE RESOURCE GROUP reporting")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        with pytest.raises(resgroups.ReadOnlyReplica, match=str(tmp_path)) as refused:
            replica.connect().execute("CREATE RESOURCE GROUP nope")
        assert refused.value.sqlstate == "25006"
        assert replica.catalog_version == primary.catalog_version  # nothing written


def test_principals_and_passwords_replicate_so_users_log_in_anywhere(tmp_path: Path) -> None:
    with (
        resgroups.Engine(catalog=tmp_path, access_control=True) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica", access_control=True) as replica,
    ):
        admin = primary.connect()
        admin.execute("CREATE RESOURCE GROUP reporting")
        admin.execute("CREATE USER ann WITH PASSWORD 'secret'")
        admin.execute("ALTER USER ann SET RESOURCE GROUP reporting")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        ann = replica.connect("ann", "secret")
        assert ann.execute("SELECT current_resource_group()").rows == [("reporting",)]
        with pytest.raises(resgroups.AuthenticationFailed):
            replica.connect("ann", "wrong")


def test_before_the_catalog_arrives_queries_run_unmanaged_and_are_counted(
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "cat"
    with Node("replica", str(catalog), "--until", "2") as rep:
        started = rep.wait_for(lambda m: "started" in m)
        assert started["version"] == 0
        assert started["group"] is None  # unmanaged: not DEFAULT, not refused
        assert started["unmanaged"] == 1
        with resgroups.Engine(catalog=catalog) as primary:  # writes the genesis record
            primary.connect().execute("CREATE RESOURCE GROUP first")
            done = rep.wait_for(lambda m: m.get("done", False))
    assert done["group"] == "DEFAULT"  # managed once the catalog is there
    assert done["unmanaged"] == 1


def test_unmanaged_queries_hold_nothing_and_show_in_the_metrics(tmp_path: Path) -> None:
    (tmp_path / "cat").mkdir()
    with resgroups.Engine(catalog=tmp_path / "cat", role="replica", workers=1) as replica:
        session = replica.connect()
        with session.query() as q:
            assert q.group is None
            assert replica.pool("default").free == 1  # no worker granted
        text = replica.metrics_text()
        assert "resgroups_resource_groups_catalog_lag_unmanaged_queries_total 1.0" in text
        assert "resgroups_resource_groups_catalog_version 0.0" in text
        assert replica.catalog_lag == (0, 0.0)


def test_promotion_is_refused_while_behind_and_succeeds_once_caught_up(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=tmp_path, role="replica") as replica:
        with resgroups.Engine(catalog=tmp_path) as primary:
            wait_until(lambda: replica.catalog_version == primary.catalog_version)
            with pytest.raises(resgroups.CatalogLocked):
                replica.promote()  # the primary still holds the writer lock
            replica._follower.stop()  # the replica falls behind
            primary.connect().execute("CREATE RESOURCE GROUP late")
            behind_version = primary.catalog_version
        with pytest.raises(resgroups.CatalogLagError, match="1 catalog record") as refused:
            replica.promote()
        assert refused.value.sqlstate == "55000"
        assert replica.catalog_lag.records == 1
        assert replica.connect().execute("SELECT 1").rows == [(1,)]  # it keeps serving
        replica._follower.start()
        wait_until(lambda: replica.catalog_version == behind_version)
        replica.promote()
        assert replica.role == "primary"
        with resgroups.Engine(catalog=tmp_path, role="replica") as other:
            replica.connect().execute("CREATE RESOURCE GROUP after_promotion")
            wait_until(lambda: other.catalog_version == replica.catalog_version)
            assert other.snapshot.find_group(resgroups.sql.ast.Ident("after_promotion"))
            assert digest(other.snapshot) == digest(replica.snapshot)


def test_promotion_while_behind_is_allowed_when_resource_groups_are_disabled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with resgroups.Engine(catalog=tmp_path, role="replica", enabled=False) as replica:
        with resgroups.Engine(catalog=tmp_path) as primary:
            wait_until(lambda: replica.catalog_version == primary.catalog_version)
            replica._follower.stop()
            primary.connect().execute("CREATE RESOURCE GROUP late")
            final = primary.catalog_version
        replica.promote()  # logged, then it applies what is left under the lock
        assert "promoting although" in caplog.text
        assert replica.catalog_version == final


def test_promoting_onto_a_log_that_never_had_a_catalog_creates_it(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=tmp_path / "new", role="replica") as replica:
        assert not replica.snapshot.has_catalog
        replica.promote()
        assert replica.catalog_version == 1
        replica.connect().execute("CREATE RESOURCE GROUP g")
    with resgroups.Engine(catalog=tmp_path / "new") as reopened:
        assert reopened.snapshot.find_group(resgroups.sql.ast.Ident("g")) is not None


def test_a_replica_killed_while_applying_restarts_with_exactly_the_primarys_snapshot(
    tmp_path: Path,
) -> None:
    catalog = tmp_path / "cat"
    with Node("primary", str(catalog), "--groups", "400") as writer:
        final = writer.wait_for(lambda m: m.get("done", False), timeout=120)
    rng = random.Random(7)
    for _ in range(3):
        with Node("replica", str(catalog), "--until", str(final["version"])) as rep:
            # somewhere in the middle of applying the 401 records
            rep.wait_for(lambda m: m.get("version", 0) >= rng.randrange(1, final["version"]))
            rep.kill()
    with Node("replica", str(catalog), "--until", str(final["version"])) as rep:
        done = rep.wait_for(lambda m: m.get("done", False))
    assert done["digest"] == final["digest"]


def test_a_primary_killed_mid_write_leaves_no_follower_ahead_of_its_log(tmp_path: Path) -> None:
    catalog = tmp_path / "cat"
    for round_ in range(3):
        with (
            resgroups.Engine(catalog=catalog, role="replica") as replica,
            Node("primary", str(catalog), "--forever") as writer,
        ):
            target = 20 * (round_ + 1)
            writer.wait_for(lambda m, target=target: m.get("version", 0) > target)
            writer.kill()  # at some instant of some append
            applied = replica.snapshot
        with resgroups.Engine(catalog=catalog) as reopened:  # cuts a torn tail, if any
            log = DirectoryLog(catalog, lock=False)
            records = log.read_all()
            log.close()
            assert applied.version <= reopened.catalog_version
            # what the follower applied is exactly a prefix of the primary's log
            assert digest(replay(records[: applied.version])) == digest(applied)


def test_the_shell_opens_a_read_only_replica(tmp_path: Path) -> None:
    from test_shell import run_cli

    with resgroups.Engine(catalog=tmp_path) as primary:
        primary.connect().execute("CREATE RESOURCE GROUP visible")
        done = run_cli(
            "shell",
            "--catalog",
            str(tmp_path),
            "--replica",
            "-c",
            "SELECT name FROM resource_groups(); CREATE RESOURCE GROUP nope",
        )
    assert "visible" in done.stdout
    assert "25006" in done.stdout + done.stderr


def test_a_record_being_appended_is_never_half_applied(tmp_path: Path) -> None:
    """A replica reads only whole records: a frame cut short (the writer in the
    middle of its append) waits for the rest; a whole one is applied."""
    from resgroups.catalog.records import Record
    from resgroups.catalog.store import _frame

    with resgroups.Engine(catalog=tmp_path) as primary:
        primary.connect().execute("CREATE RESOURCE GROUP a")
        version = primary.catalog_version
    frame = _frame(
        Record(version + 1, "create_group", {"id": 2, "name": "b", "quoted": False, "params": {}})
    )
    log = tmp_path / "catalog.log"
    with resgroups.Engine(catalog=tmp_path, role="replica") as replica:
        wait_until(lambda: replica.catalog_version == version)
        for cut in (1, 8, len(frame) // 2, len(frame) - 1):
            with log.open("ab") as f:  # the writer's append, so far
                f.write(frame[:cut])
            assert replica._catalog.catch_up() == 0
            assert replica.catalog_version == version
            with log.open("r+b") as f:
                f.truncate(log.stat().st_size - cut)
        with log.open("ab") as f:
            f.write(frame)
        wait_until(lambda: replica.catalog_version == version + 1)
        assert replica.snapshot.find_group(resgroups.sql.ast.Ident("b")) is not None
