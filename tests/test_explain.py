"""EXPLAIN RESOURCE GROUP: why did my query run in that group?

The property: over random principals, ACL memberships, mapping priorities, USE
grants, session choices (some of them then revoked or dropped) and assumed
service accounts, EXPLAIN's chosen row is the group a query actually runs in,
and when no row is chosen the query fails with the failing row's reason."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import resgroups

COLUMNS = ["candidate", "source", "priority", "eligible", "reason", "chosen"]


def explain(
    session: resgroups.Session, sql: str = "EXPLAIN RESOURCE GROUP"
) -> list[dict[str, Any]]:
    result = session.execute(sql)
    assert result.columns == COLUMNS
    return [dict(zip(COLUMNS, row, strict=True)) for row in result.rows]


@st.composite
def worlds(draw: st.DrawFn) -> dict[str, Any]:
    groups = [f"g{i}" for i in range(draw(st.integers(1, 4)))]
    users = [f"u{i}" for i in range(draw(st.integers(1, 3)))]
    acls = [f"a{i}" for i in range(draw(st.integers(0, 3)))]
    accounts = [f"s{i}" for i in range(draw(st.integers(0, 2)))]
    maybe_group = st.one_of(st.none(), st.sampled_from(groups))
    return {
        "groups": groups,
        "users": users,
        "acls": acls,
        "accounts": accounts,
        "members": {
            u: draw(st.lists(st.sampled_from(acls), unique=True)) if acls else [] for u in users
        },
        "mapping": {p: draw(maybe_group) for p in [*users, *acls, *accounts]},
        "priority": {a: draw(st.integers(0, 3)) for a in acls},
        "use": {
            p: draw(st.lists(st.sampled_from(groups), unique=True))
            for p in [*users, *acls, *accounts]
        },
        "assume": draw(st.sampled_from([None, *accounts])),
        "choose": draw(maybe_group),
        "then": draw(st.sampled_from(["nothing", "revoke", "drop"])),
        "login": draw(st.sampled_from(users)),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_explain_agrees_with_the_resolution_queries_use(world: dict[str, Any]) -> None:
    with resgroups.Engine(access_control=True, workers=1) as engine:
        admin = engine.connect()
        script = [f"CREATE RESOURCE GROUP {g}" for g in world["groups"]]
        script += [f"CREATE USER {u}" for u in world["users"]]
        script += [f"CREATE GROUP {a}" for a in world["acls"]]
        script += [f"CREATE SERVICE ACCOUNT {s}" for s in world["accounts"]]
        script += [f"ADD USER {u} TO {', '.join(a)}" for u, a in world["members"].items() if a]
        kinds = {**dict.fromkeys(world["users"], "USER"), **dict.fromkeys(world["acls"], "GROUP")}
        kinds |= dict.fromkeys(world["accounts"], "SERVICE ACCOUNT")
        for principal, group in world["mapping"].items():
            if group is not None:
                extra = (
                    f" MAPPING PRIORITY {world['priority'][principal]}"
                    if principal in world["acls"]
                    else ""
                )
                script.append(
                    f"ALTER {kinds[principal]} {principal} SET RESOURCE GROUP {group}{extra}"
                )
        for principal, groups in world["use"].items():
            script += [f"GRANT USE ON RESOURCE GROUP {g} TO {principal}" for g in groups]
        login = world["login"]
        if world["assume"] is not None:
            script.append(f"GRANT ASSUME SERVICE ACCOUNT {world['assume']} TO {login}")
        admin.execute_script(";\n".join(script))
        session = engine.connect(user=login)
        if world["assume"] is not None:
            session.execute(f"ASSUME SERVICE ACCOUNT {world['assume']}")
        chosen = world["choose"]
        if chosen is not None:
            try:
                session.execute(f"SET RESOURCE GROUP {chosen}")
            except resgroups.PermissionDenied:
                chosen = None
        if chosen is not None and world["then"] == "drop":
            for principal, group in world["mapping"].items():
                if group == chosen:
                    admin.execute(f"ALTER {kinds[principal]} {principal} UNSET RESOURCE GROUP")
            admin.execute(f"DROP RESOURCE GROUP {chosen}")
        elif chosen is not None and world["then"] == "revoke":
            for principal in world["use"]:
                admin.execute(f"REVOKE USE ON RESOURCE GROUP {chosen} FROM {principal}")

        rows = explain(session)
        picked = [r for r in rows if r["chosen"]]
        assert len(picked) <= 1
        event("resolves" if picked else "the session's choice fails")
        if picked:
            actual = session.execute("SELECT current_resource_group()").rows[0][0]
            assert [r["candidate"] for r in picked] == [actual]
            if session.chosen_group_id is None:  # a fresh login as the admin sees it
                fresh = explain(admin, f"EXPLAIN RESOURCE GROUP FOR USER {login}")
                assert [r["candidate"] for r in fresh if r["chosen"]] == [actual]
        else:  # the session's choice fails: the query gets the failing row's reason
            failing = [r for r in rows if r["source"] == "session"]
            assert failing
            assert not failing[0]["eligible"]
            with pytest.raises(resgroups.Error) as failed:
                session.execute("SELECT current_resource_group()")
            assert failed.value.message == failing[0]["reason"]


def test_explain_rows_follow_resolution_order() -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect()
        admin.execute_script(
            "CREATE RESOURCE GROUP reporting; CREATE RESOURCE GROUP adhoc;"
            "CREATE USER ann; CREATE GROUP analysts; CREATE GROUP ops;"
            "ADD USER ann TO analysts, ops;"
            "ALTER GROUP analysts SET RESOURCE GROUP adhoc MAPPING PRIORITY 5;"
            "ALTER GROUP ops SET RESOURCE GROUP reporting MAPPING PRIORITY 5"
        )
        rows = explain(admin, "EXPLAIN RESOURCE GROUP FOR USER ann")
        assert [
            (r["candidate"], r["source"], r["priority"], r["eligible"], r["chosen"]) for r in rows
        ] == [
            (None, "principal", None, False, False),
            ("reporting", "acl_group", 5, True, True),  # equal priority: created first
            ("adhoc", "acl_group", 5, True, False),
            ("DEFAULT", "default", None, True, False),
        ]
        assert "ACL group ops" in rows[1]["reason"]
        ann = engine.connect(user="ann")
        with pytest.raises(resgroups.PermissionDenied, match="RESOURCE GROUP ADMIN"):
            ann.execute("EXPLAIN RESOURCE GROUP FOR USER ann")
        with pytest.raises(resgroups.CatalogError, match="does not exist"):
            admin.execute("EXPLAIN RESOURCE GROUP FOR USER nobody")


def test_explain_without_access_control_and_when_disabled() -> None:
    with resgroups.Engine() as engine:
        session = engine.connect(user="anyone")
        session.execute("CREATE RESOURCE GROUP mine; SET RESOURCE GROUP mine")
        rows = explain(session)
        assert [(r["candidate"], r["source"], r["chosen"]) for r in rows] == [
            ("mine", "session", True),
            (None, "principal", False),
            ("DEFAULT", "default", False),
        ]
        with pytest.raises(resgroups.FeatureNotSupported):
            session.execute("EXPLAIN RESOURCE GROUP FOR USER anyone")
    with resgroups.Engine(enabled=False) as engine:
        rows = explain(engine.connect())
        assert [(r["source"], r["chosen"]) for r in rows] == [("unmanaged", True)]
