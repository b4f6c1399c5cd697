"""Refuse a signed call that was already seen: the anti-replay window of the node protocol.

A signature with opod's nonce ``n=<boot>.<counter>`` is checked against a sliding
window per sender boot (as IPsec does): the highest counter seen and a bitmap of
the ``WINDOW`` counters below it, so memory stays constant however fast the
calls come and however they are reordered. A plain v1 signature (no nonce) is
remembered whole until it leaves the ±5 minute time window.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from opod.contract.nodeauth import WINDOW_SECONDS, AuthRefused, Refusal, SignedHeader

WINDOW = 4096
"""Counters below the highest seen that may still arrive late."""
_MAX_PLAIN = 100_000


@dataclass(slots=True)
class _Stream:
    highest: int
    seen: int
    """Bit i set = counter ``highest - i`` was seen."""
    last_used: float


class ReplayGuard:
    def __init__(self, window_seconds: int = WINDOW_SECONDS) -> None:
        self._window_seconds = window_seconds
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._plain: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._last_sweep = time.monotonic()

    def check(self, header: SignedHeader) -> None:
        """Record a verified header; raise ``AuthRefused(REPLAYED)`` if it was seen before."""
        now = time.monotonic()
        if now - self._last_sweep > 60:
            self._sweep(now)
        if header.nonce:
            self._check_nonce(header, now)
        else:
            self._check_plain(header, now)

    def _refuse(self, header: SignedHeader, why: str) -> AuthRefused:
        return AuthRefused(
            Refusal.REPLAYED,
            f"replayed signature from node {header.node_id!r} refused ({why}); sign every call afresh",
            header.node_id,
        )

    def _check_nonce(self, header: SignedHeader, now: float) -> None:
        boot, _, count_text = header.nonce.rpartition(".")
        if not boot or not count_text.isdigit():
            raise AuthRefused(Refusal.MALFORMED, "X-Opod-Auth n must be <boot>.<counter>", header.node_id)
        counter = int(count_text)
        key = (header.node_id, boot)
        stream = self._streams.get(key)
        if stream is None:
            self._streams[key] = _Stream(highest=counter, seen=1, last_used=now)
            return
        stream.last_used = now
        if counter > stream.highest:
            shift = counter - stream.highest
            stream.seen = ((stream.seen << shift) | 1) & ((1 << WINDOW) - 1) if shift < WINDOW else 1
            stream.highest = counter
            return
        offset = stream.highest - counter
        if offset >= WINDOW:
            raise self._refuse(header, f"counter {counter} is older than the last {WINDOW} calls")
        bit = 1 << offset
        if stream.seen & bit:
            raise self._refuse(header, f"counter {counter} already used")
        stream.seen |= bit

    def _check_plain(self, header: SignedHeader, now: float) -> None:
        key = (header.node_id, header.ts, header.sig)
        if key in self._plain:
            raise self._refuse(header, "this exact signature was already used")
        self._plain[key] = now
        while len(self._plain) > _MAX_PLAIN:
            self._plain.popitem(last=False)

    def _sweep(self, now: float) -> None:
        horizon = 2 * self._window_seconds
        self._streams = {k: s for k, s in self._streams.items() if now - s.last_used < horizon}
        while self._plain and now - next(iter(self._plain.values())) > horizon:
            self._plain.popitem(last=False)
        self._last_sweep = now


class NonceSource:
    """Makes the nonces one sender puts on its calls: a random boot and a counter."""

    def __init__(self) -> None:
        self.boot = secrets.token_hex(6)
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self.boot}.{next(self._counter)}"
