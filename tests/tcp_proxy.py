"""A TCP proxy on 127.0.0.1 that breaks one connection on purpose.

Put between a client and a server (PostgreSQL), it forwards bytes both ways
until armed: then the first chunk the client sends that contains ``needle``
either never reaches the server (``deliver=False``: the server sees the client
vanish before it), or reaches it and the server's answer is swallowed
(``deliver=True``: the server acted, the client never hears). Either way both
sides of that connection are closed. With ``deliver=None`` the chunk and all
that follows it are dropped and both sides are left open: a peer that stopped
answering without a word. Faults armed one after another fire in that order;
connections pass untouched otherwise.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class Proxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: list[tuple[bytes, bool | None]] = []
        self.fired = threading.Event()  # the armed fault happened
        self._open: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def arm(self, needle: bytes, *, deliver: bool | None) -> None:
        with self._lock:
            self.fired.clear()
            self._armed.append((needle, deliver))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            swallow = threading.Event()  # the next answer from the server is dropped
            threading.Thread(
                target=self._pump_up, args=(client, server, swallow), daemon=True
            ).start()
            threading.Thread(
                target=self._pump_down, args=(server, client, swallow), daemon=True
            ).start()

    def _pump_up(
        self, client: socket.socket, server: socket.socket, swallow: threading.Event
    ) -> None:
        while chunk := _recv(client):
            with self._lock:
                armed = self._armed[0] if self._armed else None
                fire = armed is not None and armed[0] in chunk
                if fire:
                    del self._armed[0]
            if fire:
                assert armed is not None
                if armed[1] is None:  # a black hole: swallow everything, answer nothing
                    self.fired.set()
                    while _recv(client):
                        pass
                    break
                if armed[1]:
                    swallow.set()
                    with contextlib.suppress(OSError):
                        server.sendall(chunk)
                    return  # the answer comes down and is dropped there
                self.fired.set()
                break
            try:
                server.sendall(chunk)
            except OSError:
                break
        _close(client, server)

    def _pump_down(
        self, server: socket.socket, client: socket.socket, swallow: threading.Event
    ) -> None:
        while chunk := _recv(server):
            if swallow.is_set():  # the server answered what it must not be heard saying
                self.fired.set()
                break
            try:
                client.sendall(chunk)
            except OSError:
                break
        _close(client, server)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._open:
                _close(sock)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()
