"""What the DDL of rules and selectors (SPEC §15, §16) says when a name is
taken or missing: one wording for every named catalog object besides groups
and principals."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from resgroups.errors import CatalogError, did_you_mean
from resgroups.sql import ast


def duplicate(kind: str, name: ast.Ident, existing: str) -> CatalogError:
    """``resource rule r already exists`` (42710), naming it as it was created."""
    shown = f" as {existing}" if existing != name.text else ""
    return CatalogError(
        f"{kind} {name.text} already exists{shown}", sqlstate=CatalogError.DUPLICATE
    )


def undefined(kind: str, ref: ast.Ident, names: Iterable[str]) -> CatalogError:
    """``resource selector s does not exist.`` (42704), with a suggestion."""
    return CatalogError(
        f"{kind} {ref.text} does not exist." + did_you_mean(ref.text, list(names)),
        sqlstate=CatalogError.UNDEFINED,
    )


class Named(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...


def renamed(
    op: str, kind: str, found: Named, new_name: ast.Ident, taken: Named | None
) -> tuple[str, dict[str, object]]:
    """The record of ``ALTER RESOURCE RULE|SELECTOR name RENAME TO new_name``:
    ``taken`` is the object of the same kind ``new_name`` would be confused with."""
    if taken is not None and taken.id != found.id:
        raise duplicate(kind, new_name, taken.name)
    return op, {"id": found.id, "name": new_name.text, "quoted": new_name.quoted}
