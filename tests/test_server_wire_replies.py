"""Replies of the wire protocol's request threads: in order, whoever sends them.

A request thread sends a burst's reply on the socket itself and goes on with
the messages that arrived meanwhile; what the socket does not take at once
goes to the event loop, which drains it before any later reply. These tests
pipeline bursts without reading, so replies race the messages behind them.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pytest
from pgraw import (
    SYNC,
    Node,
    RawClient,
    bind,
    cancel,
    describe_statement,
    errors,
    execute,
    key_data,
    parse,
    query,
    wire_node,
)
from waiting import wait_until

INT8 = 20


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with wire_node("--workers", "2", "--threads", "4") as n:
        yield n


@pytest.fixture
def raw(node: Node) -> Iterator[RawClient]:
    client = RawClient(node.port)
    assert client.login()[-1].kind == b"Z"
    yield client
    client.close()


def active_queries(node: Node) -> int:
    with psycopg.connect(node.dsn("admin"), connect_timeout=10, autocommit=True) as conn:
        row = conn.execute("SELECT sum(active_queries) FROM resource_groups()").fetchone()
        return int(row[0]) if row and row[0] is not None else 0


def _values(client: RawClient, bursts: int) -> list[bytes]:
    """The first column of every DataRow up to the ``bursts``-th ReadyForQuery."""
    values: list[bytes] = []
    for _ in range(bursts):
        for reply in client.until_ready():
            assert reply.kind != b"E", reply.fields
            if reply.kind == b"D":
                (length,) = struct.unpack_from("!i", reply.body, 2)
                values.append(reply.body[6 : 6 + length])
    return values


def test_pipelined_simple_and_extended_bursts_are_answered_in_order(raw: RawClient) -> None:
    bursts = []
    for n in range(300):
        if n % 2:
            bursts.append(query(f"SELECT {n}"))
        else:
            bursts.append(parse("SELECT $1::bigint") + bind([str(n).encode()]) + execute() + SYNC)
    raw.send(*bursts)  # all of them before reading any reply
    assert _values(raw, len(bursts)) == [str(n).encode() for n in range(300)]


def test_a_burst_that_arrives_while_a_query_runs_is_answered_after_it(node: Node) -> None:
    client = RawClient(node.port)
    try:
        pid, secret = key_data(client.login())
        client.send(query("SELECT 1"))  # the replies after the first go to the socket direct
        assert _values(client, 1) == [b"1"]
        client.send(query("SELECT sum(x * x) FROM long_sequence(100000000000)"))
        wait_until(lambda: active_queries(node) == 1, timeout=30)
        client.send(query("SELECT 2"))  # reaches the thread that runs the query
        cancel(node.port, pid, secret)
        assert [e[1] for e in errors(client.until_ready())] == ["57014"]
        assert _values(client, 1) == [b"2"]
    finally:
        client.close()
    wait_until(lambda: active_queries(node) == 0, timeout=30)


def test_a_reply_the_socket_does_not_take_at_once_comes_whole_before_the_next() -> None:
    with wire_node("--workers", "2", "--threads", "4") as n:
        client = RawClient(n.port, rcvbuf=4096)  # the server's sends fill it at once
        try:
            assert client.login()[-1].kind == b"Z"
            rows = 12_000  # about 190 kB: one reply, handed over in one piece
            client.send(
                query(f"SELECT x FROM long_sequence({rows})"),
                query("SELECT 'after'"),
                query("SELECT 'last'"),
            )
            values = _values(client, 3)
            assert values == [str(x).encode() for x in range(1, rows + 1)] + [b"after", b"last"]
        finally:
            client.close()


def test_an_unnamed_statement_parsed_again_is_typed_again(raw: RawClient) -> None:
    for _ in range(3):  # the same text each time, as pgbench -M extended sends it
        raw.send(parse("SELECT * FROM long_sequence($1)"), describe_statement(), SYNC)
        replies = raw.until_ready()
        description = next(r for r in replies if r.kind == b"t")
        assert struct.unpack("!Hi", description.body) == (1, INT8)
    for _ in range(2):  # a text that does not parse is refused every time
        raw.send(parse("SELECT FROM FROM $1"), bind([b"1"]), execute(), SYNC)
        assert [e[1] for e in errors(raw.until_ready())] == ["42601"]


def test_a_burst_after_an_error_is_answered_and_the_connection_goes_on(raw: RawClient) -> None:
    raw.send(
        query("SELECT 1/0"),
        parse("SELECT $1::bigint") + bind([b"7"]) + execute() + SYNC,
        query("SELECT 8"),
    )
    first = raw.until_ready()
    assert [e[1] for e in errors(first)] == ["22012"]
    assert _values(raw, 2) == [b"7", b"8"]
