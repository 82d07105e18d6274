"""Cost that grows with the catalog (issue: hostile input, class 4): a DDL
statement costs what it changes, not the size of the catalog; 10,000 groups and
10,000 users are an ordinary catalog; the shell reads a statement in time
linear in its length.

No timing is asserted (perf/bench_catalog_scale.py measures): each case
counts the work done, or runs on a helper thread joined with a bound that only
a quadratic regression could exceed (it fails instead of hanging the suite).
"""

from __future__ import annotations

import io
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from lark.exceptions import UnexpectedInput
from waiting import bounded

import resgroups
from resgroups import shell
from resgroups.catalog.model import Snapshot
from resgroups.catalog.names import Ident
from resgroups.catalog.relation import Relation
from resgroups.sched.runtime import GroupRuntime
from resgroups.sql.parser import _parser
from resgroups.sql.split import Splitter, _State, is_complete, split_statements

T = TypeVar("T")
BIG = 10_000


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()`` within ``seconds`` (a hang guard, not a timing): its result, or its error raised."""
    outcome = bounded(fn, seconds)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome  # type: ignore[return-value]


def _big_script(n: int) -> list[str]:
    acl = n // 10
    lines = [f"CREATE RESOURCE GROUP g{i} WITH (cpu_weight = {i % 100 + 1})" for i in range(n)]
    lines += [f"CREATE GROUP acl{k}" for k in range(acl)]
    lines += [f"ALTER GROUP acl{k} SET RESOURCE GROUP g{k}" for k in range(acl)]
    lines += [f"CREATE USER u{i}" for i in range(n)]
    lines += [f"ADD USER u{i} TO acl{i % acl}" for i in range(n)]
    # scripts of 2,000 statements: one execute() takes at most 1,000,000 characters
    return [";\n".join(lines[i : i + 2000]) for i in range(0, len(lines), 2000)]


SHM = Path("/dev/shm")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[resgroups.Engine, Path]]:
    """10,000 groups, 1,000 ACL groups and 10,000 users, in a directory catalog.

    On tmpfs where there is one: each of the 32,000 records is fsynced twice, as
    always, which costs ~10 s on a disk and nothing in memory (what is checked
    here is the size of the catalog; the log's torn writes and failed fsyncs have
    their own tests, in test_catalog.py and test_catalog_faults.py). The file is
    ~3 MB."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        directory = Path(tempfile.mkdtemp(prefix="resgroups-big-", dir=SHM))
    else:
        directory = tmp_path_factory.mktemp("big")
    try:
        engine = resgroups.Engine(catalog=directory, access_control=True, workers=2)
        admin = engine.connect("admin")
        within(600, lambda: [admin.execute_script(script) for script in _big_script(BIG)])
        yield engine, directory
        engine.close()
    finally:
        if directory.is_relative_to(SHM):
            shutil.rmtree(directory, ignore_errors=True)


def test_ten_thousand_groups_and_users_are_an_ordinary_catalog(
    big: tuple[resgroups.Engine, Path],
) -> None:
    engine, _ = big
    snap = engine.snapshot
    assert snap.group_count() == BIG + 1
    assert len(snap.principals) == BIG + BIG // 10
    user = engine.connect("u4321")  # in acl321, mapped to g321
    assert user.execute("SELECT current_resource_group()").rows == [("g321",)]
    rows = engine.connect("admin").execute("SELECT name FROM resource_groups()").rows
    assert len(rows) == BIG + 1
    assert rows[:3] == [("DEFAULT",), ("g0",), ("g1",)]  # creation order


def test_a_ddl_statement_touches_only_the_group_it_changes(
    big: tuple[resgroups.Engine, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count the live runtimes each DDL reconfigures: one, at 10,000 groups."""
    engine, _ = big
    configured: list[int] = []
    original = GroupRuntime.configure

    def counting(self: GroupRuntime, group: object, cpus: float) -> None:
        configured.append(self.group_id)
        original(self, group, cpus)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupRuntime, "configure", counting)
    admin = engine.connect("admin")
    admin.execute("ALTER RESOURCE GROUP g5000 SET (cpu_weight = 3)")
    target = engine.snapshot.find_group(Ident("g5000"))
    assert target is not None
    assert configured == [target.id]
    configured.clear()
    admin.execute("CREATE RESOURCE GROUP fresh")
    admin.execute("DROP RESOURCE GROUP fresh")
    admin.execute("CREATE USER late")
    admin.execute("ADD USER late TO acl7")
    assert len(configured) == 1  # the new group's runtime, nothing else
    live = engine.runtimes.get(target.id)
    assert live is not None
    assert live.definition.cpu_weight == 3  # the ALTER reached the live runtime


def test_a_record_shares_all_but_what_it_changes() -> None:
    """Applying a record costs O(log n): the next snapshot reuses the group and
    principal objects it did not touch (no copy of the catalog per DDL)."""
    with resgroups.Engine() as engine:
        session = engine.connect()
        session.execute_script(";".join(f"CREATE RESOURCE GROUP g{i}" for i in range(200)))
        before = engine.snapshot
        session.execute("ALTER RESOURCE GROUP g100 SET (cpu_weight = 5)")
        after = engine.snapshot
        changed = [g.name for g in after.groups if before.group(g.id) is not g]
        assert changed == ["g100"]
        assert after.touched_groups == {before.find_group(Ident("g100")).id}  # type: ignore[union-attr]


def test_reopening_ten_thousand_groups_gives_the_same_catalog(
    big: tuple[resgroups.Engine, Path],
) -> None:
    engine, directory = big
    expected = engine.snapshot
    engine.close()
    with within(300, lambda: resgroups.Engine(catalog=directory, access_control=True)) as reopened:
        assert reopened.snapshot == expected
        found = reopened.snapshot.find_principal(Ident("U9999"))
        assert found is not None
        assert found.name == "u9999"


# ---- the persistent relation ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 6)), max_size=60),
    st.integers(0, 6),
)
def test_relation_behaves_as_a_set_of_pairs(ops: list[tuple[bool, int, int]], gone: int) -> None:
    relation, model = Relation(), set[tuple[int, int]]()
    for add, a, b in ops:
        relation = relation.add([(a, b)]) if add else relation.remove([(a, b)])
        (model.add if add else model.discard)((a, b))
        assert set(relation) == model
        assert len(relation) == len(model)
    for x in range(7):
        assert set(relation.right_of(x)) == {b for a, b in model if a == x}
        assert set(relation.left_of(x)) == {a for a, b in model if b == x}
    without = relation.without(gone)
    assert set(without) == {p for p in model if gone not in p}
    assert without == Relation.of(p for p in model if gone not in p)
    assert set(relation) == model  # persistent: the old value is unchanged


def test_snapshot_indexes_stay_exact_through_renames_and_drops() -> None:
    with resgroups.Engine(access_control=True) as engine:
        admin = engine.connect("admin")
        admin.execute_script(
            """
            CREATE RESOURCE GROUP "a"; CREATE RESOURCE GROUP "A"; CREATE RESOURCE GROUP b;
            CREATE USER u; CREATE GROUP acl; ADD USER u TO acl;
            ALTER GROUP acl SET RESOURCE GROUP b; GRANT USE ON RESOURCE GROUP "a" TO u;
            ALTER RESOURCE GROUP "a" RENAME TO c; DROP RESOURCE GROUP c;
            ALTER GROUP acl SET RESOURCE GROUP "A"; DROP RESOURCE GROUP b;
            DROP GROUP acl; CREATE GROUP acl2; ADD USER u TO acl2
            """
        )
        snap: Snapshot = engine.snapshot
        snap._check_invariants()  # rebuilds every index from the objects and compares
        assert snap.find_group(Ident("c")) is None
        assert snap.find_group(Ident("A", quoted=True)) is not None
        assert snap.find_group(Ident("a", quoted=True)) is None  # renamed, then dropped
        assert snap.find_group(Ident("a")) is None  # "A" is quoted: unquoted a is not it
        u = snap.find_principal(Ident("U"))
        assert u is not None
        assert u.use_groups == frozenset()
        assert [p.name for p in snap.acl_groups_of(u.id)] == ["acl2"]


# ---- the statement splitter ---------------------------------------------------------------


def _lexer_split(text: str) -> list[tuple[int, str]]:
    """The grammar's own lexer as the oracle: cut at its SEMICOLON tokens."""
    pieces, start = [], 0
    for tok in _parser().lex(text):
        if tok.type == "SEMICOLON":
            end = tok.end_pos
            assert end is not None
            if any(True for _ in _parser().lex(text[start : end - 1])):
                pieces.append((start, text[start:end]))
            start = end
    if any(True for _ in _parser().lex(text[start:])):
        pieces.append((start, text[start:]))
    return pieces


SQLISH = st.lists(
    st.sampled_from(
        ["a", "1", " ", "\n", ";", "'", "''", '"', '""', "--", "-", "/*", "*/", "*", "/", "(", "é"]
    ),
    max_size=40,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(SQLISH)
def test_the_splitter_cuts_where_the_grammars_lexer_does(text: str) -> None:
    splitter = Splitter()
    splitter.feed(text)
    # an unclosed /* is two operators to the lexer; the splitter keeps the statement
    # open to the end, as psql does: either way the parser reports the error
    assume(splitter._state is not _State.BLOCK_COMMENT)
    try:
        expected = _lexer_split(text)
    except UnexpectedInput:
        return  # text the lexer refuses (an unterminated string): the parser reports it
    assert list(split_statements(text)) == expected


@settings(max_examples=300, deadline=None)
@given(SQLISH, st.lists(st.integers(0, 40), max_size=8))
def test_any_chunking_gives_the_same_statements(text: str, cuts: list[int]) -> None:
    whole = list(split_statements(text))
    splitter = Splitter()
    got = []
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    for lo, hi in itertools.pairwise(bounds):
        got += [(p.offset, p.text) for p in splitter.feed(text[lo:hi])]
    rest = splitter.finish()
    if rest is not None:
        got.append((rest.offset, rest.text))
    assert got == whole


def test_is_complete() -> None:
    assert is_complete("select 1;")
    assert is_complete("select 1; -- done")
    assert is_complete("select 'it''s;';")
    assert not is_complete("select 'open;")
    assert not is_complete("select 1; select 2")
    assert not is_complete("select 1 /* ;")
    assert not is_complete("-- only a comment;")


def test_the_shell_reads_a_long_statement_in_linear_time() -> None:
    """50,000 lines of one statement (re-reading the statement at each line would
    take hours; one pass takes well under a second)."""
    lines = ["SELECT 1"] + ["  + 1"] * 50_000 + ["  AS total;"]
    out = io.StringIO()
    with resgroups.Engine() as engine:
        runner = shell.ShellRunner(engine.connect(), out.write)
        within(120, lambda: shell.run_text(runner, "\n".join(lines)))
    # the nesting limit answers it, cleanly, once the statement is whole
    assert "ERROR [54000]" in out.getvalue()
    assert runner.failures == 1


def test_the_shell_still_numbers_lines_across_statements() -> None:
    out = io.StringIO()
    with resgroups.Engine() as engine:
        runner = shell.ShellRunner(engine.connect(), out.write)
        shell.run_text(runner, "SELECT 1;\n\n-- note\nSELECT\n  1 +;\nSELECT 2;")
    assert "syntax error at line 5" in out.getvalue()
    assert runner.failures == 1
