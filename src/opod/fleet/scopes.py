"""What the fleet's services ask of the tenancy tree (``opod.access.tenancy``), which sits above the fleet."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol


class ScopeTree(Protocol):
    """Organizations, teams and projects as the fleet names them: ``team:ID`` texts (``access.tenancy.TenancyTree``)."""

    def scope(self, text: str, *, kinds: Collection[str], field: str) -> str:
        """``kind:ID`` of the scope ``text`` names (``team:acme/ml``, ``team:ID`` or an ID), one of ``kinds``.

        Raises ``InvalidInput`` (bad syntax, a kind not allowed) or ``NotFound`` (no such scope), each naming ``field``.
        """
        ...

    def chain(self, scope: str) -> tuple[str, ...]:
        """The scope a text names and every scope above it, as ``team:ID``, itself first; ``()`` when it names nothing
        known."""
        ...

    def label(self, scope: str) -> str:
        """How people know a scope (``Acme / ml``); ``""`` when unknown."""
        ...
