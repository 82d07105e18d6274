"""``resgroups serve`` over the PostgreSQL wire protocol, driven by real clients:
psql and psycopg 3 against a real server process."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.errors
import pytest
from servers import ServerProcess, serving, start_server
from waiting import wait_until

HERE = Path(__file__).resolve().parent / "wire"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving(["--workers", "2"]) as srv:
        yield srv


def connect(srv: ServerProcess, user: str = "analyst", **kw: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(srv.dsn(user), connect_timeout=10, **kw)


def groups(srv: ServerProcess) -> dict[str, dict[str, Any]]:
    with connect(srv, autocommit=True) as conn:
        cur = conn.execute("SELECT * FROM resource_groups()")
        names = [d.name for d in cur.description or ()]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}


def no_query_holds_anything(srv: ServerProcess) -> bool:
    return all(
        g["active_queries"] == 0 and g["queued_queries"] == 0 and g["memory_used_bytes"] == 0
        for g in groups(srv).values()
    )


# ---- psql ---------------------------------------------------------------------------------


def test_psql_runs_a_script_of_ddl_session_choice_queries_and_monitoring() -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql is missing: .ci/run installs postgresql-client"
    srv = start_server()  # a server of its own: the script's counters start at 0
    try:
        out = subprocess.run(
            [psql, "-X", "-h", srv.host, "-p", str(srv.pg_port), "-U", "analyst", "-d", "x",
             "-f", "psql_script.sql"],
            cwd=HERE, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        assert srv.stop() == 0
    got = out.stdout + out.stderr.replace(f"psql:{HERE}/", "psql:")
    expected = (HERE / "psql_expected.txt").read_text()
    assert sorted(got.splitlines()) == sorted(expected.splitlines())  # stderr interleaves
    assert out.stdout.splitlines() == [
        line for line in expected.splitlines() if not line.startswith("psql:")
    ]


# ---- psycopg -----------------------------------------------------------------------------------


def test_parameters_arrive_in_binary_and_results_convert_natively(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        cur = conn.execute(
            "SELECT %s + 1 AS i, %s * 2.0 AS f, %s AS t, %s AS b, %s AS n",
            [41, 1.25, "it's; -- not code", True, None],
        )
        assert cur.fetchall() == [(42, 2.5, "it's; -- not code", True, None)]
        assert [d.type_code for d in cur.description or ()] == [20, 701, 25, 16, 25]
        big = conn.execute("SELECT %s - 1", [2**62]).fetchone()
        assert big == (2**62 - 1,)
        cur = conn.execute("SELECT x FROM long_sequence(%s) WHERE x > %s", [10, 7], binary=True)
        assert cur.fetchall() == [(8,), (9,), (10,)]


def test_repeated_queries_switch_to_prepared_statements(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        conn.prepare_threshold = 2
        for n in range(1, 8):
            cur = conn.execute("SELECT count(*), sum(x) FROM long_sequence(%s)", [n])
            assert cur.fetchone() == (n, n * (n + 1) // 2)
        prepared = conn._prepared  # psycopg's record of what it prepared on the server
        assert prepared._names, "psycopg never prepared the statement"
        # prepared explicitly, and a statement without parameters parsed once at Parse
        for _ in range(3):
            assert conn.execute("SELECT 'same'", prepare=True).fetchone() == ("same",)


def test_ddl_takes_parameters_too(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        conn.execute("CREATE RESOURCE GROUP param_ddl WITH (max_active_queries = %s)", [3])
        assert groups(server)["param_ddl"]["max_active_queries"] == 3
        conn.execute("DROP RESOURCE GROUP param_ddl")


def test_server_cursor_pages_with_its_slot_free_between_pages(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as admin:
        admin.execute(
            "CREATE RESOURCE GROUP paging WITH (max_active_queries = 1, max_queued_queries = 0)"
        )
    try:
        with connect(server, user="pager") as conn, connect(server, user="other") as other:
            conn.execute("SET RESOURCE GROUP paging")
            other.execute("SET RESOURCE GROUP paging")
            with conn.cursor(name="pages") as cur:
                cur.execute(
                    "SELECT x, x * x AS sq FROM long_sequence(%s) WHERE x %% 3 = 0", [3_000_000]
                )
                seen = cur.fetchmany(4)
                assert seen == [(3, 9), (6, 36), (9, 81), (12, 144)]
                row = groups(server)["paging"]
                assert row["active_queries"] == 0  # suspended between pages
                assert row["memory_used_bytes"] > 0  # what it scanned ahead stays charged
                # the one slot is free: another user's query gets it, not a rejection
                assert other.execute("SELECT count(*) FROM long_sequence(10)").fetchone() == (10,)
                more = cur.fetchmany(2)
                assert more == [(15, 225), (18, 324)]
                assert len(cur.fetchmany(50_000)) == 50_000
            conn.commit()
            other.commit()
        wait_until(lambda: no_query_holds_anything(server), timeout=30)
        assert groups(server)["paging"]["admitted_total"] >= 4  # each page passed the gate
    finally:
        with connect(server, autocommit=True) as admin:
            admin.execute("DROP RESOURCE GROUP paging")


def test_execute_with_a_row_limit_returns_portal_suspended(server: ServerProcess) -> None:
    """The protocol-level cursor: Execute(max_rows) answered with PortalSuspended."""
    with RawClient(server) as raw:
        raw.send_extended("SELECT x FROM long_sequence(10)", max_rows=4)
        kinds = raw.read_until(b"Z")
        assert [k for k, _ in kinds].count(b"D") == 4
        assert b"s" in [k for k, _ in kinds]  # PortalSuspended
        raw.send(b"E", b"\0" + struct.pack("!i", 0))  # the rest of the unnamed portal
        raw.send(b"S", b"")
        rest = raw.read_until(b"Z")
        # the implicit transaction ended at Sync: the unnamed portal is gone
        assert rest[0][0] == b"E"
    wait_until(lambda: no_query_holds_anything(server), timeout=30)


def test_errors_map_to_psycopg_classes_by_sqlstate(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError) as syntax:
            conn.execute("SELECT x FROM long_sequence(3) WHER x > 1")
        # WHER is the function's alias, as in PostgreSQL: the error is at x (1-based)
        assert syntax.value.diag.statement_position == "37"
        with pytest.raises(psycopg.errors.SyntaxError) as bound:  # offsets map back past $1
            conn.execute("SELECT %s, x FROM long_sequence(3) WHER x > 1", ["a long text value"])
        assert bound.value.diag.statement_position == "41"
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT y FROM long_sequence(%s)", [3])
        with pytest.raises(psycopg.errors.UndefinedObject):
            conn.execute("DROP RESOURCE GROUP nowhere")
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        conn.execute(
            "CREATE RESOURCE GROUP no_queue WITH (max_active_queries = 1, max_queued_queries = 0)"
        )
        holder = connect(server, autocommit=True)
        holder.execute("SET RESOURCE GROUP no_queue")
        failures: list[BaseException] = []

        def hold_the_slot() -> None:
            try:
                holder.execute("SELECT sum(x * x) FROM long_sequence(100000000000)")
            except psycopg.errors.QueryCanceled:
                pass
            except BaseException as exc:  # reported below
                failures.append(exc)

        thread = threading.Thread(target=hold_the_slot)
        thread.start()
        try:
            wait_until(lambda: groups(server)["no_queue"]["active_queries"] == 1, timeout=30)
            conn.execute("SET RESOURCE GROUP no_queue")
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="queue is full"):
                conn.execute("SELECT count(*) FROM long_sequence(5)")
        finally:
            holder.cancel()
            thread.join(30)
            holder.close()
            conn.execute("RESET ALL")
            conn.execute("DROP RESOURCE GROUP no_queue")
        assert not failures
        assert conn.execute("SELECT 1").fetchone() == (1,)  # still usable


def test_transaction_status_follows_begin_errors_and_rollback(server: ServerProcess) -> None:
    with connect(server) as conn:  # not autocommit: psycopg sends BEGIN
        conn.execute("SELECT 1")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with pytest.raises(psycopg.errors.UndefinedColumn):
            conn.execute("SELECT nope FROM long_sequence(1)")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT 2").fetchone() == (2,)
        conn.commit()


def test_show_resource_groups_gives_the_rows_of_resource_groups(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        shown = conn.execute("SHOW RESOURCE GROUPS")
        names = [d.name for d in shown.description or ()]
        rows = [row[0] for row in shown.fetchall()]
        selected = conn.execute("SELECT * FROM resource_groups()")
        assert names == [d.name for d in selected.description or ()]
        assert rows == [row[0] for row in selected.fetchall()]
        assert "cpu_used_pct" in names
        assert "DEFAULT" in rows


def test_a_syntax_error_at_the_first_word_expects_what_the_server_accepts(
    server: ServerProcess,
) -> None:
    """The engine's parser knows only its statements; the server also runs BEGIN,
    COMMIT, DECLARE, FETCH... itself, and the error's list says so."""
    with connect(server, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.SyntaxError) as bad:
            conn.execute("SHOOW USERS")
        listed = str(bad.value).split("expected one of: ", 1)[1].split("\n")[0].split(", ")
        for word in ("BEGIN", "COMMIT", "DECLARE", "FETCH", "SELECT", "CREATE", "SHOW"):
            assert word in listed, (word, listed)
        with pytest.raises(psycopg.errors.SyntaxError) as mid:  # not at the first word
            conn.execute("SELECT 1 FROM")
        assert "BEGIN" not in str(mid.value)


def test_explainability_over_the_wire(server: ServerProcess) -> None:
    """resource_group_queries() and EXPLAIN RESOURCE GROUP reach psycopg typed:
    started_at arrives as an aware datetime (timestamptz)."""
    with connect(server, autocommit=True) as conn, conn.cursor(name="held") as cur:
        conn.autocommit = False
        cur.execute("SELECT x FROM long_sequence(1000000)")
        cur.fetchmany(1)  # a paging cursor: suspended between fetches
        with connect(server, autocommit=True) as watcher:
            rows = watcher.execute(
                "SELECT user_name, state, blocked_by, started_at FROM resource_group_queries()"
            ).fetchall()
            assert [r[:3] for r in rows] == [("analyst", "suspended", None)]
            assert rows[0][3].tzinfo is not None
            explained = watcher.execute("EXPLAIN RESOURCE GROUP").fetchall()
            assert [r[0] for r in explained if r[5]] == ["DEFAULT"]
        conn.rollback()


def test_sessions_are_per_connection_and_reset_clears_them(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as a, connect(server, autocommit=True) as b:
        a.execute("CREATE RESOURCE GROUP mine")
        try:
            a.execute("SET RESOURCE GROUP mine")
            a.execute("SET application_name = 'dash'")
            a.execute("SET client_encoding TO 'UTF8'")  # what drivers send on connect
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="UTF8"):
                a.execute("SET client_encoding = 'LATIN1'")
            assert a.info.parameter_status("application_name") == "dash"
            assert a.execute("SELECT current_resource_group()").fetchone() == ("mine",)
            assert b.execute("SELECT current_resource_group()").fetchone() == ("DEFAULT",)
            assert a.execute("SHOW server_version").fetchone() == ("15.0",)
            assert a.execute("SELECT version()").fetchone()[0].startswith("PostgreSQL 15.0")  # type: ignore[index]
            a.execute("DISCARD ALL")
            assert a.execute("SELECT current_resource_group()").fetchone() == ("DEFAULT",)
            assert a.info.parameter_status("application_name") == ""
            with pytest.raises(psycopg.errors.UndefinedObject, match="unrecognized configuration"):
                a.execute("SET no_such_setting = 1")
        finally:
            a.execute("DROP RESOURCE GROUP mine")


def test_cancel_stops_a_long_query_and_returns_its_slot(server: ServerProcess) -> None:
    with connect(server, autocommit=True) as conn:
        started = threading.Event()

        def cancel_when_running() -> None:
            started.wait(30)
            wait_until(lambda: groups(server)["DEFAULT"]["active_queries"] == 1, timeout=30)
            conn.cancel()

        canceller = threading.Thread(target=cancel_when_running)
        canceller.start()
        started.set()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT sum(x * x) FROM long_sequence(100000000000)")
        canceller.join(30)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    wait_until(lambda: no_query_holds_anything(server), timeout=30)


def test_a_cancel_request_with_the_wrong_secret_is_ignored(server: ServerProcess) -> None:
    with RawClient(server) as raw:
        pid, secret = raw.key
        with socket.create_connection((server.host, server.pg_port), 10) as other:
            other.sendall(struct.pack("!iiii", 16, 80877102, pid, secret ^ 1))
        raw.send(b"Q", b"SELECT count(*) FROM long_sequence(2000000)\0")
        reply = raw.read_until(b"Z")
        assert [k for k, _ in reply][:3] == [b"T", b"D", b"C"]


def test_a_dropped_connection_cancels_its_query_and_returns_everything(
    server: ServerProcess,
) -> None:
    raw = RawClient(server)
    raw.send(b"Q", b"SELECT sum(x * x) FROM long_sequence(100000000000)\0")
    wait_until(lambda: groups(server)["DEFAULT"]["active_queries"] == 1, timeout=30)
    raw.sock.close()
    wait_until(lambda: no_query_holds_anything(server), timeout=30)


# ---- a raw protocol client, for what drivers do not let a test do ----------------------------


class RawClient:
    def __init__(self, srv: ServerProcess, user: str = "raw") -> None:
        self.sock = socket.create_connection((srv.host, srv.pg_port), 10)
        self.sock.settimeout(30)
        body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)
        self.key = (0, 0)
        for kind, payload in self.read_until(b"Z"):
            if kind == b"K":
                self.key = struct.unpack("!ii", payload)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.send(b"X", b"")
        self.sock.close()

    def send(self, kind: bytes, payload: bytes) -> None:
        self.sock.sendall(kind + struct.pack("!i", len(payload) + 4) + payload)

    def send_extended(self, sql: str, max_rows: int = 0) -> None:
        self.send(b"P", b"\0" + sql.encode() + b"\0" + struct.pack("!h", 0))
        self.send(b"B", b"\0\0" + struct.pack("!hhh", 0, 0, 0))
        self.send(b"D", b"P\0")
        self.send(b"E", b"\0" + struct.pack("!i", max_rows))
        self.send(b"S", b"")

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        return data

    def read(self) -> tuple[bytes, bytes]:
        kind, length = struct.unpack("!ci", self._exactly(5))
        return kind, self._exactly(length - 4)

    def read_until(self, last: bytes) -> list[tuple[bytes, bytes]]:
        out = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kind, payload = self.read()
            out.append((kind, payload))
            if kind == last:
                return out
        raise AssertionError(f"no {last!r} within 60 s: {out}")


def test_sigterm_drains_and_exits_zero() -> None:
    """SIGTERM: a queued query fails at once, a running one past the grace period
    (2 s here: it never ends by itself) is cancelled, a held cursor is closed, and
    the exit status is 0."""
    srv = start_server(["--grace", "2"])
    with connect(srv, autocommit=True) as conn:
        conn.execute("CREATE RESOURCE GROUP one WITH (max_active_queries = 1)")
    held = RawClient(srv)
    held.send(b"Q", b"DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(5000000)\0")
    held.read_until(b"Z")
    errors: dict[str, BaseException] = {}

    def run(name: str) -> None:
        try:
            with connect(srv, user=name, autocommit=True) as conn:
                conn.execute("SET RESOURCE GROUP one")
                conn.execute("SELECT sum(x * x) FROM long_sequence(100000000000)")
        except psycopg.Error as exc:
            errors[name] = exc

    running = threading.Thread(target=run, args=("running",))
    running.start()
    wait_until(lambda: groups(srv)["one"]["active_queries"] == 1, timeout=30)
    queued = threading.Thread(target=run, args=("queued",))
    queued.start()
    wait_until(lambda: groups(srv)["one"]["queued_queries"] == 1, timeout=30)
    assert srv.stop(signal.SIGTERM, timeout=60) == 0
    running.join(30)
    queued.join(30)
    held.sock.close()
    assert set(errors) == {"running", "queued"}  # neither finished: both were told


def test_a_client_that_stops_reading_slows_only_itself(server: ServerProcess) -> None:
    slow = RawClient(server)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.send(b"Q", b"SELECT x, x * 2 FROM long_sequence(3000000)\0")  # ~90 MB of rows, unread
    try:
        with connect(server, autocommit=True) as conn:
            for n in range(20):  # others are served while the slow one's thread waits
                assert conn.execute("SELECT count(*) FROM long_sequence(%s)", [n]).fetchone() == (
                    n,
                )
    finally:
        slow.sock.close()  # going away ends its query and frees its buffers
    wait_until(lambda: no_query_holds_anything(server), timeout=30)


def test_a_replica_server_follows_its_primary_and_refuses_ddl(tmp_path: Path) -> None:
    primary = start_server(["--catalog", str(tmp_path)])
    replica = start_server(["--catalog", str(tmp_path), "--replica"])
    try:
        with connect(primary, autocommit=True) as conn:
            conn.execute("CREATE RESOURCE GROUP fleet_wide WITH (max_active_queries = 7)")
        wait_until(lambda: "fleet_wide" in groups(replica), timeout=30)
        assert groups(replica)["fleet_wide"]["max_active_queries"] == 7
        with connect(replica, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                conn.execute("DROP RESOURCE GROUP fleet_wide")
            conn.execute("SET RESOURCE GROUP fleet_wide")
            assert conn.execute("SELECT current_resource_group()").fetchone() == ("fleet_wide",)
    finally:
        assert replica.stop() == 0
        assert primary.stop() == 0


def test_a_refused_resume_ends_the_cursor_and_the_connection_stays_usable(
    server: ServerProcess,
) -> None:
    with connect(server, autocommit=True) as conn, connect(server, autocommit=True) as holder:
        conn.execute(
            "CREATE RESOURCE GROUP refusing WITH (max_active_queries = 1, max_queued_queries = 0)"
        )
        try:
            conn.execute("SET RESOURCE GROUP refusing")
            holder.execute("SET RESOURCE GROUP refusing")
            conn.execute("DECLARE c CURSOR WITH HOLD FOR SELECT x FROM long_sequence(3000000)")
            assert conn.execute("FETCH 2 FROM c").fetchall() == [(1,), (2,)]
            outcome: list[BaseException] = []

            def hold_the_slot() -> None:
                try:
                    holder.execute("SELECT sum(x * x) FROM long_sequence(100000000000)")
                except BaseException as exc:  # checked below
                    outcome.append(exc)

            thread = threading.Thread(target=hold_the_slot)
            thread.start()
            wait_until(lambda: groups(server)["refusing"]["active_queries"] == 1, timeout=30)
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded):
                conn.execute("FETCH 2 FROM c")  # the resume is refused: the cursor ends
            holder.cancel()
            thread.join(30)
            assert [type(e) for e in outcome] == [psycopg.errors.QueryCanceled]
            with pytest.raises(psycopg.errors.InvalidCursorName):
                conn.execute("FETCH 2 FROM c")
            assert conn.execute("SELECT count(*) FROM long_sequence(4)").fetchone() == (4,)
        finally:
            conn.execute("RESET ALL")
            conn.execute("DROP RESOURCE GROUP refusing")
    wait_until(lambda: no_query_holds_anything(server), timeout=30)


def test_a_fleet_member_on_postgresql_serves_clients(pg_catalog: str) -> None:
    """--catalog and --coordination on PostgreSQL: DDL over the wire lands in the
    shared catalog, and a limited group's query takes a fleet lease."""
    with serving(["--catalog", pg_catalog, "--coordination", pg_catalog]) as srv:
        with connect(srv, autocommit=True) as conn:
            conn.execute("CREATE RESOURCE GROUP fleet WITH (max_active_queries = 2)")
            conn.execute("SET RESOURCE GROUP fleet")
            assert conn.execute("SELECT count(*) FROM long_sequence(1000)").fetchone() == (1000,)
        row = groups(srv)["fleet"]
        assert (row["max_active_queries"], row["admitted_total"]) == (2, 1)
        assert "fleet_active_queries" in row
    with psycopg.connect(pg_catalog) as db:
        ops = [r[0] for r in db.execute("SELECT record->>'op' FROM resgroups_catalog_log")]
    assert "create_group" in ops


def test_describe_of_a_statement_with_placeholders_types_its_columns(
    server: ServerProcess,
) -> None:
    """What asyncpg-style drivers do: Parse, Describe the statement, then Bind."""
    with RawClient(server) as raw:
        sql = b"SELECT x, x * 0.5 AS half FROM long_sequence($1) WHERE x > $2"
        raw.send(b"P", b"s1\0" + sql + b"\0" + struct.pack("!h", 0))
        raw.send(b"D", b"Ss1\0")
        raw.send(b"S", b"")
        replies = raw.read_until(b"Z")
        kinds = [k for k, _ in replies]
        assert kinds == [b"1", b"t", b"T", b"Z"]
        row_description = dict(replies)[b"T"]
        assert b"x\0" in row_description
        assert b"half\0" in row_description
