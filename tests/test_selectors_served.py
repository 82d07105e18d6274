"""Selectors through the front ends (SPEC §15): the wire protocol's
``application_name`` (startup and SET) and ``client_tags`` (startup parameter,
``options=-c client_tags=...``, SET), psql's application name, and HTTP's
``application`` and ``tags`` parameters route queries as they do from Python."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from servers import ServerProcess, serving

SETUP = """
CREATE RESOURCE GROUP bi; CREATE RESOURCE GROUP exports; CREATE RESOURCE GROUP notebooks;
CREATE RESOURCE SELECTOR superset WHEN application LIKE 'superset%' THEN RESOURCE GROUP bi;
CREATE RESOURCE SELECTOR csv WHEN tag = 'export' THEN RESOURCE GROUP exports WITH (priority = 5);
CREATE RESOURCE SELECTOR jupyter WHEN application = 'jupyter' AND tag = 'adhoc'
    THEN RESOURCE GROUP notebooks
"""
QUERY = "SELECT current_resource_group() FROM long_sequence(1)"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving(["--workers", "2"]) as srv:
        with psycopg.connect(srv.dsn("admin"), autocommit=True, connect_timeout=10) as conn:
            for statement in SETUP.split(";"):
                if statement.strip():
                    conn.execute(statement)
        yield srv


def _group(srv: ServerProcess, **conninfo: Any) -> str:
    with psycopg.connect(srv.dsn("ann"), autocommit=True, connect_timeout=10, **conninfo) as conn:
        (row,) = conn.execute(QUERY).fetchall()
        return str(row[0])


def test_application_name_and_client_tags_at_startup(server: ServerProcess) -> None:
    assert _group(server) == "DEFAULT"
    assert _group(server, application_name="superset-worker") == "bi"
    assert _group(server, options="-c client_tags=export,daily") == "exports"
    assert _group(server, options="--client-tags=adhoc", application_name="jupyter") == "notebooks"
    # the tag selector's priority wins over the application's
    assert _group(server, application_name="superset", options="-c client_tags=export") == (
        "exports"
    )


def test_set_application_name_and_client_tags(server: ServerProcess) -> None:
    with psycopg.connect(server.dsn("ann"), autocommit=True, connect_timeout=10) as conn:

        def group() -> str:
            return str(conn.execute(QUERY).fetchone()[0])  # type: ignore[index]

        conn.execute("SET application_name = 'superset'")
        assert group() == "bi"
        assert conn.execute("SHOW application_name").fetchone() == ("superset",)
        conn.execute("SET client_tags = 'export'")
        assert group() == "exports"
        assert conn.execute("SHOW client_tags").fetchone() == ("export",)
        conn.execute("RESET client_tags")
        assert group() == "bi"
        conn.execute("RESET ALL")
        assert group() == "DEFAULT"


def test_a_bad_startup_option_is_refused_with_its_reason(server: ServerProcess) -> None:
    with pytest.raises(psycopg.OperationalError, match="only -c name=value"):
        psycopg.connect(server.dsn("ann"), options="-x y", connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="unrecognized configuration parameter"):
        psycopg.connect(server.dsn("ann"), options="-c nope=1", connect_timeout=10)


def test_psql_sends_its_application_name(server: ServerProcess) -> None:
    env = {**os.environ, "PGAPPNAME": "superset-cli", "PGCONNECT_TIMEOUT": "10"}
    out = subprocess.run(
        ["psql", server.dsn("ann"), "-At", "-c", QUERY],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "bi"


def test_http_application_and_tags(server: ServerProcess) -> None:
    def group(**params: str) -> str:
        url = f"{server.url}/execute?" + urllib.parse.urlencode({"query": QUERY, **params})
        with urllib.request.urlopen(url, timeout=60) as reply:
            body = json.load(reply)
        return str(body["rows"][0][0])

    assert group() == "DEFAULT"
    assert group(application="superset") == "bi"
    assert group(tags="adhoc", application="jupyter") == "notebooks"
    assert group(tags="x, export") == "exports"
    assert group() == "DEFAULT"  # a request's attributes are its own
