"""A session: one principal's connection to an engine."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

from resgroups.access import Identity, login_principal, resolve, still_assumed
from resgroups.catalog import Snapshot
from resgroups.catalog.model import GroupDef
from resgroups.catalog.selectors import MAX_APPLICATION, MAX_TAG, MAX_TAGS, Attributes, Estimate
from resgroups.errors import InternalError, InvalidParameter, QueryCancelled
from resgroups.query import Placement, Query, QueryState
from resgroups.result import Cursor, Result
from resgroups.sql import ast
from resgroups.sql.expr import EvalContext, Settings
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

    def __init__(
        self,
        engine: Engine,
        identity: Identity,
        application: str | None = None,
        tags: Iterable[str] = (),
    ) -> None:
        self.engine = engine
        self._identity = identity
        # the login name, the fair policy's "user": an assumption changes the
        # identity's account, never its login (read by every query as it is made)
        self.user: Final = identity.login_name
        # what selectors route on beside the query itself (SPEC §15)
        self.application: str | None = None
        self.tags: frozenset[str] = frozenset()
        self.set_application(application)
        self.set_tags(tags)
        self.database = "resgroups"  # current_database(): what a wire client named
        self.settings: Settings | None = None  # current_setting(): a wire connection's
        self._chosen: int | None = None  # the chosen group's id (a rename keeps it)
        self._cancel_requested = False  # cancel() during a script stops what is left
        self.work_cpu_ns = 0  # CPU the built-in executor spent on this session's queries
        # the last placement, with the snapshot and the export flag it was resolved
        # for under the current identity and choice (assume() and choose() forget
        # it), and whether selectors route first
        self._placed: tuple[object, bool, Placement, bool] | None = None
        # placements of the groups selectors routed to, for one snapshot and identity
        self._selected: tuple[object, Identity, dict[int, Placement]] | None = None
        self._cpu_lock = threading.Lock()

    def set_application(self, application: str | None) -> None:
        """The application name selectors see (``application_name`` over the wire)."""
        if application is not None and not isinstance(application, str):
            raise InvalidParameter(f"application must be text, not {type(application).__name__}")
        if application is not None and len(application) > MAX_APPLICATION:
            raise InvalidParameter(
                f"application name of {len(application)} characters: at most {MAX_APPLICATION}"
            )
        self.application = application or None

    def set_tags(self, tags: Iterable[str]) -> None:
        """The client tags selectors see (``client_tags`` over the wire)."""
        if tags is None or not hasattr(tags, "__iter__"):
            raise InvalidParameter(
                f"tags must be a collection of text (tags=('a', 'b')), not {tags!r}"
            )
        if isinstance(tags, str):
            raise InvalidParameter(
                f"tags must be a collection of text, not the string {tags!r} "
                "(write tags=('a', 'b'))"
            )
        given = list(tags)
        for tag in given:
            if not isinstance(tag, str) or not tag or len(tag) > MAX_TAG:
                raise InvalidParameter(
                    f"client tag {tag!r}: expected text of 1..{MAX_TAG} characters"
                )
        if len(given) > MAX_TAGS:
            raise InvalidParameter(f"{len(given)} client tags: at most {MAX_TAGS}")
        self.tags = frozenset(given)

    def attributes(
        self,
        kind: str = "select",
        statement: str | None = None,
        estimate: Estimate | None = None,
    ) -> Attributes:
        """What a query of this session with ``kind``, ``statement`` and ``estimate``
        is, for selectors (SPEC §15)."""
        return Attributes(
            self._identity.login_name,
            kind,
            self.application,
            self.tags,
            statement,
            estimate.rows if estimate is not None else None,
            estimate.memory if estimate is not None else None,
        )

    def add_work_cpu(self, nanos: int) -> None:
        with self._cpu_lock:
            self.work_cpu_ns += nanos

    @property
    def identity(self) -> Identity:
        return self._identity

    @property
    def chosen_group_id(self) -> int | None:
        return self._chosen

    def choose(self, group_id: int | None) -> None:
        """SET RESOURCE GROUP (by identity, so a rename keeps the choice) or RESET."""
        self._chosen = group_id
        self._placed = None

    def running_queries(self) -> list[Query]:
        """This session's queries in flight, from the engine's registry of open
        queries (the one record of them: a query starting or ending touches
        nothing of its session's). A query whose handle was lost without exit is
        not: the reconcile loop reclaims it. O(queries open in the engine): for a
        cancel request, not the per-query path."""
        return [query for query in self.engine.live_queries() if query.session is self]

    @property
    def running_ids(self) -> set[int]:
        """The ids of :meth:`running_queries`."""
        return {query.id for query in self.running_queries()}

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
        self._placed = None

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

    def placement(
        self, export: bool = False, attributes: Callable[[], Attributes] | None = None
    ) -> Placement | None:
        """Where a managed query starting now runs (None: unmanaged). Resolution
        depends only on the catalog snapshot, this session's identity and its
        choice, so the last answer is kept with the snapshot it was resolved for
        (``assume()`` and ``choose()`` forget it) and reused: the per-query path
        then resolves nothing. When selectors exist and no group is chosen, the
        query's ``attributes()`` are matched first, through the snapshot's
        index (SPEC §15)."""
        snap = self.engine.snapshot
        placed = self._placed
        if placed is not None and placed[0] is snap and placed[1] is export and not placed[3]:
            return placed[2]
        return self._place(snap, export, attributes)

    def _place(
        self, snap: Snapshot, export: bool, attributes: Callable[[], Attributes] | None
    ) -> Placement | None:
        """:meth:`placement` when selectors may route the query, or nothing is kept."""
        routed = (export or self._chosen is None) and bool(snap.selectors)  # no choice
        if routed and attributes is not None:
            selected = self._selected_placement(snap, attributes())
            if selected is not None:
                return selected
        placed = self._placed
        if placed is not None and placed[0] is snap and placed[1] is export:
            return placed[2]
        group = self.managed_group_def(export=export)
        if group is None:
            return None
        placement = self.engine.placement(self, group)
        self._placed = (snap, export, placement, routed)
        return placement

    def _selected_placement(self, snap: Snapshot, attributes: Attributes) -> Placement | None:
        """The placement a selector routes a query with ``attributes`` to (None: no
        selector matches, or the queries run unmanaged)."""
        engine = self.engine
        if not engine.enabled or not snap.has_catalog:
            return None
        selector = snap.select(attributes)
        if selector is None:
            return None
        engine.selector_matched(selector.id)
        cached = self._selected
        if cached is None or cached[0] is not snap or cached[1] is not self._identity:
            self._refresh_identity()  # the catalog changed: is the login still there?
            cached = self._selected = (snap, self._identity, {})
        placement = cached[2].get(selector.group_id)
        if placement is None:
            group = snap.runtime_group(selector.group_id)
            if group is None:  # the catalog's invariant says it exists
                raise InternalError(f"selector {selector.name} routes to a missing group")
            placement = cached[2][selector.group_id] = engine.placement(self, group)
        return placement

    def eval_context(self, group: str | None = None) -> EvalContext:
        """What an expression of this session may ask (current_user, ...)."""
        return EvalContext(
            current_group=group,
            user=self.user,
            database=self.database,
            statement_start=datetime.now(UTC),
            settings=self.settings,
        )

    def query(
        self,
        kind: str = "select",
        pool: str = "default",
        *,
        statement: str | None = None,
        estimate: Estimate | None = None,
    ) -> Query:
        """A managed query: ``with session.query(kind="select") as q: ...``.

        ``__enter__`` returns once the query is admitted to its group and holds
        a worker of ``pool``; everything it holds is given back before
        ``__exit__`` returns, however the body ends. Kind "other" runs
        unmanaged (no slot, no worker, ``q.group`` is None). ``statement``, the
        text the query runs, is shown in ``resource_group_queries()`` and its
        fingerprint is what a rule's ``watch`` recognises (SPEC §16); selectors
        route on it and on ``estimate``, what the executor expects to read (§15).
        """
        if statement is not None and not isinstance(statement, str):
            raise InvalidParameter(f"statement must be text, not {type(statement).__name__}")
        if estimate is not None and not isinstance(estimate, Estimate):
            raise InvalidParameter(
                f"estimate must be a resgroups.Estimate, not {type(estimate).__name__}"
            )
        if statement is None and estimate is None:
            return Query(self, kind, pool)
        return Query(self, kind, pool, statement, None, estimate)  # fingerprint: when asked

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
