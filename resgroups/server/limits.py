"""What the two listeners share so that no client can take the server from the rest.

``ConnectionSlots``
    A cap on client connections (``serve --max-connections``) with a reserve
    for RESOURCE GROUP ADMIN principals, as PostgreSQL's
    ``max_connections`` and ``superuser_reserved_connections``: once only the
    reserve is left, a connection that logs in as anyone else is refused
    with 53300 ``too_many_connections``.

``RequestThreads``
    The request threads both listeners run blocking work on, and a small pool
    of their own for admins: with every general thread pinned (queued
    queries, clients that stop reading), the admin's ``resource_groups()``,
    ``/metrics`` and ``/execute`` still run.

``LoginThrottle``
    Failed logins per source address: after ``free`` failures inside
    ``window_s`` each further attempt from that address is refused without
    hashing (PostgreSQL's ``auth_delay``, in spirit) until the window moves
    on, so wrong passwords cannot buy the server's CPU.

All three are thread-safe and cheap: a lock and a few integers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

from resgroups.access import Identity, is_group_admin

if TYPE_CHECKING:
    from resgroups.engine import Engine

T = TypeVar("T")

ADMIN_RESERVE: Final = 3  # PostgreSQL's superuser_reserved_connections default
ADMIN_THREADS: Final = 4


def reserved_for(engine: Engine, identity: Identity) -> bool:
    """Does this principal get the admin reserve (connections and request threads)?

    With access control on: the admin and every RESOURCE GROUP ADMIN
    principal. With it off anyone may log in under any name, so the reserve
    goes to the admin's name (``--admin-user``), as it would to a superuser.
    """
    if not engine.access_control:
        return identity.login_name == engine.admin_user
    return is_group_admin(engine.snapshot, identity, access_control=True)


def may_be_reserved(engine: Engine, name: str) -> bool:
    """Before a password is checked: would ``name``, once logged in, get the
    reserve? (a claimed admin's password hash runs on the admin's threads, so
    the admin can log in while every general thread is pinned)"""
    if not engine.access_control or name == engine.admin_user:
        return name == engine.admin_user
    identity, _ = engine.authenticator.credentials(engine.snapshot, name)
    return identity is not None and reserved_for(engine, identity)


class ConnectionSlots:
    """Connections in use against ``max_connections`` (None: no cap)."""

    def __init__(self, max_connections: int | None, *, reserved: int = ADMIN_RESERVE) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections={max_connections!r}: expected at least 1")
        self.max_connections = max_connections
        self.reserved = 0 if max_connections is None else min(reserved, max_connections - 1)
        self._lock = threading.Lock()
        self.open = 0

    def take(self, *, admin: bool) -> bool:
        """Count one more connection, once its principal is known; False when the
        cap (or, for a non-admin, the cap less the reserve) is reached."""
        with self._lock:
            if self.max_connections is not None:
                room = self.max_connections - (0 if admin else self.reserved)
                if self.open >= room:
                    return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.open = max(0, self.open - 1)

    def refusal(self, *, admin: bool) -> str:
        if admin or not self.reserved:
            return f"sorry, too many clients already (max_connections = {self.max_connections})"
        return (
            f"remaining connection slots are reserved for RESOURCE GROUP ADMIN principals "
            f"(max_connections = {self.max_connections}, {self.reserved} reserved)"
        )


class RequestThreads(Executor):
    """The general request threads, and a reserve that only admins use."""

    def __init__(self, general: int, *, admin: int = ADMIN_THREADS) -> None:
        self.general = ThreadPoolExecutor(general, thread_name_prefix="resgroups-request")
        self.admin = ThreadPoolExecutor(admin, thread_name_prefix="resgroups-admin-request")

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.general.submit(fn, *args, **kwargs)

    def for_admin(self, admin: bool) -> Executor:
        """Where a request of this principal runs."""
        return self.admin if admin else self.general

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.general.shutdown(wait=wait, cancel_futures=cancel_futures)
        self.admin.shutdown(wait=wait, cancel_futures=cancel_futures)


class LoginThrottle:
    """Failed logins per source address over a sliding window."""

    def __init__(
        self,
        *,
        free: int = 5,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 65536,
    ) -> None:
        self.free = free
        self.window_s = window_s
        self._clock = clock
        self._max = max_addresses
        self._lock = threading.Lock()
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, address: str, now: float) -> deque[float] | None:
        seen = self._failures.get(address)
        if seen is not None:
            while seen and seen[0] <= now - self.window_s:
                seen.popleft()
            if not seen:
                del self._failures[address]
                return None
        return seen

    def retry_after(self, address: str) -> float:
        """0 when ``address`` may try to log in now, else the seconds until it may."""
        with self._lock:
            now = self._clock()
            seen = self._recent(address, now)
            if seen is None or len(seen) < self.free:
                return 0.0
            return max(0.001, seen[-self.free] + self.window_s - now)

    def failed(self, address: str) -> None:
        with self._lock:
            now = self._clock()
            if address not in self._failures and len(self._failures) >= self._max:
                for old in list(self._failures)[: self._max // 8]:  # forget the oldest
                    del self._failures[old]
            seen = self._recent(address, now)
            if seen is None:
                seen = self._failures[address] = deque(maxlen=self.free)
            seen.append(now)

    def succeeded(self, address: str) -> None:
        with self._lock:
            self._failures.pop(address, None)
