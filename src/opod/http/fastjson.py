"""JSON on the request path: orjson, with the standard library for the values orjson refuses.

Each ``/v1`` request writes two journal lines and a route record and reads its answer's usage;
with the standard library that was a visible share of the leader's CPU per request, and orjson
does the same work in a fraction of the time. It refuses a few things the standard library takes (text
with lone surrogates, integers past 64 bits, NaN on input), so those fall back, and the
result is the same JSON either way.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_AS_TEXT = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
"""orjson writes these its own way; the standard library's ``default=str`` is kept for them."""


def dumps(value: Any) -> bytes:
    """Compact JSON (no spaces) as UTF-8 bytes; values JSON cannot hold are written with ``str()``.

    Raises ValueError or TypeError only where the standard library would (a cycle, a key that
    is not text).
    """
    try:
        return orjson.dumps(value, default=str, option=_AS_TEXT)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), default=str).encode()


def line(value: dict[str, Any]) -> bytes:
    """One JSON line (compact, ending in a newline), for the ledger's journal."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:
        # Lone surrogates and huge integers: the standard library escapes them into plain ASCII.
        return (json.dumps(value, separators=(",", ":")) + "\n").encode("ascii")


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError when it is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
