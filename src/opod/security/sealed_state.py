"""State a browser carries between two requests, sealed so that it can neither read nor alter it.

A sign-in that leaves for a provider and comes back keeps what it must check on return (its state,
nonce and PKCE verifier) in a cookie sealed here rather than in a leader's memory, so any leader
sharing the secrets key (:meth:`opod.security.sealing.SecretsKey.derive`) completes it.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.fernet import Fernet, InvalidToken


class StateSeal:
    """Seals a small JSON mapping (encrypted and authenticated, with its time) and opens it within an age."""

    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    def seal(self, state: dict[str, Any]) -> str:
        return self._fernet.encrypt(json.dumps(state, separators=(",", ":")).encode()).decode("ascii")

    def open(self, sealed: str, max_age: int) -> dict[str, Any]:
        """The mapping ``sealed`` holds; ValueError when it is altered, sealed with another key, or older than
        ``max_age`` seconds."""
        try:
            opened = json.loads(self._fernet.decrypt(sealed.encode("ascii"), ttl=max_age))
        except (InvalidToken, UnicodeError, ValueError):
            raise ValueError("not sealed here, altered, or expired") from None
        if not isinstance(opened, dict):
            raise ValueError("not a sealed mapping")
        return opened


__all__ = ["StateSeal"]
