"""The names the catalog and the SQL front end share: identifiers and principal kinds.

They live with the catalog (the lowest layer that needs them), so that the
catalog stays pure data and ``resgroups.sql`` imports them from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Final

_UNQUOTED: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*\Z")


def name_problem(text: object, quoted: object) -> str | None:
    """Why ``(text, quoted)`` is not a name SQL could have created, or None."""
    if not isinstance(text, str) or not isinstance(quoted, bool):
        return f"a name is a string with a quoted flag, not {text!r}, {quoted!r}"
    if not text:
        return "a name is not empty"
    if not quoted and not _UNQUOTED.match(text):
        return f"unquoted name {text!r} is not an identifier ([A-Za-z_][A-Za-z0-9_$]*)"
    return None


@dataclass(frozen=True)
class Ident:
    """An identifier as written: unquoted names compare case-insensitively."""

    text: str
    quoted: bool = False

    def __str__(self) -> str:
        return self.text


class PrincipalKind(Enum):
    USER = "user"
    GROUP = "group"
    SERVICE_ACCOUNT = "service account"

    @property
    def sql(self) -> str:
        return self.value.upper()
