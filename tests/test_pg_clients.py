"""Real clients introspecting ``resgroups serve`` through pg_catalog: psql's
``\\d`` family, SQLAlchemy 2's ``inspect()`` (with psycopg 3), pgcli's
completion queries and JDBC's DatabaseMetaData."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from servers import ServerProcess, serving

NOT_INSTALLED = (
    'in the test extra: pip install -e ".[test]" (the README\'s test command) installs it'
)

PSQL = shutil.which("psql")


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving() as srv:
        with psycopg.connect(srv.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(
                "CREATE TABLE readings AS SELECT x, x * 0.5 AS ratio FROM long_sequence(3)"
            )
        yield srv


def psql(server: ServerProcess, command: str) -> str:
    assert PSQL is not None
    done = subprocess.run(
        [PSQL, "-X", "-h", server.host, "-p", str(server.pg_port), "-U", "admin",
         "-d", "resgroups", "-c", command],
        capture_output=True, text=True, timeout=60, env={"PGCONNECT_TIMEOUT": "10"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not done.stderr
    return done.stdout


def psql_version() -> str:
    assert PSQL is not None
    return subprocess.run([PSQL, "--version"], capture_output=True, text=True).stdout.strip()


needs_psql = pytest.mark.skipif(
    PSQL is None, reason="psql is not installed: apt-get install postgresql-client (.ci/run does)"
)


@needs_psql
def test_psql_d_lists_relations(server: ServerProcess) -> None:
    """psql 15 (``psql --version`` in the failure message when it differs)."""
    out = psql(server, r"\d")
    assert "List of relations" in out, psql_version()
    assert " public | readings                 | table | admin" in out
    assert " public | resource_groups          | view  | admin" in out
    assert "pg_class" not in out  # pg_catalog is left out, as psql asks


@needs_psql
def test_psql_dt_lists_tables_only(server: ServerProcess) -> None:
    out = psql(server, r"\dt")
    assert " public | readings | table | admin" in out, psql_version()
    assert "resource_groups" not in out
    assert "(1 row)" in out


@needs_psql
def test_psql_df_lists_the_table_functions(server: ServerProcess) -> None:
    out = psql(server, r"\df")
    assert "List of functions" in out, psql_version()
    for name in ("long_sequence", "resource_groups", "resource_group_queries"):
        assert f" public | {name}" in out
    assert "| n bigint            | func" in out  # long_sequence(n bigint)


@needs_psql
def test_psql_du_lists_roles(server: ServerProcess) -> None:
    out = psql(server, r"\du")
    assert "List of roles" in out, psql_version()
    assert " admin     | Superuser" in out


@needs_psql
def test_psql_d_resource_groups_describes_its_columns(server: ServerProcess) -> None:
    out = psql(server, r"\d resource_groups")
    assert 'View "public.resource_groups"' in out, psql_version()
    # columns padded to the longest name, as psql does
    assert re.search(r"^ name +\| text +\|", out, re.MULTILINE), out
    assert re.search(r"^ memory_limit_bytes +\| bigint +\|", out, re.MULTILINE), out
    assert re.search(r"^ cpu_min_share_pct +\| double precision +\|", out, re.MULTILINE), out


@needs_psql
def test_psql_d_of_a_table(server: ServerProcess) -> None:
    """psql's \\d of a table also asks policies, statistics, publications (a UNION
    with generate_series and array subscripts) and inheritance: all answered."""
    out = psql(server, r"\d readings")
    assert 'Table "public.readings"' in out, psql_version()
    assert " x      | bigint           |" in out
    assert " ratio  | double precision |" in out


@needs_psql
def test_psql_l_and_dn(server: ServerProcess) -> None:
    assert " resgroups | admin | UTF8" in psql(server, r"\l"), psql_version()
    assert " public | admin" in psql(server, r"\dn")


@needs_psql
def test_psql_d_of_a_missing_relation(server: ServerProcess) -> None:
    assert PSQL is not None
    done = subprocess.run(
        [PSQL, "-X", "-h", server.host, "-p", str(server.pg_port), "-U", "admin",
         "-d", "resgroups", "-c", r"\d nothing_here"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "Did not find any relation named" in done.stderr


# ---- SQLAlchemy 2 with psycopg 3 ------------------------------------------------------


@pytest.fixture
def inspector(server: ServerProcess) -> Iterator[Any]:
    sa = pytest.importorskip("sqlalchemy", reason=NOT_INSTALLED)
    engine = sa.create_engine(
        f"postgresql+psycopg://admin@{server.host}:{server.pg_port}/resgroups"
    )
    try:
        yield sa.inspect(engine)
    finally:
        engine.dispose()


def test_sqlalchemy_lists_tables_and_views(inspector: Any) -> None:
    import sqlalchemy

    version = f"SQLAlchemy {sqlalchemy.__version__}, psycopg {psycopg.__version__}"
    assert inspector.get_table_names() == ["readings"], version
    assert set(inspector.get_view_names()) == {
        "resource_groups",
        "resource_group_queries",
        "resource_group_instances",
        "resource_group_rules",
        "resource_group_watches",
        "resource_selectors",
    }
    assert inspector.has_table("readings")
    assert not inspector.has_table("nothing_here")
    assert inspector.get_schema_names() == ["information_schema", "public"]


def test_sqlalchemy_get_columns(inspector: Any) -> None:
    import sqlalchemy

    columns = inspector.get_columns("readings")
    assert [(c["name"], type(c["type"]).__name__, c["nullable"]) for c in columns] == [
        ("x", "BIGINT", True),
        ("ratio", "DOUBLE_PRECISION", True),
    ], sqlalchemy.__version__
    described = {
        c["name"]: type(c["type"]).__name__ for c in inspector.get_columns("resource_groups")
    }
    assert described["name"] == "TEXT"
    assert described["active_queries"] == "BIGINT"
    assert inspector.get_foreign_keys("readings") == []
    assert inspector.get_check_constraints("readings") == []
    assert inspector.get_table_comment("readings") == {"text": None}


# ---- pgcli's completion queries ------------------------------------------------------


def test_pgcli_completion_metadata(server: ServerProcess) -> None:
    """pgcli's own PGExecute runs the queries its completer refreshes from."""
    pgcli = pytest.importorskip("pgcli", reason=NOT_INSTALLED)
    from pgcli.pgexecute import PGExecute

    version = f"pgcli {pgcli.__version__}"
    ex = PGExecute("resgroups", "admin", None, server.host, server.pg_port, None)
    try:
        assert ex.search_path() == ["pg_catalog", "public"], version
        assert "public" in ex.schemata()
        assert ("public", "readings") in list(ex.tables())
        assert ("public", "resource_groups") in list(ex.views())
        columns = {(t, c): kind for _, t, c, kind, _, _ in ex.table_columns()}
        assert columns[("readings", "x")] == "bigint"
        assert columns[("readings", "ratio")] == "double precision"
        assert ex.databases() == ["resgroups"]
        names = {f.func_name for f in ex.functions()}
        assert {"long_sequence", "resource_groups"} <= names
        assert list(ex.datatypes()) == []  # no types outside pg_catalog
    finally:
        ex.conn.close()


# ---- JDBC -----------------------------------------------------------------------------

JAVA = shutil.which("java")
PGJDBC = sorted(Path.home().glob(".m2/repository/org/postgresql/postgresql/*/postgresql-*.jar"))


@pytest.mark.skipif(
    JAVA is None or not PGJDBC,
    reason="java or the PostgreSQL JDBC driver is missing: install a JDK (apt-get install "
    "default-jdk-headless) and the driver into ~/.m2 (mvn dependency:get "
    "-Dartifact=org.postgresql:postgresql:42.7.4)",
)
def test_jdbc_get_tables_and_columns(server: ServerProcess) -> None:
    assert JAVA is not None
    done = subprocess.run(
        [JAVA, "-cp", str(PGJDBC[-1]), str(Path(__file__).parent / "jdbc" / "Meta.java"),
         str(server.pg_port)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    version = lines[0]  # "driver 42.7.13"
    assert "table public.readings TABLE" in lines, version
    assert "table public.resource_groups VIEW" in lines
    assert [line for line in lines if line.startswith("column ")] == [
        "column x int8 -5",
        "column ratio float8 8",
    ]  # java.sql.Types.BIGINT, DOUBLE
    assert "schema public" in lines
