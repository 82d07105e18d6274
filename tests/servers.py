"""``resgroups serve`` as a real process on ephemeral ports, for the server tests."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

_READY = re.compile(r"on ([\d.]+):(\d+), HTTP on [\d.]+:(\d+)(?:, admin on [\d.]+:(\d+))?")


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    host: str
    pg_port: int
    http_port: int
    stderr: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None
    admin_port: int | None = None  # with --admin-port

    def dsn(self, user: str = "admin", password: str | None = None, **extra: str) -> str:
        port = extra.pop("port", str(self.pg_port))
        parts = [f"host={self.host}", f"port={port}", f"user={user}", "dbname=resgroups"]
        if password is not None:
            quoted = password.replace("\\", "\\\\").replace("'", "\\'")
            parts.append(f"password='{quoted}'")
        parts += [f"{k}={v}" for k, v in extra.items()]
        return " ".join(parts)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the server and wait for it to exit; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"the server did not exit within {timeout}s of {sig!r}; stderr:\n"
                + "".join(self.stderr)
            ) from None
        finally:
            if self.drain is not None:
                self.drain.join(10)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


@contextlib.contextmanager
def serving(
    args: Sequence[str] = (), env: dict[str, str] | None = None, address_space: int | None = None
) -> Iterator[ServerProcess]:
    """A server for the block; it must exit with status 0 after SIGTERM."""
    srv = start_server(args, env, address_space)
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def start_server(
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    address_space: int | None = None,
    cwd: str | None = None,
) -> ServerProcess:
    """Start ``resgroups serve`` on ports the OS picks; return once it listens.
    ``address_space``: its RLIMIT_AS in bytes, for a test that could make it
    allocate without bound (a regression then fails the test, not the machine).
    ``cwd``: where it runs; a checkout there is the one imported (a benchmark's
    baseline)."""

    def limit() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    proc = subprocess.Popen(
        [sys.executable, "-m", "resgroups.cli", "serve", "--pg-port", "0", "--http-port", "0",
         "--grace", "5", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=limit if address_space is not None else None,
        cwd=cwd,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    stderr: list[str] = []
    drain = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    drain.start()
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    match = _READY.search(line[0]) if line else None
    server = ServerProcess(proc, "", 0, 0, stderr, drain)
    if match is None:
        server.stop(signal.SIGKILL, timeout=10)
        raise AssertionError(f"the server did not start: {line!r}\n{''.join(stderr)}")
    server.host, server.pg_port, server.http_port = (
        match.group(1), int(match.group(2)), int(match.group(3)),
    )  # fmt: skip
    if match.group(4):
        server.admin_port = int(match.group(4))
    return server
