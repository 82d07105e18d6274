"""The fence: until when what an instance holds in the fleet is certainly its own.

A renewal that started at ``t`` (``time.monotonic``) makes what it renewed
valid until ``t + MARGIN * expiry``. Another instance's sweep reclaims a row
only once it has not been renewed for ``expiry`` on the database's clock,
which ran from at least ``t``: the fence passes strictly before. The
coordinator keeps one for the instance's row and leases, the quota keeper
one for its quota rows (fleet/modes.py says what passing it does).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Final

MARGIN: Final = 0.9  # valid_until = renewal start + MARGIN * expiry
_WAIT_S: Final = 0.1  # the longest sleep of a wait for a renewal


class Fence:
    def __init__(self, expiry: float, valid_until: float = -math.inf) -> None:
        self.expiry = expiry
        self.valid_until = valid_until  # -inf: nothing valid before the first renewal
        self._fresh = threading.Condition()

    def stale(self) -> bool:
        """Past ``valid_until``: what it guards may have been reclaimed."""
        return time.monotonic() >= self.valid_until

    def lapsed(self) -> bool:
        """Whether a renewal completing now comes after the fence had passed (the
        first one never does): judged at completion, since a renewal that
        started in time may take effect only after another instance's sweep."""
        return self.valid_until != -math.inf and time.monotonic() >= self.valid_until

    def renewed(self, started: float) -> None:
        """A renewal that started at ``started`` went through."""
        with self._fresh:
            self.valid_until = started + MARGIN * self.expiry
            self._fresh.notify_all()

    def wait_fresh(self, deadline: float, hurry: Callable[[], None] = lambda: None) -> bool:
        """Until a renewal makes it valid again (True) or the monotonic ``deadline``
        passes (False); ``hurry()`` asks the renewing thread to try now."""
        if not self.stale():  # the common case: no lock
            return True
        with self._fresh:
            while self.stale():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                hurry()
                self._fresh.wait(min(left, _WAIT_S))
        return True
