"""Logging in to ``resgroups serve`` with access control on: SCRAM-SHA-256 (what psql
and psycopg use by default), cleartext, and refusals that say nothing about
who exists; permissions over the wire and over HTTP basic auth."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest
from servers import ServerProcess, start_server

ADMIN_PASSWORD = "s3cret-admin"


def _ac_server(*args: str) -> ServerProcess:
    return start_server(
        ["--access-control", *args], env={"RESGROUPS_ADMIN_PASSWORD": ADMIN_PASSWORD}
    )


@pytest.fixture(scope="module")
def scram() -> Iterator[ServerProcess]:
    srv = _ac_server()
    try:
        with psycopg.connect(srv.dsn("admin", ADMIN_PASSWORD), autocommit=True) as admin:
            admin.execute("CREATE USER alice WITH PASSWORD 'wonder land'")
            admin.execute("CREATE USER nopass")
            admin.execute("CREATE GROUP analysts")
        yield srv
    finally:
        assert srv.stop() == 0


def test_scram_login_with_the_right_password(scram: ServerProcess) -> None:
    with psycopg.connect(scram.dsn("alice", "wonder land"), autocommit=True) as conn:
        assert conn.execute("SELECT current_resource_group()").fetchone() == ("DEFAULT",)
        assert conn.info.parameter_status("session_authorization") == "alice"
        assert conn.info.parameter_status("is_superuser") == "off"


@pytest.mark.parametrize(
    ("user", "password"),
    [("alice", "wrong"), ("nobody", "wonder land"), ("analysts", "x"), ("admin", "nope")],
)
def test_wrong_password_unknown_user_and_acl_group_fail_alike(
    scram: ServerProcess, user: str, password: str
) -> None:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(scram.dsn(user, password), connect_timeout=10)
    assert f'password authentication failed for user "{user}"' in str(refused.value)


def test_a_principal_without_a_password_needs_none(scram: ServerProcess) -> None:
    with psycopg.connect(scram.dsn("nopass"), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_permissions_hold_over_the_wire(scram: ServerProcess) -> None:
    with psycopg.connect(scram.dsn("alice", "wonder land"), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE RESOURCE GROUP mine")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM resource_groups()")
    with psycopg.connect(scram.dsn("admin", ADMIN_PASSWORD), autocommit=True) as admin:
        assert admin.info.parameter_status("is_superuser") == "on"
        rows = admin.execute("SELECT name FROM resource_groups()").fetchall()
        assert rows == [("DEFAULT",)]


def _http(srv: ServerProcess, query: str, auth: tuple[str, str] | None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{srv.url}/execute", data=json.dumps({"query": query}).encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def test_http_basic_auth(scram: ServerProcess) -> None:
    status, body = _http(scram, "SELECT 1 AS one", ("alice", "wonder land"))
    assert (status, body["rows"]) == (200, [[1]])
    status, body = _http(scram, "SELECT 1", ("alice", "bad"))
    assert (status, body["error"]["sqlstate"]) == (401, "28P01")
    status, body = _http(scram, "SELECT 1", None)
    assert (status, body["error"]["sqlstate"]) == (401, "28P01")
    status, body = _http(scram, "CREATE RESOURCE GROUP x", ("alice", "wonder land"))
    assert (status, body["error"]["sqlstate"]) == (403, "42501")


def test_cleartext_password_method() -> None:
    srv = _ac_server("--auth-method", "password")
    try:
        with psycopg.connect(srv.dsn("admin", ADMIN_PASSWORD), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(srv.dsn("admin", "wrong"), connect_timeout=10)
    finally:
        assert srv.stop() == 0


def test_md5_method_keeps_md5_verifiers_and_checks_them() -> None:
    srv = _ac_server("--auth-method", "md5")
    try:
        md5_only = {"require_auth": "md5"}  # libpq refuses any other exchange
        with psycopg.connect(srv.dsn("admin", ADMIN_PASSWORD, **md5_only), autocommit=True) as c:
            c.execute("CREATE USER carol WITH PASSWORD 'md5 please'")
        with psycopg.connect(srv.dsn("carol", "md5 please", **md5_only), autocommit=True) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
        for user, password in [("carol", "wrong"), ("nobody", "md5 please")]:
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(srv.dsn(user, password, **md5_only), connect_timeout=10)
    finally:
        assert srv.stop() == 0
