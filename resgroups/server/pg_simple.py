"""Simple query and the connection-statement interpreter.

A Query message holds one or more statements; the whole text is split and
parsed first (so a syntax error anywhere runs nothing), then each runs in
turn; the first error stops the rest, and ReadyForQuery always follows,
whatever the error (an internal one included). A statement is either the
engine's or one the connection answers itself (``commands.recognize``:
transactions, settings, cursors, DEALLOCATE); ``run`` executes either kind
in a portal, which the extended protocol shares.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Final

from resgroups.errors import Error, InternalError, ProgramLimitExceeded, SqlSyntaxError
from resgroups.result import Result
from resgroups.server import commands, types, wire
from resgroups.server.pg_framing import internal
from resgroups.server.pg_state import (
    MAX_SAVEPOINTS,
    MAX_STATEMENT,
    PLAN_CACHE,
    PLAN_CACHE_TEXT,
    ConnectionBase,
    InFailedTransaction,
    NoActiveTransaction,
    NoSuchSavepoint,
    Plan,
    Portal,
    ResultTyping,
    TxStatus,
    formats_for,
    too_many,
)
from resgroups.server.wire import Body
from resgroups.sql import ast
from resgroups.sql.memo import PerStatement
from resgroups.sql.param_types import cast_parameter_type
from resgroups.sql.parser import interruptible, parse_one
from resgroups.sql.semantics import INT2_SPELLINGS, INT4_SPELLINGS, cast_target
from resgroups.sql.split import split_statements

log = logging.getLogger("resgroups.server.pgwire")

# RowDescriptions made lately, by (names, types, formats): a pure function of
# them, and a client repeats its statements (cleared when full: O(1) amortised)
DESCRIPTIONS_KEPT: Final = 256
_DESCRIPTIONS: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...]], bytes] = {}


def check_length(text: str) -> None:
    if len(text) > MAX_STATEMENT:
        raise ProgramLimitExceeded(
            f"statement text of {len(text):,} characters exceeds the limit of {MAX_STATEMENT:,}"
        )


class SimpleQuery(ConnectionBase):
    def query_message(self, body: Body) -> None:
        text = body.cstring()
        assert self.session is not None
        self.session.clear_cancel()
        self.interrupted = False
        try:
            check_length(text)
            with interruptible(self.check_interrupt):
                plans = [self.plan(piece, offset) for offset, piece in split_statements(text)]
            if not plans:
                self.send(wire.EMPTY_QUERY)
            for plan in plans:
                self.run(plan, Portal(plan), None, describe=True)
        except ConnectionError:
            raise
        except Error as exc:
            self.error(exc)
        except Exception as exc:  # a bug: report it, and the client still gets its answer
            log.exception("internal error in a simple query")
            self.error(internal(exc))
        if self.gone:
            return
        if self.tx is TxStatus.IDLE:
            self.close_portals(False)
        self.send(wire.ready_for_query(self.tx.value))

    def plan(self, text: str, offset: int = 0, mapping: Callable[[int], int] | None = None) -> Plan:
        """What one statement's text is: a connection statement, the engine's, or empty.
        Plans are immutable, so a text seen lately is not parsed again."""
        plan = self._plans.get(text)
        if plan is not None:
            self._plans.move_to_end(text)
            return plan
        plan = self.parse_text(text, offset, mapping)
        if plan is not None and len(text) <= PLAN_CACHE_TEXT:
            self._plans[text] = plan
            if len(self._plans) > PLAN_CACHE:
                self._plans.popitem(last=False)
        return plan

    def parse_text(self, text: str, offset: int, mapping: Callable[[int], int] | None) -> Plan:
        try:
            command = commands.recognize(text)
            if command is not None:
                return command
            if not text.strip(" \t\r\n;"):
                return None
            with interruptible(self.check_interrupt):
                return parse_one(text)
        except SqlSyntaxError as exc:
            widened = commands.with_connection_statements(exc)
            at = mapping(exc.position) if mapping else exc.position
            widened.position = offset + at
            raise widened from None

    def run(self, plan: Plan, portal: Portal, max_rows: int | None, *, describe: bool) -> None:
        """Execute ``plan`` in ``portal``, sending its rows and its command tag. What
        its set_config() calls changed holds if it succeeds (then ParameterStatus
        reports it, and the session routes by it) and is undone if it fails, as
        PostgreSQL rolls it back with the statement's transaction; whichever way
        it ran (all at once, streamed, a page of a portal, a FETCH)."""
        try:
            self._run(plan, portal, max_rows, describe=describe)
        except BaseException:
            self._settle_set_config(succeeded=False)
            raise
        self._settle_set_config(succeeded=True)

    def _settle_set_config(self, *, succeeded: bool) -> None:
        before, saved = self.settings_before, self.settings_saved
        if before is None:
            return
        self.settings_before = self.settings_saved = None
        if succeeded:
            self.report_changes(before)
        elif saved is not None:
            self.settings.clear()
            self.settings.update(saved)

    def _run(self, plan: Plan, portal: Portal, max_rows: int | None, *, describe: bool) -> None:
        assert self.session is not None
        if plan is None:
            self.send(wire.EMPTY_QUERY)
            return
        if self.tx is TxStatus.FAILED and not (
            isinstance(plan, commands.Transaction | commands.Savepoint)
            and plan.action in ("commit", "rollback")
        ):
            raise InFailedTransaction(
                "current transaction is aborted, commands ignored until end of transaction block"
            )
        if isinstance(plan, commands.Fetch):
            self.fetch(plan, portal.formats, describe)
            return
        if isinstance(plan, commands.Execute):  # the prepared statement runs in this portal
            plan, portal.typing = self.execute_plan(plan)
            portal.plan = plan
            self.run(plan, portal, max_rows, describe=describe)
            return
        if isinstance(plan, commands.WIRE_COMMANDS):
            result = self.command(plan)
        else:
            if portal.cursor is None and max_rows and isinstance(plan, ast.Select):
                portal.cursor = self.session.open_cursor(plan)
            if portal.cursor is not None:
                self.page(portal, max_rows, describe)
                return
            if portal.executed:
                self.send(wire.command_complete("SELECT 0"))
                return
            portal.executed = True
            if isinstance(plan, ast.Select) and plan.source is not None:
                self.stream(plan, portal, describe)
                return
            result = self.session.run(plan)
            self._after_engine_statement(plan)
        if result.columns:
            formats = formats_for(portal.formats, len(result.columns))
            kinds = wire_kinds(plan, result.types, portal.typing)
            if describe:
                self.send(self.row_description(result.columns, kinds, formats))
            self.send_rows(result.rows, kinds, formats)
        for notice in result.notices:
            self.send(wire.notice_response(notice))
        self.send(wire.command_complete(result.status))

    def _after_engine_statement(self, stmt: ast.Statement) -> None:
        if isinstance(stmt, ast.ResetAll | ast.DiscardAll):
            before = self.reported()
            self.settings.clear()
            self.report_changes(before)
        if isinstance(stmt, ast.DiscardAll):
            self.close_portals(True)
            self.drop_statements()

    # ---- connection statements ------------------------------------------------------------

    def command(self, plan: commands.WireCommand) -> Result:
        match plan:
            case commands.Transaction(action="begin"):
                if self.tx is not TxStatus.IDLE:
                    return _with_notice("BEGIN", "there is already a transaction in progress")
                self.tx = TxStatus.BLOCK
                return Result.command("BEGIN")
            case commands.Transaction(action=action):
                failed = action == "rollback" or self.tx is TxStatus.FAILED
                tag = "ROLLBACK" if failed else "COMMIT"
                was = self.tx
                self.tx = TxStatus.IDLE
                self.savepoints.clear()
                self.close_portals(False)
                if was is TxStatus.IDLE:
                    return _with_notice(tag, "there is no transaction in progress")
                return Result.command(tag)
            case commands.SetParameter(name=name, value=value):
                before = self.reported()
                commands.apply_setting(self.settings, name, value)
                self.report_changes(before)
                return Result.command("RESET" if value is None else "SET")
            case commands.ShowParameter(name="all"):
                rows = [
                    (s.name, self.setting(s.name), s.description)
                    for s in commands.SETTINGS.values()
                ]
                return Result.table(["name", "setting", "description"], rows, ["text"] * 3)
            case commands.ShowParameter(name=name):
                setting = commands.find_setting(name)
                return Result.table([setting.name], [(self.setting(setting.name),)], ["text"])
            case commands.Prepare(name=name, types=written, query=query):
                oids = [types.oid_of(_parameter_type(t))[0] for t in written]
                self.prepare(name, query, oids)
                return Result.command("PREPARE")
            case commands.Unlisten():
                return Result.command("UNLISTEN")
            case commands.Savepoint():
                return self.savepoint(plan)
            case commands.Declare():
                return self.declare(plan)
            case commands.CloseCursor(name=None):
                self.close_portals(True)
                return Result.command("CLOSE CURSOR ALL")
            case commands.CloseCursor(name=str() as name):
                portal = self.portals.pop(name, None)
                if portal is None:
                    raise no_cursor(name)
                portal.close()
                return Result.command("CLOSE CURSOR")
            case commands.CursorExists(name=name):
                return Result.table(["?column?"], [(1,)] * (name in self.portals), ["int"])
            case commands.Deallocate(name=None):
                self.drop_statements()
                return Result.command("DEALLOCATE ALL")
            case commands.Deallocate(name=str() as name):
                if not self.drop_statement(name):
                    raise commands.UndefinedObject(
                        f'prepared statement "{name}" does not exist', sqlstate="26000"
                    )
                return Result.command("DEALLOCATE")
        raise InternalError(f"unknown connection statement {type(plan).__name__}")

    def savepoint(self, plan: commands.Savepoint) -> Result:
        """SAVEPOINT, RELEASE, ROLLBACK TO: names in the transaction block. Statements
        apply at once, so ROLLBACK TO undoes nothing but the block's failed state."""
        if self.tx is TxStatus.IDLE:
            word = "ROLLBACK TO SAVEPOINT" if plan.action == "rollback" else plan.action.upper()
            raise NoActiveTransaction(f"{word} can only be used in transaction blocks")
        if plan.action == "savepoint":
            if len(self.savepoints) >= MAX_SAVEPOINTS:
                raise too_many("savepoints in this transaction block", MAX_SAVEPOINTS)
            self.savepoints.append(plan.name)
            return Result.command("SAVEPOINT")
        if plan.name not in self.savepoints:
            raise NoSuchSavepoint(f'savepoint "{plan.name}" does not exist')
        at = len(self.savepoints) - 1 - self.savepoints[::-1].index(plan.name)
        if plan.action == "release":
            del self.savepoints[at:]
            return Result.command("RELEASE")
        del self.savepoints[at + 1 :]
        self.tx = TxStatus.BLOCK
        return Result.command("ROLLBACK")

    def report_changes(self, before: dict[commands.Setting, str]) -> None:
        self.sync_attributes()  # SET application_name, client_tags, RESET ALL ...
        for setting, value in self.reported().items():
            if before.get(setting) != value:
                self.send(wire.parameter_status(setting.name, value))

    # ---- rows ----------------------------------------------------------------------

    def row_description(self, columns: Any, kinds: Any, formats: list[int]) -> bytes:
        key = (tuple(columns), tuple(kinds), tuple(formats))
        described = _DESCRIPTIONS.get(key)
        if described is None:
            fields = []
            for name, kind, fmt in zip(columns, kinds, formats, strict=True):
                oid, size = types.oid_of(kind)
                fields.append((name, oid, size, fmt))
            described = wire.row_description(fields)
            if len(_DESCRIPTIONS) >= DESCRIPTIONS_KEPT:
                _DESCRIPTIONS.clear()
            _DESCRIPTIONS[key] = described
        return described

    def send_rows(self, rows: list[tuple[Any, ...]], kinds: Any, formats: list[int]) -> None:
        oids = [types.oid_of(k)[0] for k in kinds]
        zone = self.setting("TimeZone")
        text = types.encode_text
        for row in rows:
            values: list[bytes | None] = []
            for value, oid, fmt in zip(row, oids, formats, strict=True):
                if value is None:
                    values.append(None)
                elif fmt == types.BINARY_FORMAT:
                    values.append(types.encode_binary(value, oid))
                elif isinstance(value, datetime) and zone != "UTC":
                    values.append(types.local_time(value, zone))
                else:
                    values.append(text(value))
            self.send(wire.data_row(values))


def wire_kinds(
    plan: object, kinds: Sequence[str], typing: ResultTyping | None = None
) -> Sequence[str]:
    """The result types a SELECT's (or a UNION's) columns are described and sent
    in: an integer column is int8 (the executor's integers), but int4 where
    PostgreSQL says int4 (an integer literal that fits, a cast to
    ``int``/``int4``/``integer``) and int2 for a cast to ``smallint``, so that
    drivers decode the width they expect. A statement bound from a prepared
    one is read through its ``typing``: only the literals written in its text
    narrow (never a value bound to a placeholder, so every execution is
    described as its Describe was), and a bare ``$n`` item is a column of
    ``$n``'s type."""
    if typing is not None:
        if typing.template is None:  # no literal is told from a value: none narrows
            return kinds
        plan = typing.template
    if isinstance(plan, ast.Union):
        return _union_kinds(plan, kinds, typing)
    if not isinstance(plan, ast.Select):
        return kinds
    return _select_kinds(plan, kinds, typing)


def _select_kinds(
    plan: ast.Select, kinds: Sequence[str], typing: ResultTyping | None
) -> Sequence[str]:
    if plan.items is None or len(plan.items) != len(kinds):
        return kinds
    narrowed = _integer_kinds(plan)
    if typing is None and "int" not in kinds:
        return kinds
    out = []
    for narrow, kind in zip(narrowed, kinds, strict=True):
        if isinstance(narrow, int):  # a bare $n
            if typing is not None and narrow <= len(typing.parameters):
                out.append(typing.parameters[narrow - 1])
            else:
                out.append(kind)
        else:
            out.append(narrow if kind == "int" else kind)
    return out


_NARROW: Final = ("int2", "int4")


def _union_kinds(
    plan: ast.Union, kinds: Sequence[str], typing: ResultTyping | None
) -> Sequence[str]:
    """A UNION's columns have its first branch's types (as it runs them); an
    integer column is int4 (int2) when every branch's is, as PostgreSQL
    resolves a union's types, else int8."""
    branches = [_select_kinds(select, kinds, typing) for select in plan.selects]
    out = []
    for column, first in enumerate(branches[0]):
        every = [branch[column] for branch in branches]
        if all(kind in _NARROW for kind in every):
            out.append("int4" if "int4" in every else "int2")
        elif first in _NARROW:
            out.append("int")
        else:
            out.append(first)
    return out


def _integer_kind(expr: ast.Expr) -> str | int:
    """A select item's integer type as written (int: the item is a bare ``$n``)."""
    match expr:
        case ast.Param(number=number):
            return number
        case ast.Cast(written=written) if written in INT4_SPELLINGS:
            return "int4"
        case ast.Cast(written=written) if written in INT2_SPELLINGS:
            return "int2"
        case ast.Literal(value=int() as n) if not isinstance(n, bool) and -(2**31) <= n < 2**31:
            return "int4"
        case ast.Unary(op="-", operand=ast.Literal(value=int() as n)) if (
            not isinstance(n, bool) and n <= 2**31
        ):
            return "int4"
    return "int"


_integer_kinds: Final = PerStatement(
    lambda plan: tuple(_integer_kind(item.expr) for item in plan.items)
)  # each item's integer type, as wire_kinds reads it: per statement


def _parameter_type(written: str) -> str:
    """A PREPARE parameter's type (``int``, ``varchar(20)``, ``double precision``)."""
    words, _, modifiers = written.partition("(")
    target, spelled = cast_target(
        words.strip(), [m.strip() for m in modifiers.rstrip(")").split(",") if m]
    )
    return cast_parameter_type(target, spelled)  # PREPARE p(int): int4, as PostgreSQL


def no_cursor(name: str) -> Error:
    return commands.UndefinedObject(f'cursor "{name}" does not exist', sqlstate="34000")


def _with_notice(tag: str, notice: str) -> Result:
    return Result(status=tag, notices=[notice])
