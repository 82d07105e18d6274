"""A PostgreSQL database of a benchmark's own, created and dropped around it."""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """The DSN of a fresh database on the server ``dsn`` names (a URI), dropped after."""
    name = f"resgroups_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = dsn.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def add_dsn_argument(parser: argparse.ArgumentParser) -> None:
    """``--dsn``: the server to create the scratch database on (default: the tests')."""
    parser.add_argument(
        "--dsn",
        default=os.environ.get(
            "RESGROUPS_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server to create the benchmark's database on",
    )
