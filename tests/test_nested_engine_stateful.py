"""Nested groups on a real engine with real threads, against a model (SPEC §14).

Random DDL (groups created under random parents, limits, per-user caps and
policies altered, groups reparented) and random queries, each held open on a
thread of its own until the test lets it go. After every step, once the
engine has settled (every query either admitted or counted queued, a
bounded wait), the model's tree agrees with the engine's:

- each group's ``active_queries`` is the number of admitted queries in its
  subtree, and no level holds more than its limit unless it was already above
  it when a DDL statement made it so (a lowered limit or a reparent keeps
  what runs: grandfathered), and then nothing more was admitted there;
- no user holds more than a per-user cap at any level, under the same rule;
- nobody waits who could be admitted: every queued query has a full level or
  its user at a cap somewhere on its path.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from waiting import wait_until

import resgroups
from resgroups.errors import CatalogError

USERS = ("ann", "bob")
LIMITS = st.one_of(st.none(), st.integers(1, 3))


@dataclass
class Holder:
    group: str
    user: str
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class EngineTree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.engine = resgroups.Engine(workers=16, query_timeout=60)
        self.admin = self.engine.connect()
        self.parent: dict[str, str | None] = {}
        self.limit: dict[str, int | None] = {}
        self.cap: dict[str, int | None] = {}
        self.over: set[str] = set()  # levels a DDL left above their limit or a cap
        self.holders: list[Holder] = []
        self.names = iter(f"g{i}" for i in range(1000))

    # ---- the model ------------------------------------------------------------------

    def path(self, group: str) -> list[str]:
        levels = [group]
        while (up := self.parent[levels[-1]]) is not None:
            levels.append(up)
        return levels

    def running(self) -> list[Holder]:
        return [h for h in self.holders if h.entered.is_set() and not h.release.is_set()]

    def waiting(self) -> list[Holder]:
        return [h for h in self.holders if not h.entered.is_set() and h.error is None]

    def held(self, level: str, user: str | None = None) -> int:
        return sum(
            1
            for h in self.running()
            if level in self.path(h.group) and (user is None or h.user == user)
        )

    def blocked(self, holder: Holder) -> bool:
        for level in self.path(holder.group):
            limit, cap = self.limit[level], self.cap[level]
            if limit is not None and self.held(level) >= limit:
                return True
            if cap is not None and self.held(level, holder.user) >= cap:
                return True
        return False

    def leaves(self) -> list[str]:
        inner = {p for p in self.parent.values() if p is not None}
        return [g for g in self.parent if g not in inner]

    def note_over(self) -> None:
        """After DDL: the levels now above a limit or a cap (kept, not admitted to)."""
        for level in self.parent:
            limit, cap = self.limit[level], self.cap[level]
            if (limit is not None and self.held(level) > limit) or (
                cap is not None and any(self.held(level, u) > cap for u in USERS)
            ):
                self.over.add(level)

    def settle(self) -> None:
        """Until every query is admitted or counted queued by the engine."""

        def settled() -> bool:
            rows = {r["name"]: r for r in self.engine.resource_groups()}
            queued = sum(int(rows[g]["queued_queries"]) for g in self.leaves() if g in rows)
            return all(h.entered.is_set() or h.error is not None for h in self.holders) or (
                queued == len(self.waiting())
            )

        wait_until(settled, timeout=15)

    # ---- steps -------------------------------------------------------------------------

    def _with(self, limit: int | None, cap: int | None, policy: str) -> str:
        params = [f"scheduling_policy = '{policy}'", "queue_timeout = '60s'"]
        if limit is not None:
            params.append(f"max_active_queries = {limit}")
        if cap is not None:
            params.append(f"max_active_queries_per_user = {cap}")
        return ", ".join(params)

    @rule(data=st.data(), limit=LIMITS, cap=LIMITS, policy=st.sampled_from(["fifo", "fair"]))
    def create(self, data: st.DataObject, limit: int | None, cap: int | None, policy: str) -> None:
        name = next(self.names)
        # a parent with nothing mapped or running in it of its own, or the top
        quiet = [g for g in self.parent if not any(h.group == g for h in self.holders)]
        parent = data.draw(st.one_of(st.none(), st.sampled_from(quiet)) if quiet else st.none())
        extra = f", parent = {parent}" if parent is not None else ""
        self.admin.execute(
            f"CREATE RESOURCE GROUP {name} WITH ({self._with(limit, cap, policy)}{extra})"
        )
        self.parent[name], self.limit[name], self.cap[name] = parent, limit, cap

    @precondition(lambda self: self.parent)
    @rule(data=st.data(), limit=LIMITS, cap=LIMITS, policy=st.sampled_from(["fifo", "fair"]))
    def alter(self, data: st.DataObject, limit: int | None, cap: int | None, policy: str) -> None:
        group = data.draw(st.sampled_from(sorted(self.parent)))
        sets = [f"scheduling_policy = '{policy}'"]
        sets.append(f"max_active_queries = {'UNLIMITED' if limit is None else limit}")
        sets.append(f"max_active_queries_per_user = {'UNLIMITED' if cap is None else cap}")
        self.admin.execute(f"ALTER RESOURCE GROUP {group} SET ({', '.join(sets)})")
        self.limit[group], self.cap[group] = limit, cap
        self.note_over()
        self.settle()

    @precondition(lambda self: len(self.parent) >= 2)
    @rule(data=st.data())
    def reparent(self, data: st.DataObject) -> None:
        group = data.draw(st.sampled_from(sorted(self.parent)))
        quiet = [
            g
            for g in self.parent
            if g not in self.path_down(group) and not any(h.group == g for h in self.holders)
        ]
        parent = data.draw(st.one_of(st.none(), st.sampled_from(quiet)) if quiet else st.none())
        if parent is None:
            self.admin.execute(f"ALTER RESOURCE GROUP {group} RESET (parent)")
        else:
            refused: CatalogError | None = None
            try:
                self.admin.execute(f"ALTER RESOURCE GROUP {group} SET (parent = {parent})")
            except CatalogError as exc:  # a cycle or too deep: refused, nothing changed
                refused = exc
            if refused is not None:
                assert refused.sqlstate == "42809", refused
                return
        self.parent[group] = parent
        self.note_over()
        self.settle()

    def path_down(self, group: str) -> set[str]:
        """The group and its descendants."""
        below = {group}
        grew = True
        while grew:
            grew = False
            for g, p in self.parent.items():
                if p in below and g not in below:
                    below.add(g)
                    grew = True
        return below

    @precondition(lambda self: self.parent and len(self.holders) < 12)
    @rule(data=st.data(), user=st.sampled_from(USERS))
    def start(self, data: st.DataObject, user: str) -> None:
        group = data.draw(st.sampled_from(sorted(self.leaves())))
        holder = Holder(group, user)
        session = self.engine.connect(user)
        session.execute(f"SET RESOURCE GROUP {group}")

        def body() -> None:
            try:
                with session.query():
                    holder.entered.set()
                    holder.release.wait(60)
            except BaseException as exc:  # reported by the invariant
                holder.error = exc
            finally:
                holder.done.set()

        self.holders.append(holder)
        threading.Thread(target=body, daemon=True).start()
        self.settle()

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        holder = data.draw(st.sampled_from(self.running()))
        holder.release.set()
        assert holder.done.wait(15)
        self.holders.remove(holder)
        for level in list(self.over):  # a level back within its limits is watched again
            limit, cap = self.limit[level], self.cap[level]
            if (limit is None or self.held(level) <= limit) and (
                cap is None or all(self.held(level, u) <= cap for u in USERS)
            ):
                self.over.discard(level)
        self.settle()

    # ---- after every step -------------------------------------------------------------------

    @invariant()
    def the_engine_agrees(self) -> None:
        errors = [h.error for h in self.holders if h.error is not None]
        assert not errors, errors
        rows = {r["name"]: r for r in self.engine.resource_groups()}
        for level in self.parent:
            assert rows[level]["parent_group"] == self.parent[level]
            held = self.held(level)
            assert rows[level]["active_queries"] == held, (level, rows[level], held)
            if level in self.over:
                continue
            limit, cap = self.limit[level], self.cap[level]
            assert limit is None or held <= limit, (level, held, limit)
            assert cap is None or all(self.held(level, u) <= cap for u in USERS)
        for holder in self.waiting():
            assert self.blocked(holder), f"{holder.user} waits in {holder.group} with room"

    def teardown(self) -> None:
        for holder in self.holders:
            holder.release.set()
        for holder in self.holders:
            holder.done.wait(15)
        self.engine.close()


EngineTree.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None)
test_nested_groups_on_a_real_engine = EngineTree.TestCase
