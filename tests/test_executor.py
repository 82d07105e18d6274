"""The reference executor: exact results, statement kinds, and what the scheduler sees."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from waiting import wait_until

import resgroups
from resgroups.exec import executor
from resgroups.sql import ast
from resgroups.sql.format import format_expr
from resgroups.sql.parser import parse_one

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Overflow(Exception):
    pass


class ZeroDivide(Exception):
    pass


def _check(v: int) -> int:
    if not INT64_MIN <= v <= INT64_MAX:
        raise Overflow
    return v


def py_eval(expr: ast.Expr, x: int) -> tuple[int | None, set[type[Exception]]]:
    """The reference: Python integers, with SQL's int64 range and truncating
    division; the value at row ``x`` (None when a part of it failed) and every
    error a part of the expression raises there. The executor evaluates a
    morsel's column part by part and its morsels in parallel, so any of these
    errors may be the one it reports (as in any SQL engine, no order is
    promised between them)."""
    match expr:
        case ast.Literal(value=int() as v):
            return v, set()
        case ast.Column():
            return x, set()
        case ast.Unary(op="-", operand=o):
            a, errors = py_eval(o, x)
            if a is None:
                return None, errors
            negated = -a
            return _apply(lambda: _check(negated), errors)
        case ast.Binary(op=op, left=left, right=right):
            a, errors = py_eval(left, x)
            b, right_errors = py_eval(right, x)
            errors |= right_errors
            if a is None or b is None:
                return None, errors
            return _apply(lambda: _binary(op, a, b), errors)
    raise AssertionError(expr)


def _apply(
    step: Callable[[], int], errors: set[type[Exception]]
) -> tuple[int | None, set[type[Exception]]]:
    try:
        return step(), errors
    except (Overflow, ZeroDivide) as error:
        return None, errors | {type(error)}


def _binary(op: str, a: int, b: int) -> int:
    if op == "+":
        return _check(a + b)
    if op == "-":
        return _check(a - b)
    if op == "*":
        return _check(a * b)
    if b == 0:
        raise ZeroDivide
    q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
    if op == "/":
        return _check(q)
    return a - b * q  # %: the sign of the dividend


x_col = ast.Column(ast.Ident("x"))
int_exprs = st.recursive(
    st.one_of(
        st.just(x_col),
        st.integers(0, 2**62).map(ast.Literal),
        st.sampled_from([0, 1, 2, 7, 1000, 2**31, 2**40]).map(ast.Literal),
    ),
    lambda inner: st.one_of(
        st.builds(ast.Binary, st.sampled_from(["+", "-", "*", "/", "%"]), inner, inner),
        st.builds(ast.Unary, st.just("-"), inner),
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def engine() -> Iterator[resgroups.Engine]:
    with resgroups.Engine(workers=2) as e:
        yield e


@pytest.fixture
def small_morsels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor, "MORSEL_ROWS", 997)  # many morsels, uneven ends


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(0, 5000), expr=int_exprs)
@example(  # one morsel divides by zero, the next overflows: either may be reported
    n=1449,
    expr=ast.Binary(
        "+",
        ast.Binary("*", x_col, ast.Literal(6365336119292461)),
        ast.Binary("/", x_col, ast.Literal(0)),
    ),
)
def test_results_are_exact_against_python(
    engine: resgroups.Engine, small_morsels: None, n: int, expr: ast.Expr
) -> None:
    e = format_expr(expr)
    sql = f"SELECT sum({e}), min({e}), count(*) FROM long_sequence({n})"
    rows = [py_eval(expr, x) for x in range(1, n + 1)]
    errors = set().union(*(row_errors for _, row_errors in rows))
    values = [value for value, _ in rows if value is not None]
    expected: object = None
    if not errors:
        try:
            expected = (_check(sum(values)) if values else None, min(values) if values else None, n)
        except Overflow:
            errors = {Overflow}
    session = engine.connect()
    if errors:
        allowed = {Overflow: resgroups.NumericOverflow, ZeroDivide: resgroups.DivisionByZero}
        with pytest.raises((resgroups.NumericOverflow, resgroups.DivisionByZero)) as info:
            session.execute(sql)
        assert type(info.value) in {allowed[e] for e in errors}, (info.value, errors)
    else:
        (row,) = session.execute(sql).rows
        assert row == expected
        assert all(type(v) in (int, type(None)) for v in row)


def test_sums_beyond_2_53_are_exact_and_beyond_int64_fail(engine: resgroups.Engine) -> None:
    session = engine.connect()
    big = 1_000_003
    n = 3_000_000
    (row,) = session.execute(f"SELECT sum(x * {big}) FROM long_sequence({n})").rows
    assert row[0] == big * n * (n + 1) // 2  # far beyond 2^53, exact
    assert row[0] > 2**53
    with pytest.raises(resgroups.NumericOverflow) as info:
        session.execute(f"SELECT sum(x * {2**22}) FROM long_sequence({n})")  # 1.9e19
    assert info.value.sqlstate == "22003"
    with pytest.raises(resgroups.NumericOverflow):
        session.execute("SELECT x * 9223372036854775807 FROM long_sequence(2)")


def test_select_shapes(engine: resgroups.Engine) -> None:
    session = engine.connect()
    assert session.execute(
        "SELECT x, x * x AS sq FROM long_sequence(10) WHERE x % 3 = 0 ORDER BY sq DESC LIMIT 2"
    ).rows == [(9, 81), (6, 36)]
    assert session.execute("SELECT avg(x), max(x), count(x) FROM long_sequence(4)").rows == [
        (2.5, 4, 4)
    ]
    assert session.execute("SELECT sum(x) FROM long_sequence(0)").rows == [(None,)]
    assert session.execute("SELECT x / 2.0 FROM long_sequence(1)").rows == [(0.5,)]
    result = session.execute("SELECT x FROM long_sequence(5000000) LIMIT 3")
    assert result.rows == [(1,), (2,), (3,)]
    assert result.types == ["int"]
    assert result.timings["cpu_ms"] >= 0
    with pytest.raises(resgroups.GroupingError):
        session.execute("SELECT x, count(*) FROM long_sequence(3)")
    with pytest.raises(resgroups.InvalidParameter):
        session.execute("SELECT x FROM long_sequence(-1)")
    with pytest.raises(resgroups.DatatypeMismatch):
        session.execute("SELECT x FROM long_sequence(3) WHERE x")


def test_offset_skips_rows_in_every_path(engine: resgroups.Engine, small_morsels: None) -> None:
    """OFFSET as the row engine applies it: projections (streamed or ordered),
    a paging cursor's pages, and an aggregate's one row."""
    session = engine.connect()
    select = "SELECT x FROM long_sequence(5000)"
    assert session.execute(f"{select} LIMIT 3 OFFSET 2000").rows == [(2001,), (2002,), (2003,)]
    assert session.execute(f"{select} ORDER BY x DESC LIMIT 2 OFFSET 1").rows == [(4999,), (4998,)]
    assert session.execute(f"{select} OFFSET 4998").rows == [(4999,), (5000,)]
    assert session.execute("SELECT count(*) FROM long_sequence(9) OFFSET 1").rows == []
    assert session.execute("SELECT count(*) FROM long_sequence(9) LIMIT 0").rows == []
    cursor = session.open_cursor(parse_one(f"{select} LIMIT 4 OFFSET 1990"))
    try:
        assert cursor.fetch(3) == [(1991,), (1992,), (1993,)]
        assert cursor.fetch(10) == [(1994,)]
    finally:
        cursor.close()
    with pytest.raises(resgroups.DatatypeMismatch, match="OFFSET"):
        session.execute("CREATE TABLE skipped AS SELECT x FROM long_sequence(3) OFFSET 1")


def test_tables_ctas_insert_select_drop(engine: resgroups.Engine) -> None:
    session = engine.connect()
    assert (
        session.execute(
            "CREATE TABLE t AS (SELECT x, x * 2 AS y FROM long_sequence(2500000))"
        ).status
        == "SELECT 2500000"
    )
    assert session.execute("INSERT INTO t SELECT x, x FROM long_sequence(5)").status == "INSERT 0 5"
    assert session.execute("SELECT count(*), sum(y) FROM t").rows == [
        (2500005, 2500000 * 2500001 + 15)
    ]
    assert session.execute("SELECT * FROM t WHERE x < 2").rows == [(1, 2), (1, 1)]
    with pytest.raises(resgroups.CatalogError) as exists:
        session.execute("CREATE TABLE t AS (SELECT 1)")
    assert exists.value.sqlstate == "42P07"
    with pytest.raises(resgroups.DatatypeMismatch, match="3 columns"):
        session.execute("INSERT INTO t SELECT x, x, x FROM long_sequence(1)")
    for tail in ("LIMIT 3", "OFFSET 2", "ORDER BY x"):  # refused, never ignored
        with pytest.raises(resgroups.DatatypeMismatch, match="takes no ORDER BY, LIMIT"):
            session.execute(f"INSERT INTO t SELECT x, x FROM long_sequence(10) {tail}")
    assert session.execute("SELECT count(*) FROM t").rows == [(2500005,)]  # nothing written
    session.execute("DROP TABLE t")
    with pytest.raises(resgroups.UndefinedTable):
        session.execute("SELECT * FROM t")
    session.execute("DROP TABLE IF EXISTS t")


def test_a_union_scans_its_executor_branches_within_one_managed_query() -> None:
    """A UNION whose branches read long_sequence() or a table: the executor scans
    each branch (its expressions, its checkpoints) within the union's one query."""
    with resgroups.Engine() as engine:
        session = engine.connect()
        session.execute("CREATE TABLE u AS (SELECT x * 10 AS y FROM long_sequence(2))")
        assert session.execute(
            "SELECT x FROM long_sequence(3) UNION SELECT 1 UNION ALL SELECT y FROM u ORDER BY 1"
        ).rows == [(1,), (2,), (3,), (10,), (20,)]
        assert session.execute(
            "SELECT sum(x) FROM long_sequence(4) UNION ALL SELECT count(*) FROM u"
        ).rows == [(10,), (2,)]
        default = next(r for r in engine.resource_groups() if r["name"] == "DEFAULT")
        assert default["admitted_total"] == 3  # the CTAS and one query per union
        # a table's branch with what the executor lacks is the row engine's, as before
        assert session.execute(
            "SELECT coalesce(y, 0), y::text FROM u UNION ALL SELECT 5, 'five'"
        ).rows == [(10, "10"), (20, "20"), (5, "five")]
        # branches of different widths fail before any runs (not after a long scan)
        with pytest.raises(resgroups.DatatypeMismatch, match=r"same number of columns \(1 and 2\)"):
            session.execute(f"SELECT count(*) FROM long_sequence({INT64_MAX}) UNION SELECT 1, 2")
        # one now() for every branch
        assert len(session.execute("SELECT now() FROM u UNION SELECT now()").rows) == 1
        assert len(session.execute("SELECT x FROM long_sequence(1) UNION SELECT 1").rows) == 1

        started, failed = threading.Event(), []

        def huge() -> None:
            started.set()
            try:
                session.execute(f"SELECT 1 UNION ALL SELECT x FROM long_sequence({INT64_MAX})")
            except resgroups.QueryCancelled as exc:
                failed.append(exc)

        runner = threading.Thread(target=huge)
        runner.start()
        started.wait(10)
        wait_until(lambda: session.running_ids, timeout=10)
        session.cancel()
        runner.join(10)
        assert not runner.is_alive()
        assert failed  # the branch's scan stopped at a checkpoint
        wait_until(lambda: not session.running_ids, timeout=10)


def test_current_resource_group_reports_the_group_a_query_ran_in() -> None:
    with resgroups.Engine() as engine:
        session = engine.connect("u")
        session.execute_script("CREATE RESOURCE GROUP reporting; SET RESOURCE GROUP reporting")
        assert session.execute(
            "SELECT current_resource_group(), count(*) FROM long_sequence(10)"
        ).rows == [("reporting", 10)]
        assert session.execute("SELECT current_resource_group()").rows == [("reporting",)]


def test_statement_kinds_are_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds: list[str] = []
    statements: list[str | None] = []
    real = resgroups.Session.query

    def spy(
        self: resgroups.Session,
        kind: str = "select",
        pool: str = "default",
        *,
        statement: str | None = None,
        estimate: resgroups.Estimate | None = None,
    ) -> object:
        kinds.append(kind)
        statements.append(statement)
        return real(self, kind, pool, statement=statement, estimate=estimate)

    monkeypatch.setattr(resgroups.Session, "query", spy)
    with resgroups.Engine() as engine:
        session = engine.connect()
        session.execute("SELECT count(*) FROM long_sequence(3)")
        session.execute("CREATE TABLE k AS (SELECT x FROM long_sequence(3))")
        session.execute("INSERT INTO k SELECT x FROM long_sequence(3)")
        session.execute("DROP TABLE k")
    assert kinds == ["select", "ctas", "insert_select"]
    assert statements == [  # the text each query runs, for rules and resource_group_queries()
        "SELECT count(*) FROM long_sequence(3)",
        "CREATE TABLE k AS (SELECT x FROM long_sequence(3))",
        "INSERT INTO k SELECT x FROM long_sequence(3)",
    ]


def test_memory_of_every_morsel_is_accounted_and_returned() -> None:
    with resgroups.Engine(query_memory_limit=4 * 1024 * 1024) as engine:
        session = engine.connect()
        # one 1M-row morsel of int64 is 8 MB: above a 4 MB ceiling
        with pytest.raises(resgroups.MemoryLimitExceeded):
            session.execute("SELECT sum(x) FROM long_sequence(2000000)")
        assert engine.resource_groups()[0]["memory_used_bytes"] == 0
        assert engine.memory_ledger.leaks == 0


def test_ctas_in_a_limited_group_runs_single_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: set[int] = set()
    real = executor.Scan._run

    def spy(self: executor.Scan, task: object, morsel: tuple[int, int], body: object) -> object:
        threads.add(threading.get_ident())
        return real(self, task, morsel, body)  # type: ignore[arg-type]

    monkeypatch.setattr(executor.Scan, "_run", spy)
    with resgroups.Engine(workers=2) as engine:
        pct = round(1.5 / engine.cpus * 100, 2)
        engine.connect().execute(f"CREATE RESOURCE GROUP copy WITH (cpu_limit = '{pct}%')")
        session = engine.connect("u")
        session.execute("SET RESOURCE GROUP copy")
        session.execute("CREATE TABLE c AS (SELECT x FROM long_sequence(8000000))")
        assert threads == {threading.get_ident()}  # every morsel on the query's thread
        threads.clear()
        session.execute("SELECT sum(x) FROM long_sequence(8000000)")
        assert len(threads) > 1  # a plain SELECT in the same group runs in parallel


def _row(engine: resgroups.Engine, name: str) -> dict[str, object]:
    return next(r for r in engine.resource_groups() if r["name"] == name)


def test_insert_select_yields_at_its_checkpoints() -> None:
    with resgroups.Engine(workers=1) as engine:
        engine.connect().execute_script(
            "CREATE RESOURCE GROUP load; CREATE RESOURCE GROUP dash;"
            "CREATE TABLE sink AS (SELECT x FROM long_sequence(1));"
        )
        loader = engine.connect("etl")
        loader.execute("SET RESOURCE GROUP load")
        done: dict[str, float] = {}

        def insert() -> None:
            try:
                loader.execute("INSERT INTO sink SELECT x FROM long_sequence(100000000)")
                done["insert"] = time.monotonic()
            except resgroups.QueryCancelled:
                pass  # cancelled below, once the SELECT has its answer

        t = threading.Thread(target=insert)
        t.start()
        # the insert holds the only worker once it has been admitted
        wait_until(lambda: _row(engine, "load")["active_queries"] == 1)
        viewer = engine.connect("viewer")
        viewer.execute("SET RESOURCE GROUP dash")
        viewer.execute("SELECT count(*) FROM long_sequence(1000)")
        insert_done = "insert" in done
        # the INSERT gave its worker up at a checkpoint: the SELECT finished first
        assert not insert_done
        # the rest of its 100M rows (about ten seconds) would check nothing more
        loader.cancel()
        t.join(120)
        assert not t.is_alive()
