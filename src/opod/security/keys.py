"""API keys, admin keys and node tokens: how they look, and how they are stored (as SHA-256 only)."""

from __future__ import annotations

import hashlib
import secrets
import string

ADMIN_PREFIX = "sk-orc-"
API_PREFIX = "sk-opod-"
NODE_PREFIX = "sk-node-"

_ALPHABET = string.ascii_letters + string.digits


def new_secret(prefix: str, length: int = 40) -> str:
    """A fresh key: the prefix and ``length`` random base-62 characters (about 238 bits)."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def hash_key(plaintext: str) -> str:
    """Lowercase hex SHA-256: the only form a key is kept in."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def display_prefix(plaintext: str) -> str:
    """The first characters of a key, enough to tell keys apart in a listing."""
    return plaintext[: len(plaintext.split("-", 2)[0]) + 12] if plaintext.startswith("sk-") else plaintext[:8]


def new_key_id(kind: str) -> str:
    """A fresh id for a stored key: ``t_<16 hex>`` for a node token (it is part of the token's text,
    ``sk-node-<id>.…``, and tells a token from a key in a listing), ``k_<16 hex>`` for the others."""
    return ("t_" if kind == "node" else "k_") + secrets.token_hex(8)
