"""Resolution (SPEC §5), permissions and authentication: one test per rule."""

from __future__ import annotations

import pytest

import resgroups


def group_of(session: resgroups.Session) -> str | None:
    rows = session.execute("SELECT current_resource_group()").rows
    assert len(rows) == 1
    value = rows[0][0]
    assert value is None or isinstance(value, str)
    return value


def test_unmapped_principals_run_in_default(admin: resgroups.Session) -> None:
    admin.execute("CREATE USER u")
    assert group_of(admin.engine.connect("u")) == "DEFAULT"
    assert group_of(admin) == "DEFAULT"


def test_own_mapping_beats_acl_group_mappings(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP mine; CREATE RESOURCE GROUP team_rg; CREATE USER u;"
        "CREATE GROUP team;"
        "ADD USER u TO team; ALTER GROUP team SET RESOURCE GROUP team_rg MAPPING PRIORITY 99;"
    )
    user = admin.engine.connect("u")
    assert group_of(user) == "team_rg"
    admin.execute("ALTER USER u SET RESOURCE GROUP mine")
    assert group_of(user) == "mine"
    admin.execute("ALTER USER u UNSET RESOURCE GROUP")
    assert group_of(user) == "team_rg"


def test_highest_acl_priority_wins(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP adhoc; CREATE RESOURCE GROUP dashboards; CREATE USER u;"
        "CREATE GROUP analysts; CREATE GROUP oncall; ADD USER u TO analysts, oncall;"
        "ALTER GROUP analysts SET RESOURCE GROUP adhoc MAPPING PRIORITY 10;"
        "ALTER GROUP oncall SET RESOURCE GROUP dashboards MAPPING PRIORITY 20;"
    )
    user = admin.engine.connect("u")
    assert group_of(user) == "dashboards"
    admin.execute("ALTER GROUP analysts SET RESOURCE GROUP adhoc MAPPING PRIORITY 30")
    assert group_of(user) == "adhoc"


def test_equal_priorities_go_to_the_group_created_first(admin: resgroups.Session) -> None:
    # ACL groups and mappings made in the opposite order to the resource groups
    admin.execute_script(
        "CREATE RESOURCE GROUP first_rg; CREATE RESOURCE GROUP second_rg; CREATE USER u;"
        "CREATE GROUP z_team; CREATE GROUP a_team; ADD USER u TO z_team, a_team;"
        "ALTER GROUP a_team SET RESOURCE GROUP second_rg MAPPING PRIORITY 5;"
        "ALTER GROUP z_team SET RESOURCE GROUP first_rg MAPPING PRIORITY 5;"
    )
    user = admin.engine.connect("u")
    assert group_of(user) == "first_rg"
    # renaming does not change creation order
    admin.execute("ALTER RESOURCE GROUP first_rg RENAME TO zzz")
    assert group_of(user) == "zzz"
    admin.execute("ALTER GROUP z_team UNSET RESOURCE GROUP")
    assert group_of(user) == "second_rg"


def test_service_accounts_use_their_own_mapping_and_never_inherit(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP bots; CREATE RESOURCE GROUP team_rg; CREATE SERVICE ACCOUNT bot;"
        "CREATE GROUP team; ALTER GROUP team SET RESOURCE GROUP team_rg"
    )
    with pytest.raises(resgroups.CatalogError, match="is a service account, not a user"):
        admin.execute("ADD USER bot TO team")
    bot = admin.engine.connect("bot")
    assert group_of(bot) == "DEFAULT"
    admin.execute("ALTER SERVICE ACCOUNT bot SET RESOURCE GROUP bots")
    assert group_of(bot) == "bots"


def test_acl_inheritance_is_for_users_only(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP team_rg; CREATE USER u; CREATE GROUP team; ADD USER u TO team;"
        "ALTER GROUP team SET RESOURCE GROUP team_rg"
    )
    assert group_of(admin.engine.connect("u")) == "team_rg"
    admin.execute("REMOVE USER u FROM team")
    assert group_of(admin.engine.connect("u")) == "DEFAULT"


def test_assumed_account_keeps_the_login_group(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP people; CREATE RESOURCE GROUP bots; CREATE USER u;"
        "CREATE SERVICE ACCOUNT bot; ALTER USER u SET RESOURCE GROUP people;"
        "ALTER SERVICE ACCOUNT bot SET RESOURCE GROUP bots"
    )
    user = admin.engine.connect("u")
    with pytest.raises(resgroups.PermissionDenied, match="ASSUME SERVICE ACCOUNT bot"):
        user.execute("ASSUME SERVICE ACCOUNT bot")
    admin.execute("GRANT ASSUME SERVICE ACCOUNT bot TO u")
    user.execute("ASSUME SERVICE ACCOUNT bot")
    assert group_of(user) == "people"
    assert group_of(admin.engine.connect("bot")) == "bots"  # logging in as it: its mapping
    user.execute("EXIT SERVICE ACCOUNT")
    assert group_of(user) == "people"


def test_assume_grant_through_an_acl_group(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE USER u; CREATE GROUP team; ADD USER u TO team; CREATE SERVICE ACCOUNT bot;"
        "GRANT ASSUME SERVICE ACCOUNT bot TO team"
    )
    admin.engine.connect("u").execute("ASSUME SERVICE ACCOUNT bot")


def test_session_choice_needs_use_unless_it_is_the_own_group(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP mine; CREATE RESOURCE GROUP other; CREATE USER u;"
        "ALTER USER u SET RESOURCE GROUP mine"
    )
    user = admin.engine.connect("u")
    user.execute("SET RESOURCE GROUP mine")  # the own group needs no USE
    with pytest.raises(resgroups.PermissionDenied, match="USE ON RESOURCE GROUP other") as info:
        user.execute("SET RESOURCE GROUP other")
    assert info.value.sqlstate == "42501"
    with pytest.raises(resgroups.CatalogError) as missing:
        user.execute("SET RESOURCE GROUP nothere")
    assert missing.value.sqlstate == "42704"
    admin.execute("GRANT USE ON RESOURCE GROUP other TO u")
    user.execute("SET RESOURCE GROUP other")
    assert group_of(user) == "other"


def test_use_granted_through_an_acl_group_and_for_every_group(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP a; CREATE RESOURCE GROUP b; CREATE USER u; CREATE GROUP team;"
        "ADD USER u TO team; GRANT USE ON RESOURCE GROUP a TO team"
    )
    user = admin.engine.connect("u")
    user.execute("SET RESOURCE GROUP a")
    assert group_of(user) == "a"
    with pytest.raises(resgroups.PermissionDenied):
        user.execute("SET RESOURCE GROUP b")
    admin.execute("GRANT USE RESOURCE GROUP TO team")
    user.execute("SET RESOURCE GROUP b")
    assert group_of(user) == "b"


def test_a_revoke_bites_on_the_next_query(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP alerts; CREATE USER u; GRANT USE ON RESOURCE GROUP alerts TO u"
    )
    user = admin.engine.connect("u")
    user.execute("SET RESOURCE GROUP alerts")
    assert group_of(user) == "alerts"
    admin.execute("REVOKE USE ON RESOURCE GROUP alerts FROM u")
    with pytest.raises(resgroups.PermissionDenied, match="alerts"):
        group_of(user)
    user.execute("RESET RESOURCE GROUP")
    assert group_of(user) == "DEFAULT"


def test_a_drop_of_the_chosen_group_bites_on_the_next_query(engine: resgroups.Engine) -> None:
    session = engine.connect("anyone")
    session.execute_script("CREATE RESOURCE GROUP alerts; SET RESOURCE GROUP alerts")
    engine.connect().execute("DROP RESOURCE GROUP alerts")
    with pytest.raises(resgroups.CatalogError, match="no longer exists") as info:
        group_of(session)
    assert info.value.sqlstate == "42704"
    session.execute("DISCARD ALL")
    assert group_of(session) == "DEFAULT"


def test_rename_keeps_the_session_choice(engine: resgroups.Engine) -> None:
    session = engine.connect("anyone")
    session.execute_script("CREATE RESOURCE GROUP alerts; SET RESOURCE GROUP alerts")
    engine.connect().execute("ALTER RESOURCE GROUP alerts RENAME TO paging")
    assert group_of(session) == "paging"


def test_reset_all_and_discard_all_clear_the_choice(engine: resgroups.Engine) -> None:
    session = engine.connect("anyone")
    session.execute("CREATE RESOURCE GROUP alerts")
    for reset in ("RESET RESOURCE GROUP", "RESET ALL", "DISCARD ALL"):
        session.execute("SET RESOURCE GROUP alerts")
        assert group_of(session) == "alerts"
        session.execute(reset)
        assert group_of(session) == "DEFAULT"


def test_the_admin_needs_no_use(admin: resgroups.Session) -> None:
    admin.execute_script("CREATE RESOURCE GROUP anything; SET RESOURCE GROUP anything")
    assert group_of(admin) == "anything"


def test_resource_group_admin_covers_group_ddl_mappings_grants_and_reading(
    admin: resgroups.Session,
) -> None:
    engine = admin.engine
    admin.execute_script("CREATE USER ops; CREATE USER u; CREATE GROUP admins")
    ops = engine.connect("ops")
    denied = "Access denied for ops [RESOURCE GROUP ADMIN]"
    for sql in (
        "CREATE RESOURCE GROUP g",
        "SELECT * FROM resource_groups()",
        "ALTER USER u SET RESOURCE GROUP default",
        "GRANT USE RESOURCE GROUP TO u",
        "SHOW USERS",
    ):
        with pytest.raises(resgroups.PermissionDenied) as info:
            ops.execute(sql)
        assert str(info.value) == denied
    assert group_of(ops) == "DEFAULT"  # current_resource_group() needs nothing
    admin.execute_script("ADD USER ops TO admins; GRANT RESOURCE GROUP ADMIN TO admins")
    ops.execute_script(
        "CREATE RESOURCE GROUP g; ALTER USER u SET RESOURCE GROUP g; GRANT USE RESOURCE GROUP TO u"
    )
    assert len(ops.execute("SELECT * FROM resource_groups()").rows) == 2
    # principal DDL stays the admin's
    for sql in (
        "CREATE USER x",
        "ALTER USER u SET MEMORY LIMIT '1G'",
        "GRANT RESOURCE GROUP ADMIN TO u",
    ):
        with pytest.raises(resgroups.PermissionDenied, match="is the admin's"):
            ops.execute(sql)
    admin.execute("REVOKE RESOURCE GROUP ADMIN FROM admins")
    with pytest.raises(resgroups.PermissionDenied):
        ops.execute("DROP RESOURCE GROUP g")


def test_access_control_off(engine: resgroups.Engine) -> None:
    session = engine.connect("whoever")
    session.execute("CREATE RESOURCE GROUP g")  # anyone may run group DDL
    for sql in (
        "CREATE USER u",
        "ALTER USER u SET RESOURCE GROUP g",
        "ALTER USER u SET MEMORY LIMIT '1G'",
        "GRANT USE ON RESOURCE GROUP g TO u",
        "GRANT RESOURCE GROUP ADMIN TO u",
        "SHOW USERS",
        "ASSUME SERVICE ACCOUNT s",
    ):
        with pytest.raises(resgroups.FeatureNotSupported, match="requires access control") as info:
            session.execute(sql)
        assert info.value.sqlstate == "0A000"
    session.execute("SET RESOURCE GROUP g")  # the only way out of DEFAULT
    assert group_of(session) == "g"
    assert session.user == "whoever"


def test_authentication(admin: resgroups.Session) -> None:
    engine = admin.engine
    admin.execute_script(
        "CREATE USER pw WITH PASSWORD 's3cret'; CREATE USER open; CREATE GROUP team"
    )
    # an unknown name, an ACL group and a wrong or missing password fail alike
    for name, password in (("nobody", "guess"), ("team", None), ("pw", None), ("pw", "guess")):
        with pytest.raises(resgroups.AuthenticationFailed) as failed:
            engine.connect(name, password)
        assert failed.value.sqlstate == "28P01"
        assert failed.value.message == f'password authentication failed for user "{name}"'
    assert engine.connect("pw", "s3cret").user == "pw"
    assert engine.connect("open").user == "open"
    assert engine.connect("PW", "s3cret").user == "pw"  # unquoted names fold


def test_admin_password() -> None:
    with resgroups.Engine(access_control=True, admin_password="root") as engine:
        with pytest.raises(resgroups.AuthenticationFailed) as info:
            engine.connect("admin", "nope")
        assert info.value.sqlstate == "28P01"
        engine.connect("admin", "root").execute("CREATE USER someone")


def test_a_dropped_login_is_refused_on_its_next_statement(admin: resgroups.Session) -> None:
    admin.execute("CREATE USER u")
    user = admin.engine.connect("u")
    admin.execute("DROP USER u")
    with pytest.raises(resgroups.AuthenticationFailed, match="no longer exists"):
        user.execute("SELECT current_resource_group()")


def test_principal_names_share_one_name_space(admin: resgroups.Session) -> None:
    admin.execute("CREATE USER x")
    for sql in ("CREATE GROUP x", "CREATE SERVICE ACCOUNT X", 'CREATE USER "admin"'):
        with pytest.raises(resgroups.CatalogError) as info:
            admin.execute(sql)
        assert info.value.sqlstate == "42710"
    with pytest.raises(resgroups.CatalogError, match="built-in admin"):
        admin.execute('ALTER USER "admin" SET RESOURCE GROUP default')
    with pytest.raises(resgroups.CatalogError, match="is a user, not a group"):
        admin.execute("DROP GROUP x")


def test_show_lists_memory_limits_and_mappings(admin: resgroups.Session) -> None:
    admin.execute_script(
        "CREATE RESOURCE GROUP r; CREATE USER u; CREATE GROUP g; CREATE SERVICE ACCOUNT s;"
        "ALTER USER u SET MEMORY LIMIT '1G'; ALTER GROUP g SET RESOURCE GROUP r MAPPING PRIORITY 7;"
        "ALTER SERVICE ACCOUNT s SET RESOURCE GROUP r;"
        "ALTER SERVICE ACCOUNT s SET MEMORY LIMIT 4096"
    )
    users = admin.execute("SHOW USERS")
    assert users.columns == ["name", "memory_limit", "resource_group"]
    assert users.rows == [("u", 1024**3, None)]
    groups = admin.execute("SHOW GROUPS")
    assert groups.columns == ["name", "memory_limit", "resource_group", "priority"]
    assert groups.rows == [("g", None, "r", 7)]
    assert admin.execute("SHOW SERVICE ACCOUNTS").rows == [("s", 4096, "r")]
    admin.execute("ALTER USER u SET MEMORY LIMIT UNLIMITED")
    assert admin.execute("SHOW USERS").rows == [("u", None, None)]


def test_feature_disabled_runs_every_query_unmanaged() -> None:
    with resgroups.Engine(enabled=False) as engine:
        session = engine.connect()
        session.execute("CREATE RESOURCE GROUP g")
        assert group_of(session) is None


def test_monitoring_queries_are_unmanaged(engine: resgroups.Engine) -> None:
    rows = (
        engine.connect()
        .execute("SELECT name, current_resource_group() FROM resource_groups()")
        .rows
    )
    assert rows == [("DEFAULT", None)]
