"""The wire protocol's phases in this process: what a test can only see from inside
(a bug's answer, the socket options, a parse ended by a disconnect).

The server is a :class:`~resgroups.server.pgwire.Backend` on an event loop of
its own thread, with a real engine; clients are psycopg and raw sockets.
Nothing here can allocate without bound (the unbounded cases run under
RLIMIT_AS in ``test_server_wire_limits.py``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from pgraw import RawClient, errors, query
from waiting import wait_until

from resgroups import Engine
from resgroups.server import pg_simple
from resgroups.server.pg_framing import Framing
from resgroups.server.pg_state import TxStatus
from resgroups.server.pgwire import Backend, Connection


class Running:
    def __init__(self) -> None:
        self.engine = Engine(workers=2)
        self.threads = ThreadPoolExecutor(4)
        self.backend = Backend(self.engine, self.threads)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.port = 0

        async def main() -> None:
            self.server = await asyncio.start_server(self.backend.handle, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            started.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(main(), self.loop).result(30)
        assert started.wait(30)

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=analyst dbname=x",
            autocommit=True,
            connect_timeout=10,
        )

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for conn in list(self.backend.connections.values()):
                conn.writer.transport.abort()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.engine.close(1.0)
        self.threads.shutdown(wait=True)
        self.loop.close()


@pytest.fixture
def running() -> Iterator[Running]:
    r = Running()
    yield r
    r.close()


def test_a_bug_in_a_simple_query_is_xx000_then_ready_and_names_no_file(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = pg_simple.SimpleQuery.run

    def broken(self: Connection, plan: Any, *args: Any, **kw: Any) -> None:
        if "boom" in repr(plan):
            raise RuntimeError("/usr/lib/python3/site-packages/secret.py: broke")
        original(self, plan, *args, **kw)

    monkeypatch.setattr(pg_simple.SimpleQuery, "run", broken)
    with running.connect() as conn:
        with pytest.raises(psycopg.errors.InternalError_) as info:
            conn.execute("SELECT 'boom' AS x")
        assert "RuntimeError" in str(info.value)
        assert "/" not in str(info.value)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # ReadyForQuery came
    client = RawClient(running.port)  # the simple query protocol, as psql sends it
    client.login()
    client.send(query("SELECT 'boom' AS x"))
    replies = client.until_ready()
    assert [(e[0], e[1]) for e in errors(replies)] == [("ERROR", "XX000")]
    assert replies[-1].kind == b"Z"
    client.close()


def test_wire_sockets_have_tcp_keepalive(running: Running) -> None:
    with running.connect() as conn:
        pid = conn.info.backend_pid
        wait_until(lambda: pid in running.backend.connections)  # registered after its login
        sock = running.backend.connections[pid].writer.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        if hasattr(socket, "TCP_KEEPIDLE"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 60


def test_a_long_parse_ends_when_the_client_disconnects(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = threading.Event()
    original = Framing.check_interrupt

    def watched(self: Connection) -> None:
        try:
            original(self)
        except ConnectionError:
            ended.set()
            raise

    monkeypatch.setattr(Framing, "check_interrupt", watched)
    client = RawClient(running.port)
    client.login()
    started = threading.Event()
    parsing = Connection.parse_text

    def announce(self: Connection, *args: Any) -> Any:
        started.set()
        return parsing(self, *args)

    monkeypatch.setattr(Connection, "parse_text", announce)
    client.send(query("SELECT " + ", ".join(["1"] * 300_000)))  # about 10 s of parsing
    assert started.wait(30)
    client.close()
    assert ended.wait(30)  # the parse ended at its next check, long before its end


def test_the_transaction_status_is_an_enum_through_a_block(running: Running) -> None:
    client = RawClient(running.port)
    client.login()
    statuses = []
    for text in ("BEGIN", "SELECT 1/0", "SELECT 1", "ROLLBACK"):
        client.send(query(text))
        replies = client.until_ready()
        statuses.append(replies[-1].body)
    assert statuses == [b"T", b"E", b"E", b"I"]
    (conn,) = running.backend.connections.values()
    assert conn.tx is TxStatus.IDLE
    client.close()
