"""Property tests of the SQL front end.

- arbitrary text and mutated valid statements only ever raise resgroups.Error
  subclasses (never InternalError, never a raw Lark or Python exception),
  whether parsed alone or executed against an engine;
- format -> parse is the identity on parsed and on generated statements.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resgroups
from resgroups.catalog.params import PARAMETERS
from resgroups.errors import Error, InternalError
from resgroups.sql import ast
from resgroups.sql.format import format_sql
from resgroups.sql.parser import keywords, parse_one, parse_script

HERE = Path(__file__).resolve().parent
SEED = [
    b.strip()
    for b in re.split(r"\n\s*\n", (HERE / "seed_statements.sql").read_text())
    if b.strip() and not b.lstrip().startswith("--")
]
CORPUS = [
    *SEED,
    "CREATE USER u WITH PASSWORD 'pw'",
    "CREATE GROUP g",
    "ADD USER u TO g",
    "GRANT USE ON RESOURCE GROUP reporting TO u",
    "ALTER RESOURCE GROUP reporting RESET (cpu_weight, memory_limit)",
    "ALTER RESOURCE GROUP reporting RENAME TO nightly",
    "DROP RESOURCE GROUP IF EXISTS nightly",
    "SELECT name, cpu_weight FROM resource_groups() WHERE cpu_weight > 10 ORDER BY 2 DESC LIMIT 3",
    "SELECT count(*), sum(cpu_weight), min(name) FROM resource_groups()",
    "SELECT current_resource_group()",
    "SHOW GROUPS",
    "CREATE RESOURCE RULE r ON RESOURCE GROUP reporting WHEN cpu_time > 30s AND memory > 2G "
    "THEN MOVE TO RESOURCE GROUP adhoc WITH (watch = '10m')",
    "CREATE RESOURCE RULE IF NOT EXISTS big ON RESOURCE GROUP DEFAULT WHEN rows > 10 THEN LOG",
    "ALTER RESOURCE RULE r RENAME TO s",
    "DROP RESOURCE RULE IF EXISTS s",
]
KEYWORDS = keywords()
TOKENS = [
    *KEYWORDS,
    "(",
    ")",
    ",",
    ";",
    "=",
    "'25%'",
    "'15s'",
    "-1",
    "0",
    "1.5",
    '"q"',
    "*",
    "--",
    "/*",
]


def _outcome(run: Callable[[], object]) -> Error | None:
    """The resgroups.Error ``run`` raised, or None; anything else propagates."""
    try:
        run()
    except Error as exc:
        return exc
    return None


def _check_only_errors(text: str) -> None:
    error = _outcome(lambda: parse_script(text))
    assert not isinstance(error, InternalError), error
    if error is not None:
        return
    for stmt in parse_script(text):
        assert parse_one(format_sql(stmt)) == stmt
    with resgroups.Engine(access_control=True) as engine:
        session = engine.connect()
        error = _outcome(lambda: session.execute_script(text))
        assert not isinstance(error, InternalError), error
        engine.snapshot._check_invariants()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_resgroups_errors(text: str) -> None:
    _check_only_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*TOKENS, "name", "resource_groups()", "x"]), max_size=12))
def test_token_soup_raises_only_resgroups_errors(tokens: list[str]) -> None:
    _check_only_errors(" ".join(tokens))


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(CORPUS))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        kind = draw(st.sampled_from(["delete", "insert", "replace", "duplicate"]))
        piece = draw(st.sampled_from(TOKENS)) if kind != "duplicate" else text[i:j]
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert" or kind == "duplicate":
            text = text[:i] + f" {piece} " + text[i:]
        else:
            text = text[:i] + f" {piece} " + text[j:]
    return text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_statements_raise_only_resgroups_errors(text: str) -> None:
    _check_only_errors(text)


# ---- generated statements round-trip -------------------------------------------

_RESERVED = {k.lower() for k in KEYWORDS}
names = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)
    .filter(lambda s: s not in _RESERVED)
    .map(ast.Ident),
    st.text(min_size=1, max_size=10).map(lambda s: ast.Ident(s, quoted=True)),
)
unquoted = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True).filter(
    lambda s: s not in _RESERVED
)
group_refs = st.one_of(
    names,
    st.just(ast.DEFAULT_GROUP),
    st.tuples(unquoted, unquoted).map(lambda p: ast.Ident(f"{p[0]}::{p[1]}")),  # tenants::acme
)

PARAM_VALUES = {
    "cpu_weight": st.integers(1, 10000),
    "cpu_limit": st.one_of(st.none(), st.integers(1, 10000)),
    "max_active_queries": st.one_of(st.none(), st.integers(1, 2**31 - 1)),
    "max_queued_queries": st.one_of(st.none(), st.integers(0, 2**31 - 1)),
    "queue_timeout": st.integers(1, 2**31 - 1),
    "memory_limit": st.integers(0, 2**63 - 1),
    "scheduling_policy": st.sampled_from(["fifo", "fair"]),
    "max_active_queries_per_user": st.one_of(st.none(), st.integers(1, 2**31 - 1)),
    "parent": st.one_of(
        st.text(min_size=1, max_size=10).filter(
            lambda s: s.upper() != "UNLIMITED" and not s.startswith('"')
        ),
        st.text(min_size=1, max_size=10).map(lambda s: '"' + s.replace('"', '""') + '"'),
    ),
}
params = st.lists(st.sampled_from(sorted(PARAMETERS)), unique=True, max_size=7).flatmap(
    lambda keys: st.tuples(*(st.tuples(st.just(k), PARAM_VALUES[k]) for k in keys))
)
literals = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 2**70),
    st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
).map(ast.Literal)
expressions = st.recursive(
    st.one_of(literals, names.map(ast.Column)),
    lambda inner: st.one_of(
        st.builds(ast.Unary, st.sampled_from(["-", "not"]), inner),
        st.builds(
            ast.Binary,
            st.sampled_from(
                ["+", "-", "*", "/", "%", "=", "<>", "<", "<=", ">", ">=", "and", "or", "like"]
            ),
            inner,
            inner,
        ),
        st.builds(ast.IsNull, inner, st.booleans()),
        st.builds(
            ast.InList, inner, st.lists(inner, min_size=1, max_size=3).map(tuple), st.booleans()
        ),
        st.builds(
            ast.Call,
            st.sampled_from(["lower", "abs", "coalesce", "sum"]),
            st.lists(inner, max_size=2).map(tuple),
        ),
        st.just(ast.Call("count", (), star=True)),
    ),
    max_leaves=8,
)
selects = st.builds(
    ast.Select,
    st.one_of(
        st.none(),
        st.lists(
            st.builds(ast.SelectItem, expressions, st.one_of(st.none(), names)),
            min_size=1,
            max_size=3,
        ).map(tuple),
    ),
    st.one_of(
        st.none(),
        st.builds(ast.TableFunction, st.just("resource_groups")),
        names.map(ast.TableName),
    ),
    st.one_of(st.none(), expressions),
    st.lists(st.builds(ast.OrderItem, expressions, st.booleans()), max_size=2).map(tuple),
    st.one_of(st.none(), st.integers(0, 10**6)),
)
kinds = st.sampled_from(list(ast.PrincipalKind))
statements = st.one_of(
    st.builds(ast.CreateResourceGroup, names, params, st.booleans()),
    st.builds(
        ast.CreateResourceGroup,
        names,
        params,
        st.booleans(),
        st.lists(st.builds(ast.Variant, names, params), min_size=1, max_size=3).map(tuple),
    ),
    st.builds(ast.AddVariant, group_refs, st.builds(ast.Variant, names, params)),
    st.builds(ast.DropVariant, group_refs, names, st.booleans()),
    st.builds(ast.AlterResourceGroupSet, group_refs, params.filter(bool)),
    st.builds(
        ast.AlterResourceGroupReset,
        group_refs,
        st.lists(st.sampled_from(sorted(PARAMETERS)), unique=True, min_size=1).map(tuple),
    ),
    st.builds(ast.RenameResourceGroup, group_refs, group_refs),
    st.builds(ast.DropResourceGroup, group_refs, st.booleans()),
    st.builds(
        ast.CreatePrincipal,
        st.sampled_from([ast.PrincipalKind.USER, ast.PrincipalKind.SERVICE_ACCOUNT]),
        names,
        st.one_of(st.none(), st.text(max_size=8)),
    ),
    st.builds(ast.SetMapping, kinds, names, st.one_of(st.none(), group_refs)).filter(
        lambda s: s.priority is None
    ),
    st.builds(
        ast.SetMapping,
        st.just(ast.PrincipalKind.GROUP),
        names,
        group_refs,
        st.integers(0, 2**31 - 1),
    ),
    st.builds(ast.SetMemoryLimit, kinds, names, st.one_of(st.none(), st.integers(1, 2**63 - 1))),
    st.builds(ast.GrantUse, st.one_of(st.none(), group_refs), names),
    st.builds(ast.RevokeUse, st.one_of(st.none(), group_refs), names),
    st.builds(ast.AddUser, names, st.lists(names, min_size=1, max_size=3).map(tuple)),
    st.builds(ast.SetResourceGroup, group_refs),
    selects,
)


@settings(max_examples=500, deadline=None)
@given(statements)
def test_generated_statements_round_trip(stmt: ast.Statement) -> None:
    text = format_sql(stmt)
    assert parse_one(text) == stmt, text
