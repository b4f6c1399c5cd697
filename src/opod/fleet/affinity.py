"""The sticky prefix pin: requests that start alike go back to the worker that served them last.

For engines that publish no cache events (llama.cpp), this is the approximation
of prefix routing: the request's opening text (its first ``PREFIX_CHARS``
characters) is hashed into a key; a bounded table remembers which worker
answered that key, for ``ttl`` seconds.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

from opod.http import fastjson

PREFIX_CHARS = 1024


def prefix_key(model: str, payload: dict[str, Any]) -> str | None:
    """A key for the request's opening text; ``None`` when it has none to speak of."""
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        text = fastjson.dumps(messages).decode()[:PREFIX_CHARS]
    elif isinstance(payload.get("prompt"), str):
        text = payload["prompt"][:PREFIX_CHARS]
    else:
        return None
    if len(text) < 32:
        return None
    return hashlib.blake2b(f"{model}\0{text}".encode(), digest_size=12).hexdigest()


class AffinityTable:
    def __init__(self, capacity: int = 100_000, ttl: float = 600.0) -> None:
        self.capacity = capacity
        self.ttl = ttl
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def get(self, key: str, now: float | None = None) -> str | None:
        entry = self._pins.get(key)
        if entry is None:
            return None
        node_id, at = entry
        if (time.monotonic() if now is None else now) - at > self.ttl:
            del self._pins[key]
            return None
        return node_id

    def pin(self, key: str, node_id: str, now: float | None = None) -> None:
        self._pins[key] = (node_id, time.monotonic() if now is None else now)
        self._pins.move_to_end(key)
        while len(self._pins) > self.capacity:
            self._pins.popitem(last=False)

    def __len__(self) -> int:
        return len(self._pins)
