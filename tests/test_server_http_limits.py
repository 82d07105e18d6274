"""``resgroups serve`` over HTTP under clients that would take the server from the
rest: a huge result streamed while others are answered, a reader that stops
reading, idle and half-sent connections, every general request thread pinned,
wrong passwords, a full connection cap, malformed bodies; /metrics behind the
admin's login; the engine's limits as command-line flags.

Every wait is bounded (socket timeouts, ``wait_until``); orderings are asserted
with events and counters, never with timings. A server that a regression
could make allocate without bound runs under an address-space limit.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import selectors
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from servers import ServerProcess, serving
from waiting import wait_until

import resgroups
from resgroups import cli
from resgroups.server.http import HttpFront
from resgroups.server.limits import LoginThrottle, RequestThreads

ADMIN_PASSWORD = "s3cret-admin"
ADMIN = ("admin", ADMIN_PASSWORD)
HUGE = "SELECT x, x * 2 AS y FROM long_sequence(10000000000)"  # never sent whole in a test
LONG = "SELECT sum(x * x) FROM long_sequence(100000000000)"  # runs until cancelled
GIB = 1024**3


# ---- clients -------------------------------------------------------------------------


def _headers(auth: tuple[str, str] | None) -> dict[str, str]:
    if auth is None:
        return {}
    token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def call(
    srv: ServerProcess,
    path: str,
    *,
    auth: tuple[str, str] | None = None,
    source: str | None = None,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str | None = None,
    **params: str,
) -> tuple[int, dict[str, str], Any]:
    """One request on a connection of its own (from ``source`` when given): the
    status, the headers and the body (parsed when it is JSON)."""
    conn = http.client.HTTPConnection(
        srv.host, srv.http_port, timeout=60, source_address=(source, 0) if source else None
    )
    try:
        headers = _headers(auth)
        if content_type:
            headers["Content-Type"] = content_type
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        conn.request(method, path + query, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read().decode("utf-8", "replace")
        kind = reply.headers.get("Content-Type", "")
        return reply.status, dict(reply.headers), json.loads(data) if "json" in kind else data
    finally:
        conn.close()


def raw_request(
    srv: ServerProcess,
    path: str,
    auth: tuple[str, str] | None = None,
    source: str | None = None,
    **params: str,
) -> socket.socket:
    """A GET sent on a raw socket, its answer left for the test to read (or not)."""
    sock = socket.create_connection(
        (srv.host, srv.http_port), 10, source_address=(source, 0) if source else None
    )
    sock.settimeout(60)
    lines = [f"GET {path}?{urllib.parse.urlencode(params)} HTTP/1.1", "Host: x"]
    lines += [f"{k}: {v}" for k, v in _headers(auth).items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def read_until(sock: socket.socket, marker: bytes, limit: int = 1 << 22) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before {marker!r}: {data[:300]!r}"
        data += chunk
        assert len(data) < limit, "marker not found"
    return data


def read_to_eof(sock: socket.socket) -> bytes:
    """Everything until the server closes (a socket timeout fails the test)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def groups(srv: ServerProcess, auth: tuple[str, str] | None = None) -> dict[str, dict[str, Any]]:
    status, _, body = call(srv, "/execute", auth=auth, query="SELECT * FROM resource_groups()")
    assert status == 200, body
    names = [c["name"] for c in body["columns"]]
    return {row[0]: dict(zip(names, row, strict=True)) for row in body["rows"]}


def nothing_held(srv: ServerProcess, auth: tuple[str, str] | None = None) -> bool:
    return all(
        g["active_queries"] == 0 and g["queued_queries"] == 0 and g["memory_used_bytes"] == 0
        for g in groups(srv, auth).values()
    )


def _ac_server(*args: str, address_space: int | None = None) -> Any:
    return serving(
        ["--access-control", *args],
        env={"RESGROUPS_ADMIN_PASSWORD": ADMIN_PASSWORD},
        address_space=address_space,
    )


# ---- item 4: a huge result is streamed off the event loop -------------------------------


@pytest.fixture(scope="module")
def capped() -> Iterator[ServerProcess]:
    """A server under a 3 GiB address-space limit, with tracked memory capped at
    256 MiB: a result built whole (or encoded whole) fails its test."""
    with serving(
        ["--workers", "2", "--process-memory-limit", "256MiB"],
        env={"MALLOC_ARENA_MAX": "2"},
        address_space=3 * GIB,
    ) as srv:
        yield srv


class _Reader(threading.Thread):
    """Reads a streamed response as fast as it comes, counting bytes."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(daemon=True)
        self.sock = sock
        self.received = 0
        self.head = b""
        self.started = threading.Event()  # the head and the first MiB of rows arrived
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return
                if len(self.head) < 4096:
                    self.head += chunk[:4096]
                self.received += len(chunk)
                if self.received > 1 << 20:
                    self.started.set()
        except OSError:
            pass


@pytest.mark.parametrize("path", ["/exec", "/execute"])
def test_others_are_answered_on_both_listeners_while_a_huge_result_streams(
    capped: ServerProcess, path: str
) -> None:
    reader = _Reader(raw_request(capped, path, query=HUGE))
    reader.start()
    try:
        assert reader.started.wait(60), "the huge result did not start streaming"
        assert b"Transfer-Encoding: chunked" in reader.head
        # another client of each listener is answered while the stream goes on...
        with psycopg.connect(capped.dsn("other"), autocommit=True, connect_timeout=30) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        status, _, body = call(capped, "/execute", query="SELECT 1 AS one")
        assert (status, body["rows"]) == (200, [[1]])
        # ... which is still going after they were answered (10^10 rows cannot be done)
        answered_at = reader.received
        wait_until(lambda: reader.received > answered_at + (1 << 20), timeout=60)
        memory = groups(capped)["DEFAULT"]["memory_used_bytes"]
        assert memory <= 256 * 1024**2
    finally:
        reader.stopped.set()
        reader.sock.close()  # a client that goes away cancels its query
        reader.join(30)
    wait_until(lambda: nothing_held(capped), timeout=60)


def test_a_small_result_is_one_response_with_a_length(capped: ServerProcess) -> None:
    status, headers, body = call(capped, "/execute", query="SELECT x FROM long_sequence(3)")
    assert (status, body["rows"], body["status"]) == (200, [[1], [2], [3]], "SELECT 3")
    assert headers.get("Content-Length")
    assert "Transfer-Encoding" not in headers


def test_a_streamed_result_is_whole_and_valid_json(capped: ServerProcess) -> None:
    n = 300_000  # several chunks
    status, headers, body = call(capped, "/exec", query=f"SELECT x FROM long_sequence({n})")
    assert status == 200
    assert headers.get("Transfer-Encoding") == "chunked"
    assert body["count"] == n
    assert body["dataset"][0] == [1]
    assert body["dataset"][-1] == [n]
    status, _, body = call(
        capped, "/execute", query=f"CREATE RESOURCE GROUP s; SELECT x FROM long_sequence({n})"
    )
    assert (status, len(body["rows"]), body["status"]) == (200, n, f"SELECT {n}")
    assert set(body["timings"]) >= {"wait_ms", "total_ms", "cpu_ms"}


def test_an_error_after_the_stream_began_ends_the_document_with_it() -> None:
    # the timeout must fall after the first rows are sent: on a loaded machine a
    # second may pass before they are (a 504 then: the stream had not begun), so a
    # longer timeout is tried, each on its own server
    for timeout in ("1", "3", "10"):
        with serving(["--workers", "2", "--query-timeout", timeout]) as srv:
            status, _, body = call(srv, "/execute", query=HUGE)
            wait_until(lambda: nothing_held(srv), timeout=30)
        if status != 504:
            break
    assert status == 200  # sent before the error was known
    assert body["error"]["sqlstate"] == "57014"
    assert "timeout" in body["error"]["message"]
    assert body["rows"]
    assert "status" not in body


# ---- item 3: nothing held past a deadline ------------------------------------------------


def test_a_reader_that_stops_reading_is_cut_at_its_query_timeout() -> None:
    with serving(["--workers", "2", "--query-timeout", "2"]) as srv:
        sock = raw_request(srv, "/exec", query=HUGE)
        read_until(sock, b'"dataset":[')  # then it reads nothing more
        wait_until(lambda: groups(srv)["DEFAULT"]["active_queries"] == 0, timeout=60)
        wait_until(lambda: nothing_held(srv), timeout=60)
        sock.settimeout(30)
        rest = read_to_eof(sock)  # what the kernel buffered, then the cut
        assert not rest.endswith(b"0\r\n\r\n"), "a cut response must not look complete"
        sock.close()


def test_idle_and_half_sent_http_connections_are_closed_after_the_keepalive_timeout() -> None:
    with serving(["--http-keepalive-timeout", "1"]) as srv:
        silent = socket.create_connection((srv.host, srv.http_port), 10)
        partial = socket.create_connection((srv.host, srv.http_port), 10)
        partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow:")  # never ends its headers
        kept = socket.create_connection((srv.host, srv.http_port), 10)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # keep-alive, then idle
        many = [socket.create_connection((srv.host, srv.http_port), 10) for _ in range(1000)]
        try:
            for sock in (silent, partial, kept):
                sock.settimeout(60)
            assert read_to_eof(silent) == b""
            cut = read_to_eof(partial)
            assert cut == b"" or b" 408 " in cut
            assert b"200 OK" in read_to_eof(kept)
            # a thousand idle ones are all closed by the server too
            selector = selectors.DefaultSelector()
            for sock in many:
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            open_ = set(many)
            while open_:
                ready = selector.select(timeout=60)
                assert ready, f"{len(open_)} idle connections still open"
                for key, _ in ready:
                    closed = key.fileobj
                    assert isinstance(closed, socket.socket)
                    try:
                        data = closed.recv(1024)
                    except ConnectionResetError:
                        data = b""
                    assert data == b""
                    selector.unregister(closed)
                    open_.discard(closed)
            status, _, body = call(srv, "/health")
            assert (status, body["status"]) == (200, "ok")
        finally:
            for sock in (silent, partial, kept, *many):
                sock.close()


def _answered(socks: list[socket.socket], within: float) -> dict[socket.socket, bytes]:
    """What each of ``socks`` received before the server closed it, for those it
    closed within ``within`` seconds (the others are still held open)."""
    got: dict[socket.socket, bytes] = {s: b"" for s in socks}
    closed: dict[socket.socket, bytes] = {}
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + within
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(min(left, 0.5)):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    got[sock] += chunk
                else:
                    selector.unregister(sock)
                    closed[sock] = got[sock]
    return closed


def test_at_the_socket_cap_a_flooding_address_is_refused_and_a_lighter_one_gets_room() -> None:
    flooder = "127.0.0.2"
    with serving(["--max-http-sockets", "64"]) as srv:
        # a request in progress from the flooding address is never closed for room
        busy = raw_request(srv, "/execute", source=flooder, query=LONG)
        wait_until(lambda: groups(srv)["DEFAULT"]["active_queries"] == 1, timeout=30)
        idle = [
            socket.create_connection((srv.host, srv.http_port), 10, source_address=(flooder, 0))
            for _ in range(300)
        ]
        try:
            # past the cap an address replaces its own idle sockets at most 20 times a
            # second; the rest are refused at once with 503 and 53300, nothing parsed
            closed = _answered(idle, within=5.0)
            refused = [data for data in closed.values() if data]
            assert len(refused) >= 150, (len(refused), len(closed))
            for data in refused:
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503"), head
                error = json.loads(body)["error"]
                assert error["sqlstate"] == "53300"
                assert "too many connections from this address" in error["message"]
            assert any(not data for data in closed.values())  # oldest idle ones replaced
            # an address holding fewer gets room at once: a flooder's idle socket closes
            status, _, body = call(srv, "/execute", query="SELECT 1 AS one")
            assert (status, body["rows"]) == (200, [[1]])
            assert groups(srv)["DEFAULT"]["active_queries"] == 1  # the busy one still runs
        finally:
            busy.close()
            for sock in idle:
                sock.close()
        wait_until(lambda: nothing_held(srv), timeout=30)


# ---- item 5: the admin always gets in ----------------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerProcess]:
    """Access control on, four general request threads, alice and bob."""
    with _ac_server("--request-threads", "4", "--query-timeout", "300") as srv:
        for sql in (
            "CREATE USER alice WITH PASSWORD 'wonder land'",
            "CREATE USER bob WITH PASSWORD 'builder'",
            "CREATE RESOURCE GROUP narrow WITH (max_active_queries = 1, "
            "max_queued_queries = 100, queue_timeout = '300s')",
            "GRANT USE ON RESOURCE GROUP narrow TO alice",
        ):
            status, _, body = call(srv, "/execute", auth=ADMIN, query=sql)
            assert status == 200, body
        yield srv


ALICE = ("alice", "wonder land")


def test_the_admin_is_served_while_every_general_request_thread_is_pinned(
    guarded: ServerProcess,
) -> None:
    blockers = [
        raw_request(guarded, "/execute", ALICE, query=LONG, resource_group="narrow")
        for _ in range(4)
    ]  # one runs, three queue: four request threads held
    waiting: socket.socket | None = None
    try:
        wait_until(
            lambda: (
                groups(guarded, ADMIN)["narrow"]["active_queries"] == 1
                and groups(guarded, ADMIN)["narrow"]["queued_queries"] == 3
            ),
            timeout=60,
        )
        waiting = raw_request(guarded, "/execute", ALICE, query="SELECT 1 AS one")
        # every general thread is held: the admin still gets answers
        status, _, body = call(guarded, "/execute", auth=ADMIN, query="SELECT 2 AS two")
        assert (status, body["rows"]) == (200, [[2]])
        assert groups(guarded, ADMIN)["narrow"]["queued_queries"] == 3
        status, _, text = call(guarded, "/metrics", auth=ADMIN)
        assert status == 200
        assert "resgroups_resource_group_active_queries" in text
        status, _, state = call(guarded, "/api/state", auth=ADMIN)
        assert status == 200
        assert state["groups"]
        # alice's request, sent before those, is still waiting for a thread
        waiting.setblocking(False)
        with pytest.raises(BlockingIOError):
            waiting.recv(1)
        waiting.settimeout(60)
    finally:
        for sock in blockers:
            sock.close()  # their queries are cancelled, their threads come back
    assert waiting is not None
    answer = read_until(waiting, b"}]")
    assert b"200 OK" in answer
    assert b'"rows":[[1]]' in answer
    waiting.close()
    wait_until(lambda: nothing_held(guarded, ADMIN), timeout=60)


def test_wrong_passwords_from_one_address_are_throttled_before_any_hash(
    guarded: ServerProcess,
) -> None:
    attacker, neighbour = "127.0.0.2", "127.0.0.3"
    for _ in range(5):
        status, _, body = call(guarded, "/execute", auth=("bob", "wrong"), source=attacker,
                               query="SELECT 1")  # fmt: skip
        assert (status, body["error"]["sqlstate"]) == (401, "28P01")
    status, headers, body = call(
        guarded, "/execute", auth=("bob", "wrong"), source=attacker, query="SELECT 1"
    )
    assert status == 429
    assert int(headers["Retry-After"]) >= 1
    assert body["error"]["sqlstate"] == "28000"
    # throttled means refused before the password is looked at: the right one too
    status, _, _ = call(guarded, "/execute", auth=("bob", "builder"), source=attacker,
                        query="SELECT 1")  # fmt: skip
    assert status == 429
    status, _, body = call(guarded, "/metrics", auth=("bob", "builder"), source=attacker)
    assert status == 429
    # another address is not affected
    status, _, body = call(guarded, "/execute", auth=("bob", "builder"), source=neighbour,
                           query="SELECT 1 AS one")  # fmt: skip
    assert (status, body["rows"]) == (200, [[1]])


def test_metrics_need_an_admin_login_with_access_control_on(guarded: ServerProcess) -> None:
    status, headers, body = call(guarded, "/metrics")
    assert (status, body["error"]["sqlstate"]) == (401, "28P01")
    assert headers["WWW-Authenticate"].startswith("Basic")
    status, _, body = call(guarded, "/metrics", auth=ALICE)
    assert (status, body["error"]["sqlstate"]) == (403, "42501")
    status, _, text = call(guarded, "/metrics", auth=ADMIN)
    assert status == 200
    assert "resgroups_resource_groups_enabled" in text


def test_metrics_open_leaves_metrics_to_a_scraper() -> None:
    with _ac_server("--metrics-open") as srv:
        status, _, text = call(srv, "/metrics")
        assert status == 200
        assert "resgroups_resource_groups_enabled" in text
        status, _, body = call(srv, "/execute", query="SELECT 1")
        assert (status, body["error"]["sqlstate"]) == (401, "28P01")


def test_a_warning_at_start_when_the_admin_has_no_password() -> None:
    with serving(["--access-control"]) as srv:
        wait_until(lambda: any("has no password" in line for line in srv.stderr), timeout=30)
    with _ac_server() as srv:
        status, _, _ = call(srv, "/health")
        assert status == 200
        assert not any("has no password" in line for line in srv.stderr)


def test_the_connection_cap_keeps_a_reserve_for_the_admin() -> None:
    # four connections, three of them reserved: alice's second request is refused
    with _ac_server("--max-connections", "4", "--query-timeout", "300") as srv:
        status, _, _ = call(srv, "/execute", auth=ADMIN,
                            query="CREATE USER alice WITH PASSWORD 'wonder land'")  # fmt: skip
        assert status == 200
        holder = raw_request(srv, "/execute", ALICE, query=LONG)
        try:
            # watched through /metrics, which takes no connection slot: an admin's
            # /execute in flight would count against the cap (as in PostgreSQL)
            wait_until(lambda: _active_default(srv) == 1, timeout=60)
            status, _, body = call(srv, "/execute", auth=ALICE, query="SELECT 1")
            assert (status, body["error"]["sqlstate"]) == (503, "53300")
            assert "reserved" in body["error"]["message"]
            status, _, body = call(srv, "/execute", auth=ADMIN, query="SELECT 1 AS one")
            assert (status, body["rows"]) == (200, [[1]])
        finally:
            holder.close()
        wait_until(lambda: nothing_held(srv, ADMIN), timeout=60)
        # the holder's slot comes back once its request thread is done, just after
        # its query gave back what it held: then alice gets in again
        wait_until(lambda: call(srv, "/execute", auth=ALICE, query="SELECT 1")[0] == 200, 60)


def test_the_admin_port_serves_only_resource_group_admins_on_a_loop_of_its_own() -> None:
    with _ac_server("--admin-port", "0", "--request-threads", "2", "--query-timeout", "300") as srv:
        assert srv.admin_port is not None
        assert srv.admin_port not in (srv.pg_port, srv.http_port)
        port = str(srv.admin_port)
        admin = psycopg.connect(srv.dsn(*ADMIN, port=port), autocommit=True, connect_timeout=30)
        admin.execute("CREATE USER alice WITH PASSWORD 'wonder land'")
        admin.execute("CREATE USER ops WITH PASSWORD 'ops'")
        admin.execute("GRANT RESOURCE GROUP ADMIN TO ops")
        # anyone else is refused there, even with the right password: FATAL 42501
        with pytest.raises(psycopg.OperationalError, match=r"Access denied for alice"):
            psycopg.connect(srv.dsn(*ALICE, port=port), connect_timeout=30)
        with psycopg.connect(srv.dsn("ops", "ops", port=port), connect_timeout=30) as ops:
            assert ops.execute("SELECT count(*) FROM resource_groups()").fetchone() == (1,)
        # both general request threads pinned by alice's queries on the main listeners:
        # the admin port answers, and its queries' cancels work there
        holders = [raw_request(srv, "/execute", ALICE, query=LONG) for _ in range(2)]
        try:
            wait_until(lambda: _active_default(srv) == 2, timeout=60)
            rows = admin.execute("SELECT active_queries FROM resource_groups()").fetchall()
            assert rows == [(2,)]
            outcome: list[BaseException] = []

            def long_query() -> None:
                try:
                    admin.execute(LONG)
                except psycopg.Error as exc:
                    outcome.append(exc)

            running = threading.Thread(target=long_query)
            running.start()
            wait_until(lambda: _active_default(srv) == 3, timeout=60)
            admin.cancel()
            running.join(60)
            assert [type(e) for e in outcome] == [psycopg.errors.QueryCanceled]
        finally:
            for holder in holders:
                holder.close()
        wait_until(lambda: nothing_held(srv, ADMIN), timeout=60)
    # the server stopped with the admin's connection open (and exited 0): it was ended
    with pytest.raises(psycopg.OperationalError):
        admin.execute("SELECT 1")
    admin.close()


def _active_default(srv: ServerProcess) -> float:
    status, _, text = call(srv, "/metrics", auth=ADMIN)
    assert status == 200
    for family in text_string_to_metric_families(text):
        if family.name == "resgroups_resource_group_active_queries":
            for sample in family.samples:
                if sample.labels.get("resource_group") == "DEFAULT":
                    return sample.value
    raise AssertionError("no active_queries sample for DEFAULT")


# ---- item 6: malformed requests are 400 ---------------------------------------------------


@pytest.fixture(scope="module")
def plain() -> Iterator[ServerProcess]:
    with serving(["--workers", "2"]) as srv:
        yield srv


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"SELECT '\xff\xfe'", "text/plain"),
        (b"SELECT 1", "text/plain; charset=klingon"),
        (b"SELECT 1", "text/plain; charset=utf-7x"),
        (DEEP, "application/json"),
        (b'{"query": ' + DEEP + b"}", "application/json"),
        (b'{"query": 5}', "application/json"),
        (b'["SELECT 1"]', "application/json"),
        (b'{"query": "SELECT 1"', "application/json"),
        (b'{"query": "\xff"}', "application/json"),
        (b"query=%ff%fe", "application/x-www-form-urlencoded"),
        (b"", "text/plain"),
    ],
)
@pytest.mark.parametrize("path", ["/execute", "/exec"])
def test_malformed_bodies_are_400_without_an_install_path(
    plain: ServerProcess, path: str, body: bytes, content_type: str
) -> None:
    status, _, answer = call(plain, path, method="POST", body=body, content_type=content_type)
    assert status == 400, answer
    text = json.dumps(answer)
    assert "site-packages" not in text
    assert ".py" not in text
    assert "Traceback" not in text


def test_a_malformed_http_request_is_400(plain: ServerProcess) -> None:
    for request in (
        b"GET /execute?query=SELECT%201 HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /execute HTTP/9.9\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\0" * 64,  # a TLS hello
    ):
        with socket.create_connection((plain.host, plain.http_port), 10) as sock:
            sock.settimeout(30)
            sock.sendall(request)
            assert read_to_eof(sock).split(b"\r\n")[0].endswith(b" 400 Bad Request")
    status, _, body = call(plain, "/execute", query="SELECT 1 AS one")
    assert (status, body["rows"]) == (200, [[1]])


@pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed: apt-get install curl"
)
def test_curl_gets_400_for_a_body_that_is_not_utf8(plain: ServerProcess) -> None:
    done = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30",
         "--data-binary", "SELECT '\xff'".encode("latin-1"), f"{plain.url}/execute"],
        capture_output=True, timeout=60,
    )  # fmt: skip
    assert done.stdout == b"400"


# ---- item 7: the engine's limits from the command line -----------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--query-timeout", "0"], "--query-timeout"),
        (["--query-timeout", "soon"], "--query-timeout"),
        (["--query-memory-limit", "-5"], "--query-memory-limit"),
        (["--query-memory-limit", "12parsecs"], "--query-memory-limit"),
        (["--process-memory-limit", "1.5B"], "--process-memory-limit"),
        (["--slice-ms", "0"], "--slice-ms"),
        (["--slice-ms", "inf"], "--slice-ms"),
        (["--fleet-admission", "sometimes"], "--fleet-admission"),
        (["--instance-id", ""], "--instance-id"),
        (["--workers", "0"], "--workers"),
        (["--max-connections", "0"], "--max-connections"),
        (["--request-threads", "99999"], "--request-threads"),
        (["--http-keepalive-timeout", "-1"], "--http-keepalive-timeout"),
        (["--max-http-sockets", "2"], "--max-http-sockets"),
        (["--admin-port", "70000"], "--admin-port"),
        (["--pg-port", "-1"], "--pg-port"),
    ],
)
def test_a_bad_flag_value_names_the_flag_and_exits_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err
    assert "expected" in err or "choose from" in err
    assert "Traceback" not in err


def test_quota_admission_without_coordination_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["serve", "--fleet-admission", "quota"]) == 2
    err = capsys.readouterr().err
    assert "--fleet-admission" in err
    assert "--coordination" in err


def test_the_shell_applies_the_limits_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    status = cli.main(
        ["shell", "--query-memory-limit", "1MiB", "--query-timeout", "none", "--slice-ms", "5",
         "-c", "SELECT x FROM long_sequence(10000000) ORDER BY x LIMIT 1"]
    )  # fmt: skip
    assert status == 1
    captured = capsys.readouterr()
    assert "53200" in captured.out + captured.err


def test_serve_applies_its_query_timeout() -> None:
    with serving(["--query-timeout", "1", "--process-memory-limit", "1GiB"]) as srv:
        status, _, body = call(srv, "/execute", query=LONG)
        assert (status, body["error"]["sqlstate"]) == (504, "57014")
        assert "timeout=1.0s" in body["error"]["message"]


def test_a_throttled_login_computes_no_password_hash() -> None:
    """In process, with the throttle's clock in the test's hands: while an address
    is throttled its logins never reach the authenticator; once the window has
    moved on they do again."""
    now = [0.0]
    throttle = LoginThrottle(free=3, window_s=10.0, clock=lambda: now[0])
    engine = resgroups.Engine(access_control=True, admin_password=ADMIN_PASSWORD)
    threads = RequestThreads(2)
    checked: list[str] = []
    login = engine.authenticator.login

    def counting(snap: Any, name: str, password: str | None) -> Any:
        checked.append(name)
        return login(snap, name, password)

    engine.authenticator.login = counting  # type: ignore[method-assign]
    front = HttpFront(engine, threads, throttle=throttle)

    async def scenario() -> list[int]:
        statuses = []
        async with TestClient(TestServer(front.app)) as client:
            wrong = _headers(("admin", "wrong"))
            for _ in range(8):
                reply = await client.get("/execute", params={"query": "SELECT 1"}, headers=wrong)
                statuses.append(reply.status)
            assert len(checked) == 3  # the first three were hashed, the rest refused before
            now[0] += 10.5  # the window moves on
            right = _headers(ADMIN)
            reply = await client.get("/execute", params={"query": "SELECT 1"}, headers=right)
            statuses.append(reply.status)
        return statuses

    try:
        statuses = asyncio.run(asyncio.wait_for(scenario(), 60))
    finally:
        threads.shutdown()
        engine.close()
    assert statuses == [401, 401, 401, 429, 429, 429, 429, 429, 200]
    assert len(checked) == 4


def test_identical_logins_in_flight_together_cost_one_hash() -> None:
    """In process: 16 keep-alive clients opening at once with one login (wrk, a
    pool warming up) wait for the first one's password check instead of each
    hashing; a wrong password is still a failure for every one of them."""
    engine = resgroups.Engine(access_control=True, admin_password=ADMIN_PASSWORD)
    threads = RequestThreads(16)
    checked: list[str] = []
    release = threading.Event()
    login = engine.authenticator.login

    def counting(snap: Any, name: str, password: str | None) -> Any:
        checked.append(name)
        assert release.wait(30), "the test never let the check finish"
        return login(snap, name, password)

    engine.authenticator.login = counting  # type: ignore[method-assign]
    front = HttpFront(engine, threads, throttle=LoginThrottle(free=100))
    arrived = [0]

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        arrived[0] += 1
        return await handler(request)  # type: ignore[no-any-return]

    front.app.middlewares.append(count)

    async def herd(client: TestClient, auth: tuple[str, str], n: int) -> list[int]:
        release.clear()
        before = arrived[0]

        async def one() -> int:
            reply = await client.get(
                "/execute", params={"query": "SELECT 1"}, headers=_headers(auth)
            )
            return reply.status

        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        async with asyncio.timeout(30):
            while arrived[0] < before + n:  # each request runs up to its wait once it arrived
                await asyncio.sleep(0.01)
        release.set()
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))

    async def scenario() -> tuple[list[int], list[int]]:
        async with TestClient(TestServer(front.app)) as client:
            right = await herd(client, ADMIN, 16)
            assert len(checked) == 1
            wrong = await herd(client, ("admin", "wrong"), 8)
            return right, wrong

    try:
        right, wrong = asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        release.set()
        threads.shutdown()
        engine.close()
    assert right == [200] * 16
    assert wrong == [401] * 8
    assert len(checked) == 2  # one hash for each herd
