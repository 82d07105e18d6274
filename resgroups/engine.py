"""The engine: a catalog, its sessions, the groups' live state and the schedulers."""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from resgroups.access import Identity, memory_limits
from resgroups.auth import verify_password
from resgroups.catalog import Catalog, Snapshot, open_log
from resgroups.catalog.model import GroupDef
from resgroups.catalog.names import Ident, PrincipalKind
from resgroups.catalog.store import CatalogLog
from resgroups.clock import Clock, MonotonicClock
from resgroups.cpus import available_cpus
from resgroups.errors import (
    AuthenticationFailed,
    EngineClosed,
    FeatureNotSupported,
    InvalidParameter,
    did_you_mean,
)
from resgroups.exec.tables import TableStore
from resgroups.metrics import EngineMetrics
from resgroups.query import Query
from resgroups.sched.memory import MemoryLedger, QueryMemory, query_ceiling
from resgroups.sched.pool import Dispatcher, PoolView
from resgroups.sched.runtime import GroupRuntime
from resgroups.sched.stats import CounterReading, GroupStatistics, group_statistics
from resgroups.session import Session

log = logging.getLogger("resgroups")

Change = tuple[str, Mapping[str, Any]]


def _positive(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or not value > 0:
        raise InvalidParameter(f"Engine({name}={value!r}): expected a positive number")


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
        *,
        granularity_ms: float = 50.0,
        clock: Clock | None = None,
        cpu_meter: Callable[[], int] | None = None,
    ) -> None:
        if role not in ("primary", "replica"):
            raise InvalidParameter(f"Engine(role={role!r}): expected 'primary' or 'replica'")
        if role == "replica":
            raise FeatureNotSupported(
                "role='replica' (following a catalog, SPEC §10) is not available yet"
            )
        if coordination is not None:
            raise FeatureNotSupported(
                "fleet coordination through PostgreSQL (SPEC §11) is not available yet"
            )
        if isinstance(catalog, str) and catalog.startswith(("postgresql://", "postgres://")):
            raise FeatureNotSupported(
                "a catalog in PostgreSQL (SPEC §10) is not available yet; "
                "use a directory path or None"
            )
        _positive("workers", workers)
        _positive("slice_ms", slice_ms, allow_none=False)
        _positive("granularity_ms", granularity_ms, allow_none=False)
        _positive("query_timeout", query_timeout)
        _positive("query_memory_limit", query_memory_limit)
        if process_memory_limit is None or process_memory_limit < 0:
            raise InvalidParameter(
                f"Engine(process_memory_limit={process_memory_limit!r}): expected bytes >= 0"
            )
        for pool, size in (pools or {}).items():
            _positive(f"pools[{pool!r}]", size, allow_none=False)
        if not admin_user:
            raise InvalidParameter("Engine(admin_user=''): the admin needs a name")

        self.role = role
        self.instance_id = instance_id or f"{os.uname().nodename}-{os.getpid()}-{id(self):x}"
        self.cpus = available_cpus()
        self.workers = int(workers) if workers else max(1, round(self.cpus))
        self.pools = {"default": self.workers, **dict(pools or {})}
        self.slice_ms = slice_ms
        self.access_control = access_control
        self.admin_user = admin_user
        self._admin_password = admin_password
        self.enabled = enabled
        self.query_timeout = query_timeout
        self.query_memory_limit = query_memory_limit
        self.process_memory_limit = process_memory_limit
        self.clock: Clock = clock or MonotonicClock()
        self._closed = False
        self._close_lock = threading.Lock()
        self._queries: set[Query] = set()
        self._runtimes: dict[int, GroupRuntime] = {}
        self._runtimes_lock = threading.Lock()
        self._log: CatalogLog = open_log(catalog)
        try:
            self._catalog = Catalog(self._log)
        except BaseException:
            self._log.close()
            raise
        self.cpu_meter: Callable[[], int] = cpu_meter or time.thread_time_ns
        self.granularity_ms = granularity_ms
        self.dispatcher = Dispatcher(
            {name: int(size) for name, size in self.pools.items()},
            self.clock.monotonic,
            slice_ms=slice_ms,
            granularity_ms=granularity_ms,
        )
        self._pool_views = {name: PoolView(self.dispatcher, name) for name in self.pools}
        self.memory_ledger = MemoryLedger(process_memory_limit)
        self.tables = TableStore()  # the built-in executor's tables
        self._sync_runtimes(self._catalog.snapshot)
        # what replicas report; they arrive with §10
        self.catalog_lag_unmanaged_queries = 0
        self._metrics = EngineMetrics(self)

    # ---- catalog -----------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The current catalog snapshot (immutable)."""
        return self._catalog.snapshot

    @property
    def catalog_version(self) -> int:
        """The version of the last applied catalog record."""
        return self._catalog.version

    def write_catalog(self, build: Callable[[Snapshot], Change | None]) -> Snapshot:
        """Append the one record a DDL statement makes (see :meth:`Catalog.write`)."""
        self._check_open()
        snapshot = self._catalog.write(build)
        self._sync_runtimes(snapshot)
        return snapshot

    # ---- group runtimes -------------------------------------------------------------

    def _new_runtime(self, group: GroupDef) -> GroupRuntime:
        runtime = GroupRuntime(group, self.clock.monotonic, self.dispatcher)
        self._configure_runtime(runtime, group)
        return runtime

    def _configure_runtime(self, runtime: GroupRuntime, group: GroupDef) -> None:
        runtime.configure(group, self.cpus)
        self.memory_ledger.set_group_limit(group.id, group.name, group.memory_limit)

    def _sync_runtimes(self, snapshot: Snapshot) -> None:
        """Apply the catalog to the live gates: ALTER online, DROP once idle."""
        with self._runtimes_lock:
            current = {g.id: g for g in snapshot.groups}
            for group_id, runtime in list(self._runtimes.items()):
                if group_id in current:
                    self._configure_runtime(runtime, current[group_id])
                else:
                    runtime.dropped = True
                    if runtime.idle:
                        del self._runtimes[group_id]
                        runtime.forget()
                        self.memory_ledger.forget(group_id)
            for group in snapshot.groups:
                if group.id not in self._runtimes:
                    self._runtimes[group.id] = self._new_runtime(group)
            self._update_engagement(snapshot)

    def _update_engagement(self, snapshot: Snapshot) -> None:
        """Engaged while two or more groups exist, or any has a CPU limit or the fair
        policy, or queries of dropped groups still run (SPEC §7). Lock held."""
        engaged = (
            len(snapshot.groups) >= 2
            or any(
                g.cpu_limit_centi_pct is not None or g.scheduling_policy == "fair"
                for g in snapshot.groups
            )
            or any(r.dropped for r in self._runtimes.values())
        )
        self.dispatcher.set_engaged(engaged and self.enabled)

    def runtime_for(self, group: GroupDef) -> GroupRuntime:
        """The live state of a group a query resolved to (even one dropped since)."""
        runtime = self._runtimes.get(group.id)  # the common case: no lock
        if runtime is not None:
            return runtime
        with self._runtimes_lock:
            runtime = self._runtimes.get(group.id)
            if runtime is None:
                runtime = self._runtimes[group.id] = self._new_runtime(group)
                runtime.dropped = self.snapshot.group(group.id) is None
                self._update_engagement(self.snapshot)
            return runtime

    def query_memory(self, query: Query, group: GroupDef) -> QueryMemory:
        """The budgets of a managed query starting now, its ceiling fixed (SPEC §8)."""
        session = query.session
        budget = self.memory_ledger.group(group.id, group.name)
        key = (self.snapshot.version, session.identity, group.id, budget.limit)
        cached = session.ceiling_cache
        if cached is not None and cached[0] == key:
            ceiling = cached[1]  # same catalog, principal and group: the same ceiling
        else:
            own, acl = memory_limits(self.snapshot, session.identity)
            ceiling = query_ceiling(
                own, acl, self.query_memory_limit, budget.limit, self.process_memory_limit
            )
            session.ceiling_cache = (key, ceiling)
        return QueryMemory(
            self.memory_ledger,
            group.id,
            budget,
            ceiling,
            f"group={group.name}, user={query.user}",
            query.fail,
        )

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
        self._check_open()
        self._queries.add(query)

    def close_query(self, query: Query) -> None:
        self._queries.discard(query)
        runtime = query.runtime
        if runtime is not None and runtime.dropped and runtime.idle:
            with self._runtimes_lock:
                if self._runtimes.get(runtime.group_id) is runtime and runtime.idle:
                    del self._runtimes[runtime.group_id]
                    runtime.forget()
                    self.memory_ledger.forget(runtime.group_id)
                    self._update_engagement(self.snapshot)

    # ---- sessions ------------------------------------------------------------------

    def connect(self, user: str | None = None, password: str | None = None) -> Session:
        """A session for ``user`` (default: the admin name).

        With access control on, ``user`` names a user, a service account or the
        admin; unknown names raise AuthenticationFailed (28000) and a wrong or
        missing password 28P01 when the principal has one.
        """
        self._check_open()
        name = user if user is not None else self.admin_user
        if not self.access_control:
            return Session(self, Identity(name))
        if name == self.admin_user:
            self._check_password(name, password, self._admin_password)
            return Session(self, Identity(name, is_admin=True))
        principal = self.snapshot.find_principal(Ident(name))
        if principal is None or principal.kind is PrincipalKind.GROUP:
            what = "is a group and cannot log in" if principal else "does not exist"
            raise AuthenticationFailed(f"authentication failed: principal {name} {what}")
        if principal.password_hash is not None and (
            password is None or not verify_password(password, principal.password_hash)
        ):
            raise AuthenticationFailed(
                f"password authentication failed for {name}", sqlstate="28P01"
            )
        return Session(self, Identity(principal.name, login_id=principal.id))

    def _check_password(self, name: str, given: str | None, expected: str | None) -> None:
        if expected is None:
            return
        if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
            raise AuthenticationFailed(
                f"password authentication failed for {name}", sqlstate="28P01"
            )

    # ---- observation ----------------------------------------------------------------

    def statistics(self) -> list[GroupStatistics]:
        """One frozen statistics record per group, DEFAULT first, creation order."""
        snap = self.snapshot
        total_weight = sum(g.cpu_weight for g in snap.groups)
        with self._runtimes_lock:
            runtimes = dict(self._runtimes)
        ledger = self.memory_ledger
        with ledger.lock:
            memory = {gid: budget.used for gid, budget in ledger.groups.items()}
        return [
            group_statistics(
                g,
                runtimes[g.id].reading(memory.get(g.id, 0))
                if g.id in runtimes
                else CounterReading(),
                total_weight=total_weight,
                cpus=self.cpus,
                process_memory_limit=self.process_memory_limit,
            )
            for g in snap.groups
        ]

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
        """Refuse new queries, fail queued ones, wait up to ``grace`` seconds for
        running ones (then cancel them), stop the pools and release the catalog.
        Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            closing = EngineClosed("the engine is closing")
            with self._runtimes_lock:
                runtimes = list(self._runtimes.values())
            for runtime in runtimes:
                runtime.gate.fail_queued(closing)
            # real time: this is a real wait for real threads, whatever the clock
            deadline = time.monotonic() + grace
            while self._queries and time.monotonic() < deadline:
                time.sleep(0.005)
            leftover = list(self._queries)
            for query in leftover:
                log.warning("closing the engine: cancelling a query still running after %ss", grace)
                query.cancel()
            self.dispatcher.close()
            self._catalog.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
