"""The engine: a facade over the named parts one process of resgroups is made of.

==================  =========================================================
part                what it holds
==================  =========================================================
``config``          what the engine was opened with, checked (resgroups.config)
``_catalog``        the catalog log and its current snapshot (resgroups.catalog)
``_follower``       the thread that applies what others append to the log, on
                    a replica and on every engine of a PostgreSQL catalog
                    (resgroups.follower)
``runtimes``        one live runtime per group, kept equal to the catalog
                    (resgroups.sched.groups)
``dispatcher``      the worker pools and the CPU scheduler (resgroups.sched)
``memory_ledger``   group and process memory budgets (resgroups.sched.memory)
``authenticator``   who may open a session (resgroups.access)
``admission``       how a query's slot is held beyond this process: locally, a
                    fleet lease, or this instance's quota (resgroups.fleet.modes)
``fleet``           with ``coordination=``: the fleet coordinator the
                    admission mode works through (resgroups.fleet)
``deadlines``       the thread that runs ``q.on_cancel`` callbacks when a
                    query is cancelled or times out (resgroups.deadlines)
``_reconciler``     the thread that runs :meth:`Engine.reconcile` every
                    ``reconcile_interval`` seconds (resgroups.reconcile)
``rule_hits``       how often each runaway-query rule acted, and the
``watches``         statements watched after a KILL or a MOVE
                    (resgroups.sched.rules)
``tables``          the reference executor's in-memory tables (resgroups.exec)
``_metrics``        the Prometheus registry (resgroups.metrics)
==================  =========================================================

Beside them it keeps the registry of open queries (what each holds, for the
reconcile loop). The engine wires the parts together; its arguments are
checked by :class:`resgroups.config.EngineConfig`, and what the fleet needs
of it is given to :func:`resgroups.fleet.modes.open_fleet`.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from resgroups.access import Authenticator, memory_limits
from resgroups.catalog import Catalog, CatalogLag, Snapshot, open_log
from resgroups.catalog.model import GroupDef
from resgroups.catalog.store import CatalogLog
from resgroups.clock import Clock, MonotonicClock
from resgroups.config import EngineConfig
from resgroups.cpus import available_cpus
from resgroups.deadlines import DeadlineWatcher
from resgroups.errors import (
    CatalogLagError,
    EngineClosed,
    InvalidParameter,
    ReadOnlyReplica,
    did_you_mean,
)
from resgroups.exec.tables import TableStore
from resgroups.fleet.modes import AdmissionMode, open_fleet
from resgroups.follower import CatalogFollower
from resgroups.interrupts import Hold
from resgroups.metrics import EngineMetrics
from resgroups.query import Holdings, Placement, Query, QueryState
from resgroups.reconcile import Reconciler
from resgroups.sched.groups import GroupRuntimes
from resgroups.sched.memory import MemoryLedger, query_ceiling
from resgroups.sched.pool import Dispatcher, PoolView
from resgroups.sched.rules import RuleHits, WatchList
from resgroups.sched.runtime import GroupRuntime
from resgroups.sched.stats import GroupStatistics
from resgroups.session import Session
from resgroups.sql.fingerprint import fingerprint

if TYPE_CHECKING:
    from resgroups.fleet.coordinator import FleetCoordinator

log = logging.getLogger("resgroups")

Change = tuple[str, Mapping[str, Any]]


class Engine:
    """Resource groups for one process (SPEC §2).

    >>> with resgroups.Engine() as engine:
    ...     session = engine.connect(user="analyst")
    ...     session.execute("CREATE RESOURCE GROUP reporting WITH (cpu_weight = 50)")
    """

    def __init__(
        self,
        catalog: str | os.PathLike[str] | None = None,
        role: str = "primary",
        coordination: str | None = None,
        instance_id: str | None = None,
        workers: int | None = None,
        pools: Mapping[str, int] | None = None,
        slice_ms: float = 10,
        access_control: bool = False,
        admin_user: str = "admin",
        admin_password: str | None = None,
        enabled: bool = True,
        query_timeout: float | None = 60.0,
        query_memory_limit: int | None = None,
        process_memory_limit: int = 0,
        lease_heartbeat: float = 60.0,
        lease_expiry: float = 300.0,
        sweep_interval: float = 120.0,
        coordination_pool: int = 8,
        fleet_admission: str = "lease",
        *,
        quota_hold: float = 1.0,
        md5_passwords: bool = False,
        cpu_share_window: float = 10.0,
        stall_threshold: float = 30.0,
        reconcile_interval: float = 30.0,
        granularity_ms: float = 50.0,
        priority_lanes: bool = True,
        oversubscribe: float = 1.0,
        clock: Clock | None = None,
        cpu_meter: Callable[[], int] | None = None,
    ) -> None:
        config = EngineConfig(
            catalog=catalog,
            role=role,
            coordination=coordination,
            instance_id=instance_id,
            fleet_admission=fleet_admission,
            lease_heartbeat=lease_heartbeat,
            lease_expiry=lease_expiry,
            sweep_interval=sweep_interval,
            coordination_pool=coordination_pool,
            quota_hold=quota_hold,
            workers=workers,
            pools=dict(pools or {}),
            slice_ms=slice_ms,
            granularity_ms=granularity_ms,
            priority_lanes=priority_lanes,
            oversubscribe=oversubscribe,
            cpu_share_window=cpu_share_window,
            stall_threshold=stall_threshold,
            access_control=access_control,
            admin_user=admin_user,
            admin_password=admin_password,
            md5_passwords=md5_passwords,
            enabled=enabled,
            query_timeout=query_timeout,
            query_memory_limit=query_memory_limit,
            process_memory_limit=process_memory_limit,
            reconcile_interval=reconcile_interval,
            clock=clock,
            cpu_meter=cpu_meter,
        )
        self._open(config)

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        """An engine opened with ``config`` (already checked: the command line builds one)."""
        engine = cls.__new__(cls)
        engine._open(config)
        return engine

    def _open(self, config: EngineConfig) -> None:
        self.config = c = config
        self.role = c.role
        self.instance_id = c.instance_id or (
            f"{os.uname().nodename}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        self.cpus = available_cpus()
        self.workers = int(c.workers) if c.workers else max(1, round(self.cpus))
        self.pools = {"default": self.workers, **dict(c.pools or {})}
        self.slice_ms = c.slice_ms
        self.slice_s = c.slice_ms / 1000
        self.access_control = c.access_control
        self.admin_user = c.admin_user
        # also keep PostgreSQL md5 verifiers of passwords set from now on, for
        # wire clients that log in with md5 (an md5 verifier is password-equivalent
        # for such a login, so it is off unless asked for)
        self.md5_passwords = c.md5_passwords
        self.stall_threshold = c.stall_threshold  # a worker without a checkpoint this long
        self.probe_s = c.stall_threshold / 4  # a running query's slow checkpoint, this often
        self.authenticator = Authenticator(
            access_control=c.access_control,
            admin_user=c.admin_user,
            admin_password=c.admin_password,
            md5_passwords=c.md5_passwords,
        )
        self.enabled = c.enabled
        self.query_timeout = c.query_timeout
        self.query_memory_limit = c.query_memory_limit
        self.process_memory_limit = c.process_memory_limit
        self.clock: Clock = c.clock or MonotonicClock()
        self.now = self.clock.monotonic  # the engine clock, bound once (the query path)
        self._closed = False
        self._close_lock = threading.Lock()
        # open queries by id: what each holds, with a weak reference to the query
        # (a handle lost without __exit__ dies), for the reconcile loop to give back
        self._queries: dict[int, Holdings] = {}
        self.zombies_reclaimed = 0
        self.query_ids = itertools.count(1)  # next(): a new query's id (the query path)
        try:
            # an interrupt waits until the parts are made, then they are closed: none
            # made and lost on the way (a catalog's lock, a pool's threads)
            with Hold():
                self._start(c)
        except BaseException:
            self._abandon()
            raise

    def _start(self, c: EngineConfig) -> None:
        """The parts with resources (the catalog and its lock, threads, the fleet's
        connections), made in order: :meth:`_abandon` closes what was made."""
        writer = c.role == "primary"
        self._log: CatalogLog = open_log(c.catalog, lock=writer)
        self._catalog = Catalog(self._log, writer=writer)
        self.cpu_meter: Callable[[], int] = c.cpu_meter or time.thread_time_ns
        self.granularity_ms = c.granularity_ms
        self.dispatcher = Dispatcher(
            {name: int(size) for name, size in self.pools.items()},
            self.clock.monotonic,
            slice_ms=c.slice_ms,
            granularity_ms=c.granularity_ms,
            cpus=self.cpus,
            share_window_s=c.cpu_share_window,
            lanes=c.priority_lanes,
            oversubscribe=c.oversubscribe,
        )
        self._pool_views = {name: PoolView(self.dispatcher, name) for name in self.pools}
        self.memory_ledger = MemoryLedger(c.process_memory_limit)
        self.tables = TableStore()  # the built-in executor's tables
        self.rule_hits = RuleHits()  # what runaway-query rules did (SPEC §16)
        self.selector_matches: dict[int, int] = {}  # queries each selector routed (§15)
        self.watches = WatchList(self.clock.monotonic)
        self.fingerprint = fingerprint  # a statement's, for the watch list (resgroups.sql)
        self.runtimes = GroupRuntimes(
            self.clock.monotonic,
            self.dispatcher,
            self.memory_ledger,
            cpus=self.cpus,
            enabled=c.enabled,
            snapshot=lambda: self._catalog.snapshot,
            quotas=c.fleet_admission == "quota",
        )
        # every snapshot reaches the live gates under the catalog's write lock
        self._catalog.subscribe(self.runtimes.apply)
        self.catalog_lag_unmanaged_queries = 0  # queries run before the catalog arrived
        self._unmanaged_lock = threading.Lock()
        # how a query's slot is held beyond this process (SPEC §11), chosen once:
        # locally, by a lease per query, or within this instance's quota
        self.fleet: FleetCoordinator | None = None
        self.admission: AdmissionMode = AdmissionMode()
        if c.coordination is not None:
            self.fleet, self.admission = open_fleet(
                c,
                self.instance_id,
                holdings=lambda: list(self._queries.values()),  # a copy, off the query path
                runtimes=self.runtimes,
                # the log followed, the version the gates apply
                catalog=lambda: (self.snapshot.catalog_uid, self.runtimes.configured_version),
            )
        self._reconciler = Reconciler(self.reconcile, interval=c.reconcile_interval)
        # one thread for every query's on_cancel callbacks, started on first use
        self.deadlines = DeadlineWatcher(self.clock.monotonic)
        self._reconciler.start()
        self._follower = CatalogFollower(self._catalog)
        if not writer or self._log.shared:  # PostgreSQL: every engine follows the log
            self._follower.start()
        self._metrics = EngineMetrics(self)

    def _abandon(self) -> None:
        """A construction failed or was interrupted: close what :meth:`_start` made,
        the last made first."""
        self._closed = True
        made = vars(self)
        with Hold():
            for name in ("_follower", "_reconciler"):
                if name in made:
                    made[name].stop()
            if "deadlines" in made:
                self.deadlines.close(drain_s=0)
            fleet = made.get("fleet")
            if fleet is not None:
                fleet.close()
            if "dispatcher" in made:
                self.dispatcher.close()
            if "_log" in made:
                self._log.close()

    # ---- catalog -----------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The current catalog snapshot (immutable)."""
        return self._catalog.snapshot

    @property
    def catalog_version(self) -> int:
        """The version of the last applied catalog record."""
        return self._catalog.version

    @property
    def catalog_lag(self) -> CatalogLag:
        """``(records, seconds)`` behind the newest catalog version this engine has
        seen (0, 0.0 on a primary, and on a replica that is caught up)."""
        return self._catalog.lag

    def write_catalog(self, build: Callable[[Snapshot], Change | None]) -> Snapshot:
        """Append the one record a DDL statement makes (see :meth:`Catalog.write`)."""
        self._check_open()
        if not self._catalog.writer:
            raise ReadOnlyReplica(
                f"this engine is a read-only replica of {self._catalog.log_name}: run DDL "
                "on its primary (an engine opened on that catalog with role='primary'), "
                "or promote() this one"
            )
        return self._catalog.write(build)

    def promote(self) -> None:
        """Make this replica the primary (SPEC §10). Refused with CatalogLagError
        while it is behind the log and resource groups are enabled (it keeps
        serving); logged and allowed when they are disabled. Takes the writer
        lock (CatalogLocked while the old primary still holds it), applies what
        is left of the log, and writes the genesis record onto a log that never
        had one. A no-op on a primary."""
        self._check_open()
        if self._catalog.writer:
            return
        lag = self._catalog.look_ahead()
        if lag.records:
            behind = (
                f"this replica is {lag.records} catalog record(s) behind version "
                f"{self._catalog.seen_version} of {self._catalog.log_name}"
            )
            if self.enabled:
                raise CatalogLagError(
                    f"cannot promote: {behind}; it applies them within a second, "
                    "then promote() again"
                )
            log.warning("promoting although %s (resource groups are disabled)", behind)
        applied = self._catalog.promote()
        if not self._log.shared:
            self._follower.stop()  # the only writer has nothing to follow
        self.role = "primary"
        log.info(
            "promoted to primary of %s at catalog version %d (%d record(s) applied on the way)",
            self._catalog.log_name,
            self._catalog.version,
            applied,
        )

    def note_unmanaged(self) -> None:
        """A query ran unmanaged because the catalog had not arrived (SPEC §10)."""
        with self._unmanaged_lock:
            self.catalog_lag_unmanaged_queries += 1

    # ---- group runtimes -------------------------------------------------------------

    def runtime_for(self, group: GroupDef) -> GroupRuntime:
        """The live state of a group a query resolved to (even one dropped since)."""
        return self.runtimes.runtime_for(group)

    def placement(self, session: Session, group: GroupDef) -> Placement:
        """Where a managed query of ``session`` resolved to ``group`` runs: the
        group's live runtime, its memory budget and the query's ceiling (SPEC
        §8). The session keeps it while the catalog and the principal stay the
        same (``Session.placement``)."""
        snap = self.snapshot
        budget = self.memory_ledger.group(group.id, group.name)
        own, acl = memory_limits(snap, session.identity)
        ceiling = query_ceiling(
            own, acl, self.query_memory_limit, budget.path_limit(), self.process_memory_limit
        )
        rules = snap.rules_by_group.get(group.id, ()) if snap.rules else ()
        return Placement(group, self.runtimes.runtime_for(group), budget, ceiling, rules, snap)

    def pool(self, name: str) -> PoolView:
        try:
            return self._pool_views[name]
        except KeyError:
            raise InvalidParameter(
                f"there is no worker pool {name!r}; pools: {', '.join(self._pool_views)}."
                + did_you_mean(name, self._pool_views)
            ) from None

    # ---- queries ----------------------------------------------------------------------

    # set.add / set.discard / list(set) are atomic under the GIL: the per-query
    # path takes no engine lock. close() sets _closed first and then polls.

    def open_query(self, query: Query) -> None:
        if self._closed:
            self._check_open()  # raises
        self._queries[query.id] = query.held

    def stalled_workers(self) -> dict[str, int]:
        """Per pool: the workers held by queries that have run past the stall
        threshold without reaching a checkpoint."""
        stalled = dict.fromkeys(self.pools, 0)
        for query in self.live_queries():
            progress = query.progress()
            if progress is not None and progress.stalled:
                stalled[progress.pool] = stalled.get(progress.pool, 0) + progress.workers_held
        return stalled

    def live_query(self, query_id: int) -> Query | None:
        """The open query with this id (None: ended, or its handle is lost)."""
        held = self._queries.get(query_id)
        return held.query_ref() if held is not None else None

    def live_queries(self) -> list[Query]:
        """The queries open now (a copy): queued, running, parked or suspended."""
        alive = (held.query_ref() for held in list(self._queries.values()))
        return [query for query in alive if query is not None]

    def close_query(self, query: Query) -> None:
        self._queries.pop(query.id, None)
        runtime = query.held.runtime
        if runtime is not None and runtime.dropped:
            self.runtimes.query_ended(runtime)

    def reconcile(self) -> int:
        """Check the counters against the live queries and repair what drifted: a
        query whose handle is gone without ``__exit__`` (its thread died) still
        held a slot, a worker, a lease or memory; give it all back, log it as a
        zombie and count it. Runs every ``reconcile_interval`` seconds on its
        own thread, and on demand. Returns how many zombies it reclaimed."""
        reclaimed = 0
        for query_id, held in list(self._queries.items()):
            if held.query_ref() is not None:
                continue
            # on demand on the main thread, a signal waits until this zombie is off
            # the books, everything it held is back and it is counted (not half of it)
            with Hold():
                if self._queries.pop(query_id, None) is None:
                    continue
                leaked = held.give_back(self.dispatcher, self.admission)
                if held.runtime is not None:
                    self.runtimes.query_ended(held.runtime)
                self._count_zombies(1)
                reclaimed += 1
                log.warning(
                    "reconcile: query %d of user %s in group %s is gone without giving "
                    "back what it held (a zombie); its slot, worker, lease and %d bytes "
                    "are reclaimed",
                    query_id,
                    held.user,
                    held.group,
                    leaked,
                )
        stray = self.admission.stray_leases()  # rows of ours no live query holds, deleted
        with Hold():
            self._count_zombies(len(stray))
            reclaimed += len(stray)
            for lease in stray:
                log.warning(
                    "reconcile: fleet lease %s of this instance is held by no live query "
                    "(a zombie); deleted",
                    lease,
                )
        return reclaimed

    def _count_zombies(self, count: int) -> None:
        with self._unmanaged_lock:
            self.zombies_reclaimed += count

    # ---- sessions ------------------------------------------------------------------

    def connect(
        self,
        user: str | None = None,
        password: str | None = None,
        *,
        application: str | None = None,
        tags: Iterable[str] = (),
    ) -> Session:
        """A session for ``user`` (default: the admin name).

        With access control on, ``user`` names a user, a service account or the
        admin; an unknown name and a wrong or missing password (checked when
        the principal has one) fail alike, with AuthenticationFailed (28P01)
        and in the same time. ``application`` and ``tags`` are what selectors
        route its queries on (SPEC §15).
        """
        self._check_open()
        name = user if user is not None else self.admin_user
        identity = self.authenticator.login(self.snapshot, name, password)
        return Session(self, identity, application, tags)

    def selector_matched(self, selector_id: int) -> None:
        """A selector routed a query: counted for ``resource_selectors()``."""
        with self._unmanaged_lock:
            self.selector_matches[selector_id] = self.selector_matches.get(selector_id, 0) + 1

    # ---- observation ----------------------------------------------------------------

    def statistics(self) -> list[GroupStatistics]:
        """One frozen statistics record per group, DEFAULT first, creation order."""
        mode = self.admission
        return self.runtimes.statistics(
            self.snapshot, self.process_memory_limit, mode.counts(), mode.quotas()
        )

    def resource_groups(self) -> list[dict[str, Any]]:
        """The rows of ``SELECT * FROM resource_groups()``, as dicts."""
        return [vars(s).copy() for s in self.statistics()]

    @property
    def cpu_managed_dispatch(self) -> bool:
        """True while CPU scheduling is engaged (and not degraded)."""
        core = self.dispatcher.core
        return core.engaged and not core.degraded

    @property
    def cpu_scheduler_degraded(self) -> bool:
        return self.dispatcher.degraded

    def _inject_scheduler_fault(self, error: Exception | None = None) -> None:
        """Test hook: the scheduler's next engaged operation fails with ``error``."""
        fault = error or RuntimeError("injected CPU scheduler fault")

        def fail() -> None:
            self.dispatcher.fault_hook = None
            raise fault

        self.dispatcher.fault_hook = fail

    def metrics_text(self) -> str:
        """The Prometheus text exposition of this engine's metrics (SPEC §9)."""
        return self._metrics.text()

    # ---- lifetime -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the engine is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, grace: float = 10.0) -> None:
        """Refuse new queries, fail queued ones, cancel cursors between pages (their
        next fetch raises), wait up to ``grace`` seconds for running ones (then
        cancel them), stop the pools and release the catalog.
        In fleet mode this instance's leases and quotas are released only once no
        query of it holds a slot; one that does not leave at its cancel (a native
        call without checkpoints) keeps them until they expire. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            cut_short = True
            try:
                self._closed = True
                closing = EngineClosed("the engine is closing")
                for runtime in self.runtimes.all():
                    runtime.gate.fail_queued(closing)
                for query in self.live_queries():  # a cursor between pages resumes no
                    if query.state is QueryState.SUSPENDED:  # more (its next page raises)
                        query.cancel()
                # real time: this is a real wait for real threads, whatever the clock
                deadline = time.monotonic() + grace
                while self._running() and time.monotonic() < deadline:
                    time.sleep(0.005)
                cut_short = False
            finally:
                # an interrupt during the grace cuts it short (the running queries are
                # cancelled at once); one from here on waits until all is shut down
                with Hold():
                    self._shut_down(grace, cut_short)

    def _shut_down(self, grace: float, cut_short: bool) -> None:
        """:meth:`close` after its grace: cancel what still runs, stop the threads,
        release the fleet's holdings and the catalog (``cut_short``: an interrupt
        ended the grace, and the cancelled queries are not waited for)."""
        self._reconciler.stop()
        self.reconcile()  # what lost threads left behind
        leftover = self.live_queries()
        for query in leftover:
            if query.state is not QueryState.SUSPENDED:  # those were cancelled at once
                log.warning(
                    "closing the engine: cancelling a query still running %s",
                    "(the close was interrupted)" if cut_short else f"after {grace}s",
                )
            query.cancel()
        settle = time.monotonic() + (0.0 if cut_short else min(grace, 2.0))  # at a checkpoint
        while leftover and self._running() and time.monotonic() < settle:
            time.sleep(0.005)
        for held in list(self._queries.values()):  # left open beneath the close
            held.leave_main_thread()
        self._follower.stop()
        if self.fleet is not None:  # flush the releases, then free every lease of ours,
            # unless a query still holds a slot: then they are left to expire
            holding = any(h.admitted or h.leased for h in list(self._queries.values()))
            self.fleet.close(release=not holding)
        self.deadlines.close()  # their on_cancel callbacks first
        self.dispatcher.close()
        self._catalog.close()

    def _running(self) -> bool:
        """Some query is being entered or runs, or a cursor is being resumed (it seeks
        or holds a slot, a worker or a lease while its state still says
        suspended): one that leaves by itself, at its end or its next checkpoint.
        A cursor between pages holds none of them and waits for its caller."""
        return any(
            q.state is not QueryState.SUSPENDED or _seeks_or_holds(q.held)
            for q in self.live_queries()
        )

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _seeks_or_holds(held: Holdings) -> bool:
    """Waiting for or holding a slot, a worker or a fleet lease."""
    return (
        held.counted
        or held.ticket is not None
        or held.runner is not None
        or held.seeking
        or held.leased
        or held.lease_id is not None
    )
