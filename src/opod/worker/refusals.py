"""What the worker refuses to do, with the HTTP status its API answers."""

from __future__ import annotations


class Refused(Exception):
    """A request the worker cannot carry out; ``status`` is the HTTP status, the message says why and what to do."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LoadRefused(Refused):
    """A model load or unload the worker cannot carry out."""


class AdapterRefused(Refused):
    """An adapter change the worker cannot make."""
