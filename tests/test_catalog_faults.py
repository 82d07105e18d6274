"""The catalog under faults (SPEC §10): a DDL whose write fails, or whose COMMIT
goes unanswered, never wedges an engine. Each fault is provoked for real: a
deferred constraint trigger that fails a COMMIT, a TCP proxy that cuts the
connection before or after the COMMIT reaches PostgreSQL, the server
terminating the writer's backend, ENOSPC and EIO at write and at fsync of a
directory catalog. After each: the writer's next DDL works, both engines
converge to one snapshot (the canonical digest), the log has no gap and no
duplicate, the failed statement is applied nowhere (or, when its commit went
through, exactly once everywhere), and a reopened catalog replays to it."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import types
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from catalog_digest import digest
from tcp_proxy import Proxy
from waiting import bounded, wait_until

import resgroups
from resgroups.catalog import DirectoryLog, postgres, store
from resgroups.catalog.postgres import PostgresLog
from resgroups.catalog.records import replay


def _through(proxy: Proxy, dsn: str) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    where = f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{where}" if len(netloc) == 2 else where))


def _groups(engine: resgroups.Engine) -> list[str]:
    return sorted(g.name for g in engine.snapshot.groups)


def _log_versions(dsn: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM resgroups_catalog_log ORDER BY 1")]


def _converged(dsn: str, *engines: resgroups.Engine) -> str:
    """Every engine at the log's newest version with one snapshot; that digest,
    which a catalog replayed from the log in a fresh reader also has."""
    versions = _log_versions(dsn)
    assert versions == list(range(1, len(versions) + 1)), versions  # no gap, no duplicate
    wait_until(lambda: all(e.catalog_version == len(versions) for e in engines), timeout=10)
    digests = {digest(e.snapshot) for e in engines}
    assert len(digests) == 1, [_groups(e) for e in engines]
    log = PostgresLog(dsn, lock=False)
    try:
        assert digest(replay(log.read_all())) in digests
    finally:
        log.close()
    return digests.pop()


@pytest.fixture
def pair(pg_catalog: str) -> Iterator[tuple[Proxy, resgroups.Engine, resgroups.Engine]]:
    """Engine A reaches the catalog through a proxy, engine B directly."""
    upstream = urlsplit(pg_catalog)
    with Proxy(upstream.hostname or "127.0.0.1", upstream.port or 5432) as proxy:
        a = resgroups.Engine(catalog=_through(proxy, pg_catalog))
        b = resgroups.Engine(catalog=pg_catalog)
        try:
            yield proxy, a, b
        finally:
            a.close()
            b.close()


def _ddl_fails(engine: resgroups.Engine, statement: str) -> resgroups.CatalogWriteError:
    outcome = bounded(lambda: engine.connect().execute(statement), seconds=60)
    assert isinstance(outcome, resgroups.CatalogWriteError), outcome
    assert isinstance(outcome, resgroups.Error)
    return outcome


def _after_the_fault(dsn: str, a: resgroups.Engine, b: resgroups.Engine) -> None:
    """The writer's next DDL works, from both engines, and they converge."""
    a.connect().execute("CREATE RESOURCE GROUP next_from_a")
    b.connect().execute("CREATE RESOURCE GROUP next_from_b")
    _converged(dsn, a, b)
    assert {"next_from_a", "next_from_b"} <= set(_groups(a))


def test_a_commit_that_fails_is_applied_nowhere_and_the_next_ddl_works(
    pg_catalog: str, pair: tuple[Proxy, resgroups.Engine, resgroups.Engine]
) -> None:
    _, a, b = pair
    with psycopg.connect(pg_catalog, autocommit=True) as admin:
        # fails the first COMMIT after it is created (a sequence is not rolled back)
        admin.execute(
            """
            CREATE SEQUENCE fail_once;
            CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('fail_once') = 1 THEN
                    RAISE EXCEPTION 'injected: the commit fails';
                END IF;
                RETURN NULL;
            END $$;
            CREATE CONSTRAINT TRIGGER fail_once AFTER INSERT ON resgroups_catalog_log
                DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_once();
            """
        )
    before = a.catalog_version
    failed = _ddl_fails(a, "CREATE RESOURCE GROUP never")
    assert failed.applied is False
    assert failed.sqlstate == "58030"
    assert "injected: the commit fails" in failed.message
    assert "applied nowhere" in failed.message
    assert a.catalog_version == before
    _after_the_fault(pg_catalog, a, b)
    assert "never" not in _groups(a)


@pytest.mark.parametrize("deliver", [True, False], ids=["answer-lost", "commit-lost"])
def test_a_connection_cut_at_commit_is_resolved_from_the_server(
    pg_catalog: str, pair: tuple[Proxy, resgroups.Engine, resgroups.Engine], deliver: bool
) -> None:
    proxy, a, b = pair
    before = a.catalog_version
    proxy.arm(b"COMMIT", deliver=deliver)
    failed = _ddl_fails(a, "CREATE RESOURCE GROUP cut")
    assert proxy.fired.is_set()
    assert failed.sqlstate == ("08007" if deliver else "58030")
    if deliver:  # PostgreSQL committed and the answer was lost: applied, exactly once
        assert failed.applied is True
        assert "committed" in failed.message
        assert a.catalog_version == before + 1  # applied here before the statement returned
        assert "cut" in _groups(a)
    else:  # the COMMIT never arrived: the server rolled back when the client vanished
        assert failed.applied is False
        assert a.catalog_version == before
    _after_the_fault(pg_catalog, a, b)
    assert _groups(a).count("cut") == (1 if deliver else 0)


def test_a_commit_answered_but_read_back_cut_is_still_applied_before_returning(
    pg_catalog: str, pair: tuple[Proxy, resgroups.Engine, resgroups.Engine]
) -> None:
    proxy, a, b = pair
    before = a.catalog_version
    proxy.arm(b"COMMIT", deliver=True)
    proxy.arm(b"record::text", deliver=False)  # and the first read of the log back
    failed = _ddl_fails(a, "CREATE RESOURCE GROUP twice_cut")
    assert failed.applied is True
    assert a.catalog_version == before + 1  # the read-back was tried again
    assert "twice_cut" in _groups(a)
    _after_the_fault(pg_catalog, a, b)


def test_a_server_that_stops_answering_at_commit_fails_the_ddl_and_frees_the_lock(
    pg_catalog: str,
    pair: tuple[Proxy, resgroups.Engine, resgroups.Engine],
) -> None:
    """The COMMIT vanishes and the connection stays open (a hung proxy): the write
    is cut after the write timeout (2 s here, 30 by default), reported, and the
    other engine's DDL, waiting for the append lock meanwhile, goes through."""
    proxy, a, b = pair
    log = a._log
    assert isinstance(log, postgres.PostgresLog)
    log.write_timeout = 2.0
    proxy.arm(b"COMMIT", deliver=None)
    outcome: list[object] = []
    ddl = threading.Thread(
        target=lambda: outcome.append(
            bounded(lambda: a.connect().execute("CREATE RESOURCE GROUP hung"), 60)
        )
    )
    ddl.start()
    assert proxy.fired.wait(30)
    b.connect().execute("CREATE RESOURCE GROUP from_b_meanwhile")  # waits for the lock
    ddl.join(60)
    failed = outcome[0]
    assert isinstance(failed, resgroups.CatalogWriteError), failed
    assert "no answer from the server in 2 s" in failed.message
    assert failed.applied is False  # the server never had the COMMIT
    _after_the_fault(pg_catalog, a, b)
    assert "hung" not in _groups(a)


def _backend_of(admin: psycopg.Connection[Any], wait_event: str) -> int | None:
    row = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'resgroups primary%%' AND wait_event = %s",
        [wait_event],
    ).fetchone()
    return int(row[0]) if row else None


@pytest.mark.parametrize("where", ["waiting-for-the-lock", "inside-the-commit"])
def test_the_server_terminating_the_writers_backend_mid_transaction(
    pg_catalog: str, pair: tuple[Proxy, resgroups.Engine, resgroups.Engine], where: str
) -> None:
    _, a, b = pair
    before = a.catalog_version
    with psycopg.connect(pg_catalog, autocommit=True) as admin:
        if where == "inside-the-commit":  # the COMMIT's deferred trigger sleeps, once
            admin.execute(
                """
                CREATE SEQUENCE sleep_once;
                CREATE FUNCTION sleep_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('sleep_once') = 1 THEN PERFORM pg_sleep(60); END IF;
                    RETURN NULL;
                END $$;
                CREATE CONSTRAINT TRIGGER sleep_once AFTER INSERT ON resgroups_catalog_log
                    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION sleep_once();
                """
            )
            event = "PgSleep"
        else:  # another writer holds the append lock
            admin.execute("BEGIN")
            admin.execute("SELECT pg_advisory_xact_lock(%s, %s)", [0x7267, 2])
            event = "advisory"
        outcome: list[object] = []
        ddl = threading.Thread(
            target=lambda: outcome.append(
                bounded(lambda: a.connect().execute("CREATE RESOURCE GROUP killed"), 60)
            )
        )
        ddl.start()
        pid: list[int] = []

        def waiting() -> bool:
            found = _backend_of(admin, event)
            pid.extend([found] if found else [])
            return found is not None

        wait_until(waiting, timeout=30)
        with psycopg.connect(pg_catalog, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [pid[0]])
        if where == "waiting-for-the-lock":
            admin.execute("COMMIT")
        ddl.join(60)
    assert not ddl.is_alive()
    failed = outcome[0]
    assert isinstance(failed, resgroups.CatalogWriteError), failed
    assert failed.applied is False
    assert a.catalog_version == before
    _after_the_fault(pg_catalog, a, b)
    assert "killed" not in _groups(a)


def test_a_record_too_deep_to_decode_in_postgresql_is_xx001_and_the_follower_keeps_serving(
    pg_catalog: str,
) -> None:
    with resgroups.Engine(catalog=pg_catalog) as engine:
        engine.connect().execute("CREATE RESOURCE GROUP kept")
        version = engine.catalog_version
        deep = "[" * 5000 + "]" * 5000  # jsonb takes it; a Python decoder cannot
        with psycopg.connect(pg_catalog, autocommit=True) as admin:
            admin.execute(
                "INSERT INTO resgroups_catalog_log (version, record) VALUES "
                '(%s, (\'{"op": "create_group", "params": \' || %s || \'}\')::jsonb)',
                [version + 1, deep],
            )
        follower = engine._follower
        wait_until(lambda: follower.last_error is not None, timeout=10)
        assert "record 3 is not a record this version of resgroups can read" in (
            follower.last_error or ""
        )
        assert "nested" in (follower.last_error or "")
        assert engine.catalog_version == version  # serving what it has
        assert "kept" in _groups(engine)
        with pytest.raises(resgroups.CatalogError) as refused:
            resgroups.Engine(catalog=pg_catalog)
        assert refused.value.sqlstate == "XX001"


# ---- the directory backend -----------------------------------------------------------


def _faulty_os(**calls: Callable[..., Any]) -> types.ModuleType:
    """``os`` as the catalog store sees it, with some calls replaced."""
    fake = types.ModuleType("os")
    fake.__dict__.update(os.__dict__)
    fake.__dict__.update(calls)
    return fake


def _once(error: int, real: Callable[..., Any], *, half: bool = False) -> Callable[..., Any]:
    """``real``, except that its first call fails with ``error`` (after writing half
    of what it was given, with ``half``: a frame cut short by a full disk)."""
    calls = [0]

    def call(fd: int, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            if half:
                data, offset = args
                real(fd, data[: len(data) // 2], offset)
            raise OSError(error, os.strerror(error))
        return real(fd, *args)

    return call


@pytest.mark.parametrize(
    "fault",
    ["enospc-at-write", "eio-at-write", "enospc-at-fsync", "eio-at-fsync"],
)
def test_a_directory_write_that_fails_leaves_file_and_snapshot_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    code = errno.ENOSPC if fault.startswith("enospc") else errno.EIO
    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        session = primary.connect()
        session.execute("CREATE RESOURCE GROUP kept WITH (cpu_weight = 200)")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        image = (tmp_path / "catalog.log").read_bytes()
        before = primary.snapshot
        if fault.endswith("write"):
            patched = _faulty_os(pwrite=_once(code, os.pwrite, half=True))
        else:
            patched = _faulty_os(fsync=_once(code, os.fsync))
        monkeypatch.setattr(store, "os", patched)
        with pytest.raises(resgroups.CatalogWriteError) as failed:
            session.execute("CREATE RESOURCE GROUP lost")
        assert failed.value.applied is False
        assert failed.value.sqlstate == "58030"
        assert os.strerror(code) in failed.value.message
        assert "nothing was written" in failed.value.message
        assert (tmp_path / "catalog.log").read_bytes() == image  # the frame was cut back
        assert primary.snapshot == before
        session.execute("CREATE RESOURCE GROUP next")  # the next DDL works
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        assert digest(replica.snapshot) == digest(primary.snapshot)
        assert "lost" not in _groups(primary)
        expected = digest(primary.snapshot)
    monkeypatch.undo()
    with resgroups.Engine(catalog=tmp_path) as reopened:
        assert digest(reopened.snapshot) == expected


def test_a_directory_write_that_cannot_even_be_cut_back_is_cut_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with resgroups.Engine(catalog=tmp_path) as primary:
        session = primary.connect()
        before = primary.catalog_version
        patched = _faulty_os(
            fsync=_once(errno.EIO, os.fsync), ftruncate=_once(errno.EIO, os.ftruncate)
        )
        monkeypatch.setattr(store, "os", patched)
        with pytest.raises(resgroups.CatalogWriteError) as failed:
            session.execute("CREATE RESOURCE GROUP maybe")
        # what is left in the file has no header yet: no record, to anyone
        assert failed.value.applied is False
        assert failed.value.sqlstate == "58030"
        assert primary.catalog_version == before
        with resgroups.Engine(catalog=tmp_path, role="replica") as replica:
            assert replica.catalog_version == before
        session.execute("CREATE RESOURCE GROUP next")  # cuts what the failure left, then writes
        expected = digest(primary.snapshot)
        assert "maybe" not in _groups(primary)
    monkeypatch.undo()
    log = DirectoryLog(tmp_path, lock=False)
    try:
        records = log.read_all()
    finally:
        log.close()
    assert [r.version for r in records] == list(range(1, before + 2))
    assert digest(replay(records)) == expected


def test_a_replica_polling_during_a_failing_write_never_sees_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frame is in the file while its first fsync runs (and fails): a replica
    reading the file then must not take it for a record, or it would keep a change
    the writer cuts back and diverge for good."""
    in_fsync, polled = threading.Event(), threading.Event()
    calls = [0]

    def slow_failing_fsync(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 1:
            in_fsync.set()
            assert polled.wait(10)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)

    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        replica._follower.stop()  # the test polls for it, at the moment that matters
        before = primary.catalog_version
        monkeypatch.setattr(store, "os", _faulty_os(fsync=slow_failing_fsync))
        outcome: list[object] = []
        ddl = threading.Thread(
            target=lambda: outcome.append(
                bounded(lambda: primary.connect().execute("CREATE RESOURCE GROUP lost"), 30)
            )
        )
        ddl.start()
        assert in_fsync.wait(10)
        assert replica._catalog.catch_up() == 0  # the frame is there, with no header
        polled.set()
        ddl.join(30)
        assert isinstance(outcome[0], resgroups.CatalogWriteError)
        assert outcome[0].applied is False
        primary.connect().execute("CREATE RESOURCE GROUP next_one_with_a_longer_name")
        replica._catalog.catch_up()
        assert replica.catalog_version == primary.catalog_version == before + 1
        assert digest(replica.snapshot) == digest(primary.snapshot)
        assert "lost" not in _groups(replica)


def test_a_last_fsync_that_fails_keeps_the_record_every_reader_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = [0]

    def second_fails(fd: int) -> None:
        calls[0] += 1
        if calls[0] == 2:  # after the header is written
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)

    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        before = primary.catalog_version
        monkeypatch.setattr(store, "os", _faulty_os(fsync=second_fails))
        with pytest.raises(resgroups.CatalogWriteError) as failed:
            primary.connect().execute("CREATE RESOURCE GROUP kept")
        assert failed.value.applied is True
        assert "could not confirm" in failed.value.message
        assert primary.catalog_version == before + 1  # applied here before it returned
        assert "kept" in _groups(primary)
        primary.connect().execute("CREATE RESOURCE GROUP next")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        assert digest(replica.snapshot) == digest(primary.snapshot)
        expected = digest(primary.snapshot)
    monkeypatch.undo()
    with resgroups.Engine(catalog=tmp_path) as reopened:
        assert digest(reopened.snapshot) == expected


def test_a_directory_follower_applies_the_records_before_one_it_cannot_read(
    tmp_path: Path,
) -> None:
    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        replica._follower.stop()
        version = primary.catalog_version
        next_id = primary.snapshot.next_id
        good = {"op": "create_group", "id": next_id, "name": "good", "quoted": False}
        deep = "[" * 100_000 + "]" * 100_000
        size = (tmp_path / "catalog.log").stat().st_size
        frames = b""
        for body in (
            json.dumps({"v": version + 1, **good, "params": {}}).encode(),
            f'{{"v": {version + 2}, "op": "create_group", "params": {deep}}}'.encode(),
        ):
            frames += store.FRAME.pack(len(body), zlib.crc32(body)) + body
        bad_at = size + store.FRAME.size + len(json.dumps({"v": version + 1, **good, "params": {}}))
        with (tmp_path / "catalog.log").open("ab") as f:
            f.write(frames)
        assert replica._catalog.catch_up() == 1  # the good one is applied
        assert "good" in _groups(replica)
        with pytest.raises(resgroups.CatalogError) as refused:
            replica._catalog.catch_up()
        assert refused.value.sqlstate == "XX001"
        assert f"at byte {bad_at}" in refused.value.message  # its place in the file
        assert replica.catalog_lag.records == 1  # and the lag shows it


def test_a_postgresql_follower_applies_the_records_before_one_it_cannot_read(
    pg_catalog: str,
) -> None:
    with resgroups.Engine(catalog=pg_catalog) as engine:
        engine._follower.stop()
        version = engine.catalog_version
        good = {"op": "create_group", "id": engine.snapshot.next_id, "name": "good"}
        with psycopg.connect(pg_catalog, autocommit=True) as admin:
            admin.execute(
                "INSERT INTO resgroups_catalog_log (version, record) VALUES (%s, %s::jsonb), "
                '(%s, (\'{"op": "create_group", "params": \' || %s || \'}\')::jsonb)',
                [
                    version + 1,
                    json.dumps({**good, "quoted": False, "params": {}}),
                    version + 2,
                    "[" * 5000 + "]" * 5000,
                ],
            )
        assert engine._catalog.catch_up() == 1
        assert "good" in _groups(engine)
        with pytest.raises(resgroups.CatalogError) as refused:
            engine._catalog.catch_up()
        assert refused.value.sqlstate == "XX001"
        assert engine.catalog_lag.records == 1


def test_ctrl_c_during_a_ddl_waiting_on_postgresql_interrupts_it(
    pg_catalog: str, pair: tuple[Proxy, resgroups.Engine, resgroups.Engine]
) -> None:
    """A DDL stuck on a server that does not answer stays interruptible: the
    KeyboardInterrupt ends the transaction, and the engine goes on."""
    proxy, a, b = pair
    proxy.arm(b"COMMIT", deliver=None)
    main = threading.get_ident()
    interrupter = threading.Thread(
        target=lambda: proxy.fired.wait(30) and signal.pthread_kill(main, signal.SIGINT)
    )
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        a.connect().execute("CREATE RESOURCE GROUP interrupted")
    interrupter.join(10)
    _after_the_fault(pg_catalog, a, b)
    assert "interrupted" not in _groups(a)
