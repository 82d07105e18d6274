"""Framing and back-pressure: messages in, replies out, and what a wait may cost.

In: a reader task frames messages into a queue bounded by INPUT_LIMIT bytes
(past it, the reader stops reading and TCP pushes back on the client). Out:
a request's replies gather in a buffer; each OUTPUT_CHUNK of them goes to
the loop. Whether the request thread then waits for the socket depends on
what it holds:

- a query is running (a streamed SELECT holds its slot and worker): the
  thread waits for the socket to take the chunk, and the wait is the
  query's: every OUTPUT_POLL it passes the query's checkpoint, so the
  query's own deadline or a cancel fails it with its usual error
  (QueryTimeout, QueryCancelled), and the write timeout bounds it too.
  Either way the client is not reading, so the connection then ends;
- nothing is running (rows already made, a FETCH of a cursor): the chunk is
  handed to the loop and the thread goes on, up to OUTPUT_LIMIT bytes
  unwritten; the loop writes the rest under the write timeout. A client
  that stops reading costs no request thread here. Past OUTPUT_LIMIT the
  thread waits (bounded by the write timeout) only while fewer than
  ``Backend.max_output_waiters`` threads do (a quarter of the pool); else
  the connection ends, so non-readers can never pin every request thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any, Final

from resgroups.errors import EngineClosed, Error, InternalError, QueryCancelled, SqlSyntaxError
from resgroups.server import wire
from resgroups.server.pg_state import (
    INPUT_LIMIT,
    OUTPUT_CHUNK,
    OUTPUT_LIMIT,
    OUTPUT_POLL,
    ConnectionBase,
    OutputStalled,
    TxStatus,
)
from resgroups.server.wire import Body, ProtocolViolation

log = logging.getLogger("resgroups.server.pgwire")

Message = tuple[bytes, bytes]
Handler = Callable[[ConnectionBase, Body], None]


class Framing(ConnectionBase):
    _queue: asyncio.Queue[Message | Error | None]
    _queued_bytes: int
    _room: asyncio.Event
    _out: list[bytes]
    _out_size: int
    _handed: int  # bytes handed to the loop during this request, not waited for
    handlers: Final[dict[bytes, Handler]] = {}  # filled by pgwire.Connection

    def init_framing(self) -> None:
        self._queue = asyncio.Queue()
        self._queued_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._out = []
        self._out_size = 0
        self._handed = 0

    # ---- on the loop ----------------------------------------------------------------

    async def read_loop(self) -> None:
        """Frame messages into the queue; the end of the connection cancels its query."""
        try:
            while True:
                await self._room.wait()
                kind, body = await wire.read_message(self.reader)
                self._queued_bytes += len(body) + 5
                if self._queued_bytes > INPUT_LIMIT:
                    self._room.clear()
                self._queue.put_nowait((kind, body))
                if kind == b"X":
                    return
        except ProtocolViolation as exc:
            self._queue.put_nowait(exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.gone = True
            self.cancel()  # whatever runs now ends at its next checkpoint
            self._queue.put_nowait(None)

    def cancel(self) -> None:
        raise NotImplementedError

    async def requests(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            while not self._queue.empty() and isinstance(batch[-1], tuple):
                batch.append(self._queue.get_nowait())
            messages = [m for m in batch if isinstance(m, tuple)]
            self._queued_bytes -= sum(len(body) + 5 for _, body in messages)
            if self._queued_bytes <= INPUT_LIMIT:
                self._room.set()
            if messages:
                self.busy = True
                try:
                    out = await self.loop.run_in_executor(self.executor, self.process, messages)
                finally:
                    self.busy = False
                if self.gone:
                    return
                self.writer.write(out)
                if self.writer.transport.get_write_buffer_size():  # else: all written now
                    await asyncio.wait_for(self.writer.drain(), self.backend.write_timeout)
                if self.gone_after_reply:
                    return
            end = batch[-1]
            if isinstance(end, Error):
                raise end
            if end is None or (isinstance(end, tuple) and end[0] == b"X") or self.gone:
                return
            if self.backend.closing:
                raise EngineClosed("terminating connection: the server is shutting down")

    # ---- on a request thread ------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._out.append(data)
        self._out_size += len(data)
        if self._out_size >= OUTPUT_CHUNK:
            self._flush()

    def _flush(self) -> None:
        """Hand what is buffered to the loop; wait for the socket only while a query
        runs (bounded by its deadline, its cancel and the write timeout) or when
        OUTPUT_LIMIT bytes are already waiting unwritten."""
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        if self.gone:
            raise ConnectionResetError("the client is gone")
        query = self.streaming
        if query is not None:
            self._wait_written(data, query)
            return
        if self._handed + len(data) <= OUTPUT_LIMIT:
            self._handed += len(data)
            self.loop.call_soon_threadsafe(self.writer.write, data)
            return
        # no query runs, OUTPUT_LIMIT waits unwritten: wait, if few threads already do
        if not self.backend.output_waiters.acquire(blocking=False):
            stalled = OutputStalled(
                f"the client left {OUTPUT_LIMIT // 2**20} MiB unread while "
                f"{self.backend.max_output_waiters} request threads already wait on such clients"
            )
            self.abandon(stalled)
            raise stalled
        try:
            self._wait_written(data, None)
        finally:
            self.backend.output_waiters.release()

    def _wait_written(self, data: bytes, query: Any) -> None:
        future = asyncio.run_coroutine_threadsafe(self._write(data), self.loop)
        give_up = time.monotonic() + self.backend.write_timeout
        while True:
            try:
                future.result(OUTPUT_POLL)
                self._handed = 0
                return
            except concurrent.futures.TimeoutError:
                pass
            try:
                if self.gone:
                    raise ConnectionResetError("the client is gone")
                if query is not None:
                    query.checkpoint()  # the query's deadline and cancel end the wait
                if time.monotonic() >= give_up:
                    raise OutputStalled(
                        f"the client took no output for {self.backend.write_timeout:g} s"
                    )
            except BaseException as exc:
                future.cancel()
                self.abandon(exc)
                raise

    def push(self) -> None:
        """Hand what is buffered to the loop now (a Flush message), without waiting."""
        if self._out and not self.gone:
            if self._handed + self._out_size > OUTPUT_LIMIT:
                self._flush()  # past the limit the wait is bounded as any other
                return
            data = b"".join(self._out)
            self._out.clear()
            self._out_size = 0
            self._handed += len(data)
            self.loop.call_soon_threadsafe(self.writer.write, data)

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def abandon(self, reason: BaseException) -> None:
        """The client does not read: end the connection, dropping what waits unsent."""
        if not self.gone:
            log.warning(
                "connection %d ended: the client stopped reading (%s: %s)",
                self.pid,
                type(reason).__name__,
                reason,
            )
        self.gone = True
        self.loop.call_soon_threadsafe(self.writer.transport.abort)

    def check_interrupt(self) -> None:
        """Raised in long work that no query covers (parsing): a cancel or the
        client's departure ends it."""
        if self.gone:
            raise ConnectionResetError("the client is gone")
        if self.interrupted:
            self.interrupted = False
            raise QueryCancelled("canceling statement due to user request")

    def process(self, messages: list[Message]) -> bytes:
        """Handle a burst of messages; what is left to send goes back to the loop.
        A malformed message (a field without its zero byte, invalid UTF-8) or an
        unknown type is a protocol violation: FATAL, and the connection ends."""
        self._handed = 0
        self.interrupted = False  # a cancel before this burst cancelled nothing
        for kind, body in messages:
            if kind == b"X" or self.gone:
                break
            if self.skipping and kind != b"S":
                continue
            handler = self.handlers.get(kind)
            try:
                if handler is None:
                    raise ProtocolViolation(f"invalid frontend message type {kind!r}")
                handler(self, Body(body))
            except ConnectionError:
                self.gone = True
                break
            except ProtocolViolation as exc:
                self.send(wire.error_response(exc.sqlstate, exc.brief, severity="FATAL"))
                self.gone_after_reply = True  # nothing after it is read
                break
            except Error as exc:
                self.error(exc, extended=kind != b"Q")
            except Exception as exc:  # a bug: report it, keep serving
                log.exception("internal error handling %r", kind)
                self.error(internal(exc), extended=kind != b"Q")
        data = b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return data

    gone_after_reply: bool = False

    def error(self, exc: Error, *, extended: bool = False) -> None:
        if self.gone:
            return
        if self.tx is TxStatus.BLOCK:
            self.tx = TxStatus.FAILED
        if extended:
            self.skipping = True
        position = exc.position + 1 if isinstance(exc, SqlSyntaxError) else 0
        self.send(wire.error_response(exc.sqlstate, exc.brief, position))


def internal(exc: BaseException) -> InternalError:
    """What a client is told of a bug: its kind, not its text (which may name files)."""
    return InternalError(f"internal error ({type(exc).__name__}); the server log has the details")
