"""The names the catalog and the SQL front end share: identifiers and principal kinds.

They live with the catalog (the lowest layer that needs them), so that the
catalog stays pure data and ``resgroups.sql`` imports them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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
