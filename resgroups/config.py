"""An engine's options, checked once: ``EngineConfig``.

Every keyword ``Engine(...)`` takes (SPEC §2) is a field here, with its
default, and its check sits beside it in ``__post_init__``: a value out of
range raises InvalidParameter naming the option, the value given and what is
allowed, before the engine opens a catalog or starts a thread. The command
line's flags (``resgroups serve --query-timeout ...``) become Engine
arguments and meet the same checks. Frozen: what an engine was opened with
does not change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from resgroups.errors import InvalidParameter
from resgroups.pgschema import redact

if TYPE_CHECKING:
    from resgroups.clock import Clock

MAX_THREADS: Final = 4096
ROLES: Final = ("primary", "replica")
FLEET_ADMISSIONS: Final = ("lease", "quota")


def _positive(name: str, value: object, *, optional: bool = False) -> None:
    """A positive number of seconds, milliseconds or bytes (None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidParameter(f"Engine({name}={value!r}): expected a positive number")


def _threads(name: str, value: object, *, optional: bool = False) -> None:
    """A number of threads: an integer 1..4096 (1.0 is accepted as 1, 0.5 is not)."""
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 1 <= value <= MAX_THREADS
        or value != int(value)
    ):
        raise InvalidParameter(f"Engine({name}={value!r}): expected an integer 1..{MAX_THREADS}")


def _choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        expected = " or ".join(repr(a) for a in allowed)
        raise InvalidParameter(f"Engine({name}={value!r}): expected {expected}")


@dataclass(frozen=True)
class EngineConfig:
    """What one engine is opened with (the arguments of ``Engine``, SPEC §2)."""

    # the catalog and this process's place in it
    catalog: str | os.PathLike[str] | None = None
    role: str = "primary"
    # the fleet (SPEC §11)
    coordination: str | None = None
    instance_id: str | None = None
    fleet_admission: str = "lease"
    lease_heartbeat: float = 60.0
    lease_expiry: float = 300.0
    sweep_interval: float = 120.0
    coordination_pool: int = 8
    quota_hold: float = 1.0
    # workers and the CPU scheduler (SPEC §7)
    workers: int | None = None
    pools: Mapping[str, int] = field(default_factory=dict)
    slice_ms: float = 10
    granularity_ms: float = 50.0
    # priority lanes (docs/cpu.md): a group's work at a nice from its weight while
    # engaged, and each pool this many times its workers meanwhile
    priority_lanes: bool = True
    oversubscribe: float = 1.0
    cpu_share_window: float = 10.0
    stall_threshold: float = 30.0
    # who may connect (SPEC §5)
    access_control: bool = False
    admin_user: str = "admin"
    admin_password: str | None = field(default=None, repr=False)
    md5_passwords: bool = False
    # limits every query meets (SPEC §2, §8)
    enabled: bool = True
    query_timeout: float | None = 60.0
    query_memory_limit: int | None = None
    process_memory_limit: int = 0
    # the loops that keep counters true
    reconcile_interval: float = 30.0
    # for tests: the engine's clock and the CPU meter of the calling thread
    clock: Clock | None = None
    cpu_meter: Callable[[], int] | None = None

    def __post_init__(self) -> None:
        _choice("role", self.role, ROLES)
        if self.role == "replica" and self.catalog is None:
            raise InvalidParameter(
                "Engine(role='replica', catalog=None): a replica follows a catalog "
                "another engine writes; give the primary's catalog directory"
            )
        if self.coordination is not None and not (
            isinstance(self.coordination, str)
            and self.coordination.startswith(("postgresql://", "postgres://"))
        ):
            raise InvalidParameter(
                f"Engine(coordination={redact(str(self.coordination))!r}): expected a "
                "postgresql:// connection string, or None"
            )
        _choice("fleet_admission", self.fleet_admission, FLEET_ADMISSIONS)
        if self.fleet_admission == "quota" and self.coordination is None:
            raise InvalidParameter(
                "Engine(fleet_admission='quota') shares each limit among the processes of a "
                "fleet: give coordination='postgresql://...' too"
            )
        for name in ("lease_heartbeat", "lease_expiry", "sweep_interval", "quota_hold"):
            _positive(name, getattr(self, name))
        if self.lease_expiry <= self.lease_heartbeat:
            raise InvalidParameter(
                f"Engine(lease_expiry={self.lease_expiry!r}): must be longer than "
                f"lease_heartbeat={self.lease_heartbeat!r}, or live leases would expire"
            )
        _threads("coordination_pool", self.coordination_pool)
        _threads("workers", self.workers, optional=True)
        for pool, size in dict(self.pools or {}).items():
            _threads(f"pools[{pool!r}]", size)
        for name in (
            "slice_ms",
            "granularity_ms",
            "cpu_share_window",
            "stall_threshold",
            "reconcile_interval",
        ):
            _positive(name, getattr(self, name))
        over = self.oversubscribe
        if isinstance(over, bool) or not isinstance(over, int | float) or not 1 <= over <= 16:
            raise InvalidParameter(
                f"Engine(oversubscribe={over!r}): expected a factor from 1 to 16 "
                "(1: no more workers than configured while priority lanes are on)"
            )
        _positive("query_timeout", self.query_timeout, optional=True)
        _positive("query_memory_limit", self.query_memory_limit, optional=True)
        limit = self.process_memory_limit
        if isinstance(limit, bool) or not isinstance(limit, int | float) or limit < 0:
            raise InvalidParameter(
                f"Engine(process_memory_limit={limit!r}): expected bytes >= 0 (0: no limit)"
            )
        if not self.admin_user:
            raise InvalidParameter("Engine(admin_user=''): the admin needs a name")
