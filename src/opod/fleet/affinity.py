"""The sticky prefix pin: requests that start alike go back to the worker that served them last.

For engines that publish no cache events (llama.cpp), this is the approximation
of prefix routing: the request's opening text (its first ``PREFIX_CHARS``
characters) is hashed into a key; a bounded table remembers which worker
answered that key, for ``ttl`` seconds.

A short prompt is placed by neither (:func:`worth_placing`): not pinned here, not hashed or
learnt by the leader's prefix hasher (``opod.gateway.prefix``). A cache hit on it would save less
prefill than placing it costs (a dump and a hash, a pin to remember, a tokenize call to learn it),
and short one-off prompts are most of some workloads; it goes by load.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from typing import Any

from opod.http import fastjson

PREFIX_CHARS = 1024
PLACED_FROM_CHARS = 256
"""The shortest opening text placed by its prefix: about 64 tokens at four characters a token, four blocks of
the engines' usual sixteen tokens."""


def worth_placing(payload: dict[str, Any]) -> bool:
    """Whether the request's opening text is long enough to place by its prefix (:data:`PLACED_FROM_CHARS`).

    The opening text is a text prompt, or the contents of the leading messages up to the first whose
    content is not plain text; such a message (an image, parts) is worth placing whatever its length,
    since its prefill cannot be told from its characters."""
    messages = payload.get("messages")
    if isinstance(messages, list):
        chars = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, str):
                return content is not None
            chars += len(content)
            if chars >= PLACED_FROM_CHARS:
                return True
        return False
    prompt = payload.get("prompt")
    return not isinstance(prompt, str) or len(prompt) >= PLACED_FROM_CHARS


def prefix_key(model: str, payload: dict[str, Any]) -> str | None:
    """A key for the request's opening text; ``None`` when it is too short to place (:func:`worth_placing`)."""
    if not worth_placing(payload):
        return None
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
