"""People's passwords: argon2id (RFC 9106) through argon2-cffi, a memory-hard hash.

A hash carries its own parameters, so one made under older parameters still verifies and
:meth:`Passwords.stale` says to hash it again at the next sign-in. :meth:`Passwords.verify_nothing`
spends the time of a real check for an account that has no password here, so an unknown account
is not told apart by how long its refusal takes.
"""

from __future__ import annotations

import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

PASSWORD_MIN = 10
"""Characters a new password has at least."""
PASSWORD_MAX = 1024
"""Characters of a password at most: a longer one is refused before it is hashed (hashing costs its length)."""


class Passwords:
    """Hashes and checks passwords; :data:`argon2.profiles.RFC_9106_LOW_MEMORY` unless told other parameters."""

    def __init__(self, hasher: PasswordHasher | None = None) -> None:
        self._hasher = hasher or PasswordHasher()
        self._dummy: str | None = None
        self._lock = threading.Lock()

    def hash(self, password: str) -> str:
        return self._hasher.hash(password)

    def verify(self, stored: str, password: str) -> bool:
        """Whether ``password`` is the one ``stored`` was made from; False for a hash this cannot read."""
        try:
            return self._hasher.verify(stored, password)
        except (VerifyMismatchError, VerificationError, InvalidHashError):
            return False

    def stale(self, stored: str) -> bool:
        """Whether ``stored`` was made under other parameters than these (hash the password again)."""
        try:
            return self._hasher.check_needs_rehash(stored)
        except InvalidHashError:
            return True

    def verify_nothing(self, password: str) -> None:
        """As long as :meth:`verify` takes, for an account with no password here."""
        with self._lock:
            if self._dummy is None:
                self._dummy = self._hasher.hash("opod: no account has this password")
        self.verify(self._dummy, password)


def password_problem(password: str) -> str:
    """Why ``password`` cannot be a new password, or ``""``."""
    if len(password) < PASSWORD_MIN:
        return f"a password has at least {PASSWORD_MIN} characters"
    if len(password) > PASSWORD_MAX:
        return f"a password has at most {PASSWORD_MAX} characters"
    if "\x00" in password:
        return "a password cannot hold a NUL character"
    return ""


__all__ = ["PASSWORD_MAX", "PASSWORD_MIN", "Passwords", "password_problem"]
