"""What runaway-query rules cost, and how soon they act (SPEC §16), side by side
in one run:

1. an uncontended managed query (enter + exit) with no rule anywhere, against
   the same query while rules exist on another group (one group more, so both
   run with CPU scheduling engaged: the ``engaged`` baseline has the second
   group and no rule);
2. a query running 400,000 checkpoints (one clock compare each on the fast
   path; the slow path at each slice end, and with a rule, the rule check
   there) with a rule on its own group that never fires, against the same
   query in a group without rules: the added cost per checkpoint;
3. how far past its threshold a KILL lands: a rule ``elapsed > 50ms`` on a body
   that checkpoints every millisecond, and ``cpu_time > 50ms`` on a body that
   burns CPU between checkpoints 1 ms apart; the value the error reports,
   minus the threshold (rules are checked once a slice, 10 ms).

Rounds alternate the variants so that a noisy machine's drift hits each alike;
medians over rounds are printed.

    python perf/bench_rules.py [--rounds 7] [--loops 3000]
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable

import numpy as np

import resgroups

RULE_ELSEWHERE = (
    "CREATE RESOURCE GROUP other;"
    "CREATE RESOURCE RULE r1 ON RESOURCE GROUP other WHEN cpu_time > 1h THEN KILL;"
    "CREATE RESOURCE RULE r2 ON RESOURCE GROUP other WHEN rows > 1000000000 THEN LOG"
)


def uncontended(setup: str, loops: int) -> float:
    """Seconds per enter + exit of a query in DEFAULT after ``setup``."""
    with resgroups.Engine() as engine:
        if setup:
            engine.connect().execute_script(setup)
        session = engine.connect("bench")
        for _ in range(100):  # warm
            with session.query():
                pass
        t0 = time.perf_counter()
        for _ in range(loops):
            with session.query():
                pass
        return (time.perf_counter() - t0) / loops


def checkpoints(with_rule: bool, count: int = 400_000) -> float:
    """Seconds per checkpoint of a query that runs ``count`` of them (its slice
    ends and rule checks included), in a group with or without a rule."""
    with resgroups.Engine() as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP g")
        if with_rule:
            admin.execute("CREATE RESOURCE RULE never ON RESOURCE GROUP g WHEN rows > 1 THEN LOG")
        admin.execute("SET RESOURCE GROUP g")
        best = []
        for _ in range(3):
            with admin.query() as q:
                t0 = time.perf_counter()
                for _ in range(count):
                    q.checkpoint()
                best.append((time.perf_counter() - t0) / count)
        return min(best)


def kill_overshoot(condition: str, burn: bool) -> float:
    """Milliseconds past the threshold (50 ms) at which a KILL lands."""
    data = np.arange(20_000, dtype=np.float64)
    with resgroups.Engine() as engine:
        admin = engine.connect()
        admin.execute("CREATE RESOURCE GROUP g")
        admin.execute(f"CREATE RESOURCE RULE stop ON RESOURCE GROUP g WHEN {condition} THEN KILL")
        admin.execute("SET RESOURCE GROUP g")
        try:
            with admin.query() as q:
                while True:
                    q.checkpoint()
                    if burn:  # about 1 ms of CPU
                        deadline = time.thread_time() + 0.001
                        while time.thread_time() < deadline:
                            float(np.sqrt(data).sum())
                    else:
                        time.sleep(0.001)
        except resgroups.RunawayQuery as exc:
            metric = condition.split()[0]
            match = re.search(rf"{metric} (\d+)(ms|s|m|h) >", exc.message)
            if match is None:
                raise AssertionError(f"no value reached in {exc.message!r}") from None
            return int(match.group(1)) * _MS[match.group(2)] - 50
    raise AssertionError("the rule never acted")


_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def _rounds(rounds: int, variants: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            out[name].append(fn())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loops", type=int, default=3000)
    args = parser.parse_args()

    print("1. an uncontended query on the main thread, us per enter + exit (median of rounds)")
    u = _rounds(
        args.rounds,
        {
            "DEFAULT only": lambda: uncontended("", args.loops),
            "engaged, no rules": lambda: uncontended("CREATE RESOURCE GROUP other", args.loops),
            "rules on another group": lambda: uncontended(RULE_ELSEWHERE, args.loops),
        },
    )
    for name, values in u.items():
        print(f"  {name:<26}{statistics.median(values) * 1e6:8.2f} us")
    ratio = statistics.median(
        a / b for a, b in zip(u["rules on another group"], u["engaged, no rules"], strict=True)
    )
    print(f"  rules elsewhere / engaged without rules: {ratio:.3f}x (median of paired rounds)")

    print("2. a query's checkpoints, ns per checkpoint (400,000 in one query, best of 3)")
    c = _rounds(
        args.rounds, {"no rule": lambda: checkpoints(False), "rule": lambda: checkpoints(True)}
    )
    plain, ruled = statistics.median(c["no rule"]), statistics.median(c["rule"])
    print(f"  group without rules      {plain * 1e9:8.0f} ns")
    print(f"  a rule on its own group  {ruled * 1e9:8.0f} ns  (+{(ruled - plain) * 1e9:.0f} ns)")

    print("3. how far past its threshold a KILL lands, ms (threshold 50 ms; slice 10 ms)")
    for condition, burn in (("elapsed > 50ms", False), ("cpu_time > 50ms", True)):
        over = [kill_overshoot(condition, burn) for _ in range(args.rounds * 3)]
        print(
            f"  {condition:<18} median {statistics.median(over):6.1f}  "
            f"max {max(over):6.1f}  ({len(over)} kills)"
        )


if __name__ == "__main__":
    main()
