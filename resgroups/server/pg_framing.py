"""Framing and back-pressure: messages in, replies out, and what a wait may cost.

In: a reader task frames every message of each chunk it reads (``wire.Framer``)
into ``_pending``, bounded by INPUT_LIMIT bytes (past it, the reader stops
reading and TCP pushes back on the client).

Who handles them (``_lock`` guards the hand-over): at most one request
thread per connection owns its requests (``_working``). The loop starts one
when it has framed a chunk read from the socket and none owns them (a chunk
holds a driver's whole burst: Parse/Bind/Describe/Execute/Sync). The thread
handles a burst, sends the reply on the socket itself (``_sock``, a
duplicate of the client's socket) and, under the same lock as that send,
either takes the messages that arrived meanwhile or leaves: so a round trip
wakes the loop once (to hand the burst over) and no reply can overtake
another. A reply goes through the loop instead when the loop may hold
output of this connection (``_loop_writes``: the startup's replies, chunks
handed during the request, a reply the socket did not take at once); the
loop writes it in order, drains it under the write timeout and only then
hands the next burst over, and sets ``_loop_writes`` back only once nothing
is left unwritten. How the connection ends (an error, the client gone,
Terminate) is settled on the loop (``_finished``) once no thread owns it.

Who reads (``_thread_reads``, under ``_lock``): the loop, or the request
thread that owns the requests, never both. When the loop hands a burst to a
new thread and holds no unread bytes, it pauses its reading and the thread
reads from then on: after a reply sent whole with nothing waiting, it polls
the socket for up to LINGER (in LINGER_SLICE_MS steps, leaving early when
another connection's work waits for a thread) and frames what it reads
with the same framer the loop uses, so a client that sends its next
statement at once is served with one wake-up, as PostgreSQL's backend is.
The reading goes back to the loop when the thread leaves (the linger ends,
a reply goes through the loop) and when a burst outlasts one of the loop's
looks (``Backend.watch_readers``, every WATCH_INTERVAL): a statement that
runs long has the loop reading again, so the client's departure cancels it.
A socket is closed under a lingering thread only by that thread
(``_close_deferred``), so its descriptor cannot be reused while polled.

Out, within a request: its replies gather in a buffer; each OUTPUT_CHUNK of
them goes to the loop. Whether the request thread then waits for the socket
depends on what it holds:

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
import operator
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

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

READ_CHUNK: Final = 64 * 1024  # bytes framed per read: a burst of messages at once
LINGER: Final = 0.002  # seconds a request thread reads its client's socket after a reply
LINGER_SLICE_MS: Final = 1  # between its checks for other connections' waiting work
WATCH_INTERVAL: Final = 0.05  # seconds between the loop's looks at threads that read
_POLL_END: Final = select.POLLIN | select.POLLERR | select.POLLHUP | select.POLLNVAL

Message = tuple[bytes, bytes]
_GO_ON: Final = "go on"  # a request thread goes on with the messages that wait
_LINGER: Final = "linger"  # it reads the client's next burst itself
Handler = Callable[[ConnectionBase, Body], None]


class Framing(ConnectionBase):
    _lock: threading.Lock  # guards _pending, _queued_bytes, _working, _kicked
    _pending: deque[Message | Error | None]  # framed, not yet taken by a request thread
    _queued_bytes: int
    _working: bool  # a request thread (or the loop's drain of its reply) owns the requests
    _kicked: bool  # a hand-off to a request thread is scheduled on the loop
    _finished: asyncio.Future[Error | None]  # how the connection ends
    _room: asyncio.Event
    _out: list[bytes]
    _out_size: int
    _handed: int  # bytes handed to the loop during this request, not waited for
    _loop_writes: bool  # the loop may hold unwritten output: replies go through it
    _sock: socket.socket | None  # the client's socket, for a request thread's replies
    _framer: wire.Framer  # who reads (the loop or a request thread) frames with it
    _thread_reads: bool  # a request thread reads the socket; the loop's reading is paused
    _lingering: bool  # that thread waits for the client's next burst on the socket
    _close_deferred: bool  # the socket is closed by the lingering thread as it stops
    _bursts: int  # bursts a request thread has taken (the loop's watch compares them)
    _watched_bursts: int
    _poller: Any  # select.poll of the socket, for a lingering thread
    _deferred_sock: socket.socket | None
    handlers: Final[dict[bytes, Handler]] = {}  # filled by pgwire.Connection

    def init_framing(self) -> None:
        self._lock = threading.Lock()
        self._pending = deque()
        self._queued_bytes = 0
        self._working = False
        self._kicked = False
        self._finished = self.loop.create_future()
        self._room = asyncio.Event()
        self._room.set()
        self._out = []
        self._out_size = 0
        self._handed = 0
        self._loop_writes = True  # until the loop has seen its startup replies written
        self._sock = None
        self._framer = wire.Framer()
        self._thread_reads = False
        self._lingering = False
        self._close_deferred = False
        self._deferred_sock = None
        self._bursts = 0
        self._watched_bursts = -1
        self._poller = None

    # ---- on the loop ----------------------------------------------------------------

    async def read_loop(self) -> None:
        """Frame messages for the request threads; the end of the connection
        cancels its query."""
        framer = self._framer
        try:
            while True:
                await self._room.wait()
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)  # EOF
                messages, ended = _until_terminate(framer.feed(data))
                if ended:  # Terminate: nothing after it is read
                    self.hand_over(messages)
                    return
                if messages:
                    self.hand_over(messages)
                if framer.violation is not None:
                    self.arrive(framer.violation)
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.gone = True
            self.cancel()  # whatever runs now ends at its next checkpoint
            self.arrive(None)

    def cancel(self) -> None:
        raise NotImplementedError

    def arrive(self, item: Error | None) -> None:
        """How the connection ends (an error to say, or None: the client left), for
        the request threads, after the messages before it. The hand-off waits
        for the loop's next turn."""
        with self._lock:
            self._pending.append(item)
            kick = not self._working and not self._kicked
            self._kicked = self._kicked or kick
        if kick:
            self.loop.call_soon(self._kick)

    def hand_over(self, messages: list[Message]) -> None:
        """The messages of a chunk, for a request thread: one starts now if none
        owns the requests (a chunk holds whole bursts as a driver sends them)."""
        with self._lock:
            self._pending.extend(messages)
            self._queued_bytes += _wire_size(messages)
            if self._queued_bytes > INPUT_LIMIT:
                self._room.clear()  # TCP pushes back on the client
            start = not self._working
            self._working = True
            # the thread reads the client's next burst itself, if the loop holds no
            # unread bytes of it (the stream's buffer is empty) and may stop reading
            hand_reading = (
                start
                and self._sock is not None
                and not _may_hold_bytes(self.reader)
                and not self.gone
            )
            self._thread_reads = self._thread_reads or hand_reading
        if hand_reading:
            cast(asyncio.Transport, self.writer.transport).pause_reading()
            self.backend.watch_readers(self)
        if start:
            self._start_work()

    def _kick(self) -> None:
        with self._lock:
            self._kicked = False
            start = not self._working and bool(self._pending)
            self._working = self._working or start
        if start:
            self._start_work()

    def _start_work(self) -> None:
        try:
            self.executor.submit(self._work)
        except RuntimeError:  # the request threads are shut down
            self.settle(EngineClosed("terminating connection: the server is shutting down"))

    def settle(self, reason: BaseException | None) -> None:
        """The connection ends (``reason``: raised in :meth:`requests`), on the loop."""
        if not self._finished.done():
            if reason is None or isinstance(reason, Error):
                self._finished.set_result(reason)
            else:
                self._finished.set_exception(reason)

    async def requests(self) -> None:
        """Until the connection ends; an Error ends it with FATAL."""
        reason = await self._finished
        if reason is not None:
            raise reason

    async def _drain_then_go_on(self, data: bytes, ending: tuple[Error | None] | None) -> None:
        """A reply the socket did not take at once (or that follows output handed to
        the loop): written in order, drained under the write timeout, then the
        requests go on (or the connection ends, if this burst ended it)."""
        self.resume_reading()
        try:
            if data:
                self.writer.write(data)
            if self.writer.transport.get_write_buffer_size():
                await asyncio.wait_for(self.writer.drain(), self.backend.write_timeout)
        except (TimeoutError, ConnectionError) as exc:
            self.settle(exc)
            return
        if not self.writer.transport.get_write_buffer_size():
            self._loop_writes = False  # everything is written: replies may go direct
        if ending is not None:
            self.settle(ending[0])
            return
        with self._lock:
            start = bool(self._pending)
            self._working = start
        if start:
            self._start_work()

    def resume_reading(self) -> None:
        """The loop reads the socket again (a request thread gave it back)."""
        with self._lock:
            if self._thread_reads:
                return
        if not self.gone:
            cast(asyncio.Transport, self.writer.transport).resume_reading()

    def watch_reading(self) -> bool:
        """The loop's look at a request thread that reads the socket: a burst that
        has lasted since the last look gets the loop reading again, so that the
        client's departure cancels what it runs. False: no thread reads now."""
        with self._lock:
            if not self._thread_reads or self.gone:
                return False
            if self._lingering or self._bursts != self._watched_bursts:
                self._watched_bursts = self._bursts
                return True
            self._thread_reads = False
        self.resume_reading()
        return False

    def open_socket(self) -> None:
        """The request threads' handle on the socket, once logged in. Closed when
        the connection ends (``close_socket``), or with the connection object if
        its end never runs (a loop stopped under it)."""
        self._sock = _own_socket(self.writer)
        if self._sock is not None:
            weakref.finalize(self, self._sock.close)

    def close_socket(self) -> None:
        """The request threads' handle on the socket, once none of them works."""
        with self._lock:
            sock, self._sock = self._sock, None
            if self._lingering:  # its thread polls it: that thread closes it as it stops
                self._close_deferred, self._deferred_sock, sock = True, sock, None
        if sock is not None:
            sock.close()

    # ---- on a request thread ------------------------------------------------------------

    def _work(self) -> None:
        """Handle bursts while messages wait, replying on the socket directly; then
        leave, and the loop hands the next burst to a request thread."""
        try:
            while True:
                with self._lock:
                    batch: list[Message | Error | None] = []
                    while self._pending and (not batch or isinstance(batch[-1], tuple)):
                        batch.append(self._pending.popleft())
                    if not batch:
                        give_back = self._leave_locked()
                        break
                    self._bursts += 1
                    messages = [m for m in batch if isinstance(m, tuple)]
                    self._queued_bytes -= _wire_size(messages)
                    room = self._queued_bytes <= INPUT_LIMIT and not self._room.is_set()
                if room:
                    self.loop.call_soon_threadsafe(self._room.set)
                out = b""
                if messages:
                    self.busy = True
                    try:
                        out = self.process(messages)
                    finally:
                        self.busy = False
                    if self.gone:
                        self._settle_soon(None)
                        return
                ending = self._ending(batch[-1])
                after = self._reply(out, ending)
                if after is _LINGER:
                    after = self._linger()
                if after is not _GO_ON:
                    return  # replied and left, or the loop drains the reply and goes on
        except BaseException as exc:  # a bug: the connection ends, the server goes on
            log.exception("internal error in connection %d's requests", self.pid)
            self._settle_soon(internal(exc))
            return
        if give_back:
            self.loop.call_soon_threadsafe(self.resume_reading)

    def _leave_locked(self) -> bool:
        """The thread leaves the connection (under ``_lock``); True: it read the
        socket, and the loop must read it again."""
        self._working = False
        give_back, self._thread_reads = self._thread_reads, False
        return give_back

    def _linger(self) -> object:
        """Read the client's next burst on this thread (no hop through the loop),
        for up to LINGER, while no other connection's work waits for a thread;
        then give the reading back to the loop and leave. _GO_ON: messages (or
        the client's departure) wait in ``_pending``."""
        with self._lock:
            sock = self._sock
            if sock is None:  # the connection ended as the reply went: its socket is ours
                self._end_linger_locked()
                return None
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)
        queue = getattr(self.executor, "_work_queue", None)
        give_up = time.monotonic() + LINGER
        data: bytes | None = None
        while not self.gone and not self.backend.closing:
            if queue is not None and queue.qsize():
                break  # another connection waits for a request thread
            if not self._poller.poll(LINGER_SLICE_MS):
                if time.monotonic() >= give_up:
                    break
                continue
            try:
                data = sock.recv(READ_CHUNK)
            except BlockingIOError:
                continue
            except OSError:  # reset: the client is gone
                data = b""
            break
        with self._lock:
            self._lingering = False
            if self._close_deferred:  # the connection ended meanwhile
                self._end_linger_locked()
                return None
            if data is None:
                if self._pending:  # an ending arrived meanwhile (a shutdown)
                    return _GO_ON
                give_back = self._leave_locked()
            else:
                self._take(data)
                return _GO_ON
        if give_back:
            self.loop.call_soon_threadsafe(self.resume_reading)
        return None

    def _end_linger_locked(self) -> None:
        """The connection ended while this thread lingered (under ``_lock``): close
        the socket its end left to this thread, and leave."""
        self._lingering = False
        if self._deferred_sock is not None:
            self._deferred_sock.close()
            self._deferred_sock = None
        self._working = False

    def _take(self, data: bytes) -> None:
        """What a lingering thread read, framed into ``_pending`` (under ``_lock``), as
        the loop's reader frames what it reads: b"" is the client's departure; a
        Terminate or a violation ends the reading (the connection ends after it)."""
        if not data:
            self.gone = True
            self._pending.append(None)
            return
        messages, ended = _until_terminate(self._framer.feed(data))
        self._pending.extend(messages)
        self._queued_bytes += _wire_size(messages)
        if not ended and self._framer.violation is not None:
            self._pending.append(self._framer.violation)

    def _ending(self, last: Message | Error | None) -> tuple[Error | None] | None:
        """Whether the burst ending with ``last`` ends the connection (and with
        what error): None when the requests go on."""
        if self.gone_after_reply or self.gone or last is None:
            return (None,)
        if isinstance(last, Error):
            return (last,)
        if last[0] == b"X":
            return (None,)
        if self.backend.closing:
            return (EngineClosed("terminating connection: the server is shutting down"),)
        return None

    def _reply(self, data: bytes, ending: tuple[Error | None] | None) -> object:
        """Send a burst's reply: straight to the socket when the loop holds none of
        this connection's output (one send, no hop to the loop), else through the
        loop, in order. _GO_ON: more messages wait, go on with them. _LINGER: the
        thread reads the client's next burst itself (``_linger``). None: this
        thread is done with the connection (it left, under the same lock as the
        send, so a thread the loop starts next replies after this one; or the
        loop drains the reply, then goes on itself; or the connection ends)."""
        if not self._loop_writes:
            sent = 0
            with self._lock:  # the socket is not closed under a send
                sock = self._sock
                if sock is not None and data:
                    try:
                        sent = sock.send(data)
                    except BlockingIOError:
                        sent = 0
                    except OSError:  # reset: the reader sees the end too
                        self.gone = True
                whole = sock is not None and sent == len(data) and not self.gone
                if whole and ending is None:
                    if self._pending:
                        return _GO_ON
                    if self._thread_reads:
                        self._lingering = True
                        return _LINGER
                    self._working = False
                    return None
            if whole or self.gone:
                self._settle_soon(None if self.gone or ending is None else ending[0])
                return None
            data = data[sent:]
        with self._lock:
            self._thread_reads = False  # the loop reads again as it writes this reply
        self._loop_writes = True
        asyncio.run_coroutine_threadsafe(self._drain_then_go_on(data, ending), self.loop)
        return None

    def _settle_soon(self, reason: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(self.settle, reason)

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
        self._loop_writes = True  # the loop writes this: later replies follow it there
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
            self._loop_writes = True
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


def _until_terminate(messages: list[Message]) -> tuple[list[Message], bool]:
    """A chunk's messages up to and with a Terminate, nothing after it read (the
    loop's reading and a lingering thread's frame alike); True: it came."""
    if b"X" not in map(_KIND, messages):
        return messages, False
    ends = [kind for kind, _ in messages].index(b"X")
    return messages[: ends + 1], True


def _wire_size(messages: list[Message]) -> int:
    """The bytes ``messages`` took on the wire (a type byte and a length each)."""
    return sum(map(len, map(_BODY, messages))) + 5 * len(messages)


_KIND: Final = operator.itemgetter(0)
_BODY: Final = operator.itemgetter(1)


def _may_hold_bytes(reader: asyncio.StreamReader) -> bool:
    """Whether the stream may hold bytes it has read from the socket and not yet
    given out. asyncio keeps them in a private buffer; where a Python version
    keeps it elsewhere the answer is yes, so the loop keeps reading (a thread
    reading the socket past such bytes would take the client's messages out of
    order)."""
    buffer = getattr(reader, "_buffer", None)
    return buffer is None or len(buffer) > 0


def _own_socket(writer: asyncio.StreamWriter) -> socket.socket | None:
    """A duplicate of the client's socket for request threads' replies (None: no
    socket, a test's transport). A duplicate, not the transport's own: closing
    it is the connection's, so its descriptor cannot be reused by another
    client while a thread may still send on it."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        own = socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return None
    own.setblocking(False)
    return own
