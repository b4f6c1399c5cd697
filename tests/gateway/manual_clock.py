"""A clock that moves only when a test says so, for admission's holds and rechecks."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class ManualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._due: list[tuple[float, int, ManualTimer, Callable[..., object], tuple[object, ...]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> ManualTimer:
        timer = ManualTimer()
        heapq.heappush(self._due, (self._now + delay, next(self._order), timer, callback, args))
        return timer

    def advance(self, seconds: float) -> None:
        """Move time on, running each timer that falls due on the way, in order."""
        until = self._now + seconds
        while self._due and self._due[0][0] <= until:
            at, _, timer, callback, args = heapq.heappop(self._due)
            self._now = at
            if not timer.cancelled:
                callback(*args)
        self._now = until
