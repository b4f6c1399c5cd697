"""Durations written as text, the way the management API's query strings and the settings write them.

Go's form (``720h``, ``1h30m``, ``90s``, ``250ms``), and ``d`` for days (``30d``), which
operators write for key lifetimes and retention. One grammar for every reader.
"""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h|d))+$")


def seconds(text: str) -> float:
    """Seconds in ``text``; ValueError naming the form when it is not a duration."""
    value = text.strip().lower()
    if not _WHOLE.match(value):
        raise ValueError(f"{text!r} is not a duration; write it like 720h, 30d, 1h30m or 90s")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(value))
