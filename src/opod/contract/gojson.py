"""JSON text exactly as Go's ``encoding/json`` writes it.

Most of the wire is compared by key set, but some bytes are compared as bytes
(``hardware_json``, CONTRACT.md §4.6), and the golden files are a canonical
re-encoding. Python's :mod:`json` differs from Go in three places that matter:
integral floats (Go writes ``41``, Python ``41.0``), exponent spelling (Go
``1e-7``, Python ``1e-07``) and escaping (Go escapes ``<``, ``>``, ``&``,
U+2028 and U+2029, and writes other non-ASCII as raw UTF-8).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

__all__ = ["dumps", "canonical", "format_float"]

_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


def _escape_char(ch: str) -> str:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code < 0x20:
        return f"\\u{code:04x}"
    if 0xD800 <= code <= 0xDFFF:
        # A lone surrogate is invalid UTF-8; Go writes the replacement character.
        return "\ufffd"
    return ch


def _needs_escape(s: str) -> bool:
    for ch in s:
        if ch in _SHORT_ESCAPES or ord(ch) < 0x20 or 0xD800 <= ord(ch) <= 0xDFFF:
            return True
    return False


def _string(s: str) -> str:
    if not _needs_escape(s):
        return f'"{s}"'
    return '"' + "".join(_escape_char(ch) for ch in s) + '"'


def format_float(f: float) -> str:
    """Format a float64 the way Go's encoder does (shortest round-trip digits)."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"JSON cannot carry {f!r}: Go refuses to marshal NaN or Inf")
    magnitude = abs(f)
    text = repr(f)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        mantissa, _, exponent = text.partition("e")
        if mantissa.endswith(".0"):
            mantissa = mantissa[:-2]
        sign = "-" if exponent.startswith("-") else "+"
        digits = exponent.lstrip("+-").lstrip("0") or "0"
        return f"{mantissa}e{sign}{digits}"
    # Fixed notation with the same shortest digits repr() chose.
    fixed = format(Decimal(text), "f")
    if "." in fixed:
        fixed = fixed.rstrip("0").rstrip(".")
    return fixed


def _encode(value: Any, out: list[str], indent: str | None, level: int, sort_keys: bool) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int):
        out.append(str(int(value)))
    elif isinstance(value, float):
        out.append(format_float(value))
    elif isinstance(value, Mapping):
        items = list(value.items())
        if sort_keys:
            items.sort(key=lambda kv: kv[0])
        if not items:
            out.append("{}")
            return
        out.append("{")
        for i, (key, item) in enumerate(items):
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, got {type(key).__name__}")
            if i:
                out.append(",")
            if indent is not None:
                out.append("\n" + indent * (level + 1))
            out.append(_string(key))
            out.append(": " if indent is not None else ":")
            _encode(item, out, indent, level + 1, sort_keys)
        if indent is not None:
            out.append("\n" + indent * level)
        out.append("}")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        if not value:
            out.append("[]")
            return
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            if indent is not None:
                out.append("\n" + indent * (level + 1))
            _encode(item, out, indent, level + 1, sort_keys)
        if indent is not None:
            out.append("\n" + indent * level)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """Encode plain JSON data (dicts keep their insertion order unless ``sort_keys``)."""
    out: list[str] = []
    _encode(value, out, " " * indent if indent is not None else None, 0, sort_keys)
    return "".join(out)


def canonical(value: Any) -> str:
    """The golden files' form: keys sorted at every depth, 2-space indent, final newline."""
    return dumps(value, indent=2, sort_keys=True) + "\n"
