"""Small checks every snapshot kind shares; each error names the field and what to write instead."""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import TypeVar
from urllib.parse import urlsplit

from opod.contract.wire import WireError, WireModel, parse_time
from opod.snapshots.watch import SnapshotError

M = TypeVar("M", bound=WireModel)


def decode(model: type[M], data: bytes, what: str) -> M:
    """``data`` as ``model``; a file that is not UTF-8 JSON or does not fit the type raises naming the field."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SnapshotError(f"{what}: not UTF-8 text (byte {err.start}); write the file as UTF-8 JSON") from None
    if not text.strip():
        raise SnapshotError(f"{what}: the file is empty; write a JSON object (an empty object {{}} is valid)")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as err:
        raise SnapshotError(f"{what}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    try:
        return model.from_wire(parsed)
    except WireError as err:
        raise SnapshotError(f"{what}: {'; '.join(err.problems)}") from None


def http_url(value: str, field: str) -> str:
    """``value`` when it is an absolute http(s) URL with a host; else a :class:`SnapshotError` naming ``field``."""
    try:
        parts = urlsplit(value)
        port = parts.port  # raises on a bad port
    except ValueError as err:
        raise SnapshotError(f"{field}: {value!r} is not a URL ({err}); write e.g. http://host:8080") from None
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SnapshotError(f"{field}: {value!r} is not an http(s) URL with a host; write e.g. http://host:8080")
    if any(c.isspace() for c in value):
        raise SnapshotError(f"{field}: {value!r} contains whitespace")
    return value


def finite_non_negative(value: float, field: str) -> None:
    if not math.isfinite(value) or value < 0:
        raise SnapshotError(f"{field}: {value!r} must be a number ≥ 0")


def in_range(value: int, low: int, high: int, field: str, unit: str = "") -> None:
    if not low <= value <= high:
        raise SnapshotError(f"{field}: {value} is outside {low}..{high}{unit}")


def rfc3339(value: str, field: str) -> datetime | None:
    """An RFC 3339 time, or None for an empty string."""
    if not value:
        return None
    try:
        return parse_time(value)
    except ValueError as err:
        raise SnapshotError(f"{field}: {err}") from None


def header_safe(value: str, field: str) -> None:
    """Text that travels in an HTTP header: no line breaks, nothing outside printable ASCII."""
    if any(c in value for c in "\r\n\0") or not value.isascii() or not value.isprintable():
        raise SnapshotError(f"{field}: must be printable ASCII without line breaks (it is sent as an HTTP header)")


_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def header_name(value: str, field: str) -> None:
    if not value or not set(value) <= _TOKEN_CHARS:
        raise SnapshotError(f"{field}: {value!r} is not a valid HTTP header name")
