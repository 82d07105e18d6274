"""The release batcher (SPEC §11) against a store that fails on demand: batches
gather while one is in flight, a failed batch is retried first in line until
it goes through, past the inline threshold a release is tried at once, and
close() sends what is queued."""

from __future__ import annotations

import threading

from waiting import wait_until

from resgroups.fleet.releases import BatchedReleases
from resgroups.fleet.store import StoreUnavailable


class FlakyStore:
    def __init__(self) -> None:
        self.down = False
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[list[str]] = []
        self.failures = 0

    def release_many(self, ids: list[str]) -> int:
        self.gate.wait(10)
        if self.down:
            self.failures += 1
            raise StoreUnavailable("down")
        self.batches.append(list(ids))
        return len(ids)


def _released(store: FlakyStore) -> list[str]:
    return [i for batch in store.batches for i in batch]


def test_releases_gather_into_batches_while_one_is_in_flight() -> None:
    store = FlakyStore()
    releases = BatchedReleases(store)  # type: ignore[arg-type]
    store.gate.clear()  # the first batch hangs in the database
    releases.release("a")
    wait_until(lambda: releases.queued == 0)  # taken by the batcher
    for i in range(100):
        releases.release(f"q{i}")
    store.gate.set()
    wait_until(lambda: len(_released(store)) == 101)
    assert store.batches[0] == ["a"]
    assert len(store.batches) == 2  # the other 100 went as one DELETE
    releases.close()


def test_a_failed_batch_is_retried_first_until_it_goes_through() -> None:
    store = FlakyStore()
    store.down = True
    releases = BatchedReleases(store)  # type: ignore[arg-type]
    for i in range(5):
        releases.release(f"q{i}")
    wait_until(lambda: store.failures >= 2)
    releases.release("later")
    store.down = False
    wait_until(lambda: len(_released(store)) == 6, timeout=30)
    assert _released(store) == ["q0", "q1", "q2", "q3", "q4", "later"]  # order kept
    assert releases.failures >= 2
    releases.close()


def test_past_the_threshold_a_release_is_tried_inline() -> None:
    store = FlakyStore()
    store.gate.clear()  # the batcher is stuck on its first batch
    releases = BatchedReleases(store, inline_after=3)  # type: ignore[arg-type]
    releases.release("stuck")
    wait_until(lambda: releases.queued == 0)
    for i in range(3):
        releases.release(f"q{i}")
    assert releases.queued == 3
    inline = threading.Thread(target=releases.release, args=("inline",))
    inline.start()
    store.gate.set()
    inline.join(10)
    wait_until(lambda: len(_released(store)) == 5)
    assert ["inline"] in store.batches  # its own statement, not queued
    releases.close()


def test_close_sends_what_is_queued() -> None:
    store = FlakyStore()
    releases = BatchedReleases(store)  # type: ignore[arg-type]
    store.gate.clear()
    releases.release("first")
    wait_until(lambda: releases.queued == 0)
    releases.release("queued")
    store.gate.set()
    releases.close()
    assert _released(store) == ["first", "queued"]
