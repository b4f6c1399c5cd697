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

from opod.security.keys import hash_key

KEY = "sk-opod-" + "k" * 40
"""A key as clients send it (``opod.security.keys.new_secret``'s length)."""
_PERIOD_END = datetime.now(UTC) + timedelta(days=30)
_PERIOD_END_S = _PERIOD_END.timestamp()


ANSWER = b'{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{}}'
"""An engine's whole answer, which the relay looks into for its usage."""
_HEADERS = dict[bytes, bytes]


def _nothing() -> None:
    return None


LIBRARY_CALLS: dict[str, Callable[[], object]] = {
    "a call that does nothing": _nothing,
    "before: a key's SHA-256 through hashlib (OpenSSL)": lambda: hashlib.sha256(KEY.encode()).hexdigest(),
    "now: a key's SHA-256, opod's hash_key (CPython's own)": lambda: hash_key(KEY),
    "before: a budget period's end against datetime.now(UTC)": lambda: datetime.now(UTC) >= _PERIOD_END,
    "now: a budget period's end in POSIX seconds against time.time()": lambda: time.time() >= _PERIOD_END_S,
    "before: looking into an answer with bytes' in (which raises and drops a TypeError first)": lambda: (
        b'"usage"' in ANSWER
    ),
    "now: looking into an answer with bytes.find": lambda: ANSWER.find(b'"usage"') >= 0,
    "before: an answer's header table made by calling dict[bytes, bytes]": lambda: _HEADERS(),
    "now: an answer's header table made as {}": lambda: {},
}
"""What each row times: a call that does nothing, then each ``before:`` call and the ``now:`` one in its place."""
