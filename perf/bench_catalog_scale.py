"""What the catalog's size costs: DDL, resolution, resource_groups() and reopening
at 10, 1,000 and 10,000 groups (and as many users), side by side in one run.

    python perf/bench_catalog_scale.py --fast      # ~5 minutes on 2 cores
    python perf/bench_catalog_scale.py --fast --sizes 10,1000

Each worker builds its catalog through SQL, as a user would, with access
control on: N resource groups, N users, N/10 ACL groups each mapped to a
resource group, every user in one ACL group. Per size:

``ddl``
    µs per DDL statement: a cycle of CREATE RESOURCE GROUP, ALTER RESOURCE
    GROUP (an existing group) and DROP RESOURCE GROUP, in memory (a directory
    catalog adds one fsync per statement, the same at every size).
``resolve``
    µs per managed query of a user whose group comes through an ACL group:
    login identity, resolution, admission and release (``with session.query()``).
``resource_groups``
    µs per ``SELECT * FROM resource_groups()``: N rows, so O(N) by nature;
    the metadata gives µs per row.
``reopen``
    ms to open the directory catalog holding those 2N statements (replay and
    the whole-snapshot check) and close it again.

``route``
    µs per managed query routed by selectors (SPEC §15), at 0, 10 and 1,000
    selectors (``--selectors``) on a catalog of 10 groups: each selector is
    ``application = 'appK' AND estimated_rows < 1000`` to one of the groups, and
    the query's session has the application of one of them and a row estimate
    of 10, so one selector routes it; with 0 selectors the same query is
    routed by its user's ACL group. The index files each selector under its
    application, so routing reads one candidate, not all of them.

The goals: ``ddl`` at 10,000 groups within 3x of ``ddl`` at 10 (issue 10);
``route`` at 1,000 selectors within 1.5x of none (issue 33). The ratios print
at the end.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import time
from pathlib import Path

import pyperf

import resgroups

SIZES = (10, 1_000, 10_000)
_cache: dict[int, tuple[resgroups.Engine, resgroups.Session, resgroups.Session]] = {}


def _script(n: int) -> list[str]:
    acl = max(n // 10, 1)
    lines = [f"CREATE RESOURCE GROUP g{i} WITH (cpu_weight = {i % 100 + 1})" for i in range(n)]
    lines += [f"CREATE GROUP acl{k}" for k in range(acl)]
    lines += [f"ALTER GROUP acl{k} SET RESOURCE GROUP g{k}" for k in range(acl)]
    lines += [f"CREATE USER u{i}" for i in range(n)]
    lines += [f"ADD USER u{i} TO acl{i % acl}" for i in range(n)]
    # scripts of 2,000 statements: one execute() takes at most 1,000,000 characters
    return [";\n".join(lines[i : i + 2000]) for i in range(0, len(lines), 2000)]


def _engine(n: int) -> tuple[resgroups.Engine, resgroups.Session, resgroups.Session]:
    if n not in _cache:
        engine = resgroups.Engine(access_control=True, workers=2)
        admin = engine.connect("admin")
        for script in _script(n):
            admin.execute_script(script)
        _cache[n] = (engine, admin, engine.connect(f"u{n // 2}"))
    return _cache[n]


def ddl(loops: int, n: int) -> float:
    _, admin, _ = _engine(n)
    serial = itertools.count()
    t0 = pyperf.perf_counter()
    for i in range(loops):
        k = next(serial)
        admin.execute(f"CREATE RESOURCE GROUP tmp{k} WITH (cpu_weight = 7)")
        admin.execute(f"ALTER RESOURCE GROUP g{(i * 7919) % n} SET (cpu_weight = {i % 100 + 1})")
        admin.execute(f"DROP RESOURCE GROUP tmp{k}")
    return (pyperf.perf_counter() - t0) / 3


def resolve(loops: int, n: int) -> float:
    _, _, user = _engine(n)
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        with user.query():
            pass
    return pyperf.perf_counter() - t0


def resource_groups(loops: int, n: int) -> float:
    _, admin, _ = _engine(n)
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        admin.execute("SELECT * FROM resource_groups()")
    return pyperf.perf_counter() - t0


_routing: dict[int, resgroups.Session] = {}


def _routed_session(k: int) -> resgroups.Session:
    if k not in _routing:
        engine = resgroups.Engine(access_control=True, workers=2)
        admin = engine.connect("admin")
        admin.execute_script(_script(10)[0])
        lines = [
            f"CREATE RESOURCE SELECTOR s{i} WHEN application = 'app{i}' AND "
            f"estimated_rows < 1000 THEN RESOURCE GROUP g{i % 10}"
            for i in range(k)
        ]
        for i in range(0, len(lines), 500):
            admin.execute_script(";\n".join(lines[i : i + 500]))
        _routing[k] = engine.connect("u5", application=f"app{k // 2}")
    return _routing[k]


def route(loops: int, k: int) -> float:
    session = _routed_session(k)
    estimate = resgroups.Estimate(rows=10)
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        with session.query(estimate=estimate):
            pass
    return pyperf.perf_counter() - t0


def _directory(n: int) -> Path:
    return Path(tempfile.gettempdir()) / f"resgroups-bench-scale-{n}"


def _build_directory(n: int) -> float:
    """Build the directory catalog of size n (the run's parent process does, once,
    before its workers reopen it); the seconds it took."""
    path = _directory(n)
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    with resgroups.Engine(catalog=path, access_control=True, workers=1) as engine:
        admin = engine.connect("admin")
        for script in _script(n):
            admin.execute_script(script)
    return time.perf_counter() - t0


def reopen(loops: int, n: int) -> float:
    path = _directory(n)
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        resgroups.Engine(catalog=path, access_control=True, workers=1).close()
    return pyperf.perf_counter() - t0


def _add_cmdline_args(cmd: list[str], args: object) -> None:
    cmd.extend(["--sizes", args.sizes, "--selectors", args.selectors])


if __name__ == "__main__":
    runner = pyperf.Runner(add_cmdline_args=_add_cmdline_args)
    runner.argparser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    runner.argparser.add_argument("--selectors", default="0,10,1000")
    args = runner.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    selector_counts = [int(s) for s in args.selectors.split(",") if s]
    built: dict[int, float] = {}
    results: dict[str, float] = {}
    for n in sizes:
        if not args.worker:
            built[n] = _build_directory(n)
        for name, fn in (
            ("ddl", ddl),
            ("resolve", resolve),
            ("resource_groups", resource_groups),
            ("reopen", reopen),
        ):
            bench = runner.bench_time_func(f"{name}_{n}", fn, n)
            if bench is not None and not args.worker:
                results[f"{name}_{n}"] = bench.median()
    for k in selector_counts:
        bench = runner.bench_time_func(f"route_{k}", route, k)
        if bench is not None and not args.worker:
            results[f"route_{k}"] = bench.median()
    if not args.worker and results:
        print()
        for n in sizes:
            line = [f"{n:>6} groups:"]
            line.append(f"ddl {results[f'ddl_{n}'] * 1e6:8.1f} µs")
            line.append(f"resolve {results[f'resolve_{n}'] * 1e6:7.1f} µs")
            rg = results[f"resource_groups_{n}"]
            line.append(f"resource_groups() {rg * 1e3:8.2f} ms ({rg * 1e6 / (n + 1):.2f} µs/row)")
            line.append(f"reopen {results[f'reopen_{n}'] * 1e3:8.1f} ms")
            if n in built:
                line.append(f"(creating it: {built[n]:.1f} s, fsync per statement)")
            print("  ".join(line))
        if sizes:
            low, high = min(sizes), max(sizes)
            for name in ("ddl", "resolve"):
                ratio = results[f"{name}_{high}"] / results[f"{name}_{low}"]
                print(f"{name} at {high} groups / at {low}: {ratio:.2f}x")
        for k in selector_counts:
            print(f"{k:>6} selectors: route {results[f'route_{k}'] * 1e6:7.1f} µs per query")
        if len(selector_counts) > 1:
            few, many = min(selector_counts), max(selector_counts)
            ratio = results[f"route_{many}"] / results[f"route_{few}"]
            print(f"route at {many} selectors / at {few}: {ratio:.2f}x")
