"""``resgroups serve`` over HTTP (/execute, QuestDB's /exec, /metrics, /health), and a
listener that survives hostile clients: random and truncated protocol
messages, lying lengths, dropped connections and two thousand idle ones."""

from __future__ import annotations

import json
import random
import resource
import socket
import struct
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess, serving
from waiting import wait_until


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving(["--workers", "2"]) as srv:
        yield srv


def get(srv: ServerProcess, path: str, **params: str) -> tuple[int, Any]:
    url = f"{srv.url}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=60) as reply:
            body = reply.read().decode()
            return reply.status, json.loads(body) if "json" in reply.headers[
                "Content-Type"
            ] else body
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def groups(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    status, body = get(srv, "/execute", query="SELECT * FROM resource_groups()")
    assert status == 200
    names = [c["name"] for c in body["columns"]]
    return {row[0]: dict(zip(names, row, strict=True)) for row in body["rows"]}


def nothing_held(srv: ServerProcess) -> bool:
    return all(
        g["active_queries"] == 0 and g["queued_queries"] == 0 and g["memory_used_bytes"] == 0
        for g in groups(srv).values()
    )


def test_execute_answers_columns_rows_status_group_and_timings(server: ServerProcess) -> None:
    status, body = get(server, "/execute", query="CREATE RESOURCE GROUP web")
    assert (status, body["status"]) == (200, "CREATE RESOURCE GROUP")
    status, body = get(
        server,
        "/execute",
        query="SELECT count(*) AS n, sum(x) FROM long_sequence(1000)",
        resource_group="web",
    )
    assert status == 200
    assert body["columns"] == [{"name": "n", "type": "int"}, {"name": "sum", "type": "int"}]
    assert body["rows"] == [[1000, 500500]]
    assert body["status"] == "SELECT 1"
    assert body["group"] == "web"
    assert set(body["timings"]) >= {"wait_ms", "total_ms", "cpu_ms"}
    request = urllib.request.Request(
        f"{server.url}/execute", data=b"SELECT 'posted' AS how", method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        assert json.load(reply)["rows"] == [["posted"]]


@pytest.mark.parametrize(
    ("query", "status", "sqlstate"),
    [
        ("SELEC 1", 400, "42601"),
        ("DROP RESOURCE GROUP nowhere", 400, "42704"),
        ("SELECT 1 / 0", 400, "22012"),
    ],
)
def test_execute_errors_carry_sqlstate_message_and_position(
    server: ServerProcess, query: str, status: int, sqlstate: str
) -> None:
    got, body = get(server, "/execute", query=query)
    assert (got, body["error"]["sqlstate"]) == (status, sqlstate)
    assert body["error"]["message"]
    if sqlstate == "42601":
        assert body["error"]["position"] == 1


def test_queue_full_is_429_and_a_timeout_504(server: ServerProcess) -> None:
    get(server, "/execute", query="CREATE RESOURCE GROUP shut WITH (max_active_queries = 1, "
        "max_queued_queries = 0)")  # fmt: skip
    get(server, "/execute", query="CREATE RESOURCE GROUP slow WITH (max_active_queries = 1, "
        "queue_timeout = 50ms)")  # fmt: skip
    holder = psycopg.connect(server.dsn("holder"), autocommit=True)
    try:
        holder.execute("DECLARE c1 CURSOR WITH HOLD FOR SELECT count(*) FROM long_sequence(5)")
        # a long query in each group holds its one slot
        socks = [_start_long_query(server, group) for group in ("shut", "slow")]
        wait_until(
            lambda: (
                groups(server)["shut"]["active_queries"] == 1
                and groups(server)["slow"]["active_queries"] == 1
            ),
            timeout=30,
        )
        status, body = get(server, "/execute", query="SELECT 1", resource_group="shut")
        assert (status, body["error"]["sqlstate"]) == (429, "53400")
        status, body = get(server, "/execute", query="SELECT 1", resource_group="slow")
        assert (status, body["error"]["sqlstate"]) == (504, "57014")
        for sock in socks:
            sock.close()  # a client that goes away cancels its query
        wait_until(lambda: nothing_held(server), timeout=30)
    finally:
        holder.close()


def _start_long_query(srv: ServerProcess, group: str) -> socket.socket:
    query = urllib.parse.urlencode(
        {"query": "SELECT sum(x * x) FROM long_sequence(100000000000)", "resource_group": group}
    )
    sock = socket.create_connection((srv.host, srv.http_port), 10)
    sock.sendall(f"GET /execute?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def test_exec_answers_in_questdb_shape(server: ServerProcess) -> None:
    status, body = get(server, "/exec", query="SELECT x, x * 0.5 AS half FROM long_sequence(2)")
    assert status == 200
    assert body["columns"] == [{"name": "x", "type": "LONG"}, {"name": "half", "type": "DOUBLE"}]
    assert body["dataset"] == [[1, 0.5], [2, 1.0]]
    assert body["count"] == 2
    assert body["query"].startswith("SELECT x")
    status, body = get(server, "/exec", query="SELEC")
    assert status == 400
    assert "error" in body


def test_metrics_parse_as_prometheus_text_and_health_answers(server: ServerProcess) -> None:
    get(server, "/execute", query="SELECT count(*) FROM long_sequence(10)")
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "resgroups_resource_group_active_queries" in families
    assert "resgroups_resource_groups_enabled" in families
    status, body = get(server, "/health")
    assert (status, body["status"], body["role"]) == (200, "ok", "primary")


# ---- hostile clients ---------------------------------------------------------------------


def _startup(user: bytes = b"fuzz") -> bytes:
    body = struct.pack("!i", 196608) + b"user\0" + user + b"\0\0"
    return struct.pack("!i", len(body) + 4) + body


def _messages(rng: random.Random) -> bytes:
    """A random mix of valid, truncated and garbled protocol messages."""
    choices = [
        lambda: b"Q" + struct.pack("!i", 4 + 9) + b"SELECT 1\0",
        lambda: b"Q" + struct.pack("!i", 2**30) + b"SELECT",  # a 1 GB claim
        lambda: b"Q" + struct.pack("!i", 2),  # a length below its own size
        lambda: b"P" + struct.pack("!i", 12) + b"\0SEL\0\xff\xff\xff",
        lambda: b"B" + struct.pack("!i", 10) + b"\0\0\x7f\xff\x00\x00",
        lambda: b"E" + struct.pack("!i", 6) + b"\0\0",
        lambda: b"D" + struct.pack("!i", 6) + b"Zx",
        lambda: b"S" + struct.pack("!i", 4),
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))),
        lambda: b"Q" + struct.pack("!i", 4 + 40) + b"SELECT count(*) FROM long_sequence(900)\0",
    ]
    return b"".join(rng.choice(choices)() for _ in range(rng.randrange(1, 8)))


def test_fuzzed_protocol_messages_cost_only_their_own_connection(server: ServerProcess) -> None:
    rng = random.Random(13)
    for i in range(150):
        with socket.create_connection((server.host, server.pg_port), 10) as sock:
            sock.settimeout(0.2)
            payload = (_startup() if i % 3 else b"") + _messages(rng)
            cut = rng.randrange(len(payload) + 1) if i % 5 == 0 else len(payload)
            try:
                sock.sendall(payload[:cut])
                sock.recv(65536)
            except OSError:
                pass  # the server may close first: that is its right
    with psycopg.connect(server.dsn("after"), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM long_sequence(100)").fetchone() == (100,)
    wait_until(lambda: nothing_held(server), timeout=30)


def test_two_thousand_idle_connections_do_not_stop_the_server(server: ServerProcess) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2000
    if soft < wanted + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted + 500), hard))
    idle: list[socket.socket] = []
    try:
        for i in range(wanted):
            sock = socket.create_connection((server.host, server.pg_port), 10)
            if i % 2:  # half logged in and idle, half silent before startup
                sock.sendall(_startup(b"idle"))
            idle.append(sock)
        with psycopg.connect(server.dsn("busy"), autocommit=True, connect_timeout=30) as conn:
            assert conn.execute("SELECT sum(x) FROM long_sequence(1000)").fetchone() == (500500,)
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    wait_until(lambda: nothing_held(server), timeout=30)
