"""Node tokens derived from a leader secret, so the leader never stores a token it could leak.

The node protocol signs with the token itself as the HMAC key, so the leader must
be able to recompute it. Instead of keeping tokens (the Go runtime keeps them in
plain text), the leader keeps one secret in ``~/.opod/node-secret`` (0600) and
derives each token from it and the token's id; the store keeps only the SHA-256.
A copy of the database alone cannot forge a worker.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from opod.security.keys import NODE_PREFIX


class NodeTokenMinter:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 32:
            raise ValueError("the node secret must be at least 32 bytes")
        self._secret = secret

    def token(self, token_id: str) -> str:
        """The token for ``token_id``: ``sk-node-<id>.<derived part>``."""
        mac = hmac.new(self._secret, token_id.encode(), hashlib.sha256).digest()
        return f"{NODE_PREFIX}{token_id}.{base64.b32encode(mac).decode().rstrip('=').lower()}"

    @staticmethod
    def token_id(token: str) -> str | None:
        """The id a token names, or ``None`` for text that is not a node token."""
        if not token.startswith(NODE_PREFIX) or "." not in token:
            return None
        return token[len(NODE_PREFIX) :].split(".", 1)[0] or None


def load_or_create_secret(path: Path) -> bytes:
    """Read the leader's node secret, creating it (0600) on first start."""
    if path.exists():
        data = path.read_bytes().strip()
        if len(data) < 64:
            raise ValueError(
                f"{path} is too short to be a node secret; delete it to mint a new one (existing node tokens stop working)"
            )
        return bytes.fromhex(data.decode())
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret.hex() + "\n")
    os.replace(tmp, path)
    return secret
