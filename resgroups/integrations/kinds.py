"""A statement's managed query kind (SPEC §3), read from its first words: the
integrations of SQL engines share it."""

from __future__ import annotations

import re
from typing import Final

# the statement's kind, from its first words (comments and parentheses skipped)
_KINDS: Final = (
    (re.compile(r"(create\s+(or\s+replace\s+)?(temp\w*\s+)?table\b.*\bas\b)", re.I | re.S), "ctas"),
    (re.compile(r"insert\b", re.I), "insert_select"),
    (re.compile(r"copy\b.*\bto\b", re.I | re.S), "export"),
    (re.compile(r"(select|with|from|values|pivot|unpivot|summarize|table)\b", re.I), "select"),
)
_LEADING: Final = re.compile(r"(\s+|--[^\n]*|/\*.*?\*/|\()*", re.S)


def statement_kind(sql: str) -> str:
    """The managed query kind of a SQL statement: "select", "ctas",
    "insert_select", "export" (COPY ... TO), or "other" (unmanaged) for the
    rest (SET, DDL without a query, ATTACH...)."""
    leading = _LEADING.match(sql)
    text = sql[leading.end() :] if leading is not None else sql
    return next((kind for pattern, kind in _KINDS if pattern.match(text)), "other")
