"""The admission queue with many waiters: the gate's queue views (a deque and a
deadline heap that drop what has left lazily) against a plain deque searched
and scanned, side by side in one run.

    python perf/bench_queue.py --fast

With QUEUED tickets waiting in one group (max_active_queries = 1):

1. cancel one queued ticket and queue a new one (``Gate.withdraw`` +
   ``Gate.submit``) against ``deque.remove`` + ``deque.append``;
2. the expiry check every waiter makes when it wakes, with nothing due
   (``Gate.expire``) against a scan of the whole deque for due tickets.

The ratios print at the end (deque time / gate time).
"""

from __future__ import annotations

from collections import deque

import pyperf

from resgroups.errors import QueryCancelled
from resgroups.sched.admission import Gate, GateConfig, Ticket

QUEUED = 10_000
NOW = 1000.0


def _gate() -> tuple[Gate, list[Ticket]]:
    gate = Gate(GateConfig("bench", max_active=1, queue_timeout_ms=3_600_000))
    holder = Ticket("holder")
    gate.submit(holder, NOW)
    waiting = [Ticket(f"u{i % 50}", query_deadline=NOW + 7200) for i in range(QUEUED)]
    for ticket in waiting:
        gate.submit(ticket, NOW)
    return gate, waiting


def gate_cancel_and_requeue(loops: int) -> float:
    gate, waiting = _gate()
    error = QueryCancelled("bench")
    t0 = pyperf.perf_counter()
    for i in range(loops):
        victim = waiting[(i * 7919) % QUEUED]  # anywhere in the queue
        gate.withdraw(victim, error)
        fresh = Ticket(victim.user, query_deadline=NOW + 7200)
        gate.submit(fresh, NOW)
        waiting[(i * 7919) % QUEUED] = fresh
    return pyperf.perf_counter() - t0


def deque_cancel_and_requeue(loops: int) -> float:
    waiting = [Ticket(f"u{i % 50}", query_deadline=NOW + 7200) for i in range(QUEUED)]
    queue = deque(waiting)
    t0 = pyperf.perf_counter()
    for i in range(loops):
        victim = waiting[(i * 7919) % QUEUED]
        queue.remove(victim)
        fresh = Ticket(victim.user, query_deadline=NOW + 7200)
        queue.append(fresh)
        waiting[(i * 7919) % QUEUED] = fresh
    return pyperf.perf_counter() - t0


def gate_expire_nothing_due(loops: int) -> float:
    gate, _ = _gate()
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        gate.expire(NOW + 1)
    return pyperf.perf_counter() - t0


def deque_expire_nothing_due(loops: int) -> float:
    queue = deque(Ticket(f"u{i % 50}", query_deadline=NOW + 7200) for i in range(QUEUED))
    for ticket in queue:
        ticket.queue_deadline = NOW + 3600
    now = NOW + 1
    t0 = pyperf.perf_counter()
    for _ in range(loops):
        _ = [t for t in queue if min(t.queue_deadline, t.query_deadline) <= now]
    return pyperf.perf_counter() - t0


if __name__ == "__main__":
    runner = pyperf.Runner()
    args = runner.parse_args()
    results = {
        op: (
            runner.bench_time_func(f"gate_{op}", gate_fn),
            runner.bench_time_func(f"deque_{op}", deque_fn),
        )
        for op, gate_fn, deque_fn in (
            ("cancel_and_requeue", gate_cancel_and_requeue, deque_cancel_and_requeue),
            ("expire_nothing_due", gate_expire_nothing_due, deque_expire_nothing_due),
        )
    }
    if not args.worker:
        for op, (gate, plain) in results.items():
            if gate is not None and plain is not None and gate.get_nrun() and plain.get_nrun():
                print(
                    f"{op}, {QUEUED:,} queued: gate {gate.median() * 1e6:.2f} us vs deque "
                    f"{plain.median() * 1e6:.2f} us = {plain.median() / gate.median():.1f}x faster"
                )
