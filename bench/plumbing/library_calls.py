"""Calls into C libraries that every ``/v1`` request makes, as opod makes them and as it made them before.

A call into a C library costs little warm, and can cost many times as much when what it touches (its
code, its tables, what it allocates) has left the CPU's caches, as it mostly has for a request under
load. ``python -m bench plumbing`` times each alone, warm and cold (``bench.plumbing.in_process``): what
opod did before (``before:``), each followed by what it does now in its place (``now:``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from opod.fleet.router import two_places
from opod.security.keys import hash_key

KEY = "sk-opod-" + "k" * 40
"""A key as clients send it (``opod.security.keys.new_secret``'s length)."""
_PERIOD_END = datetime.now(UTC) + timedelta(days=30)
_PERIOD_END_S = _PERIOD_END.timestamp()


LOAD = 2 / 3
"""A worker's load as the router weighs it (requests and KV use): a float with many places."""
SECONDS = 0.0123456
"""A part of a request's time, as ``Server-Timing`` writes it."""


def _nothing() -> None:
    return None


LIBRARY_CALLS: dict[str, Callable[[], object]] = {
    "a call that does nothing": _nothing,
    "before: a key's SHA-256 through hashlib (OpenSSL)": lambda: hashlib.sha256(KEY.encode()).hexdigest(),
    "now: a key's SHA-256, opod's hash_key (CPython's own)": lambda: hash_key(KEY),
    "before: a budget period's end against datetime.now(UTC)": lambda: datetime.now(UTC) >= _PERIOD_END,
    "now: a budget period's end in POSIX seconds against time.time()": lambda: time.time() >= _PERIOD_END_S,
    "before: a route's load rounded to two places and written (round, str)": lambda: str(round(LOAD, 2)),
    "now: the load written from whole hundredths (opod.fleet.router.two_places)": lambda: two_places(
        int(LOAD * 100 + 0.5)
    ),
    "before: Server-Timing's milliseconds written from a float ('%.3f')": lambda: b"dur=%.3f" % (SECONDS * 1000),
    "now: Server-Timing's milliseconds written from whole microseconds": lambda: (
        b"dur=%d.%03d" % divmod(int(SECONDS * 1e6 + 0.5), 1000)
    ),
}
"""What each row times: a call that does nothing, then each ``before:`` call and the ``now:`` one in its place."""
