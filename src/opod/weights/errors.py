"""The errors of getting weights onto a machine: each says what failed and what to do."""

from __future__ import annotations

from pathlib import Path


class WeightsError(RuntimeError):
    """Weights could not be fetched, verified or converted; the message names the remedy."""


class DigestMismatchError(WeightsError):
    """A file's SHA-256 is not the expected one; the bad file has already been removed."""

    def __init__(self, what: str, expected: str, actual: str, removed: Path | None, remedy: str) -> None:
        self.expected = expected
        self.actual = actual
        self.removed = removed
        gone = f"; the file was removed ({removed})" if removed is not None else ""
        super().__init__(f"{what}: sha256 is {actual}, expected {expected}{gone}. {remedy}")
