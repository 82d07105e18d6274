"""A fault-injection harness for fleet mode (SPEC §6, §11; docs/fleet.md).

:func:`run_faults` starts ``nodes`` engine processes (tests/programs/fault_node.py)
on one fresh database, used by every one of them as the catalog AND the
coordination database, each process connecting as a PostgreSQL role of its
own. While their threads run short queries in a limited group (by the user
mapping ``u1 -> group``), a seeded random schedule injects faults:

===============  ===============================================================
``kill``         SIGKILL a node, start a replacement (same slot, same role); the
                 dead instance's rows must be swept once its leases expire
``stop``         SIGSTOP a node, SIGCONT after a pause (sometimes past the expiry)
``partition``    ``ALTER ROLE r NOLOGIN`` + ``pg_terminate_backend`` of its
                 backends; ``ALTER ROLE r LOGIN`` after a pause
``rename``       ``ALTER RESOURCE GROUP cur RENAME TO new`` (the same group)
``limit``        ``ALTER RESOURCE GROUP cur SET (max_active_queries = n)``, 1..4
``reset_set``    ``RESET (max_active_queries)``, a pause (unlimited), then ``SET``
                 again: a limit that appears
``drop_create``  ``DROP`` (refused while mapped: unmap first), ``CREATE`` the same
                 name (a NEW group), map the user again
``pg_restart``   ``pg_ctlcluster ... restart`` (opt-in only, see FaultConfig)
===============  ===============================================================

The DDL runs through an ``Engine(catalog=dsn)`` of the driver's own, which
records, on CLOCK_MONOTONIC, when each statement started and returned and what
every group's limit was after it, by the group's identity (its catalog id: a
RENAME keeps it, a DROP + CREATE makes a new one).

That record is what :func:`check` judges by. Every body a node reports is an
interval ``[start, end]`` during which its slot was certainly held (``end`` is
the last stamp whose checkpoint passed; a body none of whose checkpoints
passed does not count). For each body B of a limited group identity, the
number of bodies of that identity open at B's start (B included) must not
exceed the limit B's admission was held to. So a lowered (or appearing)
limit lets the bodies admitted before it run above it until they end, but
nothing admitted after the change may start while the count, those older
bodies included, is at or above the new limit. While a group is unlimited
nothing is checked. The limit B's admission was held to is the most
permissive of:

- the limits in force at some instant of ``[max(submit, start - slack),
  start]``, where B's admission lies (``slack``: from the gate to the first
  stamp); while a DDL runs, its old and its new value both count, and from
  the moment it returned only the new one;
- for ``propagation`` seconds after a DDL returned (the catalog reaches the
  other processes within about a second), its old value too, but only for a
  body whose node had not applied it yet when the query was submitted (the
  node reports its catalog version before and after admission).

``propagation=0`` is the strict reading (a change is in force everywhere the
moment its DDL returned); what the fair reading tolerated is counted in the
report's notes either way, and a violation says whether the node had applied
the DDL that set the limit it broke ("applied", "catalog lag", "unknown").

It also checks progress (every live node completes a body after each fault),
that a SIGKILLed instance's rows are swept after the expiry, that every process
ends cleanly on SIGTERM, and that no lease or quota row is left afterwards.
"""

from __future__ import annotations

import heapq
import itertools
import os
import queue
import random
import shutil
import signal
import subprocess
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from nodes import Node

import resgroups

FAULT_NODE = Path(__file__).parent / "programs" / "fault_node.py"
PG_DSN = os.environ.get("RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
KINDS = ("kill", "stop", "partition", "rename", "limit", "reset_set", "drop_create")
USER = "u1"
FIRST_GROUP = "g"
FIRST_LIMIT = 2


def mono() -> float:
    """The system-wide monotonic clock every process stamps with."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


# ---- configuration --------------------------------------------------------------------


@dataclass
class FaultConfig:
    mode: str  # "lease" or "quota"
    seed: int
    nodes: int = 3
    threads: int = 4
    heartbeat: float = 0.3
    expiry: float = 1.5
    quota_hold: float = 0.5
    duration: float = 18.0  # seconds of fault schedule (the last fault may run over)
    faults: int | None = None  # this many faults instead (one of each kind per round)
    gap: tuple[float, float] = (0.3, 1.0)  # seconds between one fault's recovery and the next
    kinds: tuple[str, ...] = KINDS
    overlap: float = 0.0  # chance of a DDL fault during a stop or partition pause
    pg_restart: bool = False  # opt-in: restarts the whole PostgreSQL cluster
    slack: float = 0.05  # admission lies at most this long before a body's first stamp
    progress_timeout: float = 8.0  # every live node completes a body within this after a fault
    # seconds after a DDL returned during which a node that had not applied it yet may
    # still admit under the limit its catalog held (0: the strict reading, none)
    propagation: float = 1.0
    long_share: float = 0.03  # the share of long bodies (0.2-2.4 s: they outlive a fault)

    def node_args(self) -> list[str]:
        return [
            "--mode", self.mode, "--threads", str(self.threads),
            "--heartbeat", str(self.heartbeat), "--expiry", str(self.expiry),
            "--quota-hold", str(self.quota_hold), "--long-share", str(self.long_share),
            "--forever",
        ]  # fmt: skip


# ---- what the nodes report --------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    slot: int  # which node slot (a replacement takes the slot of the one it replaces)
    instance: str
    pid: int
    submit: float
    start: float
    end: float | None  # None: no checkpoint passed (not a valid interval)
    error: str | None
    group: str | None
    group_id: int | None
    v0: int | None
    v1: int | None

    @property
    def valid(self) -> bool:
        return self.end is not None


class FaultNode(Node):
    """A fault_node.py process (tests/nodes.py's Node), read without blocking."""

    def __init__(self, slot: int, dsn: str, instance: str, args: list[str], log: Path) -> None:
        super().__init__(
            dsn, *args, "--instance-id", instance, "--log", str(log), program=FAULT_NODE
        )
        self.slot, self.instance, self.log = slot, instance, log
        self.bodies: list[Body] = []
        self.done: dict[str, Any] | None = None
        self.ready: dict[str, Any] | None = None
        self.eof = False
        self.state = "starting"  # running, stopped, partitioned, killed, ended

    def _take(self, line: dict[str, Any]) -> None:
        self.seen.append(line)
        if "start" in line:
            end = line["end"]
            fields = {k: line[k] for k in ("error", "group", "group_id", "v0", "v1")}
            self.bodies.append(
                Body(
                    slot=self.slot,
                    instance=self.instance,
                    pid=int(line["pid"]),
                    submit=float(line["submit"]),
                    start=float(line["start"]),
                    end=None if end is None else float(end),
                    **fields,
                )
            )
        elif line.get("done"):
            self.done = line
        elif "ready" in line:
            self.ready = line

    def drain(self) -> None:
        """Take every line the node printed so far."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            if line is None:
                self.eof = True
            else:
                self._take(line)

    def wait_line(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> bool:
        """Drain until a line for which ``predicate`` holds (True), the node's end or
        ``timeout`` (False). Never blocks longer than ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                line = self._lines.get(timeout=min(left, 0.1))
            except queue.Empty:
                continue
            if line is None:
                self.eof = True
                return False
            self._take(line)
            if predicate(line):
                return True
        return False

    def completed_since(self, t: float) -> int:
        return sum(1 for b in self.bodies if b.error is None and b.valid and b.start >= t)

    def stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None or self.proc.stderr.closed:
            return ""
        try:
            return self.proc.stderr.read()[-1500:]
        except ValueError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)


# ---- PostgreSQL: roles, rows, the monitor ----------------------------------------------------


def _dsn_for(dsn: str, user: str, password: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    where = f"{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}"
    return f"postgresql://{quote(user)}:{quote(password)}@{where}/{params['dbname']}"


class Roles:
    """One LOGIN SUPERUSER role per node slot (cluster-wide: unique names, always
    dropped, after what they own in the test database is handed back)."""

    def __init__(self, dsn: str, count: int) -> None:
        self.dsn = dsn
        tag = uuid.uuid4().hex[:10]
        self.names = [f"rg_fault_{tag}_{i}" for i in range(count)]
        self.password = uuid.uuid4().hex
        self.created: list[str] = []

    def create(self) -> None:
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            for name in self.names:
                admin.execute(f"CREATE ROLE \"{name}\" LOGIN SUPERUSER PASSWORD '{self.password}'")
                self.created.append(name)

    def dsn_of(self, slot: int) -> str:
        return _dsn_for(self.dsn, self.names[slot], self.password)

    def set_login(self, slot: int, login: bool) -> None:
        name = self.names[slot]
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f'ALTER ROLE "{name}" {"LOGIN" if login else "NOLOGIN"}')
            if not login:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    [name],
                )

    def drop(self) -> list[str]:
        """Drop every role created; the problems met (never raises)."""
        problems: list[str] = []
        for name in self.created:
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                        [name],
                    )
                    conn.execute(f'REASSIGN OWNED BY "{name}" TO CURRENT_USER')
                    conn.execute(f'DROP OWNED BY "{name}"')
            except psycopg.Error as exc:
                problems.append(f"{name}: {exc}")
            try:
                with psycopg.connect(PG_DSN, autocommit=True, connect_timeout=10) as admin:
                    admin.execute(f'DROP ROLE IF EXISTS "{name}"')
            except psycopg.Error as exc:
                problems.append(f"{name}: {exc}")
        return problems


def fleet_rows(dsn: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the fleet's lease and quota tables (a missing table: none)."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for table, columns in (
            ("resgroups_fleet_leases", "group_name, instance_id, query_id"),
            ("resgroups_fleet_quotas", "group_name, instance_id, quota, wanted"),
        ):
            try:
                rows[table] = list(conn.execute(f"SELECT {columns} FROM {table}").fetchall())
            except psycopg.errors.UndefinedTable:
                rows[table] = []
    return rows


@dataclass
class KillWatch:
    instance: str
    killed: float
    rows_after_kill: int | None = None  # at the first sample after the kill
    gone: float | None = None


class Monitor(threading.Thread):
    """Samples, every 0.1 s and as the test's superuser (no partition applies to
    it), the fleet rows of every SIGKILLed instance: when they disappear."""

    def __init__(self, dsn: str) -> None:
        super().__init__(name="fleet-faults-monitor", daemon=True)
        self.dsn = dsn
        self.watches: list[KillWatch] = []
        self.errors = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def watch(self, instance: str, killed: float) -> KillWatch:
        w = KillWatch(instance, killed)
        with self._lock:
            self.watches.append(w)
        return w

    def _sample(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            pending = [w for w in self.watches if w.gone is None]
        if not pending:
            return
        counts: Counter[str] = Counter()
        for table in ("resgroups_fleet_leases", "resgroups_fleet_quotas"):
            try:
                for instance, n in conn.execute(
                    f"SELECT instance_id, count(*) FROM {table} GROUP BY 1"
                ).fetchall():
                    counts[str(instance)] += int(n)
            except psycopg.errors.UndefinedTable:
                pass
        t = mono()
        for w in pending:
            n = counts[w.instance]
            if w.rows_after_kill is None:
                w.rows_after_kill = n
            if n == 0:
                w.gone = t

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self._halt.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                self._sample(conn)
            except Exception:  # psycopg's, or a restart's: reconnect and go on
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
            self._halt.wait(0.1)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(10)


# ---- the limits in force: the driver's DDL, by group identity --------------------------------

ABSENT = "absent"  # a group not created yet (as far as the driver saw)
DROPPED = "dropped"

Limit = int | None  # None: unlimited


@dataclass
class Change:
    """One change of a group's limit as the driver saw it: ``old`` before the DDL
    that started at ``before``, ``new`` once it returned at ``after``."""

    before: float
    after: float
    old: Limit | str
    new: Limit | str
    ddl: str
    version: int  # the catalog version after the DDL


@dataclass
class Identity:
    id: int
    names: list[tuple[float, str]] = field(default_factory=list)  # (since, name)
    changes: list[Change] = field(default_factory=list)

    def name_at(self, t: float) -> str | None:
        name = None
        for since, n in self.names:
            if since <= t:
                name = n
        return name

    def limits_during(self, lo: float, hi: float) -> list[tuple[Limit | str, Change | None]]:
        """Every limit in force at some instant of [lo, hi], with the change that set
        it (a DDL running counts with its old and its new value)."""
        found: list[tuple[Limit | str, Change | None]] = []
        current: Limit | str = ABSENT
        setter: Change | None = None
        for c in self.changes:
            if c.after < lo:
                current, setter = c.new, c
                continue
            if c.before > hi:
                break
            found.append((current, setter))  # in force up to this change (and during it)
            current, setter = c.new, c
        found.append((current, setter))
        return [(self.settle(v), s) for v, s in found]

    def settle(self, value: Limit | str) -> Limit | str:
        """A dropped group's queries finish under its last settings."""
        return self.last_limit() if value == DROPPED else value

    def last_limit(self) -> Limit | str:
        for c in reversed(self.changes):
            if c.new not in (DROPPED, ABSENT):
                return c.new
        return ABSENT


def most_permissive(limits: list[Limit | str]) -> Limit | str:
    """ABSENT if any (not checked), None if any is unlimited, else the highest."""
    if any(v == ABSENT for v in limits):
        return ABSENT
    if any(v is None for v in limits):
        return None
    return max(int(v) for v in limits if v is not None and not isinstance(v, str))


class Timeline:
    """What the driver's engine saw of the groups after each DDL."""

    def __init__(self) -> None:
        self.identities: dict[int, Identity] = {}
        self._known: dict[int, tuple[str, Limit]] = {}

    def observe(self, snapshot: Any, before: float, after: float, ddl: str) -> None:
        seen: dict[int, tuple[str, Limit]] = {
            g.id: (g.name, g.max_active_queries) for g in snapshot.groups if g.id != 0
        }
        version = int(snapshot.version)
        for gid, (name, limit) in seen.items():
            ident = self.identities.setdefault(gid, Identity(gid))
            old = self._known.get(gid)
            if old is None:
                ident.names.append((before, name))
                ident.changes.append(Change(before, after, ABSENT, limit, ddl, version))
                continue
            if old[0] != name:
                ident.names.append((before, name))
            if old[1] != limit:
                ident.changes.append(Change(before, after, old[1], limit, ddl, version))
        for gid in set(self._known) - set(seen):
            ident = self.identities[gid]
            ident.changes.append(Change(before, after, self._known[gid][1], DROPPED, ddl, version))
        self._known = seen

    def identity_by_name(self, name: str, t: float) -> Identity | None:
        """The identity that had ``name`` at ``t`` (for a body without a group id)."""
        for ident in self.identities.values():
            if ident.name_at(t) == name:
                return ident
        return None


# ---- the judge -------------------------------------------------------------------------------


@dataclass
class FaultEvent:
    kind: str
    start: float
    end: float
    detail: str


@dataclass
class Violation:
    group_id: int
    names: str
    at: float
    open_bodies: list[Body]
    limit: int
    setter: Change | None
    body: Body
    lag: str  # "catalog lag" / "applied" / "unknown": had the node applied the change?
    in_play: list[FaultEvent]  # the faults during the open bodies' lives (and an expiry before)


@dataclass
class GroupFigures:
    group_id: int
    names: str
    bodies: int = 0
    peak: int = 0  # the most bodies open at one instant (any limit)
    peak_checked: int = 0  # the most open at the start of a checked body
    limits: set[Limit] = field(default_factory=set)
    worst_excess: int = 0  # max(open - limit) at a checked start
    violations: int = 0


def limit_for(
    ident: Identity, b: Body, slack: float, propagation: float
) -> tuple[Limit | str, Limit | str, list[tuple[Limit | str, Change | None]]]:
    """The limit B's admission was held to, strictly and fairly, and the candidates.

    Strictly: the most permissive limit in force at some instant of B's admission
    window ``[max(submit, start - slack), start]`` (a DDL running counts with
    both values). Fairly: also the limits its node may still have held because
    it had not applied a later DDL yet (its catalog version before the query was
    older than the DDL's), for ``propagation`` seconds after that DDL returned.
    """
    lo = max(b.submit, b.start - slack)
    in_force = ident.limits_during(lo, b.start)
    strict = most_permissive([v for v, _ in in_force])
    lagging = list(in_force)
    if b.v0 is not None:
        for c in ident.changes:
            if c.after < lo and c.version > b.v0 and b.start - c.after <= propagation:
                lagging.append((ident.settle(c.old), c))
    fair = most_permissive([v for v, _ in lagging])
    return strict, fair, lagging


def check(
    bodies: list[Body],
    timeline: Timeline,
    faults: list[FaultEvent],
    slack: float,
    propagation: float,
    expiry: float,
) -> tuple[list[Violation], dict[int, GroupFigures], Counter[str]]:
    """Every over-admission (see the module docstring), figures per group
    identity, and notes (bodies not checked, and why)."""
    notes: Counter[str] = Counter()
    by_group: dict[int, list[Body]] = {}
    for b in bodies:
        if not b.valid:
            notes["bodies with no passing checkpoint (not counted)"] += 1
            continue
        gid = b.group_id
        if gid is None and b.group is not None:
            ident = timeline.identity_by_name(b.group, b.start)
            gid = None if ident is None else ident.id
        if gid is None:
            notes[f"bodies in {b.group or 'no group'} (unlimited, not checked)"] += 1
            continue
        if gid == 0:
            notes["bodies in DEFAULT (unlimited)"] += 1
            continue
        by_group.setdefault(gid, []).append(b)
    violations: list[Violation] = []
    figures: dict[int, GroupFigures] = {}
    for gid, group_bodies in sorted(by_group.items()):
        ident = timeline.identities.get(gid, Identity(gid))
        names = " -> ".join(dict.fromkeys(n for _, n in ident.names)) or f"id {gid}"
        fig = figures[gid] = GroupFigures(gid, names, bodies=len(group_bodies))
        group_bodies.sort(key=lambda b: b.start)
        ends: list[tuple[float, int, Body]] = []  # a heap of the bodies open
        tie = itertools.count()
        for b in group_bodies:
            while ends and ends[0][0] < b.start:
                heapq.heappop(ends)
            assert b.end is not None
            heapq.heappush(ends, (b.end, next(tie), b))
            n = len(ends)
            fig.peak = max(fig.peak, n)
            strict, limit, candidates = limit_for(ident, b, slack, propagation)
            if limit == ABSENT:
                notes["bodies before the driver saw their group (not checked)"] += 1
                continue
            if limit is None:
                if strict is None:
                    notes["bodies admitted while their group was unlimited (not checked)"] += 1
                else:
                    notes[
                        "bodies admitted by a node that may not have applied a limit that "
                        f"appeared yet, within {propagation}s (not checked)"
                    ] += 1
                continue
            assert isinstance(limit, int)
            if isinstance(strict, int) and strict < n <= limit:
                notes[
                    f"body starts above the new limit by a node that may not have applied it "
                    f"yet, within {propagation}s of the DDL (tolerated as catalog propagation; "
                    "propagation=0 fails them)"
                ] += 1
            fig.limits.add(limit)
            fig.peak_checked = max(fig.peak_checked, n)
            fig.worst_excess = max(fig.worst_excess, n - limit)
            if n <= limit:
                continue
            fig.violations += 1
            setter = next(c for v, c in reversed(candidates) if v == limit)
            lag = "unknown"
            if setter is not None and b.v0 is not None and b.v1 is not None:
                if b.v1 < setter.version:
                    lag = "catalog lag"
                elif b.v0 >= setter.version:
                    lag = "applied"
            open_bodies = [e[2] for e in sorted(ends)]
            since = min(o.submit for o in open_bodies) - expiry
            in_play = [f for f in faults if f.start <= b.start and f.end >= since]
            violations.append(
                Violation(gid, names, b.start, open_bodies, limit, setter, b, lag, in_play)
            )
    return violations, figures, notes


# ---- the report --------------------------------------------------------------------------------


@dataclass
class Report:
    config: FaultConfig
    t0: float
    faults: list[FaultEvent] = field(default_factory=list)
    bodies: list[Body] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    figures: dict[int, GroupFigures] = field(default_factory=dict)
    notes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # progress, sweeps, shutdown, rows left
    stall_notes: list[str] = field(default_factory=list)  # what stalled nodes did afterwards
    refused: list[str] = field(default_factory=list)  # DDL the library refused (expected ones)
    done: list[dict[str, Any]] = field(default_factory=list)
    watches: list[KillWatch] = field(default_factory=list)

    def rel(self, t: float | None) -> str:
        return "-" if t is None else f"+{t - self.t0:.3f}s"

    def fault_kinds(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)

    def attributed(self) -> Counter[str]:
        """Violations by the kinds of fault in play (one violation may count for several)."""
        kinds: Counter[str] = Counter()
        for v in self.violations:
            kinds.update({f.kind for f in v.in_play} or {"no fault in play"})
        return kinds

    def format(self, limit: int = 8) -> str:
        c = self.config
        out = [
            f"fleet fault run: mode={c.mode} seed={c.seed} nodes={c.nodes}x{c.threads} threads, "
            f"heartbeat={c.heartbeat}s expiry={c.expiry}s",
            "faults: "
            + (", ".join(f"{k}={n}" for k, n in sorted(self.fault_kinds().items())) or "none"),
        ]
        valid = [b for b in self.bodies if b.valid]
        errors = Counter(b.error for b in self.bodies if b.error)
        out.append(
            f"bodies: {len(self.bodies)} reported, {len(valid)} valid, "
            f"{sum(1 for b in self.bodies if b.error is None)} completed; "
            f"errors in bodies: {dict(errors) or 'none'}"
        )
        before = Counter[str]()
        for d in self.done:
            before.update(d.get("errors_before_body", {}))
        if before:
            out.append(f"errors before a body (reported at shutdown): {dict(before)}")
        for fig in self.figures.values():
            limits = sorted(x for x in fig.limits if x is not None)
            out.append(
                f"group id {fig.group_id} ({fig.names}): {fig.bodies} bodies, peak {fig.peak} "
                f"open at once, peak at a checked start {fig.peak_checked} vs limits "
                f"{limits or 'none checked'}, worst excess {fig.worst_excess}, "
                f"{fig.violations} over-admitting start(s)"
            )
        for note, n in sorted(self.notes.items()):
            out.append(f"note: {n} {note}")
        for w in self.watches:
            delay = None if w.gone is None else w.gone - w.killed
            out.append(
                f"killed {w.instance} at {self.rel(w.killed)}: {w.rows_after_kill} row(s) after "
                f"the kill, gone after {'never' if delay is None else f'{delay:.2f}s'}"
            )
        for r in self.refused:
            out.append(f"refused DDL: {r}")
        if self.violations:
            lag = Counter(v.lag for v in self.violations)
            out.append(
                f"OVER-ADMISSION: {len(self.violations)} body start(s) above the limit in force "
                f"(by the faults in play while the bodies open ran: {dict(self.attributed())}; "
                f"had the node applied the DDL that set the limit: {dict(lag)})"
            )
            for v in self._worst(limit):
                out.append(self._violation(v))
        out.extend(f"FAILURE: {failure}" for failure in self.failures)
        out.extend(f"  (after a stall: {note})" for note in self.stall_notes)
        out.append("fault log:")
        for e in sorted(self.faults, key=lambda e: e.start):
            out.append(f"  {self.rel(e.start)}..{self.rel(e.end)} {e.kind}: {e.detail}")
        return "\n".join(out)

    def _worst(self, limit: int) -> list[Violation]:
        """The first violation of each set of faults in play, then the worst ones,
        ``limit`` in all."""
        picked: dict[tuple[int, ...], Violation] = {}
        for v in self.violations:
            picked.setdefault(tuple(id(f) for f in v.in_play), v)
        rest = sorted(self.violations, key=lambda v: v.limit - len(v.open_bodies))
        chosen = list(picked.values())[:limit]
        for v in rest:
            if len(chosen) >= limit:
                break
            if v not in chosen:
                chosen.append(v)
        return sorted(chosen, key=lambda v: v.at)

    def _violation(self, v: Violation) -> str:
        s = v.setter
        set_by = (
            "?"
            if s is None
            else f"`{s.ddl}` (ran {self.rel(s.before)}..{self.rel(s.after)}, version {s.version})"
        )
        lines = [
            f"  group id {v.group_id} ({v.names}) at {self.rel(v.at)}: {len(v.open_bodies)} "
            f"bodies open, limit in force {v.limit}, set by {set_by}; the body starting: "
            f"node {v.body.slot} pid {v.body.pid} in {v.body.group!r}, catalog "
            f"v{v.body.v0}..v{v.body.v1} ({v.lag})"
        ]
        for b in v.open_bodies:
            lines.append(
                f"      node {b.slot} pid {b.pid} {b.group!r}: "
                f"{self.rel(b.start)}..{self.rel(b.end)} (submitted {self.rel(b.submit)})"
                + (f" {b.error}" if b.error else "")
            )
        lines.append(
            "      faults in play: "
            + ("; ".join(f"{self.rel(f.start)} {f.kind}: {f.detail}" for f in v.in_play) or "none")
        )
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if self.violations or self.failures:
            raise AssertionError(self.format())


# ---- the driver ----------------------------------------------------------------------------------


class Driver:
    def __init__(self, dsn: str, config: FaultConfig, workdir: Path) -> None:
        self.dsn, self.config, self.workdir = dsn, config, workdir
        self.rng = random.Random(config.seed)
        self.t0 = mono()
        self.report = Report(config, self.t0)
        self.timeline = Timeline()
        self.nodes: list[FaultNode] = []  # every node started, in order
        self.live: dict[int, FaultNode] = {}  # slot -> the node serving it now
        self.killed: list[KillWatch] = []
        self.stalled: dict[str, float] = {}  # instance -> when a progress failure was recorded
        self.group = FIRST_GROUP
        self.limit: Limit = FIRST_LIMIT
        self.names = (f"g{i}" for i in itertools.count(1))
        self.roles: Roles | None = None
        self.engine: resgroups.Engine | None = None
        self.monitor = Monitor(dsn)
        self._instances = (
            f"fault-{config.seed}-{i}-{uuid.uuid4().hex[:6]}" for i in itertools.count()
        )

    # ---- DDL -------------------------------------------------------------------

    def ddl(self, sql: str) -> resgroups.Error | None:
        assert self.engine is not None
        before = mono()
        try:
            self.engine.connect().execute(sql)
        except resgroups.Error as exc:
            self.report.refused.append(f"{sql}: {type(exc).__name__} {exc.sqlstate}: {exc}")
            return exc
        after = mono()
        self.timeline.observe(self.engine.snapshot, before, after, sql)
        return None

    def _create(self, name: str, limit: int) -> None:
        err = self.ddl(
            f"CREATE RESOURCE GROUP IF NOT EXISTS {name} WITH "
            f"(max_active_queries = {limit}, queue_timeout = '60s')"
        )
        assert err is None, err
        assert self.engine is not None
        group = next(g for g in self.engine.snapshot.groups if g.name == name)
        if group.max_active_queries != limit:  # a node created it first (IF NOT EXISTS)
            err = self.ddl(f"ALTER RESOURCE GROUP {name} SET (max_active_queries = {limit})")
            assert err is None, err

    # ---- nodes -----------------------------------------------------------------

    def start_node(self, slot: int) -> FaultNode:
        return self.start_nodes([slot])[0]

    def start_nodes(self, slots: list[int]) -> list[FaultNode]:
        """Start a node in each slot (at once), each ready before this returns."""
        assert self.roles is not None
        started = []
        for slot in slots:
            instance = next(self._instances)
            node = FaultNode(
                slot,
                self.roles.dsn_of(slot),
                instance,
                [*self.config.node_args(), "--group", self.group, "--limit", str(FIRST_LIMIT)],
                self.workdir / f"{instance}.log",
            )
            self.nodes.append(node)
            self.live[slot] = node
            started.append(node)
        for node in started:
            if not node.wait_line(lambda m: "ready" in m, timeout=60):
                raise AssertionError(
                    f"node {node.slot} ({node.instance}) never became ready: {node.seen[-3:]}\n"
                    f"{node.stderr_tail()}\n{node.log_tail()}"
                )
            node.state = "running"
        return started

    def drain(self) -> None:
        for node in self.nodes:
            node.drain()

    def await_progress(self, since: float, why: str) -> None:
        """Every live node completes a body that started after ``since`` (bounded:
        a failure is recorded and the run goes on). A node that failed to once is
        not waited for again (the run goes on with its schedule); the report says
        whether it completed queries later."""
        timeout = self.config.progress_timeout
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            waiting = [
                n
                for n in self.live.values()
                if n.instance not in self.stalled and n.completed_since(since) == 0
            ]
            if not waiting:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        described = []
        for n in waiting:
            self.stalled[n.instance] = mono()
            done = [b for b in n.bodies if b.error is None and b.valid]
            last = (
                f"last completed body started {self.report.rel(done[-1].start)}"
                if done
                else ("no body completed yet")
            )
            described.append(
                f"node {n.slot} ({n.instance}, {n.state}, {len(done)} completed in all, {last}, "
                f"{len(n.bodies) - len(done)} failed or invalid)"
            )
        self.report.failures.append(
            f"no progress after {why}: {'; '.join(described)}: no query completed within "
            f"{timeout}s after {self.report.rel(since)} (liveness; not waited for again)"
        )

    def stalled_summary(self) -> None:
        for node in self.nodes:
            if node.instance in self.stalled:
                later = node.completed_since(self.stalled[node.instance])
                self.report.stall_notes.append(
                    f"node {node.slot} ({node.instance}) completed {later} queries after it "
                    f"was found stalled at {self.report.rel(self.stalled[node.instance])}"
                )

    def pick(self) -> FaultNode:
        return self.live[self.rng.choice(sorted(self.live))]

    def pause(self) -> float:
        """How long a stop or a partition lasts: short of the expiry, or past it."""
        short = self.rng.random() < 0.3
        return self.rng.uniform(*((0.3, 0.8) if short else (1.4, 2.0))) * self.config.expiry

    def sleep(self, seconds: float) -> None:
        """Space the schedule (never to wait for something), draining meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
            self.drain()

    # ---- faults ------------------------------------------------------------------

    def fault(self, kind: str) -> FaultEvent:
        start = mono()
        detail = getattr(self, f"_{kind}")()
        event = FaultEvent(kind, start, mono(), detail)
        self.report.faults.append(event)
        return event

    def _kill(self) -> str:
        """SIGKILL a node, preferably one holding rows (so that the sweep has
        something to reclaim), and start its replacement."""
        try:
            rows = fleet_rows(self.dsn)
        except psycopg.Error:
            rows = {}
        holding = {str(r[1]) for table in rows.values() for r in table}
        candidates = sorted(slot for slot, n in self.live.items() if n.instance in holding)
        node = self.live[self.rng.choice(candidates)] if candidates else self.pick()
        node.signal(signal.SIGKILL)
        killed = mono()
        node.proc.wait(10)
        node.state = "killed"
        node.drain()
        self.killed.append(self.monitor.watch(node.instance, killed))
        new = self.start_node(node.slot)
        return f"node {node.slot} ({node.instance}) killed; replaced by {new.instance}"

    def _hold_off(self, seconds: float) -> str:
        """Sleep through a pause, maybe running one DDL fault in it (config.overlap)."""
        if self.rng.random() >= self.config.overlap:
            self.sleep(seconds)
            return ""
        first = self.rng.uniform(0, seconds)
        self.sleep(first)
        event = self.fault(self.rng.choice(["rename", "limit", "reset_set", "drop_create"]))
        self.sleep(max(0.0, seconds - (mono() - event.start) - first))
        return f" (during it: {event.kind})"

    def _stop(self) -> str:
        node, seconds = self.pick(), self.pause()
        node.signal(signal.SIGSTOP)
        node.state = "stopped"
        try:
            during = self._hold_off(seconds)
        finally:
            node.signal(signal.SIGCONT)
            node.state = "running"
        return f"node {node.slot} ({node.instance}) stopped {seconds:.2f}s{during}"

    def _partition(self) -> str:
        assert self.roles is not None
        node, seconds = self.pick(), self.pause()
        self.roles.set_login(node.slot, False)
        node.state = "partitioned"
        try:
            during = self._hold_off(seconds)
        finally:
            self.roles.set_login(node.slot, True)
            node.state = "running"
        return f"node {node.slot} ({node.instance}) partitioned {seconds:.2f}s{during}"

    def _rename(self) -> str:
        old, new = self.group, next(self.names)
        err = self.ddl(f"ALTER RESOURCE GROUP {old} RENAME TO {new}")
        if err is None:
            self.group = new
        return f"{old} -> {new}" + (f" refused: {err}" if err else "")

    def _limit(self) -> str:
        n = self.rng.choice([x for x in range(1, 5) if x != self.limit])
        old = self.limit
        err = self.ddl(f"ALTER RESOURCE GROUP {self.group} SET (max_active_queries = {n})")
        if err is None:
            self.limit = n
        return f"{self.group}: {old} -> {n}" + (f" refused: {err}" if err else "")

    def _reset_set(self) -> str:
        old = self.limit
        err = self.ddl(f"ALTER RESOURCE GROUP {self.group} RESET (max_active_queries)")
        if err is not None:
            return f"{self.group}: RESET refused: {err}"
        self.limit = None
        seconds = self.rng.uniform(0.4, 1.2)
        self.sleep(seconds)
        n = self.rng.randint(1, 4)
        err = self.ddl(f"ALTER RESOURCE GROUP {self.group} SET (max_active_queries = {n})")
        if err is None:
            self.limit = n
        return f"{self.group}: {old} -> unlimited for {seconds:.2f}s -> {n}"

    def _drop_create(self) -> str:
        name = self.group
        steps = []
        err = self.ddl(f"DROP RESOURCE GROUP {name}")  # refused while u1 is mapped to it
        if err is not None:
            steps.append(f"DROP refused ({err.sqlstate})")
            assert self.ddl(f"ALTER USER {USER} UNSET RESOURCE GROUP") is None
            err = self.ddl(f"DROP RESOURCE GROUP {name}")
            assert err is None, err
            steps.append("unmapped, dropped")
        gap = self.rng.uniform(0.0, 0.4)
        self.sleep(gap)  # the user's queries run in DEFAULT meanwhile
        n = self.rng.randint(1, 4)
        self._create(name, n)
        assert self.ddl(f"ALTER USER {USER} SET RESOURCE GROUP {name}") is None
        self.limit = n
        return f"{name}: {', '.join(steps)}; {gap:.2f}s in DEFAULT; created again with {n}, mapped"

    def _pg_restart(self) -> str:
        """Restart the PostgreSQL cluster (opt-in), only when the server under test
        is the local Debian cluster ``<version>/main`` that pg_ctlcluster manages."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT current_setting('server_version_num'), current_setting('data_directory')"
            ).fetchone()
            assert row is not None
            version, data = int(row[0]) // 10000, str(row[1])
        if data != f"/var/lib/postgresql/{version}/main":
            return f"skipped: the server's data directory {data} is not cluster {version}/main"
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", str(version), "main", "restart"],
            check=True,
            timeout=120,
            capture_output=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=5):
                    break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        return f"PostgreSQL {version}/main restarted"

    # ---- the run -----------------------------------------------------------------------

    def schedule(self) -> Iterator[str]:
        """Every kind once in a shuffled order, again and again (seeded)."""
        kinds = list(self.config.kinds)
        if self.config.pg_restart and "pg_restart" not in kinds:
            kinds.append("pg_restart")
        while True:
            self.rng.shuffle(kinds)
            yield from kinds

    def run(self) -> Report:
        c = self.config
        try:
            self.roles = Roles(self.dsn, c.nodes)
            self.roles.create()
            self.engine = resgroups.Engine(catalog=self.dsn, access_control=True)
            self.monitor.start()
            self._create(FIRST_GROUP, FIRST_LIMIT)
            assert self.ddl(f"CREATE USER {USER}") is None
            assert self.ddl(f"ALTER USER {USER} SET RESOURCE GROUP {FIRST_GROUP}") is None
            self.start_nodes(list(range(c.nodes)))
            self.await_progress(self.t0, "start")
            end = mono() + c.duration
            for count, kind in enumerate(self.schedule()):
                if (count >= c.faults) if c.faults is not None else (mono() >= end):
                    break
                self.sleep(self.rng.uniform(*c.gap))
                event = self.fault(kind)
                self.await_progress(event.end, f"{kind} at {self.report.rel(event.start)}")
            self.finish()
            self.stalled_summary()
        except Exception:  # the run broke: say how, and still judge what was seen
            self.report.failures.append("the driver failed:\n" + traceback.format_exc())
        finally:
            self.cleanup()
        self.report.bodies = [b for n in self.nodes for b in n.bodies]
        self.report.watches = self.killed
        v, figures, notes = check(
            self.report.bodies, self.timeline, self.report.faults, c.slack, c.propagation, c.expiry
        )
        self.report.violations, self.report.figures = v, figures
        self.report.notes.update(notes)
        return self.report

    def finish(self) -> None:
        """Stale rows swept, a clean shutdown, nothing left behind."""
        c = self.config
        allowed = c.expiry + 2 * c.heartbeat + 3.0  # the sweep, with a margin for a busy box
        for w in self.killed:
            left = w.killed + allowed - mono()
            deadline = time.monotonic() + max(0.0, left) + 0.3
            while w.gone is None and time.monotonic() < deadline:
                self.sleep(0.05)
            if w.gone is None or w.gone - w.killed > allowed:
                self.report.failures.append(
                    f"the rows of SIGKILLed {w.instance} (killed {self.report.rel(w.killed)}, "
                    f"{w.rows_after_kill} row(s) after) were not swept within {allowed:.1f}s "
                    f"(gone: {self.report.rel(w.gone)})"
                )
        for node in self.live.values():
            node.signal(signal.SIGTERM)
        clean = True
        for node in self.live.values():
            if not node.wait_line(lambda m: bool(m.get("done")), timeout=30):
                clean = False
                self.report.failures.append(
                    f"node {node.slot} ({node.instance}) did not end cleanly on SIGTERM within "
                    f"30s (exit {node.proc.poll()}): {node.stderr_tail()} {node.log_tail(5)}"
                )
            else:
                assert node.done is not None
                self.report.done.append(node.done)
                if node.done.get("stuck_threads"):
                    clean = False
                    self.report.failures.append(f"node {node.slot}: threads stuck at shutdown")
            try:
                node.proc.wait(15)
            except subprocess.TimeoutExpired:
                clean = False
                self.report.failures.append(f"node {node.slot} ({node.instance}) did not exit")
            node.state = "ended"
        if clean:
            rows = fleet_rows(self.dsn)
            deadline = time.monotonic() + 5
            while any(rows.values()) and time.monotonic() < deadline:
                time.sleep(0.1)
                rows = fleet_rows(self.dsn)
            for table, remaining in rows.items():
                if remaining:
                    self.report.failures.append(
                        f"{len(remaining)} row(s) left in {table} after every process ended: "
                        f"{remaining[:5]}"
                    )

    def cleanup(self) -> None:
        problems: list[str] = []
        for node in self.nodes:
            try:
                node.signal(signal.SIGCONT)
                node.drain()
                node.kill()
                node.drain()
            except Exception as exc:  # cleanup goes on
                problems.append(f"node {node.instance}: {exc!r}")
        try:
            self.monitor.stop()
        except Exception as exc:
            problems.append(f"monitor: {exc!r}")
        try:
            if self.engine is not None:
                self.engine.close()
        except Exception as exc:
            problems.append(f"the driver's engine: {exc!r}")
        if self.roles is not None:
            problems += self.roles.drop()
        if problems:
            self.report.failures.append("cleanup: " + "; ".join(problems))


def run_faults(dsn: str, config: FaultConfig, workdir: Path) -> Report:
    """One seeded fault run on the fresh database ``dsn``; the report (check it
    with :meth:`Report.assert_ok`)."""
    if config.pg_restart and shutil.which("pg_ctlcluster") is None:
        config.pg_restart = False
    return Driver(dsn, config, workdir).run()
