"""A replica's follower: the thread that keeps its catalog equal to the log.

Every ``interval`` (or sooner, when the log announces news: a PostgreSQL
NOTIFY) it calls :meth:`Catalog.catch_up`, which reads the whole records
other writers appended and applies them in version order, each published to
the live group runtimes under the catalog's write lock. A failure (the log
unreachable, a record this version cannot apply) is logged once per kind and
retried with a backoff from ``interval`` up to 5 s; the replica keeps serving
with the snapshot it holds, and its lag shows in ``engine.catalog_lag`` and
the ``catalog_lag_seconds`` gauge.
"""

from __future__ import annotations

import logging
from typing import Final

from resgroups.background import Background
from resgroups.catalog import Catalog

log = logging.getLogger("resgroups.catalog")

MAX_BACKOFF: Final = 5.0


class CatalogFollower(Background):
    thread_name = "resgroups-catalog-follower"

    def __init__(self, catalog: Catalog, *, interval: float = 0.1) -> None:
        super().__init__()
        self._catalog = catalog
        self._interval = interval
        self.failures = 0  # consecutive failed catch-ups
        self.last_error: str | None = None

    def _run(self) -> None:
        wait = self._interval
        while not self._stop.is_set():
            try:
                self._catalog.catch_up()
                self._catalog.wait_for_news(wait, self._stop)
            except Exception as exc:  # keep serving with what we have; retry
                self.failures += 1
                message = str(exc)
                if message != self.last_error:
                    log.error("catalog follower of %s: %s", self._catalog.log_name, message)
                self.last_error = message
                wait = min(MAX_BACKOFF, max(wait * 2, self._interval))
                self._stop.wait(wait)
            else:
                if self.failures:
                    log.info("catalog follower of %s: caught up again", self._catalog.log_name)
                self.failures, self.last_error, wait = 0, None, self._interval
