"""The fleet schema in PostgreSQL (SPEC §11), exercised through SQL alone: the
counter kept exact by statement-level triggers whoever writes, the one-call
acquire that never admits past the limit, the recount that repairs drift."""

from __future__ import annotations

import threading

import psycopg

from resgroups.pgschema import migrate, migrations


def _conn(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(dsn, autocommit=True)
    migrate(conn)
    return conn


def _counter(conn: psycopg.Connection[tuple[object, ...]], group: str) -> int:
    row = conn.execute(
        "SELECT leased FROM resgroups_fleet_counters WHERE group_key = %s", [group]
    ).fetchone()
    return int(row[0]) if row else 0  # type: ignore[call-overload]


def _acquire(
    conn: psycopg.Connection[tuple[object, ...]], group: str, query: str, limit: int
) -> bool:
    row = conn.execute(
        "SELECT resgroups_fleet_try_acquire(%s, %s, %s, %s, %s, '', 0, 300, 0)",
        [group, group, "i1", query, limit],
    ).fetchone()
    assert row is not None
    return bool(row[0])


def test_the_acquire_admits_up_to_the_limit_and_is_idempotent(pg_catalog: str) -> None:
    with _conn(pg_catalog) as conn:
        assert [_acquire(conn, "g", f"q{i}", 2) for i in range(3)] == [True, True, False]
        assert _acquire(conn, "g", "q0", 2)  # a retried acquire of a held lease
        assert _counter(conn, "g") == 2
        conn.execute(
            "DELETE FROM resgroups_fleet_leases WHERE query_id = ANY(%s)", [["q0", "nope"]]
        )
        assert _counter(conn, "g") == 1
        assert _acquire(conn, "g", "q2", 2)
        assert _acquire(conn, "other", "x", 1)  # groups are counted apart


def test_every_writer_keeps_the_counter_exact(pg_catalog: str) -> None:
    with _conn(pg_catalog) as conn:
        conn.execute(
            "INSERT INTO resgroups_fleet_leases (query_id, group_key, instance_id) "
            "SELECT 'm' || i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, 'manual' "
            "FROM generate_series(1, 10) AS i"
        )
        assert (_counter(conn, "a"), _counter(conn, "b")) == (5, 5)
        conn.execute("DELETE FROM resgroups_fleet_leases WHERE query_id IN ('m1', 'm2', 'm3')")
        assert (_counter(conn, "a"), _counter(conn, "b")) == (4, 3)
        conn.execute("DELETE FROM resgroups_fleet_leases WHERE instance_id = 'manual'")
        assert (_counter(conn, "a"), _counter(conn, "b")) == (0, 0)


def test_concurrent_acquires_never_pass_the_limit(pg_catalog: str) -> None:
    granted: list[str] = []
    lock = threading.Lock()

    def admitter(k: int) -> None:
        with _conn(pg_catalog) as conn:
            for i in range(25):
                if _acquire(conn, "hot", f"t{k}-{i}", 5):
                    with lock:
                        granted.append(f"t{k}-{i}")

    threads = [threading.Thread(target=admitter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(granted) == 5
    with _conn(pg_catalog) as conn:
        assert _counter(conn, "hot") == 5


def test_drift_from_rows_removed_without_triggers_is_repaired_by_a_recount(
    pg_catalog: str,
) -> None:
    with _conn(pg_catalog) as conn:
        for i in range(4):
            assert _acquire(conn, "g", f"q{i}", 10)
        with conn.transaction():
            conn.execute("ALTER TABLE resgroups_fleet_leases DISABLE TRIGGER USER")
            conn.execute("DELETE FROM resgroups_fleet_leases WHERE query_id IN ('q0', 'q1')")
            conn.execute("ALTER TABLE resgroups_fleet_leases ENABLE TRIGGER USER")
        assert _counter(conn, "g") == 4  # drifted
        row = conn.execute("SELECT resgroups_fleet_recount('g')").fetchone()
        assert row is not None
        assert row[0] == 2
        assert _counter(conn, "g") == 2


def test_the_identity_migration_keeps_the_rows_it_finds(pg_catalog: str) -> None:
    """0005 keys the fleet's rows by group identity: rows written before it keep
    their name as their key and their label, counted as before, released by id."""
    with psycopg.connect(pg_catalog, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE resgroups_schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for name, sql in migrations()[:4]:
            conn.execute(sql.encode("utf-8"))
            conn.execute("INSERT INTO resgroups_schema_migrations (name) VALUES (%s)", [name])
        conn.execute(
            "INSERT INTO resgroups_fleet_leases (query_id, group_name, instance_id)"
            " VALUES ('old1', 'capped', 'i0'), ('old2', 'capped', 'i0')"
        )
        conn.execute(
            "INSERT INTO resgroups_fleet_quotas (group_name, instance_id, quota, wanted)"
            " VALUES ('capped', 'i0', 2, 2)"
        )
        assert migrate(conn) == ["0005_fleet_identity.sql", "0006_fleet_tree.sql"]
        assert _counter(conn, "capped") == 2
        rows = conn.execute(
            "SELECT query_id, group_key, group_name FROM resgroups_fleet_leases ORDER BY 1"
        ).fetchall()
        assert rows == [("old1", "capped", "capped"), ("old2", "capped", "capped")]
        quota = conn.execute("SELECT group_key, group_name, quota FROM resgroups_fleet_quotas")
        assert quota.fetchall() == [("capped", "capped", 2)]
        conn.execute("DELETE FROM resgroups_fleet_leases WHERE query_id = 'old1'")
        assert _counter(conn, "capped") == 1
        assert _acquire(conn, "1@2:capped", "new", 1)  # the identity's own count
        assert _counter(conn, "capped") == 1


def test_nobody_admits_on_a_new_limit_while_a_live_instance_is_behind(pg_catalog: str) -> None:
    """The barrier of a limit that appeared (resgroups_fleet_behind): an acquire
    waits while an instance of the same log, heartbeat live, has not adopted
    through the version; instances of other logs and lapsed ones do not count."""

    def acquire(conn: psycopg.Connection[tuple[object, ...]], query: str) -> bool:
        row = conn.execute(
            "SELECT resgroups_fleet_try_acquire('k', 'g', 'i1', %s, 5, 'log', 7, 60, 7)", [query]
        ).fetchone()
        assert row is not None
        return bool(row[0])

    with _conn(pg_catalog) as conn:
        conn.execute(
            "INSERT INTO resgroups_fleet_instances"
            " (instance_id, host, pid, catalog_uid, catalog_version) VALUES"
            " ('i2', 'h', 1, 'log', 6), ('other', 'h', 2, 'another log', 1)"
        )
        conn.execute(
            "INSERT INTO resgroups_fleet_instances"
            " (instance_id, host, pid, catalog_uid, catalog_version, heartbeat_at)"
            " VALUES ('gone', 'h', 3, 'log', 1, now() - interval '2 minutes')"
        )
        assert not acquire(conn, "q1")  # i2 is behind version 7
        conn.execute(
            "UPDATE resgroups_fleet_instances SET catalog_version = 7 WHERE instance_id = 'i2'"
        )
        assert acquire(conn, "q1")
