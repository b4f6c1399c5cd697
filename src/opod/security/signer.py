"""Signing and checking node-protocol calls: the one place both directions go through."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opod.contract.nodeauth import HEADER, SignedHeader, sign, verify
from opod.security.replay import NonceSource, ReplayGuard


class Signer:
    """Signs the calls of one node identity with its token; every call gets a fresh nonce."""

    def __init__(self, node_id: str, token: str) -> None:
        self.node_id = node_id
        self._token = token
        self._nonces = NonceSource()

    def headers(self, method: str, path: str) -> dict[str, str]:
        return {HEADER: sign(self.node_id, self._token, method, path, nonce=self._nonces.next())}


class Verifier:
    """Checks signed calls: signature, ±5 minute window, and replays."""

    def __init__(self, token_for: Callable[[str], str | None]) -> None:
        self._token_for = token_for
        self._guard = ReplayGuard()

    def check(self, headers: Mapping[str, str], method: str, path: str) -> SignedHeader:
        """The verified header; raises ``AuthRefused`` with the reason otherwise."""
        header = verify(headers.get(HEADER), method, path, self._token_for)
        self._guard.check(header)
        return header
