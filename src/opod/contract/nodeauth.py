"""The v1 node signature: the ``X-Opod-Auth`` header (CONTRACT.md §4.2).

``X-Opod-Auth: v=1,id=<node id>,ts=<unix seconds>,sig=<hex>`` where ``sig`` is
the lowercase hex HMAC-SHA256, keyed by the node's join token, of the four
lines ``v1``, the upper-case method, the URL path without its query, and ``ts``.
The body is not signed (uploads stream gigabytes). The token never travels.
The receiver refuses a ``ts`` more than five minutes from its own clock.

opod adds an optional nonce part ``n=<sender boot>.<counter>``; when present it
is a fifth line of the signed text, so a receiver can refuse a replayed header
even for calls made within the same second. A header without it is plain v1.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "HEADER",
    "WINDOW_SECONDS",
    "AuthRefused",
    "Refusal",
    "SignedHeader",
    "parse_header",
    "sign",
    "signature",
    "verify",
]

HEADER = "X-Opod-Auth"
WINDOW_SECONDS = 300
_VERSION = "1"


class Refusal(StrEnum):
    """Why a signed call was refused; each maps to a remedy in the message."""

    MISSING = "missing"
    MALFORMED = "malformed"
    VERSION = "unsupported_version"
    TIMESTAMP = "bad_timestamp"
    SKEW = "clock_skew"
    UNKNOWN_NODE = "unknown_node"
    SIGNATURE = "bad_signature"
    REPLAYED = "replayed"


class AuthRefused(Exception):
    """A refused signature: ``reason`` is machine-readable, the message says what to do."""

    def __init__(self, reason: Refusal, message: str, node_id: str = "") -> None:
        self.reason = reason
        self.node_id = node_id
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class SignedHeader:
    version: str
    node_id: str
    ts: str
    sig: str
    nonce: str = ""

    @property
    def unix(self) -> int:
        return int(self.ts)


def _message(method: str, path: str, ts: str, nonce: str) -> bytes:
    path = path.split("?", 1)[0]
    text = f"v1\n{method.upper()}\n{path}\n{ts}"
    return (text + "\n" + nonce if nonce else text).encode()


def signature(token: str, method: str, path: str, ts: str | int, nonce: str = "") -> str:
    """Lowercase hex HMAC-SHA256 over the v1 message; ``path`` loses any query string."""
    return hmac.new(token.encode(), _message(method, path, str(ts), nonce), hashlib.sha256).hexdigest()


def sign(node_id: str, token: str, method: str, path: str, now: float | None = None, nonce: str = "") -> str:
    """The ``X-Opod-Auth`` header value for one call, stamped with the current time."""
    ts = str(int(time.time() if now is None else now))
    sig = signature(token, method, path, ts, nonce)
    if nonce:
        return f"v={_VERSION},id={node_id},ts={ts},n={nonce},sig={sig}"
    return f"v={_VERSION},id={node_id},ts={ts},sig={sig}"


def parse_header(value: str | None) -> SignedHeader:
    """Split a header into its four parts, refusing anything that is not a v1 signature."""
    if not value or not value.strip():
        raise AuthRefused(Refusal.MISSING, f"no {HEADER} header: sign the call with the node token (v=1,id=,ts=,sig=)")
    parts: dict[str, str] = {}
    for item in value.split(","):
        key, eq, val = item.strip().partition("=")
        if not eq or not key:
            raise AuthRefused(
                Refusal.MALFORMED,
                f"{HEADER} part {item.strip()!r} is not key=value; expected v=1,id=<node>,ts=<unix>,sig=<hex>",
            )
        parts[key] = val
    missing = [k for k in ("v", "id", "ts", "sig") if not parts.get(k)]
    if missing:
        raise AuthRefused(
            Refusal.MALFORMED, f"{HEADER} lacks {', '.join(missing)}; expected v=1,id=<node>,ts=<unix>,sig=<hex>"
        )
    if parts["v"] != _VERSION:
        raise AuthRefused(
            Refusal.VERSION, f"{HEADER} version {parts['v']!r} is not supported; this side speaks v=1", parts["id"]
        )
    ts = parts["ts"]
    if not ts.isascii() or not ts.isdigit() or len(ts) > 12:
        raise AuthRefused(Refusal.TIMESTAMP, f"{HEADER} ts {ts!r} is not a unix time in whole seconds", parts["id"])
    sig = parts["sig"]
    if len(sig) != 64 or any(c not in "0123456789abcdef" for c in sig):
        raise AuthRefused(
            Refusal.MALFORMED, f"{HEADER} sig must be 64 lowercase hex characters (HMAC-SHA256)", parts["id"]
        )
    nonce = parts.get("n", "")
    if "n" in parts and (
        not nonce or len(nonce) > 64 or not nonce.isascii() or not all(c.isalnum() or c in ".-_" for c in nonce)
    ):
        raise AuthRefused(
            Refusal.MALFORMED, f"{HEADER} n must be 1-64 characters of letters, digits and .-_", parts["id"]
        )
    return SignedHeader(version=parts["v"], node_id=parts["id"], ts=ts, sig=sig, nonce=nonce)


def verify(
    value: str | None,
    method: str,
    path: str,
    token: str | Callable[[str], str | None],
    now: float | None = None,
    window: int = WINDOW_SECONDS,
) -> SignedHeader:
    """Check a header against the call; return it when it holds, else raise :class:`AuthRefused`.

    ``token`` is the node's token, or a function from node id to token (``None``
    for an unknown node). The comparison is constant-time.
    """
    header = parse_header(value)
    clock = time.time() if now is None else now
    skew = header.unix - clock
    if abs(skew) > window:
        direction = "ahead of" if skew > 0 else "behind"
        raise AuthRefused(
            Refusal.SKEW,
            f"signature time is {abs(skew):.0f}s {direction} this clock (allowed ±{window}s); sync the clocks (NTP)",
            header.node_id,
        )
    secret = token(header.node_id) if callable(token) else token
    if secret is None:
        raise AuthRefused(
            Refusal.UNKNOWN_NODE,
            f"node {header.node_id!r} is unknown here; create a node token and join again",
            header.node_id,
        )
    expected = signature(secret, method, path, header.ts, header.nonce)
    if not hmac.compare_digest(expected, header.sig):
        raise AuthRefused(
            Refusal.SIGNATURE,
            f"signature does not match for node {header.node_id!r}: wrong token, or method/path differ (sign the path without its query)",
            header.node_id,
        )
    return header
