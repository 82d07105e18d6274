"""resgroups' schema in PostgreSQL: versioned migration files, applied once each.

The files in ``migrations/`` (``NNNN_name.sql``) are applied in name order by
:func:`migrate`, under a transaction-scoped advisory lock, and recorded in
``resgroups_schema_migrations``: two processes starting at once never race
(the second waits, then finds them applied), and a database is brought up
to date by whichever engine opens it first. The catalog log (§10) and the
fleet leases (§11) share the one sequence, so a database may hold both.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # psycopg is the postgres extra: this module imports without it
    import psycopg

_MIGRATIONS_LOCK: Final = (0x7267, 1)  # advisory lock key: "rg", migrations


def migrations() -> list[tuple[str, str]]:
    """(name, SQL) of every migration shipped, in the order they apply."""
    folder = resources.files(__name__) / "migrations"
    names = sorted(f.name for f in folder.iterdir() if f.name.endswith(".sql"))
    return [(name, (folder / name).read_text(encoding="utf-8")) for name in names]


def migrate(conn: psycopg.Connection[Any]) -> list[str]:
    """Apply the migrations this database lacks, in order, in one transaction
    under the migrations lock; the names applied (none: already up to date)."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _MIGRATIONS_LOCK)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS resgroups_schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT name FROM resgroups_schema_migrations")}
        for name, sql in migrations():
            if name not in done:
                conn.execute(sql.encode("utf-8"))
                conn.execute("INSERT INTO resgroups_schema_migrations (name) VALUES (%s)", [name])
                applied.append(name)
    return applied


def redact(dsn: str) -> str:
    """``dsn`` with its password masked, in URI or key=value form."""
    masked = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", dsn)
    masked = re.sub(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", masked)
    return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", masked)
