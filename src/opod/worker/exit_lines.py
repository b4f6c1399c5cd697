"""Why an engine died, in one line of its own output: the line of its last ones that says it best."""

from __future__ import annotations

import re
from collections.abc import Sequence

DETAIL_LINES = 30
"""How far back the most telling log line is looked for."""


# "error loading model: …", "CUDA error: out of memory", Python's "ValueError: …".
_ERROR_WITH_MESSAGE = re.compile(r"(?i:\b(?:error|fatal|panic)\b[^:]{0,40}:\s*\S)|\b\w+(?:Error|Exception)\b:")
_ERROR_WORDS = ("error", "fatal", "panic", "exception", "abort", "out of memory", "segmentation fault")
_FAILURE_WORDS = ("failed", "cannot", "unable", "not found", "invalid", "denied", "no such")


def telling_line(lines: Sequence[str]) -> str:
    """The line that best says why it died: an error with its message, else one that names a failure,
    else the newest line. Ties go to the newest (Python's traceback ends with the raised error)."""
    best, best_score = "", -1
    for line in lines[-DETAIL_LINES:]:
        text = line.strip()
        if not text:
            continue
        lower = text.lower()
        if _ERROR_WITH_MESSAGE.search(text):
            score = 3
        elif any(word in lower for word in _ERROR_WORDS):
            score = 2
        elif any(word in lower for word in _FAILURE_WORDS):
            score = 1
        else:
            score = 0
        if score >= best_score:
            best, best_score = text, score
    return best[:300]
