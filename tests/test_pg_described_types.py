"""A result column's type is the statement's, never a value's: the Describe of a
prepared statement, the RowDescription of each execution and the encoding of
each DataRow agree, whatever values are bound.

A bare ``$n`` select item is a column of ``$n``'s type (as PostgreSQL); only
integer literals written in the statement's text (and casts) are int4, never
a value bound to a placeholder; a UNION is described by Describe (statement
and portal) like any statement that returns rows. Real asyncpg and psycopg
clients against a served engine, compared with this machine's PostgreSQL
where both answer (``long_sequence(n)`` there is ``generate_series(1::int8, n)``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from servers import ServerProcess, serving

PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

WIDE = 2**31 + 5  # past int4: an int4 description of it would be wrong
VALUES = [7, WIDE, -(2**31) - 1]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        yield srv


def _uri(server: ServerProcess) -> str:
    return f"postgresql://admin@{server.host}:{server.pg_port}/resgroups"


def _on_postgres(text: str) -> str:
    return text.replace("long_sequence($1)", "generate_series(1::int8, $1)").replace(
        "long_sequence(1)", "generate_series(1::int8, 1) AS t(x)"
    )


async def _asyncpg(dsn: str, statements: list[str], postgres: bool) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(dsn, timeout=10)
    answers: list[Any] = []
    try:
        for text in statements:
            statement = await conn.prepare(_on_postgres(text) if postgres else text)
            described = (
                [t.oid for t in statement.get_parameters()],
                [a.type.oid for a in statement.get_attributes()],
            )
            rows = []
            for value in VALUES:
                try:
                    rows.append([tuple(r) for r in await statement.fetch(value)])
                except asyncpg.PostgresError as exc:
                    rows.append(exc.sqlstate)
            answers.append((described, rows))
    finally:
        await conn.close()
    return answers


INT8_PARAMETER = [
    "SELECT $1 FROM long_sequence($1) LIMIT 1",  # the review's reproducer (int8 $1)
    "SELECT $1, x FROM long_sequence(1) WHERE x <= $1",
    "SELECT $1 AS v WHERE $1 > 0",  # typed by its comparison with an int4 literal
]


def test_asyncpg_describes_a_bare_int8_parameter_as_int8_whatever_its_value(
    server: ServerProcess,
) -> None:
    """asyncpg describes a statement once and decodes every execution by that
    description: a value past int4 must come back whole (it failed with
    'unexpected trailing 4 bytes' when the 0 bound for Describe narrowed $1).
    PostgreSQL refuses these statements (its bare $1 is text): nothing to compare."""
    ours = asyncio.run(_asyncpg(_uri(server), INT8_PARAMETER, postgres=False))
    assert [described for described, _ in ours] == [([20], [20]), ([20], [20, 20]), ([20], [20])]
    assert [rows[:2] for _, rows in ours] == [
        [[(7,)], [(WIDE,)]],
        [[(7, 1)], [(WIDE, 1)]],
        [[(7,)], [(WIDE,)]],
    ]


def test_asyncpg_reads_an_integer_parameter_in_the_select_list_as_an_integer(
    server: ServerProcess,
) -> None:
    """``SELECT $1 ... WHERE x < $1``: $1 is int8 (PostgreSQL refuses the
    statement); it was described as text and sent as a binary int
    (asyncpg returned '\\x00\\x00\\x00\\x05')."""
    import asyncpg

    async def run() -> tuple[list[int], list[Any]]:
        conn = await asyncpg.connect(_uri(server), timeout=10)
        try:
            statement = await conn.prepare("SELECT $1 FROM long_sequence(1) WHERE x < $1")
            got = [await statement.fetchval(v) for v in (5, 2**40)]
            return [a.type.oid for a in statement.get_attributes()], got
        finally:
            await conn.close()

    described, got = asyncio.run(run())
    assert described == [20]
    assert got == [5, 2**40]


def _raw_descriptions(dsn: str, text: str, oids: list[int], value: bytes) -> tuple[Any, ...]:
    """libpq's own messages: the statement's Describe, then the RowDescription
    and the binary DataRow of an execution with ``value``."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        pg = conn.pgconn
        assert pg.prepare(b"s", text.encode(), oids).status == psycopg.pq.ExecStatus.COMMAND_OK
        statement = pg.describe_prepared(b"s")
        executed = pg.exec_prepared(b"s", [value], [0], result_format=1)
        assert executed.status == psycopg.pq.ExecStatus.TUPLES_OK, executed.error_message
        return (
            [statement.ftype(i) for i in range(statement.nfields)],
            [executed.ftype(i) for i in range(executed.nfields)],
            [executed.get_value(0, i) for i in range(executed.nfields)],
        )


@pytest.mark.parametrize(
    ("text", "oids"),
    [
        ("SELECT $1 AS v", [20]),  # typed int8 by the client
        ("SELECT $1 AS v", [23]),  # typed int4 by the client: int4, as PostgreSQL
        ("SELECT $1 AS v, 5 AS five", [0]),  # untyped, no context: text
    ],
)
def test_describe_and_each_execution_agree_as_postgres(
    server: ServerProcess, text: str, oids: list[int]
) -> None:
    for value in (b"3", b"2000000000"):
        ours = _raw_descriptions(server.dsn(), text, oids, value)
        assert ours == _raw_descriptions(PG_DSN, text, oids, value)
        assert ours[0] == ours[1]  # Describe statement == this execution's description


def test_an_inferred_int8_parameter_is_described_and_sent_as_int8_for_every_value(
    server: ServerProcess,
) -> None:
    """Untyped ``$1`` compared with an integer is int8 here (PostgreSQL refuses a
    bare ``$1`` typed so): 8 bytes in binary for a small value and a wide one."""
    for value in (b"3", b"3000000000", b"-3000000000"):
        ours = _raw_descriptions(server.dsn(), "SELECT $1 AS v WHERE $1 <> 0", [0], value)
        assert ours == ([20], [20], [int(value).to_bytes(8, "big", signed=True)])


UNIONS: list[tuple[str, list[Any]]] = [
    ("SELECT %s::int AS a UNION ALL SELECT 2", [1]),  # the review's reproducer
    ("SELECT 1 AS a UNION ALL SELECT 2", []),
    ("SELECT 1 AS a UNION ALL SELECT 3000000000", []),
    ("SELECT %s::int8 AS a UNION ALL SELECT 2 ORDER BY 1", [5]),
    ("SELECT 'x' AS a UNION SELECT %s", ["y"]),
    # an integer branch and a double one make a double column (it crashed binary)
    ("SELECT %s::int8 AS a UNION ALL SELECT %s::float8 ORDER BY 1", [5, 2.5]),
    ("SELECT 2.5::float8 AS a UNION ALL SELECT 3 ORDER BY 1", []),
]


def test_union_types_that_cannot_be_matched_are_refused_as_postgres(
    server: ServerProcess,
) -> None:
    for dsn in (server.dsn(), PG_DSN):
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            for text in ("SELECT 1 UNION SELECT 'a'::text", "SELECT 'a'::text UNION SELECT true"):
                with pytest.raises(psycopg.errors.DatatypeMismatch, match="cannot be matched"):
                    conn.execute(text)


def _psycopg_unions(dsn: str, binary: bool) -> list[Any]:
    answers: list[Any] = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for text, values in UNIONS:
            for prepare in (False, True):
                cur = conn.cursor(binary=binary)
                cur.execute(text, values, prepare=prepare)  # type: ignore[arg-type]
                assert cur.description is not None
                answers.append((cur.fetchall(), [d.type_code for d in cur.description]))
    return answers


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_psycopg_reads_a_union_through_the_extended_protocol(
    server: ServerProcess, binary: bool
) -> None:
    """Describe of a UNION's portal gives its RowDescription (it said NoData and
    DataRows followed: 'server sent data without prior row description')."""
    ours = _psycopg_unions(server.dsn(), binary)
    assert ours == _psycopg_unions(PG_DSN, binary)
    assert ours[0] == ([(1,), (2,)], [23])


def test_asyncpg_reads_a_union_as_postgres(server: ServerProcess) -> None:
    import asyncpg

    async def run(dsn: str) -> list[Any]:
        conn = await asyncpg.connect(dsn, timeout=10)
        try:
            statement = await conn.prepare("SELECT 1 AS a WHERE $1::int8 > 0 UNION ALL SELECT 2")
            rows = [tuple(r) for r in await statement.fetch(1)]
            return [rows, [a.type.oid for a in statement.get_attributes()]]
        finally:
            await conn.close()

    ours = asyncio.run(run(_uri(server)))
    assert ours == asyncio.run(run(PG_DSN))
    assert ours == [[(1,), (2,)], [23]]
