"""The lease store: every statement fleet mode sends to PostgreSQL.

Connections come from a ``psycopg_pool`` pool (autocommit: the acquire is
one round trip to ``resgroups_fleet_try_acquire``, whose advisory lock lasts
for the call and its commit). Any database failure (refused, terminated,
timed out, the pool exhausted) raises :class:`StoreUnavailable`; the
callers decide: an acquire waits and retries, a release batch is retried.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

import psycopg
from psycopg_pool import ConnectionPool

from resgroups.pgschema import migrate, redact

log = logging.getLogger("resgroups.fleet")

CHANNEL: Final = "resgroups_fleet"  # one NOTIFY per release batch, never per query
_SWEEP_LOCK: Final = (0x7267, 3)


class StoreUnavailable(Exception):
    """The coordination database could not be reached or answer."""


class FleetGroup(NamedTuple):
    """A group as the fleet knows it: its identity (``GroupDef.uid``), the key of
    every row, and its name now, a label for people reading the tables."""

    key: str
    name: str


# (the log's identity, the version at which the group's limit appeared (0: none to
# wait for), the expiry in seconds, the version the caller's gates apply): who
# must have adopted before anyone admits, and whether the caller's catalog lags
Barrier = tuple[str, int, float, int]


class LeaseStore:
    def __init__(self, dsn: str, instance_id: str, *, pool_size: int = 8) -> None:
        self.dsn = dsn
        self.name = redact(dsn)
        self.instance_id = instance_id
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True, "application_name": f"resgroups fleet {instance_id}"},
            timeout=5.0,
            open=False,
        )
        try:  # one direct connection first: an unreachable server fails at once
            with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                migrate(conn)
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{self.name}: {redact(str(exc)).strip()}") from exc
        self._pool.open(wait=False)

    def _unavailable(self, what: str, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"{self.name}: cannot {what}: {redact(str(exc)).strip()}")

    def _run(self, what: str, sql: str, params: Iterable[object] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._pool.connection() as conn:
                cursor = conn.execute(sql, list(params))
                return cursor.fetchall() if cursor.description is not None else []
        except psycopg.Error as exc:  # PoolTimeout is one too
            raise self._unavailable(what, exc) from exc

    def try_acquire(self, group: FleetGroup, query_id: str, limit: int, since: Barrier) -> bool:
        """One round trip: a lease for ``query_id`` if ``group`` holds fewer than
        ``limit`` and no live instance of the log is behind ``since``."""
        rows = self._run(
            "acquire a lease",
            "SELECT resgroups_fleet_try_acquire(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (group.key, group.name, self.instance_id, query_id, limit, *since),
        )
        return bool(rows[0][0])

    def try_acquire_path(
        self, levels: list[tuple[FleetGroup, int, Barrier]], query_id: str
    ) -> bool:
        """One round trip: a lease at every limited level of a path (root first),
        or none, as :meth:`try_acquire` for one (SPEC §14)."""
        catalog, _, expiry, version = levels[-1][2]
        rows = self._run(
            "acquire a lease",
            "SELECT resgroups_fleet_try_acquire_path(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                [g.key for g, _, _ in levels],
                [g.name for g, _, _ in levels],
                self.instance_id,
                query_id,
                [limit for _, limit, _ in levels],
                catalog,
                [since for _, _, (_, since, _, _) in levels],
                expiry,
                version,
            ),
        )
        return bool(rows[0][0])

    def adopt(self, group: FleetGroup, query_ids: list[str]) -> int:
        """Leases for queries admitted before the group's limit appeared, whatever
        the count (they run already); how many were added."""
        rows = self._run(
            "adopt running queries",
            "SELECT resgroups_fleet_adopt(%s, %s, %s, %s)",
            (group.key, group.name, self.instance_id, query_ids),
        )
        return int(rows[0][0])

    def synced(self, catalog_uid: str, version: int) -> None:
        """Say that this instance has adopted its queries through ``version`` of
        log ``catalog_uid`` (and wake the instances waiting for that)."""
        self._run(
            "report the catalog version",
            "WITH up AS (UPDATE resgroups_fleet_instances SET catalog_uid = %s,"
            " catalog_version = %s WHERE instance_id = %s)"
            " SELECT pg_notify(%s, 'synced')",
            (catalog_uid, version, self.instance_id, CHANNEL),
        )

    def set_quota(
        self,
        group: FleetGroup,
        target: int,
        wanted: int,
        limit: int,
        floor: int,
        since: Barrier,
        hold: float,
    ) -> tuple[int, int, int, bool]:
        """Quota mode, one round trip: ask for ``target`` slots of ``group`` (giving
        back is always granted, never below ``floor``: the queries running here),
        saying ``wanted`` are wanted now; (the quota now held, the part of it this
        instance may admit on, its fair share (0: its turn is over, see the
        migration), whether the fleet wants more than ``limit``)."""
        rows = self._run(
            "set a quota",
            "SELECT granted, usable, fair, contended"
            " FROM resgroups_fleet_quota_set(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (group.key, group.name, self.instance_id, target, wanted, limit, floor, *since, hold),
        )
        granted, usable, fair, contended = rows[0]
        return int(granted), int(usable), int(fair), bool(contended)

    def renew_quotas(self) -> dict[str, int]:
        """Quota mode's heartbeat: this instance's quota rows renewed now; the
        quotas they hold (a row the sweep reclaimed is missing)."""
        rows = self._run(
            "renew quotas",
            "UPDATE resgroups_fleet_quotas SET renewed_at = now() WHERE instance_id = %s"
            " RETURNING group_key, quota",
            (self.instance_id,),
        )
        return {str(g): int(q) for g, q in rows}

    def quota_totals(self) -> dict[str, int]:
        """Quota mode: the slots the fleet's quotas hold, per group."""
        rows = self._run(
            "read the quotas",
            "SELECT group_key, sum(quota) FROM resgroups_fleet_quotas GROUP BY group_key",
        )
        return {str(g): int(n) for g, n in rows}

    def release_many(self, query_ids: list[str]) -> int:
        """One statement (so no transaction stays open between round trips, where a
        paused process would hold the leases' and the counters' rows and stall
        every acquire in the fleet): one DELETE for the batch (missing leases are
        no-ops) and one NOTIFY when any went; the leases removed."""
        rows = self._run(
            "release",
            "WITH gone AS (DELETE FROM resgroups_fleet_leases WHERE query_id = ANY(%s)"
            " RETURNING 1) SELECT n, CASE WHEN n > 0 THEN pg_notify(%s, n::text) END"
            " FROM (SELECT count(*) AS n FROM gone) AS released",
            (query_ids, CHANNEL),
        )
        return int(rows[0][0])

    def release_instance(self) -> int:
        """A clean shutdown: every lease of this instance released, its row gone."""
        rows = self._run(
            "release the instance's leases",
            "WITH gone AS (DELETE FROM resgroups_fleet_leases WHERE instance_id = %s RETURNING 1),"
            " quotas AS (DELETE FROM resgroups_fleet_quotas WHERE instance_id = %s RETURNING 1),"
            " bye AS (DELETE FROM resgroups_fleet_instances WHERE instance_id = %s)"
            " SELECT count(*), pg_notify(%s, (count(*) + (SELECT count(*) FROM quotas))::text)"
            " FROM gone",
            (self.instance_id, self.instance_id, self.instance_id, CHANNEL),
        )
        return int(rows[0][0])

    def holds(self, query_id: str) -> bool:
        """Whether the lease of ``query_id`` still exists."""
        rows = self._run(
            "check a lease",
            "SELECT EXISTS (SELECT 1 FROM resgroups_fleet_leases WHERE query_id = %s)",
            (query_id,),
        )
        return bool(rows[0][0])

    def forget_instance(self) -> None:
        """A shutdown that leaves its leases and quotas to expire: only its row goes."""
        self._run(
            "delete the instance's row",
            "DELETE FROM resgroups_fleet_instances WHERE instance_id = %s",
            (self.instance_id,),
        )

    def renew(
        self,
        host: str,
        pid: int,
        catalog: tuple[str, int],
        expiry: float,
        mode: str,
        *,
        admitting: bool = True,
    ) -> tuple[set[str], str | None]:
        """The heartbeat: this instance's row stamped (with the log it follows, the
        version through which it has adopted its queries, its expiry and, while it
        admits (``admitting``), its admission mode) and every lease of it renewed
        now, in one statement; the leases it still holds, and an older live
        instance admitting in another mode (None: none). An instance refused for
        its mode shows none, so it holds back nobody else."""
        rows = self._run(
            "renew leases",
            "WITH beat AS (INSERT INTO resgroups_fleet_instances"
            "  (instance_id, host, pid, catalog_uid, catalog_version, expiry, admission)"
            "  VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (instance_id)"
            "  DO UPDATE SET heartbeat_at = now(), host = EXCLUDED.host, pid = EXCLUDED.pid,"
            "  catalog_uid = EXCLUDED.catalog_uid, catalog_version = EXCLUDED.catalog_version,"
            "  expiry = EXCLUDED.expiry, admission = EXCLUDED.admission"
            "  RETURNING started_at),"
            " renewed AS (UPDATE resgroups_fleet_leases SET renewed_at = now()"
            "  WHERE instance_id = %s RETURNING query_id)"
            " SELECT 'lease', query_id FROM renewed"
            " UNION ALL SELECT 'other', o.instance_id || ' (' || o.admission || ')'"
            "  FROM resgroups_fleet_instances o, beat"
            "  WHERE o.instance_id <> %s AND o.admission NOT IN ('', %s)"
            "  AND o.started_at < beat.started_at"
            "  AND o.heartbeat_at > now() - make_interval(secs => o.expiry)",
            (self.instance_id, host, pid, *catalog, expiry, mode if admitting else "",
             self.instance_id, self.instance_id, mode),
        )  # fmt: skip
        others = sorted(str(r[1]) for r in rows if r[0] == "other")
        return {str(r[1]) for r in rows if r[0] == "lease"}, (others[0] if others else None)

    def instances(self, expiry_s: float) -> list[tuple[Any, ...]]:
        """Every instance of the fleet: (id, host, pid, last heartbeat, leases held,
        healthy: a heartbeat within ``expiry_s``, the catalog version through which it
        has adopted its queries), oldest first."""
        return self._run(
            "list the instances",
            "SELECT i.instance_id, i.host, i.pid, i.heartbeat_at,"
            " (SELECT count(*) FROM resgroups_fleet_leases l WHERE l.instance_id = i.instance_id),"
            " i.heartbeat_at > now() - make_interval(secs => %s), i.catalog_version"
            " FROM resgroups_fleet_instances i ORDER BY i.started_at, i.instance_id",
            (expiry_s,),
        )

    def server_now(self) -> Any:
        """The database's clock (``now()``), for :meth:`orphans`."""
        return self._run("read the clock", "SELECT now()")[0][0]

    def orphans(self, before: Any, live: list[str]) -> list[str]:
        """Delete this instance's lease rows acquired before ``before`` (the server's
        clock) that no live query holds; their ids. A lease acquired later is
        never a candidate, so a lease taken while ``live`` was read is safe."""
        rows = self._run(
            "delete orphaned leases",
            "DELETE FROM resgroups_fleet_leases WHERE instance_id = %s AND acquired_at < %s"
            " AND NOT (query_id = ANY(%s)) RETURNING query_id",
            (self.instance_id, before, live),
        )
        return [str(r[0]) for r in rows]

    def sweep(self, expiry_s: float) -> tuple[int, list[str]] | None:
        """As the one sweep owner (None when another instance is sweeping): expire
        leases not renewed for ``expiry_s``, recount every counter that drifted
        from its rows; (expired, groups recounted)."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                # a sweeper paused between these statements (SIGSTOP, a stalled VM)
                # would hold the sweep lock and the counters' rows, stalling every
                # acquire in the fleet: PostgreSQL ends such a session past the expiry
                conn.execute(
                    "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                    [str(max(100, int(expiry_s * 1000)))],
                )
                owner = conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", _SWEEP_LOCK)
                row = owner.fetchone()
                if not row or not row[0]:
                    return None
                # past the owner's own expiry (and this one's), whatever the sweeper's
                expired = conn.execute(
                    "DELETE FROM resgroups_fleet_leases l"
                    " WHERE renewed_at < now() - make_interval(secs => %s)"  # the index
                    " AND renewed_at < now() - make_interval(secs => greatest(%s,"
                    " (SELECT i.expiry FROM resgroups_fleet_instances i"
                    "   WHERE i.instance_id = l.instance_id)))",
                    [expiry_s, expiry_s],
                ).rowcount
                expired += conn.execute(  # quota mode: the shares of lapsed instances
                    "DELETE FROM resgroups_fleet_quotas q"
                    " WHERE renewed_at < now() - make_interval(secs => %s)"
                    " AND renewed_at < now() - make_interval(secs => greatest(%s,"
                    " (SELECT i.expiry FROM resgroups_fleet_instances i"
                    "   WHERE i.instance_id = q.instance_id)))",
                    [expiry_s, expiry_s],
                ).rowcount
                drifted = [
                    g
                    for (g,) in conn.execute(
                        "SELECT group_key FROM ("
                        " SELECT c.group_key, c.leased, coalesce(l.n, 0) AS n"
                        " FROM resgroups_fleet_counters c FULL JOIN"
                        " (SELECT group_key, count(*) AS n FROM resgroups_fleet_leases"
                        "  GROUP BY group_key) l USING (group_key)) d"
                        " WHERE leased IS DISTINCT FROM n ORDER BY group_key"
                    ).fetchall()
                ]
                if expired:
                    conn.execute("SELECT pg_notify(%s, %s)", [CHANNEL, str(expired)])
        except psycopg.Error as exc:
            raise self._unavailable("sweep", exc) from exc
        for group in drifted:  # each under its group's lock, in its own call
            self._run("recount", "SELECT resgroups_fleet_recount(%s)", (group,))
        return expired, drifted

    def counts(self) -> dict[str, int]:
        """Leases held per group key, fleet-wide (the counters)."""
        rows = self._run(
            "read the counters", "SELECT group_key, leased FROM resgroups_fleet_counters"
        )
        return {str(g): int(n) for g, n in rows}

    def listen_connection(self) -> psycopg.Connection[Any]:
        """A dedicated connection (outside the pool) that LISTENs for releases."""
        try:
            conn = psycopg.connect(
                self.dsn,
                autocommit=True,
                connect_timeout=5,
                application_name=f"resgroups fleet listen {self.instance_id}",
            )
            conn.execute(f"LISTEN {CHANNEL}")
            return conn
        except psycopg.Error as exc:
            raise self._unavailable("listen", exc) from exc

    def close(self) -> None:
        self._pool.close()
