"""timestamptz in the session's TimeZone and set_config() with its statement, as
PostgreSQL: a timestamptz's text without an offset is read in the session's
zone (a literal, a cast, a parameter alike) and every timestamptz is printed
in it (a column's text, ``::text``), up to the ends of the range (a local
time past year 9999 or before year 1, an offset with seconds) without an
internal error; a value outside the range is 22008. ``set_config()`` holds
only if its statement succeeds (ParameterStatus then, never ahead of an
error), and it holds, reported and routed by, when it runs in a portal
executed a page at a time.

The statements both servers answer run against the PostgreSQL on this
machine too (read-only, in RESGROUPS_TEST_PG_DSN's database) through
psycopg 3, with timestamptz read as the text each server sent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from pgraw import SYNC, RawClient, bind, execute, parse, query
from psycopg.types.string import TextLoader
from servers import ServerProcess, serving

PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

# (statement with %s / %b placeholders, values), run in each zone below
IN_ZONE: list[tuple[str, list[Any]]] = [
    ("SELECT '2020-01-01 12:00'::timestamptz AS t", []),  # no offset: the session's zone
    ("SELECT '2020-01-01 12:00'::timestamptz::text AS t", []),
    ("SELECT CAST('2020-07-01 12:00' AS timestamptz) AS t", []),  # summer time
    ("SELECT %s::timestamptz AS t", ["2020-01-01 12:00"]),  # a parameter's text alike
    ("SELECT %s::timestamptz::text AS t", ["2020-01-01 12:00"]),
    ("SELECT %s::timestamptz::text AS t", ["2020-01-01 12:00+05:30"]),
    ("SELECT %s::timestamptz AS t", [datetime(2020, 1, 1, 12)]),  # a timestamp: in the zone
    ("SELECT %s::timestamptz AS t", [datetime(2020, 1, 1, 12, tzinfo=UTC)]),
    ("SELECT %s::timestamptz::text AS t", ["2020-01-01 12:00:00.1234567+00"]),  # rounded
    ("SELECT '2020-01-01 12:00:00.1+00'::timestamptz AS t", []),  # .1, not .100000
    ("SELECT 'at ' || '2020-01-01 12:00+00'::timestamptz AS t", []),  # text in the zone
    # the ends of the range: a local time past 9999 or before year 1, local mean time
    ("SELECT CAST('9999-12-31 23:00:00+00' AS timestamptz) AS t", []),
    ("SELECT CAST('9999-12-31 23:00:00+00' AS timestamptz)::text AS t", []),
    ("SELECT CAST('0001-01-01 00:30:00+00' AS timestamptz) AS t", []),
    ("SELECT %s::timestamptz AS t", ["9999-12-31 23:00:00+00"]),
    ("SELECT %s::timestamptz AS t", ["0001-01-01 00:30:00+00"]),
    ("SELECT %b::timestamptz AS t", [datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)]),
    ("SELECT %b::timestamptz AS t", [datetime(1, 1, 1, tzinfo=UTC)]),
    ("SELECT %s::timestamptz AS t", ["2020-02-30"]),  # 22008 from both
    ("SELECT %s::timestamptz AS t", ["not a time"]),  # 22007 from both
]
ZONES = ["America/New_York", "Asia/Tokyo", "Asia/Kolkata"]


def _answers(dsn: str, zone: str) -> list[Any]:
    answers: list[Any] = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.adapters.register_loader("timestamptz", TextLoader)  # the text as sent
        conn.execute(f"SET TimeZone = '{zone}'")
        for text, values in IN_ZONE:
            try:
                cur = conn.execute(text, values)  # type: ignore[arg-type]
                answers.append(cur.fetchall())
            except psycopg.Error as exc:
                answers.append(exc.sqlstate)
    return answers


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        yield srv


@pytest.mark.parametrize("zone", ZONES)
def test_timestamptz_is_read_and_printed_in_the_session_zone_as_postgres(
    server: ServerProcess, zone: str
) -> None:
    ours = _answers(server.dsn(), zone)
    theirs = _answers(PG_DSN, zone)
    for (text, values), mine, pg in zip(IN_ZONE, ours, theirs, strict=True):
        assert mine == pg, (zone, text, values)
    assert "XX000" not in ours


def test_a_timestamptz_outside_the_range_is_22008(server: ServerProcess) -> None:
    """What the server cannot hold (its years are 1 to 9999 in UTC) is 22008, never an
    internal error, and the connection goes on."""
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET TimeZone = 'Asia/Tokyo'")
        for value in ["9999-12-31 23:59:59.999999-14:00", "0001-01-01 00:00"]:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute("SELECT %s::timestamptz", [value])
            assert caught.value.sqlstate == "22008", value
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_timestamptz_the_executor_cannot_compute_is_named_by_its_type(
    server: ServerProcess,
) -> None:
    with (
        psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn,
        pytest.raises(psycopg.Error) as caught,
    ):
        conn.execute(
            "SELECT count(*) FROM long_sequence(10) WHERE %s < now()",
            [datetime(2020, 1, 1, tzinfo=UTC)],
        )
    assert caught.value.sqlstate == "42804"
    message = str(caught.value)
    assert "a timestamptz value is not supported by the executor" in message
    assert "datetime" not in message


# ---- set_config() and its statement -------------------------------------------------------


def _failed_set_config(dsn: str) -> tuple[str | None, str | None, str]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT set_config('TimeZone', 'Asia/Tokyo', false), 1/0")
        reported = conn.info.parameter_status("TimeZone")  # no ParameterStatus came
        row = conn.execute("SELECT current_setting('TimeZone')").fetchone()
        assert row is not None
        return caught.value.sqlstate, reported, row[0]


def test_set_config_is_undone_when_its_statement_fails(server: ServerProcess) -> None:
    ours = _failed_set_config(server.dsn())
    assert ours == _failed_set_config(PG_DSN)
    assert ours == ("22012", "UTC", "UTC")


def _kinds(replies: list[Any]) -> list[bytes]:
    return [r.kind for r in replies]


def test_set_config_in_a_portal_read_a_page_at_a_time_is_reported_and_routes(
    server: ServerProcess,
) -> None:
    """As JDBC runs a statement with a fetch size: Execute with a row limit. The new
    application_name is reported (ParameterStatus, after the rows) and the next
    statement is routed by it."""
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as admin:
        admin.execute("CREATE RESOURCE GROUP IF NOT EXISTS tz_routed WITH (max_active_queries = 5)")
        admin.execute(
            "CREATE RESOURCE SELECTOR IF NOT EXISTS tz_routed_by_app "
            "WHEN application = 'tz_routed' THEN RESOURCE GROUP tz_routed"
        )
    client = RawClient(server.pg_port)
    try:
        client.login()
        client.send(
            parse("SELECT set_config('application_name', 'tz_routed', false)"),
            bind([]),
            execute(max_rows=1),
            SYNC,
        )
        replies = client.until_ready()
        assert b"E" not in _kinds(replies), [r.fields for r in replies if r.kind == b"E"]
        statuses = [r.body for r in replies if r.kind == b"S"]
        assert b"application_name\0tz_routed\0" in statuses
        assert _kinds(replies).index(b"S") > _kinds(replies).index(b"D")  # after the row
        client.send(query("SELECT current_resource_group()"))
        rows = [r.body for r in client.until_ready() if r.kind == b"D"]
        assert len(rows) == 1
        assert rows[0].endswith(b"tz_routed")
        # a failing statement's set_config() is neither kept nor reported
        client.send(query("SELECT set_config('application_name', 'elsewhere', false), 1/0"))
        replies = client.until_ready()
        assert b"E" in _kinds(replies)
        assert b"S" not in _kinds(replies)
        client.send(query("SELECT current_setting('application_name')"))
        rows = [r.body for r in client.until_ready() if r.kind == b"D"]
        assert len(rows) == 1
        assert rows[0].endswith(b"tz_routed")
    finally:
        client.close()
