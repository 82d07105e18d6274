from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import resgroups

SEEDS = Path(__file__).resolve().parent / "seeds"


@pytest.fixture
def engine() -> Iterator[resgroups.Engine]:
    with resgroups.Engine() as e:
        yield e


@pytest.fixture
def ac_engine() -> Iterator[resgroups.Engine]:
    """An engine with access control on; connect() without a user is the admin."""
    with resgroups.Engine(access_control=True) as e:
        yield e


@pytest.fixture
def admin(ac_engine: resgroups.Engine) -> resgroups.Session:
    return ac_engine.connect()
