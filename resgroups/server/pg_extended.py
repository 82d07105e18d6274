"""The extended protocol: Parse, Bind, Describe, Execute, Close, Sync, Flush.

A driver sends these in a burst ending with Sync. After an error every
message up to Sync is skipped (``skipping``), and only Sync answers
ReadyForQuery. What a client names is capped before anything is built for
it: a statement's text at MAX_STATEMENT characters, ``$n`` at
MAX_PARAMETERS (PostgreSQL's 65535: counts are unsigned 16-bit on the
wire), named prepared statements at MAX_PREPARED, portals at MAX_PORTALS;
each prepared statement's bytes are charged to the session's memory budget
(``StatementMemory``), so a client that prepares without end meets its
group's and the process's memory limits (53200) like a query would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, cast

from resgroups.errors import Error, FeatureNotSupported, ProgramLimitExceeded, SqlSyntaxError
from resgroups.server import commands, types, wire
from resgroups.server.pg_simple import check_length, no_cursor, wire_kinds
from resgroups.server.pg_state import (
    MAX_PARAMETER_BYTES,
    MAX_PREPARED,
    MAX_STATEMENT,
    PLAN_CACHE,
    PLAN_CACHE_TEXT,
    PREPARED_OVERHEAD,
    ConnectionBase,
    DuplicateObject,
    MessageError,
    Plan,
    Portal,
    Prepared,
    ResultTyping,
    TxStatus,
    formats_for,
    too_many,
)
from resgroups.server.wire import Body, ProtocolViolation
from resgroups.sql import ast
from resgroups.sql.memo import remember_bound
from resgroups.sql.params import Binder, bind, binder, placeholders
from resgroups.sql.parser import interruptible, parse_one, placeholders_allowed
from resgroups.sql.split import split_statements

# value types whose == tells equal values apart exactly (1.0 == 1, -0.0 == 0.0,
# Decimal("1") == Decimal("1.0"): those are compared by their repr)
_EXACT: Final = frozenset({int, str, bool, type(None)})


def _statement_bytes(text: str, oids: list[int]) -> int:
    """What a prepared statement costs, as charged: its text (UTF-8, kept as text
    and again in its plan's names and literals), its types, and a fixed part."""
    return 2 * len(text.encode("utf-8", "surrogatepass")) + 4 * len(oids) + PREPARED_OVERHEAD


class Extended(ConnectionBase):
    def parse_message(self, body: Body) -> None:
        name, text = body.cstring(), body.cstring()
        oids = [body.int32() for _ in range(body.uint16())]
        self.prepare(name, text, oids)
        self.send(wire.PARSE_COMPLETE)

    def prepare(self, name: str, text: str, oids: list[int]) -> None:
        """A prepared statement ``name`` (Parse, or PREPARE), capped and charged."""
        check_length(text)
        if name and name in self.statements:
            raise DuplicateObject(f'prepared statement "{name}" already exists')
        if name and len(self.statements) - ("" in self.statements) >= MAX_PREPARED:
            raise too_many("prepared statements", MAX_PREPARED)
        with interruptible(self.check_interrupt):
            pieces = list(split_statements(text))
        if len(pieces) > 1:
            raise SqlSyntaxError(
                "cannot insert multiple commands into a prepared statement",
                line=1,
                column=1,
                position=pieces[1][0],
            )
        prepared = Prepared(text, oids)
        if not placeholders(text):  # parse once, now: every Bind reuses the plan
            prepared.plan = self.plan(text)
            prepared.planned = True
        assert self.statement_memory is not None
        self.drop_statement(name)  # the unnamed statement is replaced
        prepared.charged = self.statement_memory.charge(_statement_bytes(text, oids))
        self.statements[name] = prepared

    def drop_statement(self, name: str) -> bool:
        prepared = self.statements.pop(name, None)
        if prepared is None:
            return False
        if self.statement_memory is not None:
            self.statement_memory.release(prepared.charged)
        return True

    def drop_statements(self) -> None:
        for name in list(self.statements):
            self.drop_statement(name)

    def bind_message(self, body: Body) -> None:
        portal_name, statement_name = body.cstring(), body.cstring()
        param_formats = [body.int16() for _ in range(body.uint16())]
        raw = []
        for _ in range(body.uint16()):
            length = body.int32()
            raw.append(None if length == -1 else body.raw(length))
        result_formats = [body.int16() for _ in range(body.uint16())]
        prepared = self.statements.get(statement_name)
        if prepared is None:
            raise commands.UndefinedObject(
                f'prepared statement "{statement_name}" does not exist', sqlstate="26000"
            )
        if portal_name and portal_name in self.portals:
            raise DuplicateObject(f'portal "{portal_name}" already exists', sqlstate="42P03")
        size = sum(len(data) for data in raw if data is not None)
        if size > MAX_PARAMETER_BYTES:  # the bound text could only be longer than allowed
            raise ProgramLimitExceeded(
                f"bind message parameters of {size:,} bytes exceed the limit of "
                f"{MAX_PARAMETER_BYTES:,} (a bound statement is at most {MAX_STATEMENT:,} "
                "characters)"
            )
        values: list[object] = []
        if raw or param_formats:
            formats = formats_for(param_formats, len(raw), "parameter")
            oids = self.parameter_oids(prepared, len(raw))
            zone = self.setting("TimeZone")
            values = [
                types.decode_parameter(data, oid, fmt, i + 1, zone)
                for i, (data, oid, fmt) in enumerate(zip(raw, oids, formats, strict=False))
            ]
        if prepared.planned and values:
            raise MessageError(
                f"bind message supplies {len(values)} parameters, "
                "but the prepared statement requires 0"
            )
        plan = self.bound_plan(prepared, values)
        typing = self.result_typing(prepared)
        if isinstance(plan, commands.Execute):  # EXECUTE of a PREPAREd statement: that statement
            plan, typing = self.execute_plan(plan)
        self.add_portal(portal_name, Portal(plan, result_formats, typing=typing))
        self.send(wire.BIND_COMPLETE)

    def describe_message(self, body: Body) -> None:
        what, name = body.byte(), body.cstring()
        if what == b"S":
            prepared = self.statements.get(name)
            if prepared is None:
                raise commands.UndefinedObject(
                    f'prepared statement "{name}" does not exist', sqlstate="26000"
                )
            count = max(placeholders(prepared.text), len(prepared.oids))
            self.send(wire.parameter_description(self.parameter_oids(prepared, count)))
            plan = prepared.plan if prepared.planned else self._typed_plan(prepared, count)
            self._describe_plan(Portal(plan, typing=self.result_typing(prepared)), [])
        elif what == b"P":
            portal = self.portals.get(name)
            if portal is None:
                raise no_cursor(name)
            self._describe_plan(portal, portal.formats)
        else:
            raise ProtocolViolation(f"invalid DESCRIBE message subtype {what!r}")

    def bound_plan(self, prepared: Prepared, values: list[object]) -> Plan:
        """What ``prepared`` is with ``values`` bound to its placeholders: bound
        into the statement parsed once with them, or (a placeholder where only a
        literal parses, a connection statement, a syntax error to report) into
        its text, parsed again."""
        if prepared.planned:
            return prepared.plan
        if prepared.binder is None:
            prepared.binder = self._binder(prepared.text)
        if callable(prepared.binder):
            # the same cap as the text it stands for: its values' text counts
            size = len(prepared.text) + sum(len(v) for v in values if isinstance(v, str))
            if size > MAX_STATEMENT:
                raise ProgramLimitExceeded(
                    f"bound statement of {size:,} characters exceeds the limit of {MAX_STATEMENT:,}"
                )
            # the same values as the last execution's: the same (immutable) tree, so
            # what is kept per statement object (its text, its shape) is kept
            key = tuple((type(v), v if type(v) in _EXACT else repr(v)) for v in values)
            if prepared.last_bound is not None and prepared.last_bound[0] == key:
                return prepared.last_bound[1]
            plan = cast(Plan, prepared.binder(values))
            prepared.last_bound = (key, plan)
            return plan
        bound, original = bind(prepared.text, values)
        check_length(bound)
        return self.plan(bound, 0, original)

    def _binder(self, text: str) -> Binder | bool:
        """How to bind values into ``text`` parsed with its placeholders; False
        when its values go into its text instead."""
        if commands.recognize(text) is not None:
            return False
        try:
            stmt, literal_types = self._template(text)
        except Error:
            self.check_interrupt()  # a cancel during the parse is not a syntax error
            return False
        made = None if literal_types else binder(stmt)
        if made is None:
            return False

        def bind_values(values: Sequence[object]) -> object:
            tree = made(values)
            remember_bound(tree, stmt)  # what no value changes is read off stmt
            return tree

        return bind_values

    def execute_plan(self, command: commands.Execute) -> tuple[Plan, ResultTyping | None]:
        """``EXECUTE name (values)``: the prepared statement with its values, each read
        as its parameter's type reads text (``EXECUTE p('42')`` binds 42 to an int),
        and how its result columns are typed."""
        prepared = self.statements.get(command.name)
        if prepared is None:
            raise commands.UndefinedObject(
                f'prepared statement "{command.name}" does not exist', sqlstate="26000"
            )
        count = max(placeholders(prepared.text), len(prepared.oids))
        if len(command.values) != count:
            raise SqlSyntaxError(
                f'wrong number of parameters for prepared statement "{command.name}": '
                f"expected {count}, got {len(command.values)}",
                line=1,
                column=1,
            )
        oids = self.parameter_oids(prepared, count)
        zone = self.setting("TimeZone")
        values = [
            types.decode_parameter(
                None if v is None else v.encode(), oid, types.TEXT_FORMAT, n, zone
            )
            for n, (v, oid) in enumerate(zip(command.values, oids, strict=True), 1)
        ]
        plan = self.bound_plan(prepared, values)
        if isinstance(plan, commands.Execute):
            raise FeatureNotSupported("a prepared statement cannot be an EXECUTE")
        return plan, self.result_typing(prepared)

    def result_typing(self, prepared: Prepared) -> ResultTyping | None:
        """How the columns of ``prepared`` bound to any values are typed (None: it has
        no placeholder, so every literal of its plan is written in its text)."""
        if prepared.planned:
            return None
        if prepared.typing is None:
            count = max(placeholders(prepared.text), len(prepared.oids))
            kinds = tuple(map(types.parameter_kind, self.parameter_oids(prepared, count)))
            template = None
            if commands.recognize(prepared.text) is None:
                try:
                    template = self._template(prepared.text)[0]
                except Error:
                    self.check_interrupt()  # a cancel during the parse is not a typing failure
            prepared.typing = ResultTyping(template, kinds)
        return prepared.typing

    def parameter_oids(self, prepared: Prepared, count: int) -> list[int]:
        """The type of each of ``count`` parameters: as the client gave it, else as
        its context in the statement wants it (``long_sequence($1)``: int8), else
        text. Inferred once per prepared statement; a statement that cannot be
        parsed with its placeholders (a syntax error, reported at Bind) has them
        all text."""
        if prepared.parameter_oids is None or len(prepared.parameter_oids) < count:
            given = prepared.oids + [0] * (count - len(prepared.oids))
            inferred: dict[int, str] = {}
            if any(oid in (0, types.UNKNOWN) for oid in given):
                inferred = self._inferred_types(prepared.text)
            prepared.parameter_oids = [
                oid if oid not in (0, types.UNKNOWN) else types.oid_of(inferred.get(n, "text"))[0]
                for n, oid in enumerate(given, 1)
            ]
        return prepared.parameter_oids[:count]

    def _inferred_types(self, text: str) -> dict[int, str]:
        assert self.session is not None
        if commands.recognize(text) is not None:
            return {}
        try:
            stmt, literal_types = self._template(text)
            return {**self.session.describe_parameters(stmt), **literal_types}
        except Error:
            self.check_interrupt()  # a cancel during the parse is not a typing failure
            return {}

    def _template(self, text: str) -> tuple[ast.Statement, dict[int, str]]:
        """``text`` parsed with its placeholders, and the types of those that stand
        where a literal does. A pure function of the text, so kept for the texts
        seen lately: a client that parses the same unnamed statement for every
        execution (pgbench -M extended, node-postgres) parses it once."""
        hit = self._templates.get(text)
        if hit is not None:
            self._templates.move_to_end(text)
            return hit
        with interruptible(self.check_interrupt), placeholders_allowed() as literal_types:
            stmt = parse_one(text)
        parsed = (stmt, dict(literal_types))
        if len(text) <= PLAN_CACHE_TEXT:
            self._templates[text] = parsed
            if len(self._templates) > PLAN_CACHE:
                self._templates.popitem(last=False)
        return parsed

    def _typed_plan(self, prepared: Prepared, count: int) -> Plan:
        """A statement with placeholders planned for Describe before any value is
        bound: with NULL for every parameter, else 0 (``long_sequence($1)`` needs a
        number); None (NoData) when neither can be typed."""
        assert self.session is not None
        for value in (None, 0):
            try:
                plan = self.bound_plan(prepared, [value] * count)
                if isinstance(plan, ast.Select | ast.Union):
                    self.session.describe(plan)  # raises when it cannot be typed
                return plan
            except Error:
                self.check_interrupt()  # a cancel during the parse is not a typing failure
                continue
        return None

    def _describe_plan(self, portal: Portal, codes: list[int]) -> None:
        """RowDescription of what the portal returns, or NoData."""
        assert self.session is not None
        plan = portal.plan
        shape: tuple[object, object] | None = None
        if portal.cursor is not None:
            shape = (portal.cursor.columns, portal.cursor.types)
        elif isinstance(plan, ast.Select | ast.Union):
            shape = self.session.describe(plan)
        elif isinstance(plan, ast.Show):  # read-only: its rows are computed now
            portal.cursor = self.session.open_cursor(plan)
            shape = (portal.cursor.columns, portal.cursor.types)
        elif isinstance(plan, commands.ShowParameter):
            shape = self.command(plan).columns, ["text"] * (3 if plan.name == "all" else 1)
        elif isinstance(plan, commands.Fetch) and not plan.move:
            target = self.portals.get(plan.name)
            if target is None or target.cursor is None:
                raise no_cursor(plan.name)
            shape = (target.cursor.columns, target.cursor.types)
        columns = list(shape[0]) if shape else []  # type: ignore[call-overload]
        if not shape or not columns:
            self.send(wire.NO_DATA)
            return
        formats = formats_for(codes, len(columns))
        described, typing = portal.plan, portal.typing
        if isinstance(plan, commands.Fetch):
            target = self.portals[plan.name]
            described, typing = target.plan, target.typing
        kinds = wire_kinds(described, shape[1], typing)  # type: ignore[arg-type]
        self.send(self.row_description(columns, kinds, formats))

    def execute_message(self, body: Body) -> None:
        name, max_rows = body.cstring(), body.int32()
        portal = self.portals.get(name)
        if portal is None:
            raise no_cursor(name)
        assert self.session is not None
        self.session.clear_cancel()
        self.interrupted = False
        self.run(portal.plan, portal, max(0, max_rows), describe=False)

    def close_message(self, body: Body) -> None:
        what, name = body.byte(), body.cstring()
        if what == b"S":
            self.drop_statement(name)
        elif what == b"P":
            portal = self.portals.pop(name, None)
            if portal is not None:
                portal.close()
        else:
            raise ProtocolViolation(f"invalid CLOSE message subtype {what!r}")
        self.send(wire.CLOSE_COMPLETE)

    def sync_message(self, body: Body) -> None:
        self.skipping = False
        if self.tx is TxStatus.IDLE:  # the implicit transaction ends: its portals close
            self.close_portals(False)
        self.send(wire.ready_for_query(self.tx.value))

    def flush_message(self, body: Body) -> None:
        self.push()

    def function_call_message(self, body: Body) -> None:
        raise FeatureNotSupported("the fast-path function call interface is not supported")
