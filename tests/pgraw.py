"""A raw PostgreSQL v3 client over a socket, for the tests that send what no driver
would: every read has a timeout, so a server that never answers fails the test."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

NODE = Path(__file__).resolve().parent / "programs" / "wire_node.py"
ADDRESS_SPACE: int = 1536 * 1024 * 1024  # what a wire node may map: a regression fails there


def msg(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def cstr(text: str | bytes) -> bytes:
    return (text.encode() if isinstance(text, str) else text) + b"\0"


def startup_packet(params: dict[str, str]) -> bytes:
    body = struct.pack("!i", 196608) + b"".join(cstr(k) + cstr(v) for k, v in params.items())
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def parse(text: str, name: str = "", oids: Sequence[int] = ()) -> bytes:
    payload = cstr(name) + cstr(text) + struct.pack("!H", len(oids))
    return msg(b"P", payload + b"".join(struct.pack("!i", o) for o in oids))


def bind(
    values: Sequence[bytes | None],
    formats: Sequence[int] = (),
    statement: str = "",
    portal: str = "",
) -> bytes:
    payload = cstr(portal) + cstr(statement) + struct.pack("!H", len(formats))
    payload += b"".join(struct.pack("!h", f) for f in formats)
    payload += struct.pack("!H", len(values))
    for value in values:
        payload += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return msg(b"B", payload + struct.pack("!H", 0))


def describe_statement(name: str = "") -> bytes:
    return msg(b"D", b"S" + cstr(name))


def execute(max_rows: int = 0) -> bytes:
    return msg(b"E", cstr("") + struct.pack("!i", max_rows))


SYNC = msg(b"S")
TERMINATE = msg(b"X")


def query(text: str | bytes) -> bytes:
    return msg(b"Q", cstr(text))


@dataclass
class Reply:
    kind: bytes
    body: bytes

    @property
    def fields(self) -> dict[str, str]:
        """An ErrorResponse's or NoticeResponse's fields by code letter."""
        out = {}
        for part in self.body.split(b"\0"):
            if part:
                out[chr(part[0])] = part[1:].decode("utf-8", "replace")
        return out


class RawClient:
    def __init__(self, port: int, timeout: float = 30.0, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect: the window the server sees stays small
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.buf = b""

    def send(self, *data: bytes) -> None:
        self.sock.sendall(b"".join(data))

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("the server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def reply(self) -> Reply:
        kind = self._read(1)
        (length,) = struct.unpack("!i", self._read(4))
        return Reply(kind, self._read(length - 4))

    def until_ready(self) -> list[Reply]:
        """Replies up to and including ReadyForQuery (or a FATAL error)."""
        out = []
        while True:
            r = self.reply()
            out.append(r)
            if r.kind == b"Z" or (r.kind == b"E" and r.fields.get("S") == "FATAL"):
                return out

    def login(self, user: str = "analyst", **params: str) -> list[Reply]:
        self.send(startup_packet({"user": user, "database": "x", **params}))
        return self.until_ready()

    def closed(self) -> bool:
        """True once the server has closed the connection (reads what is left)."""
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return True
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def errors(replies: list[Reply]) -> list[tuple[str, str, str]]:
    """(severity, SQLSTATE, message) of each ErrorResponse."""
    return [(r.fields["S"], r.fields["C"], r.fields["M"]) for r in replies if r.kind == b"E"]


def cancel(port: int, pid: int, secret: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
        s.recv(1)  # the server closes it


def key_data(replies: list[Reply]) -> tuple[int, int]:
    key = next(r for r in replies if r.kind == b"K")
    pid, secret = struct.unpack("!ii", key.body)
    return pid, secret


@dataclass
class Node:
    proc: subprocess.Popen[str]
    port: int
    stderr: list[str] = field(default_factory=list)

    def dsn(self, user: str = "analyst", password: str | None = None) -> str:
        dsn = f"host=127.0.0.1 port={self.port} user={user} dbname=x"
        return dsn + (f" password={password}" if password is not None else "")


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@contextlib.contextmanager
def wire_node(*args: str, env: dict[str, str] | None = None) -> Iterator[Node]:
    """tests/programs/wire_node.py under RLIMIT_AS; it must still be alive at the end
    (a MemoryError or a crash fails the test) and exit on SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, str(NODE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "OPENBLAS_NUM_THREADS": "1",
            "MALLOC_ARENA_MAX": "2",
            **(env or {}),
        },
        preexec_fn=_limit_address_space,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not line or not line[0].strip():
        proc.kill()
        proc.wait(10)
        raise AssertionError("the wire node did not start:\n" + "".join(stderr))
    node = Node(proc, json.loads(line[0])["port"], stderr)
    try:
        yield node
        assert proc.poll() is None, "the wire node died:\n" + "".join(stderr)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
