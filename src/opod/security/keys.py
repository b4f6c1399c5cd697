"""API keys, admin keys and node tokens: how they look, and how they are stored (as SHA-256 only)."""

from __future__ import annotations

import hashlib
import importlib
import secrets
import string
from collections.abc import Callable
from typing import Any

ADMIN_PREFIX = "sk-orc-"
API_PREFIX = "sk-opod-"
NODE_PREFIX = "sk-node-"

_ALPHABET = string.ascii_letters + string.digits


def new_secret(prefix: str, length: int = 40) -> str:
    """A fresh key: the prefix and ``length`` random base-62 characters (about 238 bits)."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def _sha256() -> Callable[[bytes], Any]:
    """CPython's own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before), else hashlib's.

    The same digest as hashlib's, which goes through OpenSSL's lookup of the algorithm and a context it
    allocates: more code and memory touched for every key checked, and a request's key check mostly runs
    with none of it in the CPU's caches (``docs/dataplane.md``)."""
    for name in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(name).sha256
        except (ImportError, AttributeError):
            continue
    return hashlib.sha256


_SHA256 = _sha256()


def hash_key(plaintext: str) -> str:
    """Lowercase hex SHA-256: the only form a key is kept in."""
    return _SHA256(plaintext.encode()).hexdigest()


def display_prefix(plaintext: str) -> str:
    """The first characters of a key, enough to tell keys apart in a listing."""
    return plaintext[: len(plaintext.split("-", 2)[0]) + 12] if plaintext.startswith("sk-") else plaintext[:8]


def new_key_id(kind: str) -> str:
    """A fresh id for a stored key: ``t_<16 hex>`` for a node token (it is part of the token's text,
    ``sk-node-<id>.…``, and tells a token from a key in a listing), ``k_<16 hex>`` for the others."""
    return ("t_" if kind == "node" else "k_") + secrets.token_hex(8)
