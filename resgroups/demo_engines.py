"""The demo's embedded engines: ``resgroups demo --scenario duckdb|datafusion|polars|sqlite``.

Each engine runs the dashboards-versus-report story of ``resgroups.demo`` on a
table ``facts(i, v, k)`` it holds itself, through its integration
(``resgroups.integrations``): the same workloads, users and output as the
built-in scenario, the SQL in the engine's dialect. What an engine needs
for it is one :class:`EngineDemo`: its modules (the extra to install), how
to build the table, and how a client runs one statement.

The table is sized so that the report's GROUP BY over all of it takes about
``seconds`` alone on this machine: :func:`table_rows` times it on a probe
table first.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sqlite3
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import resgroups

# the workloads' SQL: {rows} is a workload's share of the table. Engines that skip
# what a filter on i excludes (DuckDB's zone maps, SQLite's primary key) read a
# range of i; the others (DataFusion's and Polars' in-memory tables, which would
# scan all of it) read through a LIMIT, which they stop scanning at.
RANGE_SQL: Final = (
    "SELECT count(*), sum(v) FROM facts WHERE i < {rows}",
    "SELECT avg(v), count(*) FROM facts WHERE i < {rows} AND k = 3",
)
LIMIT_SQL: Final = (
    "SELECT count(*), sum(v) FROM (SELECT v FROM facts LIMIT {rows})",
    "SELECT avg(v), count(*) FROM (SELECT v, k FROM facts LIMIT {rows}) WHERE k = 3",
)
REPORT_SQL: Final = "SELECT k, sum(v), max(v) FROM facts GROUP BY k"

PROBE_ROWS: Final = 1_000_000
PROBES: Final = 3


class Database(ABC):
    """An engine's copy of ``facts``, and how a client runs a statement on it."""

    @abstractmethod
    def run(self, session: resgroups.Session, sql: str, timings: dict[str, float]) -> None:
        """Run ``sql`` as a managed query of ``session`` (its integration); fill
        ``timings`` with ``wait_ms`` and, where the engine has threads of its
        own, ``native_cpu_ms``."""

    def close(self) -> None:  # noqa: B027 (most engines free their table themselves)
        """Free the table (engines holding nothing to free keep this)."""


@dataclass(frozen=True)
class EngineDemo:
    name: str
    modules: tuple[str, ...]  # needed to run it
    extra: str  # pip install 'resgroups[extra]' ("" : the standard library)
    max_rows: int  # the table stays in memory
    open: Callable[[int], Database]  # a database holding ``facts`` of that many rows
    sql: tuple[str, str]  # the dashboards' and the ad-hoc analyst's queries

    def missing(self) -> list[str]:
        return [m for m in self.modules if importlib.util.find_spec(m) is None]


# ---- DuckDB -------------------------------------------------------------------------


class _DuckDB(Database):
    def __init__(self, rows: int) -> None:
        import duckdb

        self.con = duckdb.connect()
        self.con.execute(
            "CREATE TABLE facts AS SELECT range AS i, (range % 1000) * 0.5 AS v, "
            f"(range % 17)::INTEGER AS k FROM range({rows})"
        )

    def run(self, session: resgroups.Session, sql: str, timings: dict[str, float]) -> None:
        from resgroups.integrations.duckdb import execute

        execute(session, self.con, sql, timings=timings)

    def close(self) -> None:
        self.con.close()


# ---- DataFusion ---------------------------------------------------------------------


def _arrow_facts(rows: int) -> Any:
    import numpy as np
    import pyarrow as pa

    i = np.arange(rows, dtype=np.int64)
    return pa.table({"i": i, "v": (i % 1000) * 0.5, "k": (i % 17).astype(np.int32)})


class _DataFusion(Database):
    def __init__(self, rows: int) -> None:
        from resgroups.integrations.datafusion import DataFusion

        batches = _arrow_facts(rows).to_batches(max_chunksize=100_000)
        self.fusion = DataFusion(lambda ctx: ctx.register_record_batches("facts", [batches]))

    def run(self, session: resgroups.Session, sql: str, timings: dict[str, float]) -> None:
        self.fusion.execute(session, sql, timings=timings)


# ---- Polars (its SQL interface over a LazyFrame) ----------------------------------------


class _Polars(Database):
    def __init__(self, rows: int) -> None:
        import polars as pl

        self.facts = pl.from_arrow(_arrow_facts(rows)).lazy()  # type: ignore[union-attr]

    def run(self, session: resgroups.Session, sql: str, timings: dict[str, float]) -> None:
        import polars as pl

        from resgroups.integrations.polars import collect

        frame = pl.SQLContext(facts=self.facts).execute(sql)
        collect(session, frame, statement=sql, timings=timings)


# ---- SQLite: a database file, one connection per client thread ---------------------------
# Not a shared-cache in-memory database: its connections share one mutex held while
# a statement steps, so a statement parked by the scheduler in its progress handler
# would stall every other connection (each holding a worker): a deadlock until the
# timeouts. Separate connections to a file share nothing while they read.


class _SQLite(Database):
    def __init__(self, rows: int) -> None:
        self.directory = tempfile.TemporaryDirectory(prefix="resgroups-demo-")
        self.path = os.path.join(self.directory.name, "facts.db")
        with contextlib.closing(sqlite3.connect(self.path)) as con, con:
            con.execute("CREATE TABLE facts (i INTEGER PRIMARY KEY, v REAL, k INTEGER)")
            con.execute(
                "WITH RECURSIVE s(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < ?) "
                "INSERT INTO facts SELECT x, (x % 1000) * 0.5, x % 17 FROM s",
                (rows - 1,),
            )
        self.local = threading.local()
        self.lock = threading.Lock()
        self.opened: list[sqlite3.Connection] = []

    def run(self, session: resgroups.Session, sql: str, timings: dict[str, float]) -> None:
        from resgroups.integrations.sqlite import execute

        con: sqlite3.Connection | None = getattr(self.local, "con", None)
        if con is None:
            con = self.local.con = sqlite3.connect(self.path, check_same_thread=False)
            with self.lock:
                self.opened.append(con)
        execute(session, con, sql, timings=timings)

    def close(self) -> None:
        with self.lock:
            for con in self.opened:
                con.close()
        self.directory.cleanup()


ENGINES: Final = {
    "duckdb": EngineDemo("duckdb", ("duckdb", "pyarrow"), "duckdb", 40_000_000, _DuckDB, RANGE_SQL),
    "datafusion": EngineDemo(
        "datafusion", ("datafusion", "pyarrow"), "datafusion", 40_000_000, _DataFusion, LIMIT_SQL
    ),
    "polars": EngineDemo("polars", ("polars", "pyarrow"), "polars", 40_000_000, _Polars, LIMIT_SQL),
    "sqlite": EngineDemo("sqlite", (), "", 10_000_000, _SQLite, RANGE_SQL),
}


def table_rows(engine: EngineDemo, seconds: float) -> tuple[float, int]:
    """(the report's rate in rows per second on a probe table, the rows that make
    one report take about ``seconds`` alone here, capped at ``max_rows``)."""
    probe = engine.open(PROBE_ROWS)
    try:
        best = math.inf
        with resgroups.Engine() as timing:
            session = timing.connect()
            for _ in range(PROBES):
                started = time.perf_counter()
                probe.run(session, REPORT_SQL, {})
                best = min(best, time.perf_counter() - started)
    finally:
        probe.close()
    rate = PROBE_ROWS / best
    return rate, min(engine.max_rows, max(PROBE_ROWS, int(round(rate * seconds, -4))))
