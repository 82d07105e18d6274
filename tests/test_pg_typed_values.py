"""Values of the types PostgreSQL's drivers bind and read, as PostgreSQL binds and
describes them: timestamptz and timestamp parameters (text and binary, typed
by the client or inferred from their context), int4 and int2 where
PostgreSQL says them (``$1::int4``, ``$1::int``, an integer literal),
``current_setting()`` and ``set_config()`` over the settings SHOW and SET
know; and a statement's values bound into the statement parsed once, not
into its text parsed again for every execution.

The statements both servers answer run against the PostgreSQL on this
machine too (read-only, in RESGROUPS_TEST_PG_DSN's database), through
psycopg 3 and asyncpg, and the answers and descriptions must be equal.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from servers import ServerProcess, serving
from test_server_wire_phases import Running
from waiting import wait_until

import resgroups
from resgroups.server import pg_extended, pg_simple
from resgroups.sql import parser
from resgroups.sql.params import bind, binder
from resgroups.sql.parser import parse_one, placeholders_allowed

PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
ZONE = "-c TimeZone=UTC"  # both servers' sessions in the same zone
MOMENT = datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

# (statement with %s / %b placeholders, values): what both servers answer alike
SHARED: list[tuple[str, list[Any]]] = [
    ("SELECT %s::timestamptz AS t", [MOMENT]),  # text format, typed timestamptz
    ("SELECT %b::timestamptz AS t", [MOMENT]),  # binary
    ("SELECT %s::timestamptz AS t", [datetime(2024, 1, 2, 3, 4, 5)]),  # a timestamp
    ("SELECT %b::timestamptz AS t", [datetime(2024, 1, 2, 3, 4, 5)]),
    ("SELECT %s::timestamptz AS t", ["2024-01-02 03:04:05+02"]),  # text, read as such
    ("SELECT %s::timestamptz::text AS t", [MOMENT]),
    ("SELECT %s::timestamptz > '2020-01-01 00:00:00+00'::timestamptz AS later", [MOMENT]),
    ("SELECT %s::timestamptz AS t", ["not a time"]),  # 22007 from both
    ("SELECT '2024-01-02 03:04:05.5+02'::timestamptz AS t", []),
    ("SELECT 'x'::timestamptz AS t", []),  # 22007 from both
    ("SELECT 1::timestamptz AS t", []),  # 42846 from both
    ("SELECT now()::int AS t", []),  # 42846 from both
    ("SELECT %s::int4 AS i", [5]),
    ("SELECT %b::int AS i", [7]),
    ("SELECT %s::integer AS i, %s::smallint AS s", [8, 9]),
    ("SELECT %s::int4 AS i", [3_000_000_000]),  # 22003 from both
    ("SELECT 1 AS one, -5 AS minus, 3000000000 AS big", []),
    ("SELECT current_setting('application_name') AS a", []),
    ("SELECT current_setting('TimeZone') AS z", []),
    ("SELECT current_setting('no_such_setting', true) AS missing", []),
    ("SELECT current_setting('no_such_setting') AS missing", []),  # 42704 from both
    ("SELECT set_config('application_name', 'typed', false) AS s", []),
    ("SELECT current_setting('application_name') AS a", []),
    ("SELECT set_config('application_name', 'local', true) AS s", []),
    ("SELECT current_setting('application_name') AS a", []),  # a local one did not last
]


def _psycopg_answers(dsn: str) -> list[Any]:
    answers: list[Any] = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10, options=ZONE) as conn:
        for text, values in SHARED:
            try:
                cur = conn.execute(text, values)  # type: ignore[arg-type]
                assert cur.description is not None
                answers.append((cur.fetchall(), [d.type_code for d in cur.description]))
            except psycopg.Error as exc:
                answers.append(exc.sqlstate)
    return answers


def _numbered(text: str) -> str:
    n = 0
    while "%s" in text or "%b" in text:
        n += 1
        at = min(i for i in (text.find("%s"), text.find("%b")) if i >= 0)
        text = f"{text[:at]}${n}{text[at + 2 :]}"
    return text


async def _asyncpg_answers(dsn: str) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10, server_settings={"TimeZone": "UTC"})
    answers: list[Any] = []
    try:
        for text, values in SHARED:
            if any(isinstance(v, str) for v in values) or any(
                isinstance(v, datetime) and v.tzinfo is None for v in values
            ):
                continue  # asyncpg binds by the described type: a str or a naive time is refused
            try:
                statement = await conn.prepare(_numbered(text))
                rows = [tuple(r) for r in await statement.fetch(*values)]
                answers.append(
                    (
                        rows,
                        [a.type.oid for a in statement.get_attributes()],
                        [t.oid for t in statement.get_parameters()],
                    )
                )
            except asyncpg.PostgresError as exc:
                answers.append(exc.sqlstate)
    finally:
        await conn.close()
    return answers


def _uri(server: ServerProcess) -> str:
    return f"postgresql://admin@{server.host}:{server.pg_port}/resgroups"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        yield srv


def test_psycopg_binds_and_reads_as_postgres(server: ServerProcess) -> None:
    ours = _psycopg_answers(server.dsn())
    assert ours == _psycopg_answers(PG_DSN), f"psycopg {psycopg.__version__}"
    described = {text: answer[1] for (text, _), answer in zip(SHARED, ours, strict=True)
                 if isinstance(answer, tuple)}  # fmt: skip
    assert described["SELECT %s::timestamptz AS t"] == [1184]
    assert described["SELECT %s::int4 AS i"] == [23]
    assert described["SELECT %s::integer AS i, %s::smallint AS s"] == [23, 21]
    assert described["SELECT 1 AS one, -5 AS minus, 3000000000 AS big"] == [23, 23, 20]


def test_asyncpg_binds_and_reads_as_postgres(server: ServerProcess) -> None:
    import asyncpg

    ours = asyncio.run(_asyncpg_answers(_uri(server)))
    assert ours == asyncio.run(_asyncpg_answers(PG_DSN)), f"asyncpg {asyncpg.__version__}"
    assert [1184] in [a[2] for a in ours if isinstance(a, tuple)]  # described as timestamptz


def test_a_timestamptz_parameter_is_typed_by_the_column_it_is_compared_with(
    server: ServerProcess,
) -> None:
    """``started_at > $1``: an untyped parameter compared with a timestamptz column
    is a timestamptz (asyncpg then sends it in binary), and it filters."""
    import asyncpg

    async def session() -> tuple[list[int], int, int]:
        conn = await asyncpg.connect(_uri(server), timeout=10)
        try:
            statement = await conn.prepare(
                "SELECT count(*) FROM resource_group_queries() WHERE started_at > $1"
            )
            oids = [t.oid for t in statement.get_parameters()]
            past = await statement.fetchval(datetime.now(UTC) - timedelta(days=1))
            future = await statement.fetchval(datetime.now(UTC) + timedelta(days=1))
            return oids, past, future
        finally:
            await conn.close()

    oids, past, future = asyncio.run(session())
    assert oids == [1184]
    assert future == 0
    assert past >= 0
    with psycopg.connect(server.dsn(), autocommit=True, connect_timeout=10) as conn:
        # text format, typed by psycopg as timestamptz: the same filter
        found = conn.execute(
            "SELECT count(*) FROM resource_group_queries() WHERE started_at > %s",
            [datetime.now(UTC) + timedelta(days=1)],
        ).fetchone()
        assert found == (0,)


# ---- values bound into the parsed statement ------------------------------------------------

VALUES: list[object] = [
    0, 7, -5, 2**63 - 1, -(2**63), 1.5, -0.25, Decimal("12.50"), Decimal("-3"),
    Decimal("0.001"), "it's", "", True, False, None, MOMENT,
]  # fmt: skip


@pytest.fixture(scope="module")
def session() -> Iterator[resgroups.Session]:
    engine = resgroups.Engine(workers=1)
    yield engine.connect()
    engine.close(1.0)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_bound_into_the_statement_reads_as_its_literal(
    session: resgroups.Session, value: object
) -> None:
    """Binding into the parsed statement gives what the literal in the text gives."""
    text = "SELECT $1 AS v, $1 IS NULL AS n, coalesce($1, $1) AS c"
    with placeholders_allowed():
        template = parse_one(text)
    made = binder(template)
    assert made is not None
    from_tree = session.run(made([value]))  # type: ignore[arg-type]
    from_text = session.run(parse_one(bind(text, [value])[0]))
    assert (from_tree.rows, from_tree.types) == (from_text.rows, from_text.types)


def test_binding_checks_what_the_text_would() -> None:
    with placeholders_allowed():
        made = binder(parse_one("SELECT $1 + $2"))
    assert made is not None
    with pytest.raises(resgroups.Error) as undefined:
        made([1])
    assert undefined.value.sqlstate == "42P02"
    with pytest.raises(resgroups.Error) as infinite:
        made([1, float("inf")])
    assert infinite.value.sqlstate == "22023"


def test_a_prepared_statement_is_parsed_once_whatever_its_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each execution binds its values into the statement parsed at its first
    Bind: no parse per distinct value (pgbench, node-postgres and psycopg send
    the same text again and again)."""
    parses: list[str] = []
    original = parser.parse_one

    def counted(text: str, *args: Any, **kwargs: Any) -> Any:
        parses.append(text)
        return original(text, *args, **kwargs)

    monkeypatch.setattr(pg_extended, "parse_one", counted)
    monkeypatch.setattr(pg_simple, "parse_one", counted)
    running = Running()
    try:
        with running.connect() as conn:
            for n in range(12):
                got = conn.execute(
                    "SELECT x * %s::int4 FROM long_sequence(3) WHERE x > %s", [n, 1]
                ).fetchall()
                assert got == [(2 * n,), (3 * n,)]
            # a placeholder where only a literal parses: bound into the text instead
            for n in range(1, 4):
                assert conn.execute("SELECT x FROM long_sequence(9) LIMIT %s", [n]).rowcount == n
            (served,) = running.backend.connections.values()
        # its end drops its prepared statements, then closes its transport
        wait_until(lambda: served.writer.transport.is_closing())
    finally:
        running.close()
    assert parses.count("SELECT x * $1::int4 FROM long_sequence(3) WHERE x > $2") == 1
    assert len([p for p in parses if "long_sequence(9)" in p]) >= 3


def test_a_statement_executed_again_with_equal_looking_values_binds_each(
    server: ServerProcess,
) -> None:
    """The tree bound for the last values is reused only for the very same values:
    -0.0 is not 0.0, 1 is not TRUE (asyncpg, one prepared statement)."""
    import asyncpg

    async def answers(dsn: str) -> list[Any]:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            floats = await conn.prepare("SELECT $1::float8::text AS t")
            texts = await conn.prepare("SELECT $1::text AS t")
            return [
                *[await floats.fetchval(v) for v in (-0.0, 0.0, -0.0, 1.0, 1)],
                *[await texts.fetchval(v) for v in ("1", "1.0", "1")],
            ]
        finally:
            await conn.close()

    ours = asyncio.run(answers(_uri(server)))
    assert ours == asyncio.run(answers(PG_DSN))
    assert ours[:3] == ["-0", "0", "-0"]


def test_a_prepare_of_int_parameters_describes_them_as_postgres(server: ServerProcess) -> None:
    def described(dsn: str) -> list[int]:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("PREPARE typed(int, smallint, bigint) AS SELECT $1 + $2 + $3")
            result = conn.pgconn.describe_prepared(b"typed")
            return [result.param_type(i) for i in range(result.nparams)]

    assert described(server.dsn()) == described(PG_DSN) == [23, 21, 20]


def test_a_cast_to_int4_of_an_executor_column_checks_its_range(
    session: resgroups.Session,
) -> None:
    """The vectorised cast checks int4's and smallint's range as the row
    evaluator's does (a value past it would not fit the int4 it is described as)."""
    session.execute("CREATE TABLE widths AS SELECT x * 1000000 AS x FROM long_sequence(3000)")
    assert session.execute("SELECT x::int4 FROM widths WHERE x < 3000000").rows == [
        (1_000_000,),
        (2_000_000,),
    ]
    with pytest.raises(resgroups.Error, match="integer out of range") as info:
        session.execute("SELECT x::int4 FROM widths")
    assert info.value.sqlstate == "22003"
    with pytest.raises(resgroups.Error, match="smallint out of range"):
        session.execute("SELECT x::smallint FROM widths")
