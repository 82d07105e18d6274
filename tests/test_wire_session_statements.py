"""What drivers send on their own, answered by the wire connection: SQL-level
PREPARE / EXECUTE / DEALLOCATE (sharing the extended protocol's capped
statements), savepoints, SHOW and SET of the usual settings, UNLISTEN, now();
and parameters typed by their context, with values that do not fit refused
naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors
from servers import ServerProcess, serving

from resgroups.server.pg_state import MAX_PREPARED


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        yield srv


@pytest.fixture
def conn(server: ServerProcess) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as c:
        yield c


def test_prepare_execute_deallocate(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    conn.execute("PREPARE total(bigint) AS SELECT sum(x) FROM long_sequence($1)")
    assert conn.execute("EXECUTE total(4)").fetchall() == [(10,)]
    assert conn.execute("EXECUTE total('5')").fetchall() == [(15,)]  # read as its type
    conn.execute("PREPARE untyped AS SELECT count(*) FROM long_sequence($1)")  # inferred
    assert conn.execute("EXECUTE untyped('7')").fetchall() == [(7,)]
    conn.execute("PREPARE nothing AS SELECT 1 AS one")
    assert conn.execute("EXECUTE nothing").fetchall() == [(1,)]
    with pytest.raises(errors.InvalidTextRepresentation, match=r"parameter \$1"):
        conn.execute("EXECUTE total('many')")
    with pytest.raises(errors.SyntaxError, match="expected 1, got 2"):
        conn.execute("EXECUTE total(1, 2)")
    with pytest.raises(errors.DuplicatePreparedStatement):
        conn.execute("PREPARE total AS SELECT 1")
    with pytest.raises(errors.FeatureNotSupported, match="constants"):
        conn.execute("EXECUTE total(abs(1))")
    conn.execute("DEALLOCATE total")
    with pytest.raises(errors.InvalidSqlStatementName):
        conn.execute("EXECUTE total(1)")
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(errors.InvalidSqlStatementName):
        conn.execute("EXECUTE nothing")


def test_prepare_shares_the_protocols_cap(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    script = "; ".join(f"PREPARE p{n} AS SELECT {n}" for n in range(MAX_PREPARED))
    conn.execute(script)
    with pytest.raises(errors.ProgramLimitExceeded, match="prepared statements"):
        conn.execute("PREPARE one_too_many AS SELECT 1")
    conn.execute("DISCARD ALL")  # every prepared statement goes
    conn.execute("PREPARE again AS SELECT 2")
    assert conn.execute("EXECUTE again").fetchall() == [(2,)]


def test_placeholder_without_a_value(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    with pytest.raises(errors.UndefinedParameter, match=r"there is no parameter \$1"):
        conn.execute("SELECT $1 + 1", prepare=False)  # no values bound: the simple protocol


def test_untyped_text_is_read_as_its_context_wants(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    """psycopg sends a str untyped: the context types it, as PostgreSQL does."""
    assert conn.execute("SELECT count(*) FROM long_sequence(%s)", ["12"]).fetchall() == [(12,)]
    assert conn.execute("SELECT NOT %s AS flipped", ["yes"]).fetchall() == [(False,)]
    with pytest.raises(errors.InvalidTextRepresentation, match=r"parameter \$1: .*bigint"):
        conn.execute("SELECT count(*) FROM long_sequence(%s)", ["twelve"])
    with pytest.raises(errors.NumericValueOutOfRange, match=r"parameter \$2"):
        conn.execute("SELECT x FROM long_sequence(%s) WHERE x > %s", ["3", "99999999999999999999"])


def test_savepoints(server: ServerProcess) -> None:
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn:
        with pytest.raises(errors.NoActiveSqlTransaction, match="transaction blocks"):
            conn.execute("SAVEPOINT outside")
        conn.execute("BEGIN")
        conn.execute("SAVEPOINT a")
        conn.execute("SAVEPOINT b")
        with pytest.raises(errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        with pytest.raises(errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.execute("ROLLBACK TO SAVEPOINT b")  # the block works again
        assert conn.execute("SELECT 2").fetchall() == [(2,)]
        conn.execute("RELEASE a")  # and b with it
        with pytest.raises(errors.InvalidSavepointSpecification):
            conn.execute("ROLLBACK TO b")
        conn.execute("ROLLBACK")
    nested = psycopg.connect(server.dsn(), connect_timeout=10)
    with nested, nested.transaction(), nested.transaction():  # the inner one: a savepoint
        assert nested.execute("SELECT 3").fetchall() == [(3,)]


def test_show_and_set_what_drivers_ask(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    def show(what: str) -> tuple[str, str]:
        cur = conn.execute(f"SHOW {what}")
        assert cur.description is not None
        row = cur.fetchone()
        assert row is not None
        return cur.description[0].name, str(row[0])

    assert show("time zone") == ("TimeZone", "UTC")
    assert show("TRANSACTION ISOLATION LEVEL") == ("transaction_isolation", "read committed")
    assert show("standard_conforming_strings") == ("standard_conforming_strings", "on")
    assert show("server_version_num") == ("server_version_num", "150000")
    conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert show("default_transaction_isolation")[1] == "repeatable read"
    with pytest.raises(errors.InvalidParameterValue, match="allowed: read uncommitted"):
        conn.execute("SET TRANSACTION ISOLATION LEVEL sometimes")
    conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
    conn.execute("COMMIT")
    for spelling in ("'utf-8'", "UTF8", "'Unicode'", '"utf_8"'):
        conn.execute(f"SET client_encoding = {spelling}")
        assert show("client_encoding")[1] == "UTF8"
    with pytest.raises(errors.FeatureNotSupported, match="speaks UTF8"):
        conn.execute("SET client_encoding = 'LATIN1'")
    conn.execute("SET TIME ZONE 'Europe/Paris'")
    assert show("TimeZone")[1] == "Europe/Paris"
    conn.execute("RESET ALL")
    assert show("TimeZone")[1] == "UTC"


def test_unlisten_and_listen(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    assert conn.execute("UNLISTEN *").statusmessage == "UNLISTEN"
    assert conn.execute('UNLISTEN "channel"').statusmessage == "UNLISTEN"
    with pytest.raises(errors.FeatureNotSupported, match="no notifications"):
        conn.execute("LISTEN channel")


def test_now_is_the_statements_start(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    cur = conn.execute("SELECT now() AS a, current_timestamp AS b, now() = now() AS same")
    a, b, same = cur.fetchone() or ()
    assert a == b
    assert same is True
    assert getattr(a, "tzinfo", None) is not None
    assert conn.execute("SELECT pg_advisory_unlock_all()").fetchall() == [("",)]


def test_placeholders_where_only_a_literal_stands(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    """LIMIT $1 / OFFSET $2 are integers, an integer option's value is an integer,
    the other options' values text: untyped text values (node-postgres) fit."""
    rows = conn.execute(
        "SELECT x FROM long_sequence(10) ORDER BY x LIMIT %s OFFSET %s", ["3", "2"]
    ).fetchall()
    assert rows == [(3,), (4,), (5,)]
    conn.execute(
        "CREATE RESOURCE GROUP literal_params WITH (max_active_queries = %s, memory_limit = %s, "
        "queue_timeout = %s, cpu_limit = %s)",
        ["5", "64M", "15s", "50%"],
    )
    assert conn.execute(
        "SELECT max_active_queries, memory_limit_bytes, queue_timeout_millis, cpu_limit_pct "
        "FROM resource_groups() WHERE name = 'literal_params'"
    ).fetchall() == [(5, 64 * 1024**2, 15_000, 50.0)]
    with pytest.raises(errors.InvalidTextRepresentation, match=r"parameter \$1"):
        conn.execute("ALTER RESOURCE GROUP literal_params SET (cpu_weight = %s)", ["heavy"])
