"""Durations written as text, the way the management API's query strings and the settings write them.

Go's form (``720h``, ``1h30m``, ``90s``, ``250ms``), and ``d`` for days (``30d``), which
operators write for key lifetimes and retention. One grammar for every reader, and one bound:
at most :data:`LONGEST_SECONDS` (a hundred years), so every date a duration is added to or taken
from stays a date.
"""

from __future__ import annotations

import re

_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h|d))+$")
LONGEST_DAYS = 36500
LONGEST_SECONDS = LONGEST_DAYS * 86400.0
"""The longest duration taken: a hundred years, far beyond any key's life or retention."""


class TooLong(ValueError):
    """A duration in the grammar but longer than :data:`LONGEST_SECONDS`."""


def seconds(text: str) -> float:
    """Seconds in ``text``; ValueError naming the form when it is not a duration (:class:`TooLong` past the bound)."""
    value = text.strip().lower()
    if not _WHOLE.match(value):
        raise ValueError(f"{text!r} is not a duration; write it like 720h, 30d, 1h30m or 90s")
    total = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(value))
    if not total <= LONGEST_SECONDS:
        raise TooLong(
            f"{_shown(text)} is longer than the longest duration taken, {LONGEST_DAYS}d (a hundred years); write a shorter one"
        )
    return total


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "…"
