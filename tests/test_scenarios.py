"""Scenario files for the scheduling core: steps, then the expected state after ``----``.

Each file in ``tests/scenarios/`` is a list of commands; a ``dump`` command is
followed by ``----`` and the state it must print, up to a blank line, so a
change to a scheduling rule shows up as a readable diff. Commands:

    pool NAME SIZE                       (before anything else; default: default 2)
    group NAME [weight=W] [limit=CORES] [policy=fifo|fair] [parent=GROUP]
                                         (create or ALTER; no parent: top level)
    query GROUP USER [kind=K] [pool=P] [xN]   new queries q1, q2, ...
    task QUERY                           a parallel task of a query: t1, t2, ...
    tick MS [cpu=MS] [xN]                time passes; every running runner ends a slice
    finish RUNNER [cpu=MS]               a runner gives its worker back (or stops waiting)
    advance MS                           time passes; waiting runners re-check (budgets)
    engage on|off
    dump

``RESGROUPS_REWRITE_SCENARIOS=1 pytest tests/test_scenarios.py`` rewrites the
expected dumps (then read the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from resgroups.sched.cpu import CpuScheduler, GroupCpu, Runner, RunnerState

MS = 1_000_000
HERE = Path(__file__).resolve().parent / "scenarios"
FILES = sorted(HERE.glob("*.txt"))


class Scenario:
    def __init__(self) -> None:
        self.pools: dict[str, int] = {}
        self.s: CpuScheduler | None = None
        self.now = 0.0
        self.groups: dict[str, GroupCpu] = {}
        self.runners: dict[str, Runner] = {}
        self.names: dict[int, str] = {}
        self.queries = 0
        self.tasks = 0

    @property
    def core(self) -> CpuScheduler:
        if self.s is None:
            self.s = CpuScheduler(self.pools or {"default": 2}, slice_ms=10)
            self.s.engaged = True
        return self.s

    def run(self, line: str) -> str | None:
        words = line.split()
        options = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        plain = [w for w in words[1:] if "=" not in w and not w.startswith("x")]
        repeat = next((int(w[1:]) for w in words[1:] if w.startswith("x") and w[1:].isdigit()), 1)
        command = words[0]
        for _ in range(repeat):
            getattr(self, f"do_{command}")(plain, options)
        if command == "dump":
            return self.dump()
        self.core._check_invariants(self.now)
        return None

    def do_pool(self, args: list[str], _: dict[str, str]) -> None:
        assert self.s is None, "pools come first"
        self.pools[args[0]] = int(args[1])

    def do_group(self, args: list[str], o: dict[str, str]) -> None:
        name = args[0]
        gid = list(self.groups).index(name) if name in self.groups else len(self.groups)
        limit = None if o.get("limit", "none") == "none" else float(o["limit"])
        parent = self.groups[o["parent"]].group_id if "parent" in o else None
        self.core.configure(
            gid,
            name,
            int(o.get("weight", 100)),
            limit,
            o.get("policy", "fifo"),
            self.now,
            parent=parent,
        )
        self.groups[name] = self.core.groups[gid]

    def _add(self, name: str, runner: Runner) -> None:
        self.runners[name] = runner
        self.names[id(runner)] = name
        self.core.submit(runner, self.now)

    def do_query(self, args: list[str], o: dict[str, str]) -> None:
        self.queries += 1
        group, user = self.groups[args[0]], args[1]
        runner = Runner(
            group, o.get("pool", "default"), user, self.queries, o.get("kind", "select")
        )
        self._add(f"q{self.queries}", runner)

    def do_task(self, args: list[str], _: dict[str, str]) -> None:
        self.tasks += 1
        of = self.runners[args[0]]
        self._add(f"t{self.tasks}", Runner(of.group, of.pool, of.user, of.query_id, of.kind, True))

    def do_tick(self, args: list[str], o: dict[str, str]) -> None:
        ms = float(args[0])
        self.now += ms / 1000
        used = round(float(o.get("cpu", ms)) * MS)
        # the runners holding a worker when the time passed: one granted during
        # this tick has not run a slice yet
        running = [r for r in self.runners.values() if r.state is RunnerState.RUNNING]
        for runner in sorted(running, key=lambda r: r.seq):
            if runner.state is RunnerState.RUNNING:
                self.core.slice_end(runner, used, self.now)
        self.core.dispatch(self.now)

    def do_finish(self, args: list[str], o: dict[str, str]) -> None:
        self.core.release(self.runners[args[0]], round(float(o.get("cpu", 0)) * MS), self.now)

    def do_advance(self, args: list[str], _: dict[str, str]) -> None:
        self.now += float(args[0]) / 1000
        self.core.dispatch(self.now)

    def do_engage(self, args: list[str], _: dict[str, str]) -> None:
        self.core.engaged = args[0] == "on"
        self.core.dispatch(self.now)

    def do_dump(self, args: list[str], _: dict[str, str]) -> None:
        pass

    def dump(self) -> str:
        core = self.core
        lines = [
            f"t={self.now * 1000:.0f}ms free=" + ",".join(f"{p}:{n}" for p, n in core.free.items())
        ]
        for g in self.groups.values():
            g.refill(self.now)  # the budget as of now
            running = sorted(self.names[id(r)] for r in g.running)
            waiting = [self.names[id(r)] for q in g.waiting.values() for r in q]
            budget = f" budget={g.budget_ns / MS:.0f}ms" if g.fractional else ""
            users = ",".join(f"{u}:{ns // MS}" for u, ns in sorted(g.cpu_by_user.items()))
            # in a tree: the path, and an inner group's subtree CPU (held is the subtree's)
            label = "/".join(h.name for h in g.path())
            if g.children:
                subtree = sum(h.cpu_ns_total for h in g.subtree()) // MS
                label += f" (subtree cpu={subtree}ms)"
            lines.append(
                f"{label}: cpu={g.cpu_ns_total // MS}ms v={g.vtime / MS:.0f} held={g.held}"
                f"{budget} running=[{' '.join(running)}] waiting=[{' '.join(waiting)}]"
                + (f" users={users}" if g.policy == "fair" else "")
            )
        return "\n".join(lines)


def parse(path: Path) -> list[tuple[str, str | None]]:
    """(command, expected output of a dump or None) pairs."""
    steps: list[tuple[str, str | None]] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        if line.startswith("dump"):
            assert lines[i].strip() == "----", f"{path.name}: dump without ----"
            i += 1
            expected = []
            while i < len(lines) and lines[i].strip():
                expected.append(lines[i].rstrip())
                i += 1
            steps.append((line, "\n".join(expected)))
        else:
            steps.append((line, None))
    return steps


def render(path: Path, outputs: list[tuple[str, str | None]]) -> str:
    """The file with the expected dumps replaced by ``outputs``."""
    out: list[str] = []
    lines = path.read_text().splitlines()
    i = 0
    dumps = iter(o for c, o in outputs if c.startswith("dump"))
    while i < len(lines):
        line = lines[i]
        i += 1
        out.append(line)
        if line.strip().startswith("dump"):
            i += 1  # ----
            while i < len(lines) and lines[i].strip():
                i += 1
            out.append("----")
            out.extend((next(dumps) or "").splitlines())
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario(path: Path) -> None:
    scenario = Scenario()
    outputs = [(command, scenario.run(command)) for command, _ in parse(path)]
    if os.environ.get("RESGROUPS_REWRITE_SCENARIOS"):
        path.write_text(render(path, outputs))
        return
    for (command, expected), (_, got) in zip(parse(path), outputs, strict=True):
        if expected is not None:
            assert got == expected, f"{path.name}: after `{command}`"


def test_there_are_scenarios() -> None:
    assert len(FILES) >= 4
