"""The live page at ``/``: what the engine is doing, refreshed every second.

The page (``static/``: plain HTML, CSS and JavaScript, with uPlot vendored
beside its licence) reads one JSON document, ``/api/state``, which tests read
too. The server samples every group's statistics once a second into a ring
buffer (:class:`History`, the last five minutes), so a page opened late
still shows the last minutes.

With access control on, ``/`` and ``/api/state`` need the same login as
``/execute`` (HTTP basic auth) and answer with what that principal may read:
the state is built by running ``resource_groups()`` and
``resource_group_queries()`` in the principal's own session, so the page
follows exactly the rules of SQL (the groups and their history for RESOURCE
GROUP ADMIN; otherwise only the principal's own queries).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from resgroups.errors import PermissionDenied
from resgroups.session import Session

if TYPE_CHECKING:
    from resgroups.sched.stats import GroupStatistics

SAMPLE_SECONDS: Final = 1.0
HISTORY_SECONDS: Final = 300  # five minutes of samples
# what a sample keeps of each group: the charts' series
SERIES: Final = (
    "cpu_used_pct",
    "cpu_entitled_pct",
    "active_queries",
    "queued_queries",
    "oldest_queue_wait_millis",
    "memory_used_bytes",
    "memory_limit_bytes",
    # CPU charged so far: the page's "CPU used" is its change from one sample to
    # the next, % of the CPUs, so it follows the load within a second (cpu_used_pct
    # reads a window of cpu_share_window, ten seconds by default)
    "cpu_nanos_total",
)
# the page's files: name -> content type (nothing else under /static/ is served)
STATIC: Final = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "favicon.svg": "image/svg+xml",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "uPlot.LICENSE": "text/plain",
}


class History:
    """The last ``capacity`` samples of every group's :data:`SERIES` (thread-safe)."""

    def __init__(self, capacity: int = HISTORY_SECONDS) -> None:
        self._samples: deque[tuple[float, dict[str, tuple[float, ...]]]] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def record(self, at: float, stats: Iterable[GroupStatistics]) -> None:
        sample = {s.name: tuple(float(getattr(s, f)) for f in SERIES) for s in stats}
        with self._lock:
            self._samples.append((at, sample))

    def __len__(self) -> int:
        return len(self._samples)

    def series(self) -> dict[str, Any]:
        """``{"t": [unix seconds...], "groups": {name: {series: [value or null...]}}}``:
        one array per series, aligned with ``t``; null where a group did not exist."""
        with self._lock:
            samples = list(self._samples)
        names = list(dict.fromkeys(name for _, groups in samples for name in groups))
        groups: dict[str, dict[str, list[float | None]]] = {}
        for name in names:
            rows = [g.get(name) for _, g in samples]
            groups[name] = {
                field: [None if row is None else row[i] for row in rows]
                for i, field in enumerate(SERIES)
            }
        return {"t": [round(at, 3) for at, _ in samples], "groups": groups}


def _rows(result: Any) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, row, strict=True)) for row in result.rows]


def state(session: Session, history: History) -> dict[str, Any]:
    """The document of ``/api/state`` for ``session``'s principal (runs SQL: a thread)."""
    body: dict[str, Any] = {
        "now": round(time.time(), 3),
        "interval": SAMPLE_SECONDS,
        "cpus": session.engine.cpus,  # what a CPU percentage is a percentage of
        "user": session.user,
        "notice": None,
    }
    try:
        groups = session.execute("SELECT * FROM resource_groups()")
    except PermissionDenied as exc:
        body.update(groups=None, history=None, notice=exc.brief)
    else:
        body.update(groups=_rows(groups), history=history.series())
    body["queries"] = _rows(session.execute("SELECT * FROM resource_group_queries()"))
    return body


class Sampler:
    """Records the engine's statistics into a :class:`History` once a second, on
    the server's loop (the statistics are read on a worker thread)."""

    def __init__(
        self,
        read: Callable[[], list[GroupStatistics]],
        history: History,
        interval: float = SAMPLE_SECONDS,
    ) -> None:
        self._read = read
        self.history = history
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    def start(self, executor: Any) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(executor))

    async def _run(self, executor: Any) -> None:
        loop = asyncio.get_running_loop()
        while True:
            stats = await loop.run_in_executor(executor, self._read)
            self.history.record(time.time(), stats)
            # on the next whole interval, so samples line up across pages
            await asyncio.sleep(self._interval - time.time() % self._interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def static_file(name: str) -> bytes:
    return (resources.files("resgroups.server") / "static" / name).read_bytes()


async def serve_static(request: web.Request) -> web.Response:
    return await serve_static_named(request.match_info["name"])


async def serve_static_named(name: str) -> web.Response:
    content_type = STATIC.get(name)
    if content_type is None:
        raise web.HTTPNotFound(text=f"no file {name!r}: the page's files are {', '.join(STATIC)}")
    return web.Response(
        body=static_file(name),
        content_type=content_type,
        charset="utf-8" if not content_type.startswith("image/") else None,
        headers={"Cache-Control": "no-cache"},
    )


async def favicon(request: web.Request) -> web.Response:
    return web.Response(body=static_file("favicon.svg"), content_type="image/svg+xml")
