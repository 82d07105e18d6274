"""A session: one principal's connection to an engine."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from resgroups.access import Identity, login_principal, resolve, still_assumed
from resgroups.catalog.model import GroupDef
from resgroups.errors import QueryCancelled
from resgroups.query import Placement, Query, QueryState
from resgroups.result import Cursor, Result
from resgroups.sql import ast
from resgroups.sql.expr import EvalContext
from resgroups.sql.parser import parse_script
from resgroups.statements.dispatch import (
    describe,
    describe_parameters,
    execute_statement,
    open_cursor,
)

if TYPE_CHECKING:
    from resgroups.engine import Engine


class Session:
    """One principal's session. Use it from one thread at a time.

    >>> session = engine.connect(user="analyst")
    >>> session.execute("SELECT current_resource_group()").rows
    [('default',)]
    """

    def __init__(self, engine: Engine, identity: Identity) -> None:
        self.engine = engine
        self._identity = identity
        self.database = "resgroups"  # current_database(): what a wire client named
        self._chosen: int | None = None  # the chosen group's id (a rename keeps it)
        # the ids of this session's queries in flight: a query adds its own as it
        # starts and takes it out as it ends (set.add and discard are atomic
        # under the GIL: the per-query path takes no lock for it). Ids, not the
        # queries: the engine's registry holds them weakly, so that a query whose
        # handle is lost is left for the reconcile loop to reclaim.
        self.running_ids: set[int] = set()
        self._cancel_requested = False  # cancel() during a script stops what is left
        self.work_cpu_ns = 0  # CPU the built-in executor spent on this session's queries
        # the last placement, with the snapshot, identity and choice it was resolved for
        self._placed: tuple[object, Identity, int | None, Placement] | None = None
        self._cpu_lock = threading.Lock()

    def add_work_cpu(self, nanos: int) -> None:
        with self._cpu_lock:
            self.work_cpu_ns += nanos

    @property
    def identity(self) -> Identity:
        return self._identity

    @property
    def user(self) -> str:
        """The login name: the fair policy's "user"."""
        return self._identity.login_name

    @property
    def chosen_group_id(self) -> int | None:
        return self._chosen

    def choose(self, group_id: int | None) -> None:
        """SET RESOURCE GROUP (by identity, so a rename keeps the choice) or RESET."""
        self._chosen = group_id

    def running_queries(self) -> list[Query]:
        """This session's queries in flight. A query whose handle was lost without
        exit is not: its id is dropped here, and the reconcile loop reclaims it."""
        running = []
        for query_id in list(self.running_ids):
            query = self.engine.live_query(query_id)
            if query is None:
                self.running_ids.discard(query_id)
            else:
                running.append(query)
        return running

    def cancel(self) -> int:
        """Cancel every query this session has in flight, from any thread (what
        Ctrl-C in the shell and a wire protocol cancel request do); how many.
        A suspended cursor is not in flight: it is left for its next fetch."""
        self._cancel_requested = True
        running = [q for q in self.running_queries() if q.state is not QueryState.SUSPENDED]
        for query in running:
            query.cancel()
        return len(running)

    def assume(self, account_id: int | None) -> None:
        self._identity = replace(self._identity, assumed_id=account_id)

    def _refresh_identity(self) -> None:
        """Before each statement and managed query: the login must still exist,
        and an assumption whose grant was revoked ends (SPEC §5)."""
        snap = self.engine.snapshot
        login_principal(snap, self._identity)  # dropped since login?
        if not still_assumed(snap, self._identity):
            self.assume(None)

    def managed_group_def(self, *, export: bool = False) -> GroupDef | None:
        """Resolve the group a managed query starting now runs in (SPEC §5).

        None when queries run unmanaged: the feature is disabled, or this is a
        replica that has not received the catalog yet (SPEC §10). Exports keep
        the principal's mapped group even when the session chose another.
        """
        engine = self.engine
        if not engine.enabled:
            return None
        if not engine.snapshot.has_catalog:  # a replica the catalog has not reached yet
            engine.note_unmanaged()
            return None
        self._refresh_identity()
        chosen = None if export else self._chosen
        return resolve(
            engine.snapshot, self._identity, chosen, access_control=engine.access_control
        )

    def placement(self, *, export: bool = False) -> Placement | None:
        """Where a managed query starting now runs (None: unmanaged). Resolution
        depends only on the catalog snapshot, this session's identity and its
        choice, so while those are the same objects the last answer is reused:
        the per-query path then resolves nothing (docs/queries.md "Cost")."""
        snap = self.engine.snapshot
        chosen = None if export else self._chosen
        placed = self._placed
        if (
            placed is not None
            and placed[0] is snap
            and placed[1] is self._identity
            and placed[2] == chosen
        ):
            return placed[3]
        group = self.managed_group_def(export=export)
        if group is None:
            return None
        placement = self.engine.placement(self, group)
        self._placed = (snap, self._identity, chosen, placement)
        return placement

    def eval_context(self, group: str | None = None) -> EvalContext:
        """What an expression of this session may ask (current_user, ...)."""
        return EvalContext(
            current_group=group,
            user=self.user,
            database=self.database,
            statement_start=datetime.now(UTC),
        )

    def query(self, kind: str = "select", pool: str = "default") -> Query:
        """A managed query: ``with session.query(kind="select") as q: ...``.

        ``__enter__`` returns once the query is admitted to its group and holds
        a worker of ``pool``; everything it holds is given back before
        ``__exit__`` returns, however the body ends. Kind "other" runs
        unmanaged (no slot, no worker, ``q.group`` is None).
        """
        return Query(self, kind, pool)

    def run(self, stmt: ast.Statement) -> Result:
        """One parsed statement (what execute_script does for each of its own)."""
        self._refresh_identity()
        return execute_statement(self, stmt)

    def open_cursor(self, stmt: ast.Statement, *, paging: bool = True) -> Cursor:
        """One parsed statement's result as a cursor read a page at a time: a
        SELECT over the executor's sources becomes a paging cursor whose query
        is suspended between pages (SPEC §6), or with ``paging=False`` a scan
        that keeps its slot and produces rows as they are read (a result
        streamed to a client); any other statement runs now."""
        self._refresh_identity()
        return open_cursor(self, stmt, paging=paging)

    def describe(self, stmt: ast.Statement) -> tuple[list[str], list[str]] | None:
        """The columns and types a SELECT would return, without running it (None:
        not a SELECT)."""
        self._refresh_identity()
        return describe(self, stmt)

    def describe_parameters(self, stmt: ast.Statement) -> dict[int, str]:
        """The type each ``$n`` of ``stmt`` (parsed with its placeholders) takes from
        its context; a parameter no context types is left out."""
        return describe_parameters(self, stmt)

    def clear_cancel(self) -> None:
        """A new request begins: a cancel that came before it is forgotten."""
        self._cancel_requested = False

    @property
    def cancel_requested(self) -> bool:
        """Has :meth:`cancel` been called since the request began? (a script run
        statement by statement stops at the next one)"""
        return self._cancel_requested

    def execute(self, sql: str) -> Result:
        """Run every statement of ``sql``; the last one's result."""
        results = self.execute_script(sql)
        return results[-1] if results else Result.command("")

    def execute_script(self, sql: str) -> list[Result]:
        """Run every statement of ``sql`` in order; each one's result.

        The script is parsed whole first, so a syntax error runs nothing.
        A statement that fails stops the script; those before it stay done.
        """
        statements = parse_script(sql)
        self._cancel_requested = False
        results = []
        for stmt in statements:
            if self._cancel_requested:
                raise QueryCancelled("canceling statement due to user request")
            self._refresh_identity()
            results.append(execute_statement(self, stmt))
        return results
