"""Group variants (issue 15): one base policy expanded into runtime groups named
``base::variant``, each the base's parameters with its own overrides on top."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from waiting import wait_until

import resgroups
from resgroups.catalog.records import replay

TENANTS = (
    "CREATE RESOURCE GROUP tenants WITH (cpu_weight = 50, max_active_queries = 4) "
    "VARIANTS (acme WITH (cpu_limit = '10%'), globex WITH (max_active_queries = 2), initech)"
)
SHOWN = ("cpu_weight", "max_active_queries", "cpu_limit_pct", "max_queued_queries", "base_group")


def rows(engine: resgroups.Engine) -> dict[str, dict[str, Any]]:
    return {r["name"]: {k: r[k] for k in SHOWN} for r in engine.resource_groups()}


@pytest.fixture
def engine() -> Any:
    with resgroups.Engine(workers=2, access_control=True) as engine:
        engine.connect().execute(TENANTS)
        yield engine


def test_create_expands_the_base_into_variants_with_their_overrides(
    engine: resgroups.Engine,
) -> None:
    assert rows(engine) == {
        "DEFAULT": dict(zip(SHOWN, (100, None, None, None, None), strict=True)),
        "tenants::acme": dict(zip(SHOWN, (50, 4, 10.0, None, "tenants"), strict=True)),
        "tenants::globex": dict(zip(SHOWN, (50, 2, None, None, "tenants"), strict=True)),
        "tenants::initech": dict(zip(SHOWN, (50, 4, None, None, "tenants"), strict=True)),
    }
    # the same through SQL, and the base is no row of its own
    got = engine.connect().execute(
        "SELECT name, base_group FROM resource_groups() WHERE base_group IS NOT NULL"
    )
    assert got.rows == [(f"tenants::{v}", "tenants") for v in ("acme", "globex", "initech")]


def test_a_base_set_reaches_the_variants_that_do_not_override_it(
    engine: resgroups.Engine,
) -> None:
    admin = engine.connect()
    admin.execute("ALTER RESOURCE GROUP tenants SET (max_active_queries = 8, cpu_weight = 70)")
    admin.execute('ALTER RESOURCE GROUP "tenants::acme" SET (cpu_weight = 10)')
    now = rows(engine)
    assert [now[f"tenants::{v}"]["max_active_queries"] for v in ("acme", "globex", "initech")] == [
        8,
        2,  # globex overrides it
        8,
    ]
    assert [now[f"tenants::{v}"]["cpu_weight"] for v in ("acme", "globex", "initech")] == [
        10,  # acme's own now
        70,
        70,
    ]
    admin.execute("ALTER RESOURCE GROUP tenants SET (cpu_weight = 20)")
    assert rows(engine)["tenants::acme"]["cpu_weight"] == 10  # still its own
    admin.execute("ALTER RESOURCE GROUP tenants::acme RESET (cpu_weight)")  # unquoted works too
    assert rows(engine)["tenants::acme"]["cpu_weight"] == 20  # the base's again
    admin.execute("ALTER RESOURCE GROUP tenants RESET (max_active_queries)")
    assert rows(engine)["tenants::initech"]["max_active_queries"] is None
    assert rows(engine)["tenants::globex"]["max_active_queries"] == 2


def test_add_and_drop_variant(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute("ALTER RESOURCE GROUP tenants ADD VARIANT hooli WITH (max_queued_queries = 3)")
    admin.execute("ALTER RESOURCE GROUP tenants DROP VARIANT initech")
    admin.execute("ALTER RESOURCE GROUP tenants DROP VARIANT IF EXISTS initech")  # a no-op
    assert rows(engine)["tenants::hooli"] == dict(
        zip(SHOWN, (50, 4, None, 3, "tenants"), strict=True)
    )
    assert list(rows(engine)) == ["DEFAULT", "tenants::acme", "tenants::globex", "tenants::hooli"]
    with pytest.raises(resgroups.CatalogError, match="no variant initech; its variants: acme"):
        admin.execute("ALTER RESOURCE GROUP tenants DROP VARIANT initech")


def test_a_plain_group_becomes_a_base_and_back(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute("CREATE RESOURCE GROUP solo WITH (cpu_weight = 30)")
    admin.execute("ALTER RESOURCE GROUP solo ADD VARIANT one")
    assert "solo" not in rows(engine)
    assert rows(engine)["solo::one"]["cpu_weight"] == 30
    admin.execute("ALTER RESOURCE GROUP solo DROP VARIANT one")
    assert rows(engine)["solo"]["cpu_weight"] == 30  # without variants nothing changes
    admin.execute("SET RESOURCE GROUP solo")
    assert admin.execute("SELECT current_resource_group()").rows == [("solo",)]


def test_the_base_is_not_a_runtime_group(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute("CREATE USER ann")
    named = (
        r"has variants, so queries do not run in it: name one of its variants "
        r'\("tenants::acme", "tenants::globex", "tenants::initech"\)'
    )
    for sql in (
        "SET RESOURCE GROUP tenants",
        "ALTER USER ann SET RESOURCE GROUP tenants",
        "GRANT USE ON RESOURCE GROUP tenants TO ann",
    ):
        with pytest.raises(resgroups.CatalogError, match=named) as refused:
            admin.execute(sql)
        assert refused.value.sqlstate == "42809"
    # the expanded names work everywhere a group is named
    admin.execute('ALTER USER ann SET RESOURCE GROUP "tenants::globex"')
    admin.execute("GRANT USE ON RESOURCE GROUP tenants::acme TO ann")
    ann = engine.connect("ann")
    assert ann.execute("SELECT current_resource_group()").rows == [("tenants::globex",)]
    ann.execute("SET RESOURCE GROUP tenants::acme")
    with ann.query() as q:
        assert q.group == "tenants::acme"
    with pytest.raises(resgroups.PermissionDenied):
        ann.execute("SET RESOURCE GROUP tenants::initech")
    # a mapped variant is not dropped, nor is its base
    with pytest.raises(resgroups.CatalogError, match=r"entity=ann"):
        admin.execute("ALTER RESOURCE GROUP tenants DROP VARIANT globex")
    with pytest.raises(resgroups.CatalogError, match=r"entity=ann"):
        admin.execute("DROP RESOURCE GROUP tenants")


def test_a_group_that_is_mapped_or_granted_cannot_get_variants(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute("CREATE RESOURCE GROUP solo")
    admin.execute("CREATE USER ann")
    admin.execute("GRANT USE ON RESOURCE GROUP solo TO ann")
    with pytest.raises(resgroups.CatalogError, match=r"granted to \[entity=ann\]"):
        admin.execute("ALTER RESOURCE GROUP solo ADD VARIANT one")
    assert "solo" in rows(engine)


@pytest.mark.parametrize(
    ("sql", "message", "sqlstate"),
    [
        (
            'CREATE RESOURCE GROUP "tenants::acme"',
            "resource group tenants::acme already exists",
            "42710",
        ),
        (
            "ALTER RESOURCE GROUP tenants ADD VARIANT ACME",
            "variant ACME of resource group tenants already exists",
            "42710",
        ),
        (
            "CREATE RESOURCE GROUP firms VARIANTS (a, b, A)",
            "variant A of resource group firms already exists",
            "42710",
        ),
        (
            'ALTER RESOURCE GROUP tenants ADD VARIANT "a::b"',
            "variant name a::b contains '::'",
            "42602",
        ),
        (
            "ALTER RESOURCE GROUP tenants::acme ADD VARIANT x",
            "tenants::acme is a variant and cannot have variants",
            "42809",
        ),
        (
            "ALTER RESOURCE GROUP DEFAULT ADD VARIANT x",
            "DEFAULT is the built-in group and cannot have variants",
            "42809",
        ),
        (
            "ALTER RESOURCE GROUP tenants::acme RENAME TO acme",
            "tenants::acme is a variant: its name follows its base's",
            "42809",
        ),
        ("ALTER RESOURCE GROUP tenants DROP VARIANT nope", "has no variant nope", "42704"),
        (
            "CREATE RESOURCE GROUP firms VARIANTS (x WITH (cpu_weight = 0))",
            "cpu_weight",
            "22023",
        ),
    ],
)
def test_variant_errors_change_nothing(
    engine: resgroups.Engine, sql: str, message: str, sqlstate: str
) -> None:
    before = (engine.catalog_version, rows(engine))
    with pytest.raises(resgroups.Error, match=message) as refused:
        engine.connect().execute(sql)
    assert refused.value.sqlstate == sqlstate
    assert (engine.catalog_version, rows(engine)) == before


def test_an_expanded_name_that_collides_names_both(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute('CREATE RESOURCE GROUP "firms::acme"')
    expected = (
        "variant acme of resource group firms would be named firms::acme, "
        "which collides with the existing resource group firms::acme"
    )
    with pytest.raises(resgroups.CatalogError, match=expected):
        admin.execute("CREATE RESOURCE GROUP firms VARIANTS (acme)")
    admin.execute("CREATE RESOURCE GROUP firms")
    with pytest.raises(resgroups.CatalogError, match=expected):
        admin.execute("ALTER RESOURCE GROUP firms ADD VARIANT acme")
    admin.execute("DROP RESOURCE GROUP firms")
    with pytest.raises(
        resgroups.CatalogError,
        match="renaming tenants to firms would name its variant acme firms::acme, "
        "which collides with the existing resource group firms::acme",
    ):
        admin.execute("ALTER RESOURCE GROUP tenants RENAME TO firms")


def test_renaming_the_base_renames_its_variants(engine: resgroups.Engine) -> None:
    admin = engine.connect()
    admin.execute("CREATE USER ann")
    admin.execute("ALTER USER ann SET RESOURCE GROUP tenants::acme")
    admin.execute("ALTER RESOURCE GROUP tenants RENAME TO firms")
    assert [n for n in rows(engine) if "::" in n] == [
        "firms::acme",
        "firms::globex",
        "firms::initech",
    ]
    assert rows(engine)["firms::acme"]["base_group"] == "firms"
    ann = engine.connect("ann")
    assert ann.execute("SELECT current_resource_group()").rows == [("firms::acme",)]


def test_a_session_whose_choice_gained_variants_is_told_which_to_choose(
    engine: resgroups.Engine,
) -> None:
    admin = engine.connect()
    admin.execute("CREATE RESOURCE GROUP solo")
    user = engine.connect()
    user.execute("SET RESOURCE GROUP solo")
    admin.execute("ALTER RESOURCE GROUP solo ADD VARIANT one")
    with pytest.raises(
        resgroups.CatalogError,
        match=r"solo chosen by SET RESOURCE GROUP has variants now; "
        r'choose one of them \("solo::one"\)',
    ):
        user.execute("SELECT 1")
    explained = user.execute("EXPLAIN RESOURCE GROUP")
    assert not any(row[-1] for row in explained.rows)  # resolution fails: nothing chosen


def test_hot_changes_of_the_base_while_a_variants_queries_run() -> None:
    """A queued query of a variant that inherits max_active_queries is admitted as
    soon as the base raises it; one whose variant overrides it is not."""
    with resgroups.Engine(workers=4) as engine:
        engine.connect().execute(
            "CREATE RESOURCE GROUP t WITH (max_active_queries = 1) "
            "VARIANTS (a, b WITH (max_active_queries = 1))"
        )
        release = threading.Event()
        admitted: dict[str, int] = {"t::a": 0, "t::b": 0}
        lock = threading.Lock()
        errors: list[BaseException] = []

        def one(group: str) -> None:
            try:
                session = engine.connect()
                session.execute(f"SET RESOURCE GROUP {group}")
                with session.query():
                    with lock:
                        admitted[group] += 1
                    assert release.wait(30)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(g,)) for g in ("t::a", "t::b") * 2]
        for t in threads:
            t.start()

        def state(group: str) -> tuple[int, int]:
            row = next(r for r in engine.resource_groups() if r["name"] == group)
            return row["active_queries"], row["queued_queries"]

        wait_until(lambda: state("t::a") == (1, 1) and state("t::b") == (1, 1))
        engine.connect().execute("ALTER RESOURCE GROUP t SET (max_active_queries = 2)")
        try:
            wait_until(lambda: state("t::a") == (2, 0))  # inherited: the queued one runs
            wait_until(lambda: admitted["t::a"] == 2)
            assert state("t::b") == (1, 1)  # overridden: still one at a time
            assert admitted["t::b"] == 1
        finally:
            release.set()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert admitted == {"t::a": 2, "t::b": 2}


def test_dropping_a_base_while_a_variants_query_runs_lets_it_finish() -> None:
    with resgroups.Engine(workers=2) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP t VARIANTS (a)")
        session.execute("SET RESOURCE GROUP t::a")
        with session.query() as q:
            engine.connect().execute("DROP RESOURCE GROUP t")
            q.checkpoint()  # the query keeps its slot and runs on
            assert q.group == "t::a"
        assert [r["name"] for r in engine.resource_groups()] == ["DEFAULT"]
        with pytest.raises(
            resgroups.CatalogError, match="t::a chosen by SET RESOURCE GROUP no longer exists"
        ):
            session.execute("SELECT 1")


def test_variants_replicate_and_survive_a_restart(tmp_path: Path) -> None:
    with (
        resgroups.Engine(catalog=tmp_path) as primary,
        resgroups.Engine(catalog=tmp_path, role="replica") as replica,
    ):
        admin = primary.connect()
        admin.execute(TENANTS)
        admin.execute("ALTER RESOURCE GROUP tenants SET (cpu_weight = 70)")
        admin.execute("ALTER RESOURCE GROUP tenants ADD VARIANT hooli")
        admin.execute("ALTER RESOURCE GROUP tenants DROP VARIANT initech")
        wait_until(lambda: replica.catalog_version == primary.catalog_version)
        assert rows(replica) == rows(primary)
        assert rows(replica)["tenants::globex"] == dict(
            zip(SHOWN, (70, 2, None, None, "tenants"), strict=True)
        )
        user = replica.connect()
        user.execute("SET RESOURCE GROUP tenants::hooli")
        with user.query() as q:
            assert q.group == "tenants::hooli"
        with pytest.raises(resgroups.CatalogError, match="has variants"):
            user.execute("SET RESOURCE GROUP tenants")
        expected = rows(primary)
        snapshot = primary.snapshot
    with resgroups.Engine(catalog=tmp_path) as reopened:
        assert rows(reopened) == expected
        assert reopened.snapshot == snapshot


def test_variants_reach_another_primary_of_a_postgresql_catalog(pg_catalog: str) -> None:
    with (
        resgroups.Engine(catalog=pg_catalog) as first,
        resgroups.Engine(catalog=pg_catalog) as second,
    ):
        first.connect().execute(TENANTS)
        wait_until(lambda: second.catalog_version == first.catalog_version, timeout=10)
        second.connect().execute('ALTER RESOURCE GROUP "tenants::acme" SET (cpu_weight = 7)')
        wait_until(lambda: first.catalog_version == second.catalog_version, timeout=10)
        assert rows(first) == rows(second)
        assert rows(first)["tenants::acme"]["cpu_weight"] == 7


# ---- a stateful property test: variant DDL against a model ---------------------------

BASES = ("b0", "b1")
VARIANTS = ("v0", "v1", "v2")
WEIGHTS = st.integers(1, 500)


class VariantCatalog(RuleBasedStateMachine):
    """Random variant DDL on an engine, against a model of what each runtime group's
    parameters must be (the base's with the variant's overrides on top); every
    snapshot keeps its invariants and replays to itself."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = resgroups.Engine(workers=1)
        self.admin = self.engine.connect()
        # base -> (its cpu_weight or None, {variant: its override or None}); None: absent
        self.model: dict[str, tuple[int | None, dict[str, int | None]] | None] = dict.fromkeys(
            BASES
        )

    def teardown(self) -> None:
        self.engine.close()

    def _run(self, sql: str, ok: bool) -> None:
        before = self.engine.catalog_version
        if ok:
            self.admin.execute(sql)
        else:
            with pytest.raises(resgroups.Error):
                self.admin.execute(sql)
            assert self.engine.catalog_version == before  # a refusal writes nothing

    @rule(base=st.sampled_from(BASES), weight=WEIGHTS, variants=st.sets(st.sampled_from(VARIANTS)))
    def create(self, base: str, weight: int, variants: set[str]) -> None:
        listed = ", ".join(sorted(variants))
        sql = f"CREATE RESOURCE GROUP {base} WITH (cpu_weight = {weight})"
        sql += f" VARIANTS ({listed})" if variants else ""
        exists = self.model[base] is not None
        self._run(sql, not exists)
        if not exists:
            self.model[base] = (weight, dict.fromkeys(variants))

    @rule(base=st.sampled_from(BASES), variant=st.sampled_from(VARIANTS), weight=WEIGHTS)
    def add(self, base: str, variant: str, weight: int) -> None:
        entry = self.model[base]
        ok = entry is not None and variant not in entry[1]
        self._run(
            f"ALTER RESOURCE GROUP {base} ADD VARIANT {variant} WITH (cpu_weight = {weight})", ok
        )
        if ok and entry is not None:
            entry[1][variant] = weight

    @rule(base=st.sampled_from(BASES), variant=st.sampled_from(VARIANTS))
    def drop_variant(self, base: str, variant: str) -> None:
        entry = self.model[base]
        ok = entry is not None and variant in entry[1]
        self._run(f"ALTER RESOURCE GROUP {base} DROP VARIANT {variant}", ok)
        if ok and entry is not None:
            del entry[1][variant]

    @rule(base=st.sampled_from(BASES), weight=st.one_of(st.none(), WEIGHTS))
    def alter_base(self, base: str, weight: int | None) -> None:
        entry = self.model[base]
        if weight is None:
            sql = f"ALTER RESOURCE GROUP {base} RESET (cpu_weight)"
        else:
            sql = f"ALTER RESOURCE GROUP {base} SET (cpu_weight = {weight})"
        self._run(sql, entry is not None)
        if entry is not None:
            self.model[base] = (weight, entry[1])

    @rule(base=st.sampled_from(BASES), variant=st.sampled_from(VARIANTS),
          weight=st.one_of(st.none(), WEIGHTS))  # fmt: skip
    def alter_variant(self, base: str, variant: str, weight: int | None) -> None:
        entry = self.model[base]
        ok = entry is not None and variant in entry[1]
        name = f"{base}::{variant}"
        if weight is None:
            sql = f"ALTER RESOURCE GROUP {name} RESET (cpu_weight)"
        else:
            sql = f"ALTER RESOURCE GROUP {name} SET (cpu_weight = {weight})"
        self._run(sql, ok)
        if ok and entry is not None:
            entry[1][variant] = weight

    @rule(base=st.sampled_from(BASES))
    def drop_base(self, base: str) -> None:
        self._run(f"DROP RESOURCE GROUP {base}", self.model[base] is not None)
        self.model[base] = None

    @invariant()
    def runtime_groups_follow_the_model(self) -> None:
        expected = {"DEFAULT": (100, None)}
        for base, entry in self.model.items():
            if entry is None:
                continue
            weight, variants = entry
            if not variants:  # without variants, a plain group
                expected[base] = (weight or 100, None)
            for variant, own in variants.items():
                expected[f"{base}::{variant}"] = (own or weight or 100, base)
        got = {r["name"]: (r["cpu_weight"], r["base_group"]) for r in self.engine.resource_groups()}
        assert got == expected
        snapshot = self.engine.snapshot
        snapshot._check_invariants()
        assert replay(self.engine._log.read_all()) == snapshot  # the log rebuilds it


TestVariantCatalog = VariantCatalog.TestCase
TestVariantCatalog.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_each_variant_is_its_own_fleet_wide_limit(pg_catalog: str) -> None:
    """Fleet mode: leases are taken per variant (``t::a`` and ``t::b`` each admit
    one query across both engines), never per base."""
    a = resgroups.Engine(coordination=pg_catalog, workers=2)
    b = resgroups.Engine(coordination=pg_catalog, workers=2)
    try:
        for engine in (a, b):
            engine.connect().execute(
                "CREATE RESOURCE GROUP t WITH (max_active_queries = 1, queue_timeout = '30s') "
                "VARIANTS (a, b)"
            )
        holder, waiter, other = a.connect(), b.connect(), b.connect()
        holder.execute("SET RESOURCE GROUP t::a")
        waiter.execute("SET RESOURCE GROUP t::a")
        other.execute("SET RESOURCE GROUP t::b")
        held = holder.query()
        held.__enter__()
        started = threading.Event()

        def wait() -> None:
            with waiter.query():
                started.set()

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            fleet = lambda: {r["name"]: r["fleet_active_queries"] for r in b.resource_groups()}  # noqa: E731
            wait_until(lambda: fleet()["t::a"] == 1, timeout=10)
            assert not started.is_set()  # t::a is full across the fleet
            with other.query() as q:  # t::b is not: a variant's limit is its own
                assert q.group == "t::b"
        finally:
            held.__exit__(None, None, None)
        assert started.wait(10)
        thread.join(10)
    finally:
        a.close()
        b.close()
