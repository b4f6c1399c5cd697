"""A fetch's progress as a person reads it: bytes done of the total, the rate, a line per tenth.

Every fetch in :mod:`opod.weights` reports ``progress(done, total)`` per chunk (``total``
None when the server does not say). :class:`FetchMeter` is such a callback: it keeps the
rate and says a line at each whole tenth, so a log shows a fetch moving without a line
per chunk; :meth:`FetchMeter.describe` is the one-line state for a status field.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def size_text(n: float) -> str:
    """Bytes in decimal units, as download pages and the hub write them: ``270 MB``, ``1.3 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    return f"{int(n)} B"


class FetchMeter:
    """A ``progress(done, total)`` callback that knows the rate and says a line every ``step`` percent."""

    def __init__(
        self,
        what: str,
        say: Callable[[str], None] | None = None,
        *,
        step: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.say = say
        self.step = step
        self.clock = clock
        self.done = 0
        self.total: int | None = None
        self._start: tuple[float, int] | None = None
        """When and at which byte this fetch was first heard of: a resumed fetch's rate counts only new bytes."""
        self._said = -1
        self._last_said_at = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = self.clock()
        if self._start is None:
            self._start = (now, done)
        self.done, self.total = done, total
        if self.say is None:
            return
        if total:
            tenth = min(100, int(100 * done / total)) // self.step * self.step
            if tenth > self._said:
                self._said = tenth
                self.say(self.describe())
        elif now - self._last_said_at >= 10:
            # No total to take tenths of: a line every ten seconds instead.
            self._last_said_at = now
            self.say(self.describe())

    @property
    def rate(self) -> float:
        """Bytes per second since the first report (0 until a second report)."""
        if self._start is None:
            return 0.0
        started, at = self._start
        elapsed = self.clock() - started
        return (self.done - at) / elapsed if elapsed > 0 else 0.0

    def describe(self) -> str:
        """``what: 41% of 128 MB (52.3 MB, 12.1 MB/s)``; without a total, the bytes so far."""
        rate = f", {size_text(self.rate)}/s" if self.rate else ""
        if self.total:
            pct = min(100, int(100 * self.done / self.total))
            return f"{self.what}: {pct}% of {size_text(self.total)} ({size_text(self.done)}{rate})"
        return f"{self.what}: {size_text(self.done)}{rate}"
