"""EngineConfig: every Engine option checked once, beside its field, and frozen."""

from __future__ import annotations

import dataclasses

import pytest

import resgroups
from resgroups.config import EngineConfig


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"role": "leader"}, "role='leader'): expected 'primary' or 'replica'"),
        ({"role": "replica"}, "a replica follows a catalog"),
        ({"coordination": "mysql://x:secret@h/db"}, "expected a postgresql://"),
        ({"fleet_admission": "votes"}, "expected 'lease' or 'quota'"),
        ({"fleet_admission": "quota"}, "give coordination="),
        ({"lease_heartbeat": 0}, "lease_heartbeat=0): expected a positive number"),
        ({"lease_heartbeat": 10, "lease_expiry": 5}, "must be longer than"),
        ({"workers": 0}, "workers=0): expected an integer 1..4096"),
        ({"workers": 2.5}, "workers=2.5)"),
        ({"pools": {"etl": 0}}, "pools['etl']=0)"),
        ({"slice_ms": -1}, "slice_ms=-1)"),
        ({"query_timeout": True}, "query_timeout=True)"),
        ({"query_memory_limit": 0}, "query_memory_limit=0)"),
        ({"process_memory_limit": -1}, "process_memory_limit=-1): expected bytes >= 0"),
        ({"process_memory_limit": "1G"}, "process_memory_limit='1G')"),
        ({"admin_user": ""}, "the admin needs a name"),
    ],
)
def test_each_bad_option_is_refused_by_the_config_and_by_the_engine_alike(
    options: dict[str, object], needle: str
) -> None:
    with pytest.raises(resgroups.InvalidParameter) as by_config:
        EngineConfig(**options)  # type: ignore[arg-type]
    with pytest.raises(resgroups.InvalidParameter) as by_engine:
        resgroups.Engine(**options)  # type: ignore[arg-type]
    assert needle in by_config.value.message
    assert by_config.value.message == by_engine.value.message
    assert "secret" not in by_config.value.message  # a DSN's password is masked


def test_an_engine_keeps_its_config_frozen_and_opens_from_one() -> None:
    config = EngineConfig(workers=2, query_timeout=5.0, admin_password="pw")
    assert "pw" not in repr(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.workers = 3  # type: ignore[misc]
    with resgroups.Engine.from_config(config) as engine:
        assert engine.config is config
        assert engine.workers == 2
        assert engine.query_timeout == 5.0
        engine.connect().execute("CREATE RESOURCE GROUP g")
    with resgroups.Engine(workers=2, query_timeout=5.0) as engine:
        assert engine.config == dataclasses.replace(config, admin_password=None)
