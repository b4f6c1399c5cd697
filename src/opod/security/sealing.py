"""The key that seals the secrets kept in the store (``PUT /api/v1/auth/secrets/{name}``), and sealing with it.

A secret is sealed with Fernet (AES-128-CBC and HMAC-SHA256, from ``cryptography``) before it
reaches the database, so a copy of the database, or a reader of its file, learns no secret. The
key lives beside the admin key: ``<home>/secrets.key`` (0600), made on a leader's first start, or
the file ``OPOD_SECRETS_KEY_FILE`` names. Every leader sharing one store needs the same key: the
store keeps the key's fingerprint and refuses a leader whose key differs
(:meth:`opod.store.secrets.SecretsRepo.adopt_secrets_key`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from opod import config
from opod.security.private import write_private

KEY_FILE = "secrets.key"
KEY_FILE_VAR = "OPOD_SECRETS_KEY_FILE"


class SecretsKey:
    """One Fernet key, where it was read from, and its fingerprint."""

    def __init__(self, key: bytes, where: Path) -> None:
        try:
            self._fernet = Fernet(key)
        except ValueError:
            raise ValueError(
                f"{where} does not hold a secrets key (44 characters of URL-safe base64); restore it from a backup "
                "or from a leader that shares this store"
            ) from None
        self._key = key
        self.where = where
        self.fingerprint = hmac.new(key, b"opod secrets key", hashlib.sha256).hexdigest()[:16]
        """Names the key without giving it away: the store keeps it, and messages show it."""

    def seal(self, text: str) -> str:
        return self._fernet.encrypt(text.encode()).decode("ascii")

    def unseal(self, token: str) -> str:
        """The text ``token`` seals; ValueError when this key did not seal it (or it was altered)."""
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode()
        except (InvalidToken, UnicodeError):
            raise ValueError(f"a stored secret was not sealed with the key in {self.where}") from None

    def derive(self, purpose: str) -> bytes:
        """A Fernet key of its own for ``purpose`` (what one sealed for it opens nothing else), the same on every
        leader that shares this key."""
        return base64.urlsafe_b64encode(hmac.new(self._key, f"opod {purpose}".encode(), hashlib.sha256).digest())

    def __repr__(self) -> str:
        return f"SecretsKey({self.where}, fingerprint {self.fingerprint})"


def key_path(home: Path) -> Path:
    """Where this leader's key is: ``OPOD_SECRETS_KEY_FILE``, else ``<home>/secrets.key``."""
    named = config.read(KEY_FILE_VAR)
    return Path(named).expanduser() if named else home / KEY_FILE


def load_or_create_key(home: Path) -> SecretsKey:
    """This leader's secrets key; a new one is made (0600) in ``<home>/secrets.key`` when there is none.

    A file named by ``OPOD_SECRETS_KEY_FILE`` is never made here: it is the key several leaders share,
    and a new one would not open what they sealed. Raises ValueError saying what to do.
    """
    path = key_path(home)
    try:
        return SecretsKey(path.read_bytes().strip(), path)
    except FileNotFoundError:
        if path != home / KEY_FILE:
            raise ValueError(
                f"{KEY_FILE_VAR} names {path}, which does not exist: copy there the {KEY_FILE} of a leader that "
                f"shares this store, or unset {KEY_FILE_VAR} to keep the key in {home / KEY_FILE}"
            ) from None
    except OSError as err:
        raise ValueError(f"cannot read the secrets key {path}: {err.strerror}") from None
    key = Fernet.generate_key()
    write_private(path, key + b"\n")
    return SecretsKey(key, path)
