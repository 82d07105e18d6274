"""What a wire client can cost the server, and what it always gets back (issue 28).

Every server here is ``tests/programs/wire_node.py`` in its own process under
an address-space limit (``pgraw.ADDRESS_SPACE``): a message that makes the
server allocate without bound fails the test with a dead node instead of
exhausting the machine. Every read has a timeout; waits are bounded polls.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import psycopg
import psycopg.errors
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
    msg,
    parse,
    query,
    startup_packet,
    wire_node,
)
from waiting import wait_until

NUMERIC, TIMESTAMPTZ = 1700, 1184


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with wire_node("--workers", "2", "--threads", "4") as n:
        yield n


def connect(n: Node, user: str = "analyst", **kw: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(n.dsn(user), connect_timeout=10, autocommit=True, **kw)


def groups(n: Node) -> dict[str, dict[str, Any]]:
    with connect(n, "admin") as conn:
        cur = conn.execute("SELECT * FROM resource_groups()")
        names = [d.name for d in cur.description or ()]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def nothing_held(n: Node) -> bool:
    return all(
        g["active_queries"] == 0 and g["queued_queries"] == 0 and g["memory_used_bytes"] == 0
        for g in groups(n).values()
    )


def still_serves(n: Node) -> None:
    with connect(n) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.fixture
def raw(node: Node) -> Iterator[RawClient]:
    client = RawClient(node.port)
    assert client.login()[-1].kind == b"Z"
    yield client
    client.close()


def extended(client: RawClient, *messages: bytes) -> list[Any]:
    client.send(*messages, SYNC)
    return client.until_ready()


# ---- bounded work per message ----------------------------------------------------------


@pytest.mark.parametrize("number", ["2147483648", "100000000", "65536", "9" * 5000])
def test_a_placeholder_beyond_65535_is_refused_before_anything_is_built(
    node: Node, raw: RawClient, number: str
) -> None:
    replies = extended(raw, parse(f"SELECT ${number}"), describe_statement())
    assert [e[:2] for e in errors(replies)] == [("ERROR", "54000")]
    assert "at most 65535 parameters" in errors(replies)[0][2]
    assert replies[-1].kind == b"Z"
    still_serves(node)


def test_more_than_32767_placeholders_are_described_and_bound(node: Node) -> None:
    count = 40_000
    with connect(node) as conn:
        text = "SELECT count(*) FROM long_sequence(9) WHERE x IN (" + ", ".join(["%s"] * count)
        row = conn.execute(text + ")", list(range(count))).fetchone()
    assert row == (9,)


@pytest.mark.parametrize("value", ["1e999999999", "1e-999999999", "9" * 200_000])
def test_a_numeric_parameter_past_postgresql_precision_is_22003(
    node: Node, raw: RawClient, value: str
) -> None:
    replies = extended(
        raw, parse("SELECT $1 AS n", oids=[NUMERIC]), bind([value.encode()]), execute()
    )
    assert [e[1] for e in errors(replies)] == ["22003"]
    assert replies[-1].kind == b"Z"


def test_a_numeric_within_precision_is_taken(node: Node) -> None:
    with connect(node) as conn:
        row = conn.execute("SELECT %s AS n", [Decimal("-12345.678e-20")]).fetchone()
    assert row is not None
    assert float(row[0]) == pytest.approx(-1.2345678e-16)


def test_a_huge_binary_numeric_is_a_user_error(node: Node, raw: RawClient) -> None:
    groups_ = 20_000
    value = struct.pack("!hhHh", groups_, 32767, 0, 20_000) + struct.pack("!H", 9999) * groups_
    replies = extended(
        raw, parse("SELECT $1 AS n", oids=[NUMERIC]), bind([value], formats=[1]), execute()
    )
    assert [e[1] for e in errors(replies)] == ["22P03"]
    # 1e131068 is a numeric, but longer than a literal may be: a limit, not XX000
    big = struct.pack("!hhHh", 1, 32767, 0, 0) + struct.pack("!H", 1)
    replies = extended(
        raw, parse("SELECT $1 AS n", oids=[NUMERIC]), bind([big], formats=[1]), execute()
    )
    assert [e[1] for e in errors(replies)] == ["54000"]
    assert replies[-1].kind == b"Z"


def test_a_binary_timestamp_out_of_range_is_22008(node: Node, raw: RawClient) -> None:
    replies = extended(
        raw,
        parse("SELECT $1 AS t", oids=[TIMESTAMPTZ]),
        bind([struct.pack("!q", 2**63 - 1)], formats=[1]),
        execute(),
    )
    assert [e[:2] for e in errors(replies)] == [("ERROR", "22008")]
    assert replies[-1].kind == b"Z"


def test_an_unterminated_comment_is_answered_in_linear_time(node: Node, raw: RawClient) -> None:
    # 900 KB of "/*x": the quadratic lexer took 21 s for 48 KB of this
    raw.send(query("SET x = 1 " + "/*x" * 300_000))
    replies = raw.until_ready()
    assert [e[1] for e in errors(replies)] == ["42601"]
    raw.send(query("SELECT 1 /*" + " /*" * 300_000))
    assert [e[1] for e in errors(raw.until_ready())] == ["42601"]


def test_a_statement_longer_than_the_limit_is_54000(node: Node, raw: RawClient) -> None:
    raw.send(query("SELECT 1" + " " * 1_000_000))
    replies = raw.until_ready()
    assert [e[1] for e in errors(replies)] == ["54000"]
    replies = extended(raw, parse("SELECT 1" + " " * 1_000_000))
    assert [e[1] for e in errors(replies)] == ["54000"]


def test_parameter_values_longer_than_a_statement_are_54000(node: Node, raw: RawClient) -> None:
    replies = extended(raw, parse("SELECT $1 AS t"), bind([b"x" * 4_500_000]), execute())
    assert [e[1] for e in errors(replies)] == ["54000"]
    replies = extended(raw, parse("SELECT $1 AS t"), bind([b"y" * 1_200_000]), execute())
    assert [e[1] for e in errors(replies)] == ["54000"]  # the bound text is too long
    assert replies[-1].kind == b"Z"


def test_a_long_parse_ends_at_a_cancel(node: Node) -> None:
    client = RawClient(node.port, timeout=60)
    pid, secret = key_data(client.login())
    client.send(query("SELECT " + ", ".join(["1"] * 300_000)))  # 900 K characters
    cancelled = threading.Event()

    def cancel_soon() -> None:
        cancel(node.port, pid, secret)
        cancelled.set()

    threading.Thread(target=cancel_soon, daemon=True).start()
    replies = client.until_ready()
    assert cancelled.wait(30)
    client.close()
    # a cancel before the parse ends ends it (57014); on a fast machine the parse may
    # end first, and 300,000 select items are past PostgreSQL's 1,664 (54011):
    # either way an answer, in bounded time, and never an internal error
    assert [e[1] for e in errors(replies)] in (["57014"], ["54011"])


def test_prepared_statements_per_connection_are_capped(node: Node, raw: RawClient) -> None:
    messages = [parse(f"SELECT {i}", name=f"s{i}") for i in range(1000)]
    replies = extended(raw, *messages)
    assert errors(replies) == []
    replies = extended(raw, parse("SELECT 1000", name="s1000"))
    assert [e[1] for e in errors(replies)] == ["54000"]
    raw.send(query("DEALLOCATE ALL"))
    raw.until_ready()
    assert errors(extended(raw, parse("SELECT 1000", name="s1000"))) == []


def test_portals_per_connection_are_capped(node: Node, raw: RawClient) -> None:
    portals = [bind([], portal=f"p{i}") for i in range(1001)]
    replies = extended(raw, parse("SELECT 1 AS one"), *portals)
    assert [e[1] for e in errors(replies)] == ["54000"]
    assert "portals" in errors(replies)[0][2]
    raw.send(query("SELECT 2"))
    assert errors(raw.until_ready()) == []  # Sync closed them all


def test_nesting_past_the_parser_limit_is_54000(node: Node, raw: RawClient) -> None:
    raw.send(query("SELECT " + "abs(" * 5000 + "1" + ")" * 5000))
    assert [e[1] for e in errors(raw.until_ready())] == ["54000"]
    raw.send(query("SELECT " + "(" * 5000 + "1" + ")" * 5000))  # parentheses only: no depth
    assert errors(raw.until_ready()) == []
    replies = extended(raw, parse("SELECT " + "abs(" * 300 + "1" + ")" * 300), describe_statement())
    assert [e[1] for e in errors(replies)] == ["54000"]


def test_prepared_statements_are_charged_to_the_group_and_given_back(node: Node) -> None:
    client = RawClient(node.port)
    client.login()
    text = "SELECT 1 AS " + "x" * 100_000
    assert errors(extended(client, *[parse(text, name=f"p{i}") for i in range(20)])) == []
    used = groups(node)["DEFAULT"]["memory_used_bytes"]
    assert used >= 20 * 100_000
    client.send(query("DEALLOCATE p0"))
    client.until_ready()
    assert groups(node)["DEFAULT"]["memory_used_bytes"] < used
    client.close()
    wait_until(lambda: nothing_held(node), 30)


def test_prepared_statements_meet_the_process_memory_limit() -> None:
    with wire_node("--memory-limit", str(4 * 1024 * 1024)) as n:
        client = RawClient(n.port)
        client.login()
        text = "SELECT 1 AS " + "x" * 500_000
        replies = extended(client, *[parse(text, name=f"p{i}") for i in range(10)])
        assert [e[1] for e in errors(replies)] == ["53200"]
        assert "prepared statement memory limit" in errors(replies)[0][2]
        client.close()
        with psycopg.connect(n.dsn("admin"), autocommit=True, connect_timeout=10) as conn:
            wait_until(
                lambda: (
                    conn.execute("SELECT sum(memory_used_bytes) FROM resource_groups()").fetchone()
                    == (0,)
                ),
                30,
            )


# ---- every answer arrives -------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        msg(b"Q", b"SELECT '\xff\xfe'\0"),  # invalid UTF-8
        msg(b"Q", b"SELECT 1"),  # no terminating zero byte
        msg(b"y", b"whatever"),  # no such message type
    ],
    ids=["invalid-utf8", "missing-nul", "unknown-type"],
)
def test_a_protocol_violation_ends_the_connection_with_fatal_08p01(
    node: Node, message: bytes
) -> None:
    client = RawClient(node.port)
    client.login()
    client.send(message)
    replies = client.until_ready()
    assert [e[:2] for e in errors(replies)] == [("FATAL", "08P01")]
    assert client.closed()
    client.close()
    still_serves(node)


@pytest.mark.parametrize("count", ["1.5", "1e3", "99999999999999999999"])
def test_fetch_with_a_count_that_is_not_a_bigint_is_a_user_error(node: Node, count: str) -> None:
    with connect(node) as conn:
        conn.execute("DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(5)")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"FETCH {count} FROM c")
        assert info.value.sqlstate in ("42601", "22003")
        assert conn.execute("FETCH 2 FROM c").fetchall() == [(1,), (2,)]


def test_a_long_timezone_is_a_clear_error_in_set_and_at_startup(node: Node) -> None:
    with connect(node) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
            conn.execute(f"SET TimeZone = '{'x' * 5000}'")
        assert "at most 255" in str(info.value)
    client = RawClient(node.port)
    client.send(startup_packet({"user": "analyst", "TimeZone": "y" * 5000}))
    replies = client.until_ready()
    assert [e[:2] for e in errors(replies)] == [("FATAL", "22023")]
    assert "TimeZone" in errors(replies)[0][2]
    client.close()


def test_psql_gets_an_answer_to_every_error_and_no_path() -> None:
    psql = shutil.which("psql")
    assert psql is not None
    with wire_node() as n:
        script = "FETCH 1.5 FROM c;\nSET TimeZone = '" + "z" * 400 + "';\nSELECT 42 AS answer;\n"
        out = subprocess.run(
            [psql, "-X", "-h", "127.0.0.1", "-p", str(n.port), "-U", "analyst", "-d", "x"],
            input=script,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert " 42" in out.stdout
    assert out.stderr.count("ERROR:") == 2
    assert "/" not in out.stderr.replace("*/", "").replace("/*", "")


# ---- nothing held past a deadline ------------------------------------------------------


def ended_or_failed(client: RawClient, sqlstate: str) -> bool:
    """The query of a client that did not read ended one of two ways: while its
    thread waited on the socket (the server dropped the connection, the usual
    case) or while it computed rows (the error follows the rows sent so far)."""
    try:
        replies = client.until_ready()
    except (EOFError, ConnectionResetError):
        return True
    return [e[1] for e in errors(replies)] == [sqlstate] and replies[-1].kind == b"Z"


def test_a_client_that_stops_reading_is_failed_and_disconnected_by_its_deadline() -> None:
    # a 4 s deadline leaves seconds for the other client below to be served and see
    # the query running before it (a few hundred ms on a quiet machine)
    with wire_node("--query-timeout", "4", "--workers", "2", "--threads", "2") as n:
        stuck = RawClient(n.port, timeout=60, rcvbuf=4096)
        stuck.login()
        stuck.send(query("SELECT x, x * 2 AS y FROM long_sequence(100000000)"))

        def running() -> bool:
            return groups(n)["DEFAULT"]["active_queries"] == 1

        wait_until(running, 30)
        # while it is stuck, another client is served, and sees it running
        with connect(n) as conn:
            assert conn.execute("SELECT count(*) FROM long_sequence(1000)").fetchone() == (1000,)
            assert conn.execute("SELECT active_queries FROM resource_groups()").fetchone() == (1,)
        wait_until(lambda: nothing_held(n), 30)  # at its deadline: failed, all given back
        assert ended_or_failed(stuck, "57014")  # read only now: it never read
        # its worker and its request thread are back: two clients at once are served
        with connect(n) as a, connect(n) as b:
            assert a.execute("SELECT count(*) FROM long_sequence(10)").fetchone() == (10,)
            assert b.execute("SELECT count(*) FROM long_sequence(20)").fetchone() == (20,)
        stuck.close()


def test_a_cancel_ends_a_query_whose_client_stopped_reading() -> None:
    with wire_node("--query-timeout", "600", "--threads", "2") as n:
        stuck = RawClient(n.port, timeout=60, rcvbuf=4096)
        pid, secret = key_data(stuck.login())
        stuck.send(query("SELECT x FROM long_sequence(100000000)"))
        wait_until(lambda: groups(n)["DEFAULT"]["active_queries"] == 1, 30)
        cancel(n.port, pid, secret)
        wait_until(lambda: nothing_held(n), 30)
        assert ended_or_failed(stuck, "57014")
        stuck.close()


def test_clients_that_never_read_a_fetch_pin_no_request_thread() -> None:
    with wire_node("--threads", "1", "--write-timeout", "600") as n:
        stuck = []
        for _ in range(4):
            client = RawClient(n.port, timeout=60, rcvbuf=4096)
            client.login()
            client.send(
                query(
                    "DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(200000);"
                    "FETCH ALL FROM c"
                )
            )
            stuck.append(client)
        with connect(n) as conn:  # one request thread, and it is free
            for _ in range(3):
                assert conn.execute("SELECT count(*) FROM long_sequence(7)").fetchone() == (7,)
        for client in stuck:
            client.close()


def test_clients_that_leave_more_than_the_output_limit_unread_pin_a_quarter_at_most() -> None:
    # 4 threads: one may wait on a client with 16 MiB unread; the next such client
    # is dropped, and the other threads serve everyone else
    with wire_node("--threads", "4", "--write-timeout", "600") as n:
        stuck = []
        for _ in range(3):
            client = RawClient(n.port, timeout=60, rcvbuf=4096)
            client.login()
            stuck.append(client)
        for client in stuck:
            client.send(
                query(
                    "DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(1200000);"
                    "FETCH ALL FROM c"
                )
            )
        wait_until(lambda: "request threads already wait" in "".join(n.stderr), 60)
        with connect(n) as conn:
            for _ in range(3):
                assert conn.execute("SELECT count(*) FROM long_sequence(7)").fetchone() == (7,)
        for client in stuck:
            client.close()


def test_a_client_that_stops_reading_is_dropped_at_the_write_timeout() -> None:
    with wire_node("--threads", "2", "--write-timeout", "1") as n:
        client = RawClient(n.port, timeout=60, rcvbuf=4096)
        client.login()
        client.send(query("DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(200000)"))
        client.until_ready()
        client.send(query("FETCH ALL FROM c"))
        wait_until(lambda: "read nothing for 1 s" in "".join(n.stderr), 30)
        assert client.closed()
        client.close()
        still_serves(n)


# ---- the admin always gets in ------------------------------------------------------


ADMIN_ENV = {"RESGROUPS_ADMIN_PASSWORD": "sesame"}


def admin_connect(n: Node) -> psycopg.Connection[Any]:
    return psycopg.connect(n.dsn("admin", "sesame"), connect_timeout=10, autocommit=True)


def with_user(n: Node) -> None:
    with admin_connect(n) as conn:
        conn.execute("CREATE USER analyst")  # no password: logs in without one


def test_the_connection_cap_keeps_a_reserve_for_the_admin() -> None:
    with wire_node("--access-control", "--max-connections", "5", env=ADMIN_ENV) as n:
        with_user(n)  # 3 of 5 reserved for admins
        # a closed connection's slot comes back once the server has read its end,
        # which a loaded machine may not have done yet: take the slots as they free
        held = [_when_free(lambda: connect(n)) for _ in range(2)]
        with pytest.raises(psycopg.OperationalError) as info:
            connect(n)
        assert "reserved for RESOURCE GROUP ADMIN" in str(info.value)
        admins = [_when_free(lambda: admin_connect(n)) for _ in range(3)]
        with pytest.raises(psycopg.OperationalError) as info:
            admin_connect(n)
        assert "too many clients" in str(info.value)
        for conn in held + admins:
            conn.close()
        wait_until(lambda: _can_connect(n), 30)  # every slot is back


def _when_free(connecting: Callable[[], psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """A connection as soon as a slot is free for it (within 30 s)."""
    made: list[psycopg.Connection[Any]] = []

    def attempt() -> bool:
        try:
            made.append(connecting())
        except psycopg.OperationalError:
            return False
        return True

    wait_until(attempt, 30)
    return made[0]


def _can_connect(n: Node) -> bool:
    try:
        with connect(n), connect(n):
            return True
    except psycopg.OperationalError:
        return False


def _logged_in(n: Node) -> RawClient:
    clients: list[RawClient] = []

    def attempt() -> bool:
        client = RawClient(n.port)
        if client.login()[-1].kind == b"Z":
            clients.append(client)
            return True
        client.close()
        return False

    wait_until(attempt, 30)
    return clients[0]


def test_a_refused_connection_says_53300_after_login() -> None:
    with wire_node("--access-control", "--max-connections", "4", env=ADMIN_ENV) as n:
        with_user(n)
        first = _logged_in(n)  # once the admin's connection has given its slot back
        second = RawClient(n.port)
        replies = second.login()
        assert [e[:2] for e in errors(replies)] == [("FATAL", "53300")]
        first.close()
        second.close()


def test_the_admin_is_served_while_every_general_thread_is_pinned() -> None:
    with wire_node(
        "--access-control", "--threads", "1", "--query-timeout", "600", env=ADMIN_ENV
    ) as n:
        with_user(n)
        stuck = RawClient(n.port, timeout=60, rcvbuf=4096)
        pid, secret = key_data(stuck.login())
        stuck.send(query("SELECT x FROM long_sequence(100000000)"))
        with admin_connect(n) as admin:
            # the admin's answer itself shows the stuck query running on the one thread
            def stuck_runs() -> bool:
                cur = admin.execute("SELECT active_queries FROM resource_groups()")
                return cur.fetchall() == [(1,)]

            wait_until(stuck_runs, 30)
            assert admin.execute("SELECT count(*) FROM long_sequence(5)").fetchone() == (5,)
            cancel(n.port, pid, secret)
            wait_until(
                lambda: (
                    admin.execute("SELECT active_queries FROM resource_groups()").fetchall()
                    == [(0,)]
                ),
                30,
            )
        stuck.close()


def test_failed_logins_are_throttled_per_address() -> None:
    with wire_node("--access-control", "--throttle", "2", env=ADMIN_ENV) as n:
        admin_connect(n).close()
        for _ in range(2):
            with pytest.raises(psycopg.OperationalError) as info:
                psycopg.connect(n.dsn("admin", "wrong"), connect_timeout=10)
            assert "password authentication failed" in str(info.value)
        with pytest.raises(psycopg.OperationalError) as info:  # refused before hashing
            admin_connect(n)
        assert "too many failed logins" in str(info.value)
        client = RawClient(n.port)
        replies = client.login("admin")
        assert [e[:2] for e in errors(replies)] == [("FATAL", "28P01")]
        client.close()
