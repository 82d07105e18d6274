"""The catalog: one record per DDL, replay, the directory log's crash safety and lock."""

from __future__ import annotations

import errno
import functools
import json
import os
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import resgroups
import resgroups.catalog.params
import resgroups.catalog.records
from resgroups.catalog import Catalog, DirectoryLog, Record, Snapshot
from resgroups.catalog.records import replay
from resgroups.catalog.store import FRAME, MAGIC, scan

SCRIPT = [
    "CREATE RESOURCE GROUP reporting WITH (cpu_weight = 50, max_active_queries = 4)",
    "CREATE RESOURCE GROUP dashboards WITH (cpu_limit = '25%', scheduling_policy = 'fair')",
    "CREATE USER analyst WITH PASSWORD 'secret'",
    "CREATE GROUP analysts",
    "ADD USER analyst TO analysts",
    "ALTER GROUP analysts SET RESOURCE GROUP reporting MAPPING PRIORITY 10",
    "CREATE SERVICE ACCOUNT bot",
    "ALTER SERVICE ACCOUNT bot SET RESOURCE GROUP dashboards",
    "GRANT USE ON RESOURCE GROUP dashboards TO analyst",
    "ALTER USER analyst SET MEMORY LIMIT '1G'",
    "CREATE RESOURCE GROUP tenants WITH (cpu_weight = 50, max_active_queries = 4)"
    " VARIANTS (acme WITH (cpu_limit = '10%'), globex WITH (max_active_queries = 2))",
    "ALTER RESOURCE GROUP tenants ADD VARIANT initech",
    "ALTER RESOURCE GROUP tenants SET (max_active_queries = 6)",
    'ALTER RESOURCE GROUP "tenants::acme" SET (cpu_weight = 10)',
    "ALTER RESOURCE GROUP tenants DROP VARIANT globex",
    "ALTER RESOURCE GROUP reporting SET (memory_limit = '8G')",
    "ALTER RESOURCE GROUP dashboards RENAME TO dash",
    "ALTER RESOURCE GROUP reporting RESET (cpu_weight)",
]


def _run(directory: Path, statements: list[str]) -> Snapshot:
    with resgroups.Engine(catalog=str(directory), access_control=True) as engine:
        session = engine.connect()
        for sql in statements:
            session.execute(sql)
        return engine.snapshot


def _reopen(directory: Path) -> Snapshot:
    with resgroups.Engine(catalog=str(directory), access_control=True) as engine:
        return engine.snapshot


def test_every_ddl_statement_appends_exactly_one_record(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=str(tmp_path), access_control=True) as engine:
        assert engine.catalog_version == 1  # the genesis record
        session = engine.connect()
        for i, sql in enumerate(SCRIPT, start=2):
            session.execute(sql)
            assert engine.catalog_version == i, sql
        # statements that change nothing append nothing
        session.execute("CREATE RESOURCE GROUP IF NOT EXISTS reporting")
        session.execute("DROP RESOURCE GROUP IF EXISTS nothing")
        session.execute("SELECT * FROM resource_groups()")
        assert engine.catalog_version == len(SCRIPT) + 1
    records, _ = scan((tmp_path / "catalog.log").read_bytes())
    assert [r.version for r in records] == list(range(1, len(SCRIPT) + 2))
    assert records[0].op == "genesis"


@pytest.mark.parametrize("n", [0, 1, 5, len(SCRIPT)])
def test_restart_after_n_statements_gives_the_same_snapshot(tmp_path: Path, n: int) -> None:
    before = _run(tmp_path, SCRIPT[:n])
    after = _reopen(tmp_path)
    assert after == before
    assert after.version == n + 1


def test_replay_of_the_log_rebuilds_the_snapshot(tmp_path: Path) -> None:
    before = _run(tmp_path, SCRIPT)
    records, _ = scan((tmp_path / "catalog.log").read_bytes())
    assert replay(records) == before
    # and a restarted engine answers from it: mappings, grants, passwords
    with resgroups.Engine(catalog=str(tmp_path), access_control=True) as engine:
        analyst = engine.connect("analyst", "secret")
        assert analyst.execute("SELECT current_resource_group()").rows == [("reporting",)]
        analyst.execute("SET RESOURCE GROUP dash")
        assert analyst.execute("SELECT current_resource_group()").rows == [("dash",)]
        bot = engine.connect("bot")
        assert bot.execute("SELECT current_resource_group()").rows == [("dash",)]


def _last_record_span(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    records, end = scan(data)
    assert end == len(data)
    start = len(MAGIC)
    for _ in records[:-1]:
        (length, _crc) = FRAME.unpack_from(data, start)
        start += FRAME.size + length
    return start, end


def _recovers(directory: Path, expected: Snapshot, expected_records: int) -> None:
    with resgroups.Engine(catalog=str(directory), access_control=True) as engine:
        assert engine.snapshot == expected
        assert engine.catalog_version == expected_records
        engine.connect().execute("CREATE RESOURCE GROUP after_crash")
        assert engine.catalog_version == expected_records + 1
    with resgroups.Engine(catalog=str(directory), access_control=True) as engine:
        assert engine.snapshot.find_group(resgroups.sql.ast.Ident("after_crash")) is not None
        assert engine.catalog_version == expected_records + 1


def test_truncating_the_last_record_at_every_offset_recovers(tmp_path: Path) -> None:
    base = tmp_path / "base"
    expected = _run(base, SCRIPT[:-1])
    _run(base, SCRIPT[-1:])
    log = base / "catalog.log"
    start, end = _last_record_span(log)
    image = log.read_bytes()
    for cut in range(start, end):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        (directory / "catalog.log").write_bytes(image[:cut])
        _recovers(directory, expected, len(SCRIPT))


def test_corrupting_any_byte_of_the_last_record_recovers(tmp_path: Path) -> None:
    base = tmp_path / "base"
    expected = _run(base, SCRIPT[:-1])
    _run(base, SCRIPT[-1:])
    log = base / "catalog.log"
    start, end = _last_record_span(log)
    image = log.read_bytes()
    for offset in range(start, end):
        damaged = bytearray(image)
        damaged[offset] ^= 0xFF
        directory = tmp_path / f"bad{offset}"
        directory.mkdir()
        (directory / "catalog.log").write_bytes(bytes(damaged))
        _recovers(directory, expected, len(SCRIPT))


def test_damage_in_the_middle_is_refused_not_dropped(tmp_path: Path) -> None:
    _run(tmp_path, SCRIPT)
    log = tmp_path / "catalog.log"
    image = bytearray(log.read_bytes())
    image[len(MAGIC) + FRAME.size + 2] ^= 0xFF  # inside the genesis record
    log.write_bytes(bytes(image))
    with pytest.raises(resgroups.CatalogError, match="intact records after it"):
        resgroups.Engine(catalog=str(tmp_path))
    assert log.read_bytes() == bytes(image)  # nothing was cut


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "catalog.log").write_bytes(b"hello, world\n")
    with pytest.raises(resgroups.CatalogError, match="not a resgroups catalog log"):
        resgroups.Engine(catalog=str(tmp_path))


def test_a_log_cut_inside_its_header_starts_fresh(tmp_path: Path) -> None:
    (tmp_path / "catalog.log").write_bytes(MAGIC[:3])
    with resgroups.Engine(catalog=str(tmp_path)) as engine:
        assert engine.catalog_version == 1
    assert (tmp_path / "catalog.log").read_bytes().startswith(MAGIC)


def test_second_writer_in_this_process_is_refused(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=str(tmp_path)):
        with pytest.raises(resgroups.CatalogLocked) as info:
            resgroups.Engine(catalog=str(tmp_path))
        assert info.value.sqlstate == "55006"
    with resgroups.Engine(catalog=str(tmp_path)) as again:  # released on close
        assert again.catalog_version == 1


def test_second_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import resgroups
        try:
            resgroups.Engine(catalog={str(tmp_path)!r})
        except resgroups.CatalogLocked as exc:
            print("locked", exc.sqlstate)
        else:
            print("opened")
        """
    )
    with resgroups.Engine(catalog=str(tmp_path)):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
    assert out.split() == ["locked", "55006"]


def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    log = DirectoryLog(tmp_path)
    catalog = Catalog(log)
    before = catalog.snapshot
    os.close(log._fd)
    log._fd = os.open(tmp_path / "catalog.log", os.O_RDONLY)  # writes now fail
    with pytest.raises(resgroups.CatalogError, match="cannot write catalog record 2"):
        catalog.write(
            lambda snap: (
                "create_group",
                {"id": snap.next_id, "name": "g", "quoted": False, "params": {}},
            )
        )
    assert catalog.snapshot == before
    catalog.close()


def test_rename_keeps_mappings_grants_and_creation_order(admin: resgroups.Session) -> None:
    engine = admin.engine
    admin.execute_script(
        "CREATE RESOURCE GROUP a; CREATE RESOURCE GROUP b; CREATE RESOURCE GROUP c;"
        "CREATE USER u; ALTER USER u SET RESOURCE GROUP b; GRANT USE ON RESOURCE GROUP c TO u"
    )
    user = engine.connect("u")
    user.execute("SET RESOURCE GROUP c")
    admin.execute_script(
        "ALTER RESOURCE GROUP b RENAME TO bee; ALTER RESOURCE GROUP c RENAME TO sea"
    )
    assert [r["name"] for r in engine.resource_groups()] == ["DEFAULT", "a", "bee", "sea"]
    assert user.execute("SELECT current_resource_group()").rows == [("sea",)]
    user.execute("RESET RESOURCE GROUP")
    assert user.execute("SELECT current_resource_group()").rows == [("bee",)]
    user.execute("SET RESOURCE GROUP sea")  # the USE grant followed the rename
    assert admin.execute("SHOW USERS").rows == [("u", None, "bee")]


def test_drop_of_a_mapped_group_is_refused(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP reporting; CREATE USER analyst; CREATE GROUP team;"
        "ALTER USER analyst SET RESOURCE GROUP reporting;"
        "ALTER GROUP team SET RESOURCE GROUP reporting"
    )
    with pytest.raises(resgroups.CatalogError) as info:
        admin.execute("DROP RESOURCE GROUP reporting")
    assert info.value.sqlstate == "42809"
    assert "Resource Group is assigned to an ACL entity [entity=analyst,team]" in str(info.value)
    admin.execute_script(
        "ALTER USER analyst UNSET RESOURCE GROUP; ALTER GROUP team UNSET RESOURCE GROUP"
    )
    admin.execute("DROP RESOURCE GROUP reporting")
    assert [r["name"] for r in admin.engine.resource_groups()] == ["DEFAULT"]


def test_default_cannot_be_dropped_or_renamed_but_can_be_altered(engine: resgroups.Engine) -> None:
    session = engine.connect()
    with pytest.raises(
        resgroups.CatalogError, match="built-in Resource Group cannot be dropped"
    ) as info:
        session.execute("DROP RESOURCE GROUP default")
    assert info.value.sqlstate == "42809"
    with pytest.raises(resgroups.CatalogError, match="built-in Resource Group cannot be renamed"):
        session.execute("ALTER RESOURCE GROUP DEFAULT RENAME TO other")
    with pytest.raises(resgroups.CatalogError, match="already exists") as dup:
        session.execute("CREATE RESOURCE GROUP Default")
    assert dup.value.sqlstate == "42710"
    session.execute("ALTER RESOURCE GROUP DEFAULT SET (cpu_weight = 300)")
    assert engine.resource_groups()[0]["cpu_weight"] == 300
    session.execute("ALTER RESOURCE GROUP default RESET (cpu_weight)")
    assert engine.resource_groups()[0]["cpu_weight"] == 100


def test_names_unquoted_case_insensitive_quoted_exact(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP Reporting")
    with pytest.raises(resgroups.CatalogError) as info:
        session.execute("CREATE RESOURCE GROUP REPORTING")
    assert info.value.sqlstate == "42710"
    with pytest.raises(resgroups.CatalogError):
        session.execute('CREATE RESOURCE GROUP "reporting"')  # would shadow the unquoted name
    session.execute("ALTER RESOURCE GROUP reporting SET (cpu_weight = 5)")
    assert engine.resource_groups()[1]["name"] == "Reporting"  # shown as created
    session.execute_script('CREATE RESOURCE GROUP "Mixed"; CREATE RESOURCE GROUP "MIXED"')
    with pytest.raises(resgroups.CatalogError, match=r'Did you mean "(Mixed|MIXED)"'):
        session.execute('ALTER RESOURCE GROUP "mixed" SET (cpu_weight = 5)')
    session.execute('DROP RESOURCE GROUP "MIXED"')
    assert [r["name"] for r in engine.resource_groups()] == ["DEFAULT", "Reporting", "Mixed"]


def test_a_group_created_again_is_a_new_group(engine: resgroups.Engine) -> None:
    session = engine.connect()
    session.execute("CREATE RESOURCE GROUP g WITH (cpu_weight = 5)")
    first = engine.snapshot.groups[-1]
    session.execute_script("DROP RESOURCE GROUP g; CREATE RESOURCE GROUP g")
    second = engine.snapshot.groups[-1]
    assert second.id != first.id
    assert second.cpu_weight == 100


def test_record_encoding_round_trips() -> None:
    record = Record(7, "alter_group", {"id": 3, "set": {"cpu_weight": 5}, "reset": ["cpu_limit"]})
    assert Record.decode(record.encode()) == record
    with pytest.raises(ValueError, match="without an operation"):
        Record.decode(b'{"v": 1}')


# ---- records this version cannot apply: refused with their position, never cut off ----


def _append_raw(directory: Path, body: dict[str, object]) -> bytes:
    """Frame ``body`` as a whole record (valid checksum) at the end of the log."""
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    log = directory / "catalog.log"
    with log.open("ab") as f:
        f.write(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
    return log.read_bytes()


NEXT = len(SCRIPT) + 2  # genesis, the script, then one more


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"op": "explode"}, "unknown operation 'explode'"),
        ({"op": "alter_group", "id": 1, "set": {"cpu_weight": -5}, "reset": []}, "cpu_weight"),
        ({"op": "alter_group", "id": 1, "set": {"cpu_weight": True}, "reset": []}, "cpu_weight"),
        ({"op": "alter_group", "id": 1, "set": {"nice": 3}, "reset": []}, "'nice'"),
        ({"op": "alter_group", "id": 109, "set": {}, "reset": []}, "missing resource group"),
        ({"op": "alter_group", "id": 1, "set": {}}, "lacks field 'reset'"),
        ({"op": "alter_group", "id": 1, "set": {"scheduling_policy": "lifo"}, "reset": []}, "lifo"),
        ({"op": "create_group", "id": 50, "name": "x", "quoted": False, "params": {}}, "id 50"),
        (
            {"op": "create_group", "id": 10, "name": "bad name", "quoted": False, "params": {}},
            "identifier",
        ),
        ({"op": "create_group", "id": 10, "name": "", "quoted": True, "params": {}}, "not empty"),
        (
            {"op": "create_group", "id": 10, "name": "REPORTING", "quoted": False, "params": {}},
            "already exists",
        ),
        (
            {
                "op": "create_principal",
                "id": 10,
                "kind": "user",
                "name": "u",
                "quoted": False,
                "password_hash": "x",
            },
            "password hash",
        ),
        (
            {
                "op": "create_principal",
                "id": 10,
                "kind": "user",
                "name": "u",
                "quoted": False,
                "md5_verifier": "md5" + "0" * 32,  # without a password hash
            },
            "md5 verifier",
        ),
        (
            {"op": "create_principal", "id": 10, "kind": "robot", "name": "u", "quoted": False},
            "robot",
        ),
        ({"op": "add_member", "user": 4, "groups": [3]}, "is a group, not a user"),
        ({"op": "set_mapping", "principal": 4, "group": 1, "priority": -1}, "priority"),
        ({"op": "set_mapping", "principal": 3, "group": 1, "priority": 5}, "PRIORITY on user"),
        ({"op": "set_admin", "principal": 3, "value": "yes"}, "true or false"),
        ({"op": "drop_group", "id": 0}, "must stay"),
        ({"op": "set_mapping", "principal": 4, "group": 6}, "has variants"),
        ({"op": "grant_use", "principal": 3, "group": 6}, "has variants"),
        ({"op": "rename_group", "id": 7, "name": "x", "quoted": False}, "a variant"),
        (
            {"op": "add_variant", "base": 1, "id": 10, "name": "v", "quoted": False, "params": {}},
            "mapped or granted",
        ),
        (
            {"op": "add_variant", "base": 7, "id": 10, "name": "v", "quoted": False, "params": {}},
            "not a variant SQL could create",
        ),
        (
            {
                "op": "add_variant",
                "base": 6,
                "id": 10,
                "name": "a::b",
                "quoted": True,
                "params": {},
            },
            "not a variant SQL could create",
        ),
        (
            {
                "op": "add_variant",
                "base": 6,
                "id": 10,
                "name": "ACME",
                "quoted": False,
                "params": {},
            },
            "is taken",
        ),
    ],
)
def test_a_whole_record_this_version_cannot_apply_is_refused(
    tmp_path: Path, body: dict[str, object], needle: str
) -> None:
    snap = _run(tmp_path, SCRIPT)
    assert snap.find_principal(resgroups.sql.ast.Ident("analyst")).id == 3  # type: ignore[union-attr]
    image = _append_raw(tmp_path, {"v": NEXT, **body})
    with pytest.raises(resgroups.CatalogError, match=needle) as refused:
        resgroups.Engine(catalog=tmp_path)
    assert f"record {NEXT}" in str(refused.value)
    assert "catalog.log" in str(refused.value)
    assert refused.value.sqlstate == "XX001"
    assert (tmp_path / "catalog.log").read_bytes() == image  # nothing was cut


DEEP = 100_000  # nested arrays: past any recursion limit of the JSON decoder


@pytest.mark.parametrize(
    "payload",
    [
        b"not json at all",
        b'{"v": 16, "op": 7}',
        b"[1, 2]",
        b"\xff\xfe",
        b"[" * DEEP + b"]" * DEEP,
        b'{"v": 16, "op": "create_group", "params": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    ],
    ids=["text", "op", "array", "utf8", "deep", "deep-field"],
)
def test_a_whole_frame_that_is_no_record_is_refused_not_cut(tmp_path: Path, payload: bytes) -> None:
    _run(tmp_path, SCRIPT)
    log = tmp_path / "catalog.log"
    with log.open("ab") as f:
        f.write(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
    image = log.read_bytes()
    with pytest.raises(resgroups.CatalogError, match="checksum holds") as refused:
        resgroups.Engine(catalog=tmp_path)
    assert refused.value.sqlstate == "XX001"
    assert log.read_bytes() == image


def test_a_whole_record_out_of_sequence_is_refused(tmp_path: Path) -> None:
    _run(tmp_path, SCRIPT)
    image = _append_raw(tmp_path, {"v": NEXT + 5, "op": "create_group", "id": 10})
    with pytest.raises(resgroups.CatalogError, match=f"version {NEXT} belongs"):
        resgroups.Engine(catalog=tmp_path)
    assert (tmp_path / "catalog.log").read_bytes() == image


_VALUES = st.one_of(
    st.integers(-3, 12),
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=6),
    st.lists(st.one_of(st.integers(-1, 12), st.text(max_size=3)), max_size=3),
)
_PARAMS = st.dictionaries(
    st.sampled_from([*resgroups.catalog.params.PARAMETERS, "nice", ""]),
    st.one_of(st.integers(-5, 20_000), st.text(max_size=5), st.none(), st.booleans()),
    max_size=3,
)
# whole records valid against the SCRIPT's catalog (ids: reporting 1, dash 2,
# analyst 3, analysts 4, bot 5, tenants 6 with variants acme 7 and initech 9 (globex 8
# dropped); next id 10), each to be mutated in up to two fields
_VALID = [
    ("create_group", {"id": 10, "name": "g", "quoted": False, "params": {"cpu_weight": 5}}),
    ("alter_group", {"id": 1, "set": {"cpu_weight": 7}, "reset": ["memory_limit"]}),
    ("rename_group", {"id": 2, "name": "dd", "quoted": True}),
    ("drop_group", {"id": 2}),
    ("drop_group", {"id": 6}),  # a base, with its variants
    ("drop_group", {"id": 7}),  # a variant
    ("alter_group", {"id": 6, "set": {"cpu_weight": 8}, "reset": ["max_active_queries"]}),
    ("alter_group", {"id": 7, "set": {"memory_limit": 4096}, "reset": ["cpu_weight"]}),
    ("rename_group", {"id": 6, "name": "firms", "quoted": False}),
    ("add_variant", {"base": 6, "id": 10, "name": "hooli", "quoted": False, "params": {}}),
    ("add_variant", {"base": 1, "id": 10, "name": "v", "quoted": True, "params": {}}),
    (
        "create_group",
        {
            "id": 10,
            "name": "b",
            "quoted": False,
            "params": {},
            "variants": [{"id": 11, "name": "x", "quoted": False, "params": {"cpu_weight": 3}}],
        },
    ),
    ("create_principal", {"id": 10, "kind": "user", "name": "u2", "quoted": False}),
    ("drop_principal", {"id": 3}),
    ("add_member", {"user": 3, "groups": [4]}),
    ("remove_member", {"user": 3, "groups": [4]}),
    ("set_mapping", {"principal": 4, "group": 2, "priority": 3}),
    ("set_memory_limit", {"principal": 3, "limit": 1024}),
    ("set_admin", {"principal": 3, "value": True}),
    ("grant_use", {"principal": 3, "group": 1}),
    ("revoke_use", {"principal": 3, "group": None}),
    ("grant_assume", {"account": 5, "user": 3}),
    ("revoke_assume", {"account": 5, "user": 4}),
    ("explode", {}),
]
_FIELDS = sorted({key for _, args in _VALID for key in args} | {"format", "password_hash"})


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    op, args = draw(st.sampled_from(_VALID))
    changes = draw(
        st.dictionaries(st.sampled_from(_FIELDS), st.one_of(_VALUES, _PARAMS), max_size=2)
    )
    dropped = draw(st.sets(st.sampled_from(sorted(args) or ["id"]), max_size=1))
    mutated = {k: v for k, v in {**args, **changes}.items() if k not in dropped}
    return op, mutated


@settings(max_examples=1500, deadline=None)
@given(st.one_of(st.sampled_from(_VALID), _records()))
def test_any_record_is_applied_whole_or_refused_with_a_catalog_error(
    record: tuple[str, dict[str, object]],
) -> None:
    """Whatever a record carries, apply() either yields a snapshot that keeps
    every invariant, or raises CatalogError; never another exception."""
    op, args = record
    base = _script_snapshot()
    refused: resgroups.CatalogError | None = None
    try:
        new = resgroups.catalog.records.apply(base, Record(base.version + 1, op, args))
    except resgroups.CatalogError as exc:
        refused = exc
    if refused is not None:
        event("refused")
        assert refused.sqlstate == "XX001"
        return
    event(f"applied {op}")
    new._check_invariants()
    assert new.version == base.version + 1


@functools.cache
def _script_snapshot() -> Snapshot:
    with resgroups.Engine(access_control=True) as engine:
        session = engine.connect()
        for sql in SCRIPT:
            session.execute(sql)
        return engine.snapshot


# ---- opening a catalog: every failure is a CatalogError naming the path and the cause ----


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("cat\0alog", "NUL byte"),
        (b"/tmp/x", "expected a directory path"),
        (123, "expected a directory path"),
    ],
)
def test_bad_catalog_paths_are_refused(spec: object, needle: str) -> None:
    with pytest.raises(resgroups.CatalogError, match=needle):
        resgroups.Engine(catalog=spec)  # type: ignore[arg-type]


def test_a_catalog_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a directory")
    with pytest.raises(resgroups.CatalogError, match="plain") as failed:
        resgroups.Engine(catalog=tmp_path / "plain")
    assert failed.value.__cause__ is not None  # the OS error, as the cause


@pytest.mark.parametrize("name", ["catalog.log", "catalog.lock"])
def test_a_directory_where_a_catalog_file_belongs_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(resgroups.CatalogError, match=name):
        resgroups.Engine(catalog=tmp_path)


def test_a_read_only_file_system_is_a_catalog_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "ftruncate", refuse)  # the header of a new log is a repair
    with pytest.raises(resgroups.CatalogError, match="Read-only file system"):
        resgroups.Engine(catalog=tmp_path / "ro")


def test_catalog_files_are_the_owners_alone(tmp_path: Path) -> None:
    with resgroups.Engine(catalog=tmp_path / "c", access_control=True) as engine:
        engine.connect().execute("CREATE USER u WITH PASSWORD 'pw'")
    for name in ("catalog.log", "catalog.lock"):
        assert (tmp_path / "c" / name).stat().st_mode & 0o077 == 0, name
    assert (tmp_path / "c").stat().st_mode & 0o077 == 0
