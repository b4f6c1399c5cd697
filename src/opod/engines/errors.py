"""The errors an engine driver raises, each saying what was wrong and what to do.

They are ``ValueError``/``LookupError``/``RuntimeError`` subclasses so callers
that only know the builtin kinds still catch them; the worker maps them to a
refusal that carries the message unchanged.
"""

from __future__ import annotations


class LaunchError(ValueError):
    """A launch request the driver refuses: a bad field of the spec or a bad plan flag."""

    def __init__(self, field: str, reason: str, remedy: str) -> None:
        self.field = field
        self.reason = reason
        self.remedy = remedy
        super().__init__(f"{field}: {reason}; {remedy}")


class NotLaunchable(RuntimeError):
    """The engine is a daemon its operator runs; opod connects to it and never starts it."""


class UnknownEngine(LookupError):
    """An engine name that no registered driver answers to."""

    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = tuple(known)
        super().__init__(f"unknown engine {name!r}; known engines: {', '.join(known)}")


class MetricsParseError(ValueError):
    """An engine's /metrics page that is not Prometheus text."""


class EngineCallError(RuntimeError):
    """An engine endpoint answered with an error, or did not answer."""

    def __init__(self, engine: str, what: str, detail: str, status: int = 0, answer: str = "") -> None:
        self.engine = engine
        self.what = what
        self.detail = detail
        self.status = status
        """The engine's HTTP status when it answered with an error; 0 when it did not answer."""
        self.answer = answer
        """The engine's error body, as it sent it."""
        super().__init__(f"{engine}: {what} failed: {detail}")
