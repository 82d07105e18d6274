"""The public API is curated, typed, and the linters are clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import resgroups

ROOT = Path(__file__).resolve().parent.parent


def test_every_public_name_is_exported_exactly_once() -> None:
    assert len(resgroups.__all__) == len(set(resgroups.__all__))
    for name in resgroups.__all__:
        assert hasattr(resgroups, name), name
    errors = [
        obj
        for name, obj in vars(resgroups.errors).items()
        if isinstance(obj, type) and issubclass(obj, resgroups.Error)
    ]
    for cls in errors:
        assert cls.__name__ in resgroups.__all__, cls


def test_error_sqlstates() -> None:
    expected = {
        "SqlSyntaxError": "42601",
        "InvalidParameter": "22023",
        "CatalogError": "42704",
        "PermissionDenied": "42501",
        "AuthenticationFailed": "28P01",
        "FeatureNotSupported": "0A000",
        "ReadOnlyReplica": "25006",
        "CatalogLocked": "55006",
        "CatalogLagError": "55000",
        "AdmissionRejected": "53400",
        "QueueTimeout": "57014",
        "QueryTimeout": "57014",
        "QueryCancelled": "57014",
        "RunawayQuery": "57014",
        "MemoryLimitExceeded": "53200",
        "CoordinationUnavailable": "08006",
        "NumericOverflow": "22003",
        "InternalError": "XX000",
    }
    for name, state in expected.items():
        assert getattr(resgroups, name).sqlstate == state, name


def test_package_is_typed() -> None:
    assert (ROOT / "resgroups" / "py.typed").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
        ["lint-imports"],  # the layering contract of docs/architecture.md
    ],
)
def test_linters_are_clean(command: list[str]) -> None:
    tool = shutil.which(command[0], path=str(Path(sys.executable).parent))
    assert tool is not None, f"{command[0]} is part of the test extra"
    result = subprocess.run([tool, *command[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
