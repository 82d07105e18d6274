"""The drivers people use, each running a realistic session against ``resgroups
serve``: connect, ``resource_groups()``, DDL, parameterised queries, an error,
its own introspection. The statements both servers answer run against the
PostgreSQL on this machine too (in a database of this module's own, where
``long_sequence`` is a SQL function), and the answers must be equal.

Clients: asyncpg, SQLAlchemy 2 with psycopg 3 (no overrides), pandas
``read_sql``, pgcli's startup, node-postgres (installed with npm into
``tests/node``), pgbench in its three ``-M`` modes. Each test states the
client's version in its failure message.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from servers import ServerProcess, serving

NOT_INSTALLED = (
    'in the test extra: pip install -e ".[test]" (the README\'s test command) installs it'
)

PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
NODE_DIR = Path(__file__).parent / "node"
TIMEOUT = 60.0

# (statement with $n placeholders, values): what both servers answer alike
SHARED: list[tuple[str, list[Any]]] = [
    ("SELECT count(*) FROM long_sequence($1)", [1000]),
    ("SELECT x FROM long_sequence(5) WHERE x > $1 ORDER BY x", [3]),
    ("SELECT x, x * $1 AS twice FROM long_sequence(3) ORDER BY x", [2]),
    ("SELECT sum(x) FROM long_sequence($1) WHERE x % 2 = 0", [10]),
    ("SELECT x FROM readings WHERE ratio > $1 ORDER BY x", [0.7]),
    ("SELECT $1 || '!' AS shout", ["it's"]),
    ("SELECT x FROM long_sequence(3) WHERE (x > 1) = $1 ORDER BY x", [True]),
    ("SELECT coalesce($1::text, 'none') AS c", [None]),
    ("SELECT lower($1) AS quiet", ["LOUD"]),
    ("SELECT 1 / 0", []),  # 22012 from both
]
# text a client sends untyped: the server reads it as the type the context wants
UNTYPED_TEXT: list[tuple[str, list[Any]]] = [
    ("SELECT count(*) FROM long_sequence($1)", ["12"]),
    ("SELECT count(*) FROM long_sequence($1)", ["twelve"]),  # 22P02 from both
    ("SELECT x FROM long_sequence(4) WHERE x >= $1 ORDER BY x", ["3"]),
]
SETUP = "CREATE TABLE readings AS SELECT x, (x * 0.5)::float8 AS ratio FROM long_sequence(3)"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        with psycopg.connect(srv.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(SETUP)
        yield srv


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, Any]]:
    """Connection parameters of a database of this module's own on the PostgreSQL
    RESGROUPS_TEST_PG_DSN names, with ``long_sequence(n)`` and ``readings``."""
    name = f"resgroups_drivers_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(PG_DSN)
    where = {
        "host": str(params.get("host", "127.0.0.1")),
        "port": int(params.get("port", 5432)),
        "user": str(params.get("user", "postgres")),
        "database": name,
    }
    if params.get("password"):
        where["password"] = str(params["password"])
    try:
        with psycopg.connect(PG_DSN, dbname=name, autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                "CREATE FUNCTION long_sequence(n bigint) RETURNS TABLE (x bigint) "
                "LANGUAGE sql AS 'SELECT generate_series(1, n)'"
            )
            conn.execute(SETUP)
        yield where
    finally:
        with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def ours(server: ServerProcess) -> dict[str, Any]:
    return {"host": server.host, "port": server.pg_port, "user": "admin", "database": "resgroups"}


# ---- asyncpg ---------------------------------------------------------------------------


async def _asyncpg_answers(where: dict[str, Any]) -> list[Any]:
    import asyncpg

    conn = await asyncpg.connect(**where, timeout=10)
    answers: list[Any] = []
    try:
        for text, values in SHARED:
            try:
                answers.append([tuple(r) for r in await conn.fetch(text, *values)])
            except asyncpg.PostgresError as exc:
                answers.append(exc.sqlstate)
    finally:
        await conn.close()
    return answers


def test_asyncpg_answers_as_postgres(server: ServerProcess, postgres: dict[str, Any]) -> None:
    """asyncpg prepares every statement, asks the parameters' types (Describe) and
    sends each value in binary in that type."""
    asyncpg = pytest.importorskip("asyncpg", reason=NOT_INSTALLED)
    answers = asyncio.run(asyncio.wait_for(_asyncpg_answers(ours(server)), TIMEOUT))
    expected = asyncio.run(asyncio.wait_for(_asyncpg_answers(postgres), TIMEOUT))
    assert answers == expected, f"asyncpg {asyncpg.__version__}"
    assert answers[0] == [(1000,)]
    assert answers[-1] == "22012"


async def _asyncpg_session(where: dict[str, Any]) -> dict[str, Any]:
    import asyncpg

    seen: dict[str, Any] = {}
    conn = await asyncpg.connect(**where, timeout=10)
    try:
        seen["groups"] = [r["name"] for r in await conn.fetch("SELECT * FROM resource_groups()")]
        seen["ddl"] = await conn.execute(
            "CREATE RESOURCE GROUP IF NOT EXISTS asyncpg_group WITH (max_active_queries = 3)"
        )
        seen["limit"] = await conn.fetchval(
            "SELECT max_active_queries FROM resource_groups() WHERE name = $1", "asyncpg_group"
        )
        seen["typed"] = await conn.fetchrow(
            "SELECT $1::bigint AS i, $2::float8 AS f, $3::text AS t, $4::bool AS b",
            -(2**63),
            1.5,
            "é'",
            False,
        )
        seen["now"] = await conn.fetchval("SELECT now()")
        seen["type"] = await conn.fetchval(
            "SELECT typname FROM pg_catalog.pg_type WHERE oid = $1", 701
        )
        try:
            await conn.fetch("SELECT * FROM no_such_table")
        except asyncpg.PostgresError as exc:
            seen["error"] = exc.sqlstate
        # a prepared statement reused, as an application's hot query is
        statement = await conn.prepare("SELECT count(*) FROM long_sequence($1)")
        seen["prepared"] = [await statement.fetchval(n) for n in (1, 10, 100)]
        seen["parameters"] = [t.name for t in statement.get_parameters()]
    finally:
        await conn.close()
    # a pool of one connection acquired and released twice: the release runs the
    # pool's reset (pg_advisory_unlock_all, CLOSE ALL, UNLISTEN *, RESET ALL)
    pool = await asyncpg.create_pool(**where, min_size=1, max_size=1, timeout=10)
    try:
        seen["pool"] = []
        for n in (2, 3):
            async with pool.acquire(timeout=10) as pooled:
                seen["pool"].append(
                    await pooled.fetchval("SELECT sum(x) FROM long_sequence($1)", n)
                )
    finally:
        await asyncio.wait_for(pool.close(), 10)
    return seen


def test_asyncpg_session(server: ServerProcess) -> None:
    asyncpg = pytest.importorskip("asyncpg", reason=NOT_INSTALLED)
    version = f"asyncpg {asyncpg.__version__}"
    seen = asyncio.run(asyncio.wait_for(_asyncpg_session(ours(server)), TIMEOUT))
    assert "DEFAULT" in seen["groups"], version
    assert seen["ddl"] == "CREATE RESOURCE GROUP"
    assert seen["limit"] == 3
    assert tuple(seen["typed"]) == (-(2**63), 1.5, "é'", False)
    assert seen["now"].tzinfo is not None
    assert seen["type"] == "float8"
    assert seen["error"] == "42P01"
    assert seen["prepared"] == [1, 10, 100]
    assert seen["parameters"] == ["int8"]
    assert seen["pool"] == [3, 6]


# ---- SQLAlchemy 2 with psycopg 3, and pandas ------------------------------------------


def _sqlalchemy_url(where: dict[str, Any]) -> str:
    secret = f":{where['password']}" if where.get("password") else ""
    return (
        f"postgresql+psycopg://{where['user']}{secret}@{where['host']}:{where['port']}"
        f"/{where['database']}"
    )


def _sqlalchemy_answers(where: dict[str, Any]) -> list[Any]:
    import sqlalchemy as sa

    engine = sa.create_engine(_sqlalchemy_url(where), connect_args={"connect_timeout": 10})
    answers: list[Any] = []
    try:
        with engine.connect() as conn:
            for text, values in SHARED:
                bound = text
                for n in range(len(values), 0, -1):
                    bound = bound.replace(f"${n}", f":p{n}")
                params = {f"p{n}": v for n, v in enumerate(values, 1)}
                try:
                    answers.append([tuple(r) for r in conn.execute(sa.text(bound), params)])
                except sa.exc.DBAPIError as exc:
                    answers.append(exc.orig.sqlstate)  # type: ignore[union-attr]
                    conn.rollback()
            conn.rollback()
    finally:
        engine.dispose()
    return answers


def test_sqlalchemy_answers_as_postgres(server: ServerProcess, postgres: dict[str, Any]) -> None:
    """SQLAlchemy with its defaults (no overrides): its first connect asks
    version(), current_schema(), the isolation level and standard_conforming_strings,
    probes hstore in a savepoint; statements run in a transaction block."""
    sa = pytest.importorskip("sqlalchemy", reason=NOT_INSTALLED)
    version = f"SQLAlchemy {sa.__version__}, psycopg {psycopg.__version__}"
    assert _sqlalchemy_answers(ours(server)) == _sqlalchemy_answers(postgres), version


def test_sqlalchemy_session(server: ServerProcess) -> None:
    sa = pytest.importorskip("sqlalchemy", reason=NOT_INSTALLED)
    version = f"SQLAlchemy {sa.__version__}, psycopg {psycopg.__version__}"
    engine = sa.create_engine(_sqlalchemy_url(ours(server)), connect_args={"connect_timeout": 10})
    try:
        with engine.connect() as conn:
            names = [r.name for r in conn.execute(sa.text("SELECT * FROM resource_groups()"))]
            assert "DEFAULT" in names, version
            conn.execute(sa.text("CREATE RESOURCE GROUP IF NOT EXISTS sa_group"))
            conn.commit()
            rows = conn.execute(
                sa.text("SELECT x, ratio FROM readings WHERE x >= :low ORDER BY x"), {"low": 2}
            ).all()
            assert [tuple(r) for r in rows] == [(2, 1.0), (3, 1.5)]
            with pytest.raises(sa.exc.ProgrammingError, match="no_such_column"):
                conn.execute(sa.text("SELECT no_such_column FROM readings"))
            conn.rollback()
            assert conn.execute(sa.text("SELECT count(*) FROM readings")).scalar() == 3
        inspector = sa.inspect(engine)
        assert inspector.get_table_names() == ["readings"]
        assert [
            (c["name"], type(c["type"]).__name__) for c in inspector.get_columns("readings")
        ] == [
            ("x", "BIGINT"),
            ("ratio", "DOUBLE_PRECISION"),
        ]
        assert engine.dialect.server_version_info[0] == 15
    finally:
        engine.dispose()


def test_pandas_read_sql(server: ServerProcess, postgres: dict[str, Any]) -> None:
    """pandas ``read_sql`` through a SQLAlchemy engine, with parameters."""
    pd = pytest.importorskip("pandas", reason=NOT_INSTALLED)
    sa = pytest.importorskip("sqlalchemy", reason=NOT_INSTALLED)
    query = sa.text("SELECT x, ratio, x * :k AS scaled FROM readings WHERE ratio < :r ORDER BY x")
    frames = []
    for where in (ours(server), postgres):
        engine = sa.create_engine(_sqlalchemy_url(where), connect_args={"connect_timeout": 10})
        try:
            frames.append(pd.read_sql(query, engine, params={"k": 10, "r": 1.2}))
        finally:
            engine.dispose()
    version = f"pandas {pd.__version__}"
    assert frames[0].to_dict("list") == {"x": [1, 2], "ratio": [0.5, 1.0], "scaled": [10, 20]}, (
        version
    )
    pd.testing.assert_frame_equal(frames[0], frames[1])


# ---- pgcli ------------------------------------------------------------------------------


def test_pgcli_startup(server: ServerProcess) -> None:
    """What pgcli does at start, replayed with its own PGExecute: connect, read and
    set the time zone, then refresh its completions."""
    pgcli = pytest.importorskip("pgcli", reason=NOT_INSTALLED)
    from pgcli.pgexecute import PGExecute

    version = f"pgcli {pgcli.__version__}"
    ex = PGExecute("resgroups", "admin", None, server.host, server.pg_port, None)
    try:
        assert ex.server_version == "15.0", version
        assert ex.get_timezone() == "UTC"
        ex.set_timezone("Europe/Paris")
        assert ex.get_timezone() == "Europe/Paris"
        assert ex.search_path() == ["pg_catalog", "public"]
        assert ("public", "readings") in list(ex.tables())
        status = [r[3] for r in ex.run("SELECT count(*) FROM long_sequence(5)")]
        assert status == ["SELECT 1"]
    finally:
        ex.conn.close()


# ---- node-postgres -------------------------------------------------------------------------

NODE = shutil.which("node")
NPM = shutil.which("npm")


@pytest.fixture(scope="module")
def node_postgres() -> Path:
    """node-postgres installed into tests/node (npm, once; ignored by git)."""
    if NODE is None or NPM is None:
        pytest.skip("node and npm are not installed (.ci/run installs them)")
    if not (NODE_DIR / "node_modules" / "pg" / "package.json").exists():
        done = subprocess.run(
            [NPM, "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    return NODE_DIR


def _node_session(node_dir: Path, where: dict[str, Any], script: Path) -> tuple[str, list[Any]]:
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(node_dir / "session.js"), json.dumps(where), str(script)],
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return lines[0]["version"], [line.get("rows", line.get("error")) for line in lines[1:]]


def test_node_postgres_answers_as_postgres(
    node_postgres: Path, server: ServerProcess, postgres: dict[str, Any], tmp_path: Path
) -> None:
    """node-postgres sends every parameter untyped (oid 0) as text: the server
    reads it as the type the parameter's context wants."""
    script = tmp_path / "statements.json"
    script.write_text(json.dumps(SHARED + UNTYPED_TEXT))
    version, answers = _node_session(node_postgres, ours(server), script)
    _, expected = _node_session(node_postgres, postgres, script)
    assert answers == expected, f"node-postgres {version}"
    assert answers[0] == [["1000"]]  # bigint arrives as text in node-postgres
    assert answers[len(SHARED) + 1] == "22P02"


def test_node_postgres_session(node_postgres: Path, server: ServerProcess, tmp_path: Path) -> None:
    script = tmp_path / "session.json"
    script.write_text(
        json.dumps([
            ["SELECT name FROM resource_groups() WHERE name = $1", ["DEFAULT"]],
            ["CREATE RESOURCE GROUP IF NOT EXISTS node_group WITH (cpu_weight = 200)", []],
            ["SELECT cpu_weight FROM resource_groups() WHERE name = $1", ["node_group"]],
            ["SELECT x FROM readings WHERE ratio = $1", ["1.5"]],
            ["SELECT * FROM resource_groups() WHERE no_such_column = $1", [1]],
            ["SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
             ["public"]],
        ])
    )  # fmt: skip
    version, answers = _node_session(node_postgres, ours(server), script)
    assert answers == [
        [["DEFAULT"]],
        [],
        [["200"]],
        [["3"]],
        "42703",
        [["resource_groups"], ["resource_group_queries"], ["resource_group_instances"],
         ["resource_group_rules"], ["resource_group_watches"], ["resource_selectors"],
         ["readings"]],
    ], f"node-postgres {version}"  # fmt: skip


# ---- pgbench -----------------------------------------------------------------------------------

PGBENCH = shutil.which("pgbench")


@pytest.mark.skipif(PGBENCH is None, reason="pgbench is not installed (.ci/run installs it)")
@pytest.mark.parametrize("mode", ["simple", "extended", "prepared"])
def test_pgbench_modes(
    mode: str, server: ServerProcess, postgres: dict[str, Any], tmp_path: Path
) -> None:
    """pgbench with a ``\\set`` parameter in each protocol mode: extended and
    prepared send it untyped, as text. Every transaction succeeds, as against
    PostgreSQL."""
    assert PGBENCH is not None
    script = tmp_path / "bench.sql"
    script.write_text(
        "\\set n random(1, 1000)\n"
        "SELECT count(*) FROM long_sequence(:n);\n"
        "SELECT x FROM readings WHERE x <= :n;\n"
    )
    version = subprocess.run([PGBENCH, "--version"], capture_output=True, text=True).stdout
    for where in (ours(server), postgres):
        done = subprocess.run(
            [PGBENCH, "-n", "-h", where["host"], "-p", str(where["port"]), "-U", where["user"],
             "-M", mode, "-c", "2", "-j", "1", "-t", "25", "-f", str(script), where["database"]],
            capture_output=True, text=True, timeout=TIMEOUT,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10", "PGPASSWORD": where.get("password", "")},
        )  # fmt: skip
        assert done.returncode == 0, f"{version}: {done.stderr}"
        assert "number of transactions actually processed: 50/50" in done.stdout, done.stdout
        assert "number of failed transactions: 0" in done.stdout, done.stdout


# ---- the parameter types Describe reports ------------------------------------------------

DESCRIBED = [
    "SELECT count(*) FROM long_sequence($1)",
    "SELECT x FROM readings WHERE x > $1 AND ratio < $2",
    "SELECT x FROM readings WHERE $1 AND NOT $2",
    "SELECT lower($1), $2 LIKE 'a%', $3 || 'x'",
    "SELECT $1::float8, $2::bigint, $3::text, $4::boolean",
    "SELECT x FROM readings WHERE x IN ($1, $2)",
    "SELECT $1",
]


def _described(dsn: str) -> list[list[int]]:
    """Each statement's parameter types as Describe reports them (oids)."""
    out = []
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for n, text in enumerate(DESCRIBED):
            name = f"described_{n}".encode()
            conn.pgconn.prepare(name, text.encode())
            result = conn.pgconn.describe_prepared(name)
            assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, result.error_message
            out.append([result.param_type(i) for i in range(result.nparams)])
    return out


def test_parameter_types_as_postgres_infers_them(
    server: ServerProcess, postgres: dict[str, Any]
) -> None:
    """What asyncpg reads before sending values in binary: the type PostgreSQL
    infers for each untyped parameter from its context."""
    theirs = " ".join(f"{k}={v}" for k, v in {**postgres, "dbname": postgres["database"]}.items()
                      if k != "database")  # fmt: skip
    ours = _described(server.dsn())
    assert ours == _described(theirs), f"libpq {psycopg.pq.version()}"
    assert ours[0] == [20]  # long_sequence(bigint)
    assert ours[-1] == [25]  # nothing types it: text
