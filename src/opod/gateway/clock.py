"""The clock admission reads and sets its timers by: the event loop's, or one a test moves by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> Timer:
        """Call ``callback(*args)`` once ``delay`` seconds have passed on this clock."""
        ...


class LoopClock:
    """``time.monotonic`` and the running event loop's timers (the loop's clock is monotonic too)."""

    now = staticmethod(time.monotonic)

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback, *args)


LOOP_CLOCK = LoopClock()
