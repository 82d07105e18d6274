"""Portals and cursors: rows made as the client reads them.

A portal is a bound statement (Bind) or a DECLAREd cursor. A whole SELECT
(simple query, or Execute without a row limit) streams: its query keeps its
slot and worker and makes STREAM_ROWS rows at a time, and while the socket
is full the wait is the query's (``pg_framing``: its deadline and cancel end
it). Execute with a row limit and FETCH page a suspended query instead
(SPEC §6): between pages it holds no slot and no worker. At most
MAX_PORTALS are open per connection (54000 past it).
"""

from __future__ import annotations

import logging
from typing import Any

from resgroups.errors import Error, SqlSyntaxError
from resgroups.result import Result
from resgroups.server import commands, types, wire
from resgroups.server.pg_simple import no_cursor, wire_kinds
from resgroups.server.pg_state import (
    MAX_PORTALS,
    STREAM_ROWS,
    ConnectionBase,
    DuplicateObject,
    NoActiveTransaction,
    Portal,
    TxStatus,
    formats_for,
    too_many,
)
from resgroups.sql import ast

log = logging.getLogger("resgroups.server.pgwire")


class Portals(ConnectionBase):
    def add_portal(self, name: str, portal: Portal) -> None:
        """Keep ``portal`` as ``name``, replacing (and closing) one of that name."""
        old = self.portals.pop(name, None)
        if old is not None:
            old.close()
        if len(self.portals) >= MAX_PORTALS:
            portal.close()
            raise too_many("portals and cursors", MAX_PORTALS)
        self.portals[name] = portal

    def stream(self, stmt: ast.Select, portal: Portal, describe: bool) -> None:
        """A whole SELECT streamed STREAM_ROWS at a time: rows are made as the client
        reads them (a slow reader holds back its own scan, and only STREAM_ROWS
        rows plus a chunk of bytes wait in memory)."""
        assert self.session is not None
        cursor = self.session.open_cursor(stmt, paging=False)
        self.streaming = getattr(cursor, "query", None)
        try:
            formats = formats_for(portal.formats, len(cursor.columns))
            kinds = wire_kinds(stmt, cursor.types, portal.typing)
            if describe:
                self.send(self.row_description(cursor.columns, kinds, formats))
            total = 0
            while not cursor.done:
                rows = cursor.fetch(STREAM_ROWS)
                total += len(rows)
                self.send_rows(rows, kinds, formats)
        finally:
            self.streaming = None
            cursor.close()
        self.send(wire.command_complete(f"SELECT {total}"))

    def page(self, portal: Portal, max_rows: int | None, describe: bool) -> None:
        cursor = portal.cursor
        assert cursor is not None
        formats = formats_for(portal.formats, len(cursor.columns))
        kinds = wire_kinds(portal.plan, cursor.types, portal.typing)
        if describe:
            self.send(self.row_description(cursor.columns, kinds, formats))
        if not cursor.columns and cursor.status:
            self.send(wire.command_complete(cursor.status))
            return
        rows = self._fetch_page(portal, max_rows or None)
        self.send_rows(rows, kinds, formats)
        if cursor.done:
            self.send(wire.command_complete(f"SELECT {len(rows)}"))
        else:
            self.send(wire.PORTAL_SUSPENDED)

    def _fetch_page(self, portal: Portal, count: int | None) -> list[tuple[Any, ...]]:
        """A page of the portal's cursor. An error (a resume the gate refused, a
        cancel, a timeout) ends the cursor, and the connection stays usable."""
        assert portal.cursor is not None
        try:
            return portal.cursor.fetch(count)
        except Error:
            for name, held in list(self.portals.items()):
                if held is portal:
                    del self.portals[name]
            portal.close()
            raise

    def declare(self, plan: commands.Declare) -> Result:
        assert self.session is not None
        if not plan.hold and self.tx is not TxStatus.BLOCK:
            raise NoActiveTransaction("DECLARE CURSOR can only be used in transaction blocks")
        if plan.name in self.portals:
            raise DuplicateObject(f'cursor "{plan.name}" already exists', sqlstate="42P03")
        if len(self.portals) >= MAX_PORTALS:
            raise too_many("portals and cursors", MAX_PORTALS)
        stmt = self.plan(plan.query, plan.offset)
        if not isinstance(stmt, ast.Select):
            raise SqlSyntaxError(
                "DECLARE ... CURSOR FOR takes a SELECT", line=1, column=plan.offset + 1
            )
        cursor = self.session.open_cursor(stmt)
        self.add_portal(plan.name, Portal(stmt, cursor=cursor, hold=plan.hold, binary=plan.binary))
        return Result.command("DECLARE CURSOR")

    def fetch(self, plan: commands.Fetch, codes: list[int], describe: bool) -> None:
        portal = self.portals.get(plan.name)
        if portal is None or portal.cursor is None:
            raise no_cursor(plan.name)
        cursor = portal.cursor
        rows = self._fetch_page(portal, plan.count)
        verb = "MOVE" if plan.move else "FETCH"
        if not plan.move:
            if not codes and portal.binary:
                codes = [types.BINARY_FORMAT]
            formats = formats_for(codes, len(cursor.columns))
            kinds = wire_kinds(portal.plan, cursor.types, portal.typing)
            if describe:
                self.send(self.row_description(cursor.columns, kinds, formats))
            self.send_rows(rows, kinds, formats)
        self.send(wire.command_complete(f"{verb} {len(rows)}"))

    def close_portals(self, everything: bool) -> None:
        """Close portals: all of them, or those a transaction's end closes (all
        but WITH HOLD cursors). Each gives back what its query held."""
        for name, portal in list(self.portals.items()):
            if everything or not portal.hold:
                del self.portals[name]
                try:
                    portal.close()
                except Error as exc:
                    log.warning("closing cursor %r: %s", name, exc)
