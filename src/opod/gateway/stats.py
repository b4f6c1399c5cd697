"""What ``/loadz`` reports about the gateway itself: requests in flight, per minute, refused, and TTFT.

Counted per second in rings of 60 buckets, so a reading costs the same however
busy the leader is. A request carrying ``X-Opod-Probe`` is served but counted
nowhere: it neither keeps an idle endpoint awake nor wakes a sleeping one.
"""

from __future__ import annotations

import time
from collections import deque

PROBE_HEADER = "x-opod-probe"
WINDOW = 60


class MinuteCounter:
    def __init__(self) -> None:
        self._buckets = [0] * WINDOW
        self._stamps = [0] * WINDOW

    def add(self, now: float, n: int = 1) -> None:
        second = int(now)
        slot = second % WINDOW
        if self._stamps[slot] != second:
            self._stamps[slot] = second
            self._buckets[slot] = 0
        self._buckets[slot] += n

    def total(self, now: float) -> int:
        horizon = int(now) - WINDOW
        return sum(b for b, s in zip(self._buckets, self._stamps, strict=True) if s > horizon)


class GatewayStats:
    def __init__(self) -> None:
        self.in_flight = 0
        self.requests = MinuteCounter()
        self.unavailable = MinuteCounter()
        self.last_request_unix = 0
        self._ttft: deque[tuple[float, int]] = deque(maxlen=4096)

    def started(self) -> None:
        now = time.time()
        self.in_flight += 1
        self.requests.add(now)
        self.last_request_unix = int(now)

    def finished(self, status: int) -> None:
        self.in_flight -= 1
        if status >= 500:
            self.unavailable.add(time.time())

    def refused(self, status: int) -> None:
        """A request answered without being relayed (401, 404, 503…): counted, never in flight."""
        now = time.time()
        self.requests.add(now)
        self.last_request_unix = int(now)
        if status >= 500:
            self.unavailable.add(now)

    def ttft(self, ms: int) -> None:
        self._ttft.append((time.time(), ms))

    def ttft_percentiles(self) -> tuple[int, int]:
        """TTFT p50 and p95 over the last minute, ms; ``(0, 0)`` when nothing streamed (never "instant")."""
        horizon = time.time() - WINDOW
        values = sorted(ms for at, ms in self._ttft if at >= horizon)
        if not values:
            return 0, 0
        return values[len(values) // 2], values[min(len(values) - 1, int(0.95 * len(values)))]
