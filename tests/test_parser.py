"""The SQL front end: grammar features, typed parameters and friendly errors."""

from __future__ import annotations

from importlib import resources

import pytest
from lark import Lark

from resgroups.errors import InvalidParameter, NumericOverflow, SqlSyntaxError
from resgroups.sql import ast
from resgroups.sql.format import format_sql
from resgroups.sql.parser import keywords, parse_one, parse_script
from resgroups.sql.split import split_statements


def test_grammar_has_no_conflicts() -> None:
    grammar = resources.files("resgroups.sql").joinpath("grammar.lark").read_text()
    Lark(grammar, parser="lalr", lexer="basic", start="script", strict=True)


def test_keywords_are_case_insensitive() -> None:
    assert parse_one("cReAtE rEsOuRcE gRoUp g") == parse_one("CREATE RESOURCE GROUP g")


def test_several_statements_comments_and_empty_statements() -> None:
    statements = parse_script(
        """-- leading comment
        CREATE RESOURCE GROUP a; /* block ; comment */
        ;;
        DROP RESOURCE GROUP a -- trailing
        """
    )
    assert statements == [
        ast.CreateResourceGroup(ast.Ident("a")),
        ast.DropResourceGroup(ast.Ident("a")),
    ]
    assert parse_script("") == []
    assert parse_script("  ; -- nothing\n ;") == []


def test_keywords_are_reserved_unless_quoted() -> None:
    with pytest.raises(SqlSyntaxError) as info:
        parse_one("CREATE RESOURCE GROUP show")
    assert 'write "show"' in str(info.value)
    assert parse_one('CREATE RESOURCE GROUP "show"') == ast.CreateResourceGroup(
        ast.Ident("show", quoted=True)
    )


def test_default_names_the_builtin_group() -> None:
    assert parse_one("SET RESOURCE GROUP DEFAULT") == ast.SetResourceGroup(ast.DEFAULT_GROUP)
    assert parse_one("set resource group default") == ast.SetResourceGroup(ast.DEFAULT_GROUP)


def test_quoted_identifiers_keep_case_and_escape_quotes() -> None:
    stmt = parse_one('CREATE RESOURCE GROUP "Odd ""Name"""')
    assert stmt == ast.CreateResourceGroup(ast.Ident('Odd "Name"', quoted=True))
    with pytest.raises(SqlSyntaxError):
        parse_one('CREATE RESOURCE GROUP ""')


@pytest.mark.parametrize(
    ("text", "param", "value"),
    [
        ("cpu_weight = 1", "cpu_weight", 1),
        ("cpu_weight = 10000", "cpu_weight", 10000),
        ("cpu_limit = '25%'", "cpu_limit", 2500),
        ("cpu_limit = '0.01%'", "cpu_limit", 1),
        ("cpu_limit = '12.5%'", "cpu_limit", 1250),
        ("cpu_limit = '100%'", "cpu_limit", 10000),
        ("cpu_limit = UNLIMITED", "cpu_limit", None),
        ("max_active_queries = 4", "max_active_queries", 4),
        ("max_active_queries = unlimited", "max_active_queries", None),
        ("max_queued_queries = 0", "max_queued_queries", 0),
        ("queue_timeout = 250", "queue_timeout", 250),
        ("queue_timeout = '250ms'", "queue_timeout", 250),
        ("queue_timeout = '15s'", "queue_timeout", 15_000),
        ("queue_timeout = '2m'", "queue_timeout", 120_000),
        ("queue_timeout = '1h'", "queue_timeout", 3_600_000),
        ("memory_limit = 1024", "memory_limit", 1024),
        ("memory_limit = '512K'", "memory_limit", 512 * 1024),
        ("memory_limit = '64mb'", "memory_limit", 64 * 1024**2),
        ("memory_limit = '2G'", "memory_limit", 2 * 1024**3),
        ("memory_limit = '1T'", "memory_limit", 1024**4),
        ("memory_limit = 0", "memory_limit", 0),
        ("memory_limit = UNLIMITED", "memory_limit", 0),
        ("scheduling_policy = 'fair'", "scheduling_policy", "fair"),
        ("scheduling_policy = 'FIFO'", "scheduling_policy", "fifo"),
        ("CPU_WEIGHT = 7", "cpu_weight", 7),
    ],
)
def test_parameter_values_are_typed(text: str, param: str, value: object) -> None:
    stmt = parse_one(f"CREATE RESOURCE GROUP g WITH ({text})")
    assert isinstance(stmt, ast.CreateResourceGroup)
    assert stmt.params == ((param, value),)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("cpu_weight = 0", "1..10000"),
        ("cpu_weight = 10001", "1..10000"),
        ("cpu_weight = 1.5", "1..10000"),
        ("cpu_weight = '50'", "1..10000"),
        ("cpu_limit = '0%'", "0 < N <= 100"),
        ("cpu_limit = '100.01%'", "0 < N <= 100"),
        ("cpu_limit = '12.345%'", "2 decimals"),
        ("cpu_limit = 25", "'N%'"),
        ("max_active_queries = 0", ">= 1"),
        ("max_queued_queries = -1", ">= 0"),
        ("queue_timeout = 0", "'15s'"),
        ("queue_timeout = '15 days'", "'15s'"),
        ("memory_limit = '2X'", "'2G'"),
        ("memory_limit = -1", "'2G'"),
        ("scheduling_policy = 'round-robin'", "'fifo' or 'fair'"),
    ],
)
def test_bad_parameter_values_name_the_allowed_range(text: str, needle: str) -> None:
    with pytest.raises(InvalidParameter) as info:
        parse_one(f"CREATE RESOURCE GROUP g WITH ({text})")
    assert info.value.sqlstate == "22023"
    assert needle in str(info.value)


def test_unknown_parameter_and_policy_suggest_the_closest() -> None:
    with pytest.raises(InvalidParameter, match='Did you mean "cpu_weight"'):
        parse_one("CREATE RESOURCE GROUP g WITH (cpu_wieght = 5)")
    with pytest.raises(InvalidParameter, match='Did you mean "fair"'):
        parse_one("CREATE RESOURCE GROUP g WITH (scheduling_policy = 'fiar')")
    with pytest.raises(InvalidParameter, match='Did you mean "queue_timeout"'):
        parse_one("ALTER RESOURCE GROUP g RESET (queue_timout)")
    with pytest.raises(InvalidParameter, match="more than once"):
        parse_one("CREATE RESOURCE GROUP g WITH (cpu_weight = 5, cpu_weight = 6)")


def test_syntax_error_has_line_column_expected_and_caret() -> None:
    with pytest.raises(SqlSyntaxError) as info:
        parse_script("CREATE RESOURCE GROUP a;\nALTER RESOURCE GROUP a SET cpu_weight = 5")
    err = info.value
    assert (err.line, err.column) == (2, 28)
    assert err.expected == ["'('"]
    assert err.sqlstate == "42601"
    assert err.context.splitlines() == [
        "ALTER RESOURCE GROUP a SET cpu_weight = 5",
        " " * 27 + "^",
    ]


def test_end_of_input_and_bad_characters() -> None:
    with pytest.raises(SqlSyntaxError, match="unexpected end of input") as info:
        parse_one("DROP RESOURCE GROUP")
    assert "identifier" in info.value.expected
    with pytest.raises(SqlSyntaxError, match="unterminated string"):
        parse_one("CREATE USER u WITH PASSWORD 'open")
    with pytest.raises(SqlSyntaxError, match="unexpected character '#'"):
        parse_one("SELECT # FROM resource_groups()")


def test_mapping_priority_only_on_alter_group() -> None:
    stmt = parse_one("ALTER GROUP g SET RESOURCE GROUP r MAPPING PRIORITY 5")
    assert stmt == ast.SetMapping(ast.PrincipalKind.GROUP, ast.Ident("g"), ast.Ident("r"), 5)
    for kind in ("USER", "SERVICE ACCOUNT"):
        with pytest.raises(SqlSyntaxError, match="only on ALTER GROUP") as info:
            parse_one(f"ALTER {kind} u SET RESOURCE GROUP r MAPPING PRIORITY 5")
        assert info.value.column == len(f"ALTER {kind} u SET RESOURCE GROUP r ") + 1
    with pytest.raises(InvalidParameter, match="MAPPING PRIORITY"):
        parse_one("ALTER GROUP g SET RESOURCE GROUP r MAPPING PRIORITY -1")


def test_principal_statements() -> None:
    assert parse_script(
        "CREATE USER u WITH PASSWORD 'it''s'; CREATE GROUP g; CREATE SERVICE ACCOUNT s;"
        "ADD USER u TO g, h; REMOVE USER u FROM g; GRANT ASSUME SERVICE ACCOUNT s TO u;"
        "ASSUME SERVICE ACCOUNT s; EXIT SERVICE ACCOUNT; ALTER USER u UNSET RESOURCE GROUP;"
        "ALTER SERVICE ACCOUNT s SET MEMORY LIMIT '1G'; ALTER GROUP g SET MEMORY LIMIT UNLIMITED;"
        "GRANT RESOURCE GROUP ADMIN TO u; REVOKE RESOURCE GROUP ADMIN FROM u;"
        "GRANT USE ON RESOURCE GROUP r TO u; GRANT USE RESOURCE GROUP TO g;"
        "REVOKE USE ON RESOURCE GROUP r FROM u; REVOKE USE RESOURCE GROUP FROM g;"
        "RESET RESOURCE GROUP; RESET ALL; DISCARD ALL; SHOW USERS; SHOW GROUPS;"
        "SHOW SERVICE ACCOUNTS"
    ) == [
        ast.CreatePrincipal(ast.PrincipalKind.USER, ast.Ident("u"), "it's"),
        ast.CreatePrincipal(ast.PrincipalKind.GROUP, ast.Ident("g")),
        ast.CreatePrincipal(ast.PrincipalKind.SERVICE_ACCOUNT, ast.Ident("s")),
        ast.AddUser(ast.Ident("u"), (ast.Ident("g"), ast.Ident("h"))),
        ast.RemoveUser(ast.Ident("u"), (ast.Ident("g"),)),
        ast.GrantAssume(ast.Ident("s"), ast.Ident("u")),
        ast.AssumeServiceAccount(ast.Ident("s")),
        ast.ExitServiceAccount(),
        ast.SetMapping(ast.PrincipalKind.USER, ast.Ident("u"), None),
        ast.SetMemoryLimit(ast.PrincipalKind.SERVICE_ACCOUNT, ast.Ident("s"), 1024**3),
        ast.SetMemoryLimit(ast.PrincipalKind.GROUP, ast.Ident("g"), None),
        ast.GrantAdmin(ast.Ident("u")),
        ast.RevokeAdmin(ast.Ident("u")),
        ast.GrantUse(ast.Ident("r"), ast.Ident("u")),
        ast.GrantUse(None, ast.Ident("g")),
        ast.RevokeUse(ast.Ident("r"), ast.Ident("u")),
        ast.RevokeUse(None, ast.Ident("g")),
        ast.ResetResourceGroup(),
        ast.ResetAll(),
        ast.DiscardAll(),
        ast.Show(ast.PrincipalKind.USER),
        ast.Show(ast.PrincipalKind.GROUP),
        ast.Show(ast.PrincipalKind.SERVICE_ACCOUNT),
    ]
    with pytest.raises(SqlSyntaxError, match="takes no password"):
        parse_one("CREATE GROUP g WITH PASSWORD 'x'")


def test_select_shapes() -> None:
    stmt = parse_one(
        "SELECT name, cpu_weight * 2 AS w, count(*) FROM resource_groups() "
        "WHERE NOT cpu_weight >= 10 AND name LIKE 'r%' OR name IN ('a', 'b') "
        "ORDER BY 2 DESC, name ASC LIMIT 5"
    )
    assert isinstance(stmt, ast.Select)
    assert stmt.items is not None
    assert len(stmt.items) == 3
    assert stmt.items[1].alias == ast.Ident("w")
    assert stmt.source == ast.TableFunction("resource_groups")
    assert stmt.order_by == (
        ast.OrderItem(ast.Literal(2), descending=True),
        ast.OrderItem(ast.Column(ast.Ident("name"))),
    )
    assert stmt.limit == 5
    # NOT binds looser than comparison, AND tighter than OR
    assert isinstance(stmt.where, ast.Binary)
    assert stmt.where.op == "or"
    left = stmt.where.left
    assert isinstance(left, ast.Binary)
    assert left.op == "and"
    assert left.left == ast.Unary(
        "not",
        ast.Binary(">=", ast.Column(ast.Ident("cpu_weight")), ast.Literal(10)),
    )
    assert parse_one("SELECT * FROM resource_groups()") == ast.Select(
        None, ast.TableFunction("resource_groups")
    )
    assert parse_one("show resource groups") == parse_one("SELECT * FROM resource_groups()")
    assert parse_one("select current_resource_group()") == ast.Select(
        (ast.SelectItem(ast.Call("current_resource_group")),)
    )
    with pytest.raises(SqlSyntaxError, match="LIMIT takes a non-negative integer"):
        parse_one("SELECT * FROM resource_groups() LIMIT 1.5")
    with pytest.raises(NumericOverflow):
        parse_one("SELECT 1e999")


def test_format_round_trips_every_statement_kind() -> None:
    script = (
        'CREATE RESOURCE GROUP IF NOT EXISTS "we""ird" WITH (cpu_weight = 50, '
        "cpu_limit = '12.5%', queue_timeout = '15s', memory_limit = '2G', "
        "scheduling_policy = 'fair', max_active_queries = UNLIMITED, max_queued_queries = 3);"
        "ALTER RESOURCE GROUP a SET (cpu_weight = 5); ALTER RESOURCE GROUP a RESET (cpu_limit, "
        "memory_limit); ALTER RESOURCE GROUP a RENAME TO b; DROP RESOURCE GROUP IF EXISTS b;"
        "CREATE USER u WITH PASSWORD 'p''w'; DROP SERVICE ACCOUNT s; SET RESOURCE GROUP DEFAULT;"
        "ALTER GROUP g SET RESOURCE GROUP r MAPPING PRIORITY 3; ALTER USER u SET MEMORY LIMIT 9;"
        "SELECT name, -cpu_weight * 2 + 1.5 AS w FROM resource_groups() WHERE x IS NOT NULL "
        "AND y NOT IN (1, 'a', NULL, TRUE) OR NOT z NOT LIKE '%q' ORDER BY 2 DESC LIMIT 0;"
        "SELECT count(*), coalesce(a, b) FROM t"
    )
    for stmt in parse_script(script):
        assert parse_one(format_sql(stmt)) == stmt


def test_split_statements_respects_quotes_and_comments() -> None:
    text = "a; 'x;y'; -- c;\n b; /* ; */ ;"
    assert list(split_statements(text)) == [(0, "a;"), (2, " 'x;y';"), (9, " -- c;\n b;")]
    assert list(split_statements("select 'open;")) == [(0, "select 'open;")]


def test_keywords_list() -> None:
    words = keywords()
    assert {"CREATE", "RESOURCE", "GROUP", "DEFAULT", "UNLIMITED"} <= set(words)
    assert all(w.isupper() for w in words)


def test_warm_builds_the_parser_before_the_first_statement() -> None:
    """``resgroups serve`` warms before it says it is ready: the first statement
    does not pay for the LALR tables."""
    from resgroups.sql import parser

    parser._parser.cache_clear()
    assert parser._parser.cache_info().currsize == 0
    parser.warm()
    assert parser._parser.cache_info().currsize == 1
    assert parse_one("SELECT 1") == ast.Select((ast.SelectItem(ast.Literal(1)),))
